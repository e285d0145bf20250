package registry

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func webShard(cluster ClusterID, addrs ...string) *Shard {
	eps := make([]Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = endpoint(a, eport("http", 8080))
	}
	return shard(cluster, keyWeb, []ServicePort{tcp("http", 80)}, eps...)
}

func apiShard(cluster ClusterID, addrs ...string) *Shard {
	eps := make([]Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = endpoint(a, eport("grpc", 9090))
	}
	return shard(cluster, keyAPI, []ServicePort{tcp("grpc", 9090)}, eps...)
}

func dbShard(cluster ClusterID, addrs ...string) *Shard {
	eps := make([]Endpoint, len(addrs))
	for i, a := range addrs {
		eps[i] = endpoint(a, eport("pg", 5432))
	}
	return shard(cluster, keyDB, []ServicePort{tcp("pg", 5432)}, eps...)
}

func diffKinds(d Diff) map[ServiceKey]ChangeKind {
	out := map[ServiceKey]ChangeKind{}
	for _, s := range d.Services {
		out[s.Key] = s.Kind
	}
	return out
}

func TestApply(t *testing.T) {
	type step struct {
		change Change
		// want is the diff's kinds by service; nil means Apply must change nothing.
		want map[ServiceKey]ChangeKind
		// services are the merged services afterwards, with the clusters exporting each.
		services map[ServiceKey][]ClusterID
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "upsert adds, re-upsert of an equal copy changes nothing",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1")), want: map[ServiceKey]ChangeKind{keyWeb: Added},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east"}}},
				{change: upsert("east", webShard("east", "10.0.0.1")), services: map[ServiceKey][]ClusterID{keyWeb: {"east"}}},
			},
		},
		{
			name: "upsert of a changed shard updates",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")),
					want: map[ServiceKey]ChangeKind{keyWeb: Added, keyAPI: Added}},
				{change: upsert("east", webShard("east", "10.0.0.1", "10.0.0.3"), apiShard("east", "10.0.0.2")),
					want:     map[ServiceKey]ChangeKind{keyWeb: Updated},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east"}, keyAPI: {"east"}}},
			},
		},
		{
			name: "remove",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")),
					want: map[ServiceKey]ChangeKind{keyWeb: Added, keyAPI: Added}},
				{change: Change{Cluster: "east", Removes: []ServiceKey{keyWeb}},
					want:     map[ServiceKey]ChangeKind{keyWeb: Removed},
					services: map[ServiceKey][]ClusterID{keyAPI: {"east"}}},
				{change: Change{Cluster: "east", Removes: []ServiceKey{keyWeb, keyDB}}, // already gone, never there
					services: map[ServiceKey][]ClusterID{keyAPI: {"east"}}},
				{change: Change{Cluster: "west", Removes: []ServiceKey{keyAPI}}, // another cluster's service
					services: map[ServiceKey][]ClusterID{keyAPI: {"east"}}},
			},
		},
		{
			name: "remove in one cluster of two updates the service",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1")), want: map[ServiceKey]ChangeKind{keyWeb: Added}},
				{change: upsert("west", webShard("west", "10.1.0.1")), want: map[ServiceKey]ChangeKind{keyWeb: Updated},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east", "west"}}},
				{change: Change{Cluster: "east", Removes: []ServiceKey{keyWeb}}, want: map[ServiceKey]ChangeKind{keyWeb: Updated},
					services: map[ServiceKey][]ClusterID{keyWeb: {"west"}}},
			},
		},
		{
			name: "replace removes services it does not name, in its own cluster only",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2"), dbShard("east", "10.0.0.3")),
					want: map[ServiceKey]ChangeKind{keyWeb: Added, keyAPI: Added, keyDB: Added}},
				{change: upsert("west", apiShard("west", "10.1.0.2")), want: map[ServiceKey]ChangeKind{keyAPI: Updated}},
				{change: Change{Cluster: "east", Replace: true, Upserts: []*Shard{webShard("east", "10.0.0.1")}},
					want:     map[ServiceKey]ChangeKind{keyAPI: Updated, keyDB: Removed},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east"}, keyAPI: {"west"}}},
			},
		},
		{
			name: "replace with the held state changes nothing (make-before-break)",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")),
					want: map[ServiceKey]ChangeKind{keyWeb: Added, keyAPI: Added}},
				{change: Change{Cluster: "east", Replace: true, Upserts: []*Shard{apiShard("east", "10.0.0.2"), webShard("east", "10.0.0.1")}},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east"}, keyAPI: {"east"}}},
			},
		},
		{
			name: "replace with an updated and a new shard",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")),
					want: map[ServiceKey]ChangeKind{keyWeb: Added, keyAPI: Added}},
				{change: Change{Cluster: "east", Replace: true, Upserts: []*Shard{webShard("east", "10.0.0.9"), dbShard("east", "10.0.0.3")}},
					want:     map[ServiceKey]ChangeKind{keyWeb: Updated, keyAPI: Removed, keyDB: Added},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east"}, keyDB: {"east"}}},
			},
		},
		{
			name: "replace with nothing removes the cluster",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")),
					want: map[ServiceKey]ChangeKind{keyWeb: Added, keyAPI: Added}},
				{change: Change{Cluster: "east", Replace: true}, want: map[ServiceKey]ChangeKind{keyWeb: Removed, keyAPI: Removed},
					services: map[ServiceKey][]ClusterID{}},
				{change: Change{Cluster: "east", Replace: true}, services: map[ServiceKey][]ClusterID{}},
			},
		},
		{
			name: "replace for a new cluster adds",
			steps: []step{
				{change: Change{Cluster: "west", Replace: true, Upserts: []*Shard{webShard("west", "10.1.0.1")}},
					want: map[ServiceKey]ChangeKind{keyWeb: Added}, services: map[ServiceKey][]ClusterID{keyWeb: {"west"}}},
			},
		},
		{
			name: "removes and upserts of the same service in one change: the upsert wins",
			steps: []step{
				{change: upsert("east", webShard("east", "10.0.0.1")), want: map[ServiceKey]ChangeKind{keyWeb: Added}},
				{change: Change{Cluster: "east", Removes: []ServiceKey{keyWeb}, Upserts: []*Shard{webShard("east", "10.0.0.1")}},
					services: map[ServiceKey][]ClusterID{keyWeb: {"east"}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New()
			for i, st := range tt.steps {
				before := fingerprint(t, r)
				next, d := r.Apply(st.change)
				if got := fingerprint(t, r); got != before {
					t.Fatalf("step %d: Apply changed the registry it was called on", i)
				}
				if st.want == nil {
					if next != r || !d.Empty() || next.Version() != r.Version() || d.Version != r.Version() {
						t.Fatalf("step %d: no-op Apply returned registry %p (was %p), version %d (was %d), diff %+v",
							i, next, r, next.Version(), r.Version(), d)
					}
				} else {
					if next == r || next.Version() != r.Version()+1 || d.Version != next.Version() {
						t.Fatalf("step %d: Apply returned version %d (was %d), diff version %d", i, next.Version(), r.Version(), d.Version)
					}
					if got := diffKinds(d); !mapsEqual(got, st.want) {
						t.Errorf("step %d: diff %v, want %v", i, got, st.want)
					}
					if !slices.IsSortedFunc(d.Services, func(a, b ServiceDiff) int { return a.Key.Compare(b.Key) }) {
						t.Errorf("step %d: diff not sorted by key: %+v", i, d.Services)
					}
				}
				r = next
				if st.services != nil {
					got := map[ServiceKey][]ClusterID{}
					for _, s := range r.Services() {
						got[s.Key] = s.Clusters()
					}
					if fmt.Sprint(got) != fmt.Sprint(st.services) || r.Len() != len(st.services) {
						t.Errorf("step %d: services %v (Len %d), want %v", i, got, r.Len(), st.services)
					}
				}
				checkInvariants(t, r)
			}
		})
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// fingerprint renders everything observable about r, to prove a registry never changes after the fact.
func fingerprint(t *testing.T, r *Registry) string {
	t.Helper()
	type view struct {
		Version  uint64
		Services []*Service
		Clusters []ClusterSummary
		Shards   map[string]map[string]*Shard
		Digests  map[string]Hash
	}
	v := view{Version: r.Version(), Services: r.Services(), Clusters: clusters(r),
		Shards: map[string]map[string]*Shard{}, Digests: map[string]Hash{}}
	for _, c := range clusters(r) {
		m := map[string]*Shard{}
		for k, s := range r.ClusterShards(c.Cluster) {
			m[k.String()] = s
		}
		v.Shards[string(c.Cluster)] = m
		v.Digests[string(c.Cluster)] = r.ClusterDigest(c.Cluster)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkInvariants checks what must hold for every registry: digests match the held shards,
// summaries match, and every merged service is exactly its clusters' shards, merged.
func checkInvariants(t *testing.T, r *Registry) {
	t.Helper()
	exporting := map[ServiceKey][]ClusterID{}
	for _, c := range clusters(r) {
		shards := r.ClusterShards(c.Cluster)
		if len(shards) == 0 {
			t.Errorf("cluster %s listed with no shards", c.Cluster)
		}
		if got, want := r.ClusterDigest(c.Cluster), Digest(shards); got != want {
			t.Errorf("ClusterDigest(%s) = %v, want Digest(ClusterShards) = %v", c.Cluster, got, want)
		}
		if c.Digest != r.ClusterDigest(c.Cluster) {
			t.Errorf("summary digest of %s = %v, ClusterDigest %v", c.Cluster, c.Digest, r.ClusterDigest(c.Cluster))
		}
		endpoints := 0
		for k, s := range shards {
			if s.Cluster != c.Cluster || s.Service != k {
				t.Errorf("cluster %s holds shard %s/%s under key %s", c.Cluster, s.Cluster, s.Service, k)
			}
			endpoints += len(s.Endpoints)
			exporting[k] = append(exporting[k], c.Cluster)
		}
		if c.Services != len(shards) || c.Endpoints != endpoints {
			t.Errorf("summary of %s = %d services, %d endpoints; want %d, %d", c.Cluster, c.Services, c.Endpoints, len(shards), endpoints)
		}
	}
	if len(exporting) != r.Len() {
		t.Errorf("%d services held by clusters, registry has %d", len(exporting), r.Len())
	}
	for k, ids := range exporting {
		svc := r.Service(k)
		if svc == nil {
			t.Errorf("service %s held by %v is not merged", k, ids)
			continue
		}
		slices.Sort(ids)
		if !slices.Equal(svc.Clusters(), ids) {
			t.Errorf("service %s merges %v, want %v", k, svc.Clusters(), ids)
		}
		for _, s := range svc.Shards {
			if s != r.ClusterShards(s.Cluster)[k] && !s.Equal(r.ClusterShards(s.Cluster)[k]) {
				t.Errorf("service %s holds a stale shard of %s", k, s.Cluster)
			}
		}
		// The merged view must not depend on history: merge the same shards into a fresh registry.
		fresh := New()
		for _, s := range slices.Backward(svc.Shards) {
			fresh, _ = fresh.Apply(upsert(s.Cluster, s))
		}
		want := fresh.Service(k)
		if !slices.Equal(svc.Ports, want.Ports) || svc.Headless != want.Headless || !slices.Equal(svc.Conflicts, want.Conflicts) {
			t.Errorf("service %s merged as %+v, a fresh merge gives %+v", k, svc, want)
		}
		if svc.ShapeRevision > svc.Revision || svc.Revision > r.Version() {
			t.Errorf("service %s: ShapeRevision %d, Revision %d, registry version %d", k, svc.ShapeRevision, svc.Revision, r.Version())
		}
	}
}

func TestApplyKeepsOldRegistriesIntact(t *testing.T) {
	var history []*Registry
	var prints []string
	r := New()
	record := func() {
		history = append(history, r)
		prints = append(prints, fingerprint(t, r))
	}
	record()
	changes := []Change{
		upsert("east", webShard("east", "10.0.0.1"), apiShard("east", "10.0.0.2")),
		upsert("west", webShard("west", "10.1.0.1")),
		upsert("east", webShard("east", "10.0.0.1", "10.0.0.5")),
		{Cluster: "west", Removes: []ServiceKey{keyWeb}},
		{Cluster: "east", Replace: true, Upserts: []*Shard{dbShard("east", "10.0.0.3")}},
		upsert("west", shard("west", keyDB, []ServicePort{tcp("postgres", 5432)}, endpoint("10.1.0.3", eport("postgres", 5432)))),
		{Cluster: "east", Replace: true},
	}
	for _, c := range changes {
		r, _ = mustApply(t, r, c)
		record()
	}
	for i, old := range history {
		if got := fingerprint(t, old); got != prints[i] {
			t.Errorf("registry at version %d changed after later Applies:\nwas %s\nnow %s", old.Version(), prints[i], got)
		}
		if old.Version() != uint64(i) {
			t.Errorf("registry %d has version %d", i, old.Version())
		}
	}
}

func TestClusterSummaries(t *testing.T) {
	r := New()
	web := webShard("east", "10.0.0.1", "10.0.0.2")
	web.Endpoints[1].Conditions = notReady() // excluded endpoints still count as held
	r, _ = mustApply(t, r, upsert("east", web, apiShard("east", "10.0.0.3")))
	r, _ = mustApply(t, r, upsert("west", webShard("west", "10.1.0.1")))
	r, _ = mustApply(t, r, upsert("north", dbShard("north")))

	want := []ClusterSummary{
		{Cluster: "east", Services: 2, Endpoints: 3},
		{Cluster: "north", Services: 1, Endpoints: 0},
		{Cluster: "west", Services: 1, Endpoints: 1},
	}
	got := clusters(r)
	if len(got) != len(want) {
		t.Fatalf("Clusters() = %+v, want %+v", got, want)
	}
	for i := range want {
		want[i].Digest = Digest(r.ClusterShards(want[i].Cluster))
		if got[i] != want[i] {
			t.Errorf("Clusters()[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if r.ClusterDigest("south") != ZeroHash || r.ClusterShards("south") != nil {
		t.Error("an unknown cluster has a digest or shards")
	}

	r, _ = mustApply(t, r, Change{Cluster: "east", Removes: []ServiceKey{keyAPI}})
	if got := clusters(r)[0]; got.Services != 1 || got.Endpoints != 2 {
		t.Errorf("after removing api, east = %+v", got)
	}
	r, _ = mustApply(t, r, Change{Cluster: "east", Removes: []ServiceKey{keyWeb}})
	if len(clusters(r)) != 2 || clusters(r)[0].Cluster != "north" {
		t.Errorf("after removing everything east had, Clusters() = %+v", clusters(r))
	}
	if r.ClusterDigest("east") != ZeroHash || r.ClusterShards("east") != nil {
		t.Errorf("gone cluster has digest %v, shards %v", r.ClusterDigest("east"), r.ClusterShards("east"))
	}
	checkInvariants(t, r)
}

// A spoke reconnecting sends its full state and later its digest; both must agree with what the hub holds.
// The hub decodes shards off the wire with empty (non-nil) slices; a spoke may build them with nil ones.
func TestApplyFullStateDigestMatchesSender(t *testing.T) {
	held := dbShard("east")
	held.Endpoints = nil // a service scaled to zero, as a spoke builds it
	sent := cloneShard(held)
	sent.Endpoints = []Endpoint{} // the same state as decoded from the wire
	r, _ := mustApply(t, New(), upsert("east", held))
	r2, d := r.Apply(Change{Cluster: "east", Replace: true, Upserts: []*Shard{sent}})
	if !d.Empty() {
		t.Fatalf("re-sending an equal full state changed something: %+v", d)
	}
	want := Digest(map[ServiceKey]*Shard{keyDB: sent})
	if got := r2.ClusterDigest("east"); got != want {
		t.Errorf("after the full state, hub digest %v != digest of the full state %v: anti-entropy never converges", got, want)
	}
}

// TestApplyRandomSequences applies random changes and checks the registry against a plain model after each.
func TestApplyRandomSequences(t *testing.T) {
	clusters := []ClusterID{"east", "west", "north"}
	keys := []ServiceKey{keyWeb, keyAPI, keyDB, {Namespace: "dns", Name: "coredns"}}
	portPool := []ServicePort{
		tcp("http", 80), tcp("web", 80), {Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "h2c"},
		tcp("http", 8080), tcp("grpc", 9090), udp("dns", 53), tcp("dns-tcp", 53),
	}
	for seed := range uint64(30) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			randomShard := func(c ClusterID, k ServiceKey) *Shard {
				s := &Shard{Cluster: c, Service: k, ExportedAt: t0.Add(time.Duration(rng.IntN(3)) * time.Hour), Headless: rng.IntN(5) == 0}
				names, numbers := map[string]bool{}, map[string]bool{}
				for _, p := range portPool {
					nk := fmt.Sprint(p.Port, p.Protocol)
					if rng.IntN(3) == 0 && !names[p.Name] && !numbers[nk] {
						names[p.Name], numbers[nk] = true, true
						s.Ports = append(s.Ports, p)
					}
				}
				if len(s.Ports) == 0 {
					s.Ports = []ServicePort{portPool[rng.IntN(len(portPool))]}
				}
				for i := range rng.IntN(4) {
					e := Endpoint{
						Addresses:  ips(fmt.Sprintf("10.%d.%d.%d", slices.Index(clusters, c), rng.IntN(3), i)),
						Locality:   Locality{Region: "r", Zone: fmt.Sprint("z", rng.IntN(2))},
						Conditions: []Conditions{ready(), draining(), notReady()}[rng.IntN(3)],
					}
					for _, p := range s.Ports {
						e.Ports = append(e.Ports, eport(p.Name, p.Port+int32(rng.IntN(2))))
					}
					s.Endpoints = append(s.Endpoints, e)
				}
				s.Normalize()
				if err := s.Validate(DefaultLimits()); err != nil {
					t.Fatalf("fixture: %v", err)
				}
				return s
			}

			model := map[ClusterID]map[ServiceKey]*Shard{}
			r := New()
			var history []*Registry
			var prints []string
			for step := range 60 {
				c := clusters[rng.IntN(len(clusters))]
				var change Change
				next := map[ServiceKey]*Shard{}
				for k, s := range model[c] {
					next[k] = s
				}
				switch op := rng.IntN(4); op {
				case 0: // upserts
					change = Change{Cluster: c}
					for _, k := range keys {
						if rng.IntN(2) == 0 {
							s := randomShard(c, k)
							change.Upserts = append(change.Upserts, s)
							next[k] = s
						}
					}
				case 1: // removes
					change = Change{Cluster: c}
					for _, k := range keys {
						if rng.IntN(3) == 0 {
							change.Removes = append(change.Removes, k)
							delete(next, k)
						}
					}
				case 2: // full state
					change = Change{Cluster: c, Replace: true}
					next = map[ServiceKey]*Shard{}
					for _, k := range keys {
						switch rng.IntN(3) {
						case 0: // keep what is held, as an equal copy
							if s, ok := model[c][k]; ok {
								s = cloneShard(s)
								change.Upserts = append(change.Upserts, s)
								next[k] = s
							}
						case 1:
							s := randomShard(c, k)
							change.Upserts = append(change.Upserts, s)
							next[k] = s
						}
					}
				case 3: // the same state again, as copies: must be a no-op
					change = Change{Cluster: c, Replace: rng.IntN(2) == 0}
					for _, s := range model[c] {
						change.Upserts = append(change.Upserts, cloneShard(s))
					}
				}

				// Which services should the diff name? Those whose shard in c changed.
				wantKeys := map[ServiceKey]bool{}
				for _, k := range keys {
					if !model[c][k].Equal(next[k]) {
						wantKeys[k] = true
					}
				}

				history = append(history, r)
				prints = append(prints, fingerprint(t, r))
				nr, d := r.Apply(change)
				if len(wantKeys) == 0 {
					if nr != r || !d.Empty() {
						t.Fatalf("step %d: %+v should change nothing, got diff %+v", step, change, d)
					}
					continue
				}
				if nr.Version() != r.Version()+1 || d.Version != nr.Version() {
					t.Fatalf("step %d: version %d -> %d, diff version %d", step, r.Version(), nr.Version(), d.Version)
				}
				gotKeys := map[ServiceKey]bool{}
				for _, sd := range d.Services {
					gotKeys[sd.Key] = true
					prev, now := r.Service(sd.Key), nr.Service(sd.Key)
					switch {
					case prev == nil && (sd.Kind != Added || now == nil):
						t.Errorf("step %d: %s kind %v, want added", step, sd.Key, sd.Kind)
					case now == nil && (sd.Kind != Removed || prev == nil):
						t.Errorf("step %d: %s kind %v, want removed", step, sd.Key, sd.Kind)
					case prev != nil && now != nil:
						if sd.Kind != Updated {
							t.Errorf("step %d: %s kind %v, want updated", step, sd.Key, sd.Kind)
						}
						sameShape := prev.Headless == now.Headless && slices.Equal(prev.Ports, now.Ports) && slices.Equal(prev.Conflicts, now.Conflicts)
						if sd.ShapeChanged == sameShape {
							t.Errorf("step %d: %s ShapeChanged=%t but shape same=%t", step, sd.Key, sd.ShapeChanged, sameShape)
						}
						if sameShape != (now.ShapeRevision == prev.ShapeRevision) {
							t.Errorf("step %d: %s ShapeRevision %d -> %d with shape same=%t", step, sd.Key, prev.ShapeRevision, now.ShapeRevision, sameShape)
						}
						if !sd.EndpointsChanged && !sameEndpoints(prev, now) {
							t.Errorf("step %d: %s endpoints changed but EndpointsChanged=false", step, sd.Key)
						}
					}
					if now != nil && now.Revision != nr.Version() {
						t.Errorf("step %d: %s Revision %d, want %d", step, sd.Key, now.Revision, nr.Version())
					}
				}
				if !mapsEqual(gotKeys, wantKeys) {
					t.Errorf("step %d: diff names %v, want %v", step, gotKeys, wantKeys)
				}
				r = nr
				if len(next) == 0 {
					delete(model, c)
				} else {
					model[c] = next
				}
				for _, id := range clusters {
					want := Digest(model[id])
					if len(model[id]) == 0 {
						want = ZeroHash
					}
					if got := r.ClusterDigest(id); got != want {
						t.Errorf("step %d: ClusterDigest(%s) = %v, want %v", step, id, got, want)
					}
					held := r.ClusterShards(id)
					if len(held) != len(model[id]) {
						t.Errorf("step %d: %s holds %d shards, want %d", step, id, len(held), len(model[id]))
					}
					for k, s := range model[id] {
						if !held[k].Equal(s) {
							t.Errorf("step %d: %s holds %+v for %s, want %+v", step, id, held[k], k, s)
						}
					}
				}
				checkInvariants(t, r)
				if t.Failed() {
					t.FailNow()
				}
			}
			for i, old := range history {
				if fingerprint(t, old) != prints[i] {
					t.Errorf("registry at version %d changed after later Applies", old.Version())
				}
			}
		})
	}
}

// sameEndpoints reports whether every merged port is served by the same endpoints in prev and now.
func sameEndpoints(prev, now *Service) bool {
	ports := append(slices.Clone(prev.Ports), now.Ports...)
	for _, p := range ports {
		if !slices.Equal(prev.Endpoints(p), now.Endpoints(p)) {
			return false
		}
	}
	return true
}

// A full state keeps, for the services it retains, whatever shard the cluster had.
func TestReplaceRetains(t *testing.T) {
	r, _ := mustApply(t, New(), upsert("east", dbShard("east")))
	before := r.Service(keyDB)
	r2, d := r.Apply(Change{Cluster: "east", Replace: true, Retain: []ServiceKey{keyDB}})
	if !d.Empty() || r2.Service(keyDB) != before {
		t.Fatalf("a retained service changed: diff %+v", d)
	}
	r3, _ := r.Apply(Change{Cluster: "east", Replace: true})
	if r3.Service(keyDB) != nil {
		t.Fatal("a service neither sent nor retained survived a full state")
	}
	checkInvariants(t, r2)
}

// clusters summarizes every cluster that has a shard, sorted by ID.
func clusters(r *Registry) []ClusterSummary {
	var out []ClusterSummary
	for _, id := range slices.Sorted(r.clusters.Keys()) {
		out = append(out, r.Cluster(id))
	}
	return out
}

func TestAllYieldsEveryService(t *testing.T) {
	r := New()
	for _, name := range []string{"a", "b", "c"} {
		r, _ = r.Apply(upsert("east", shard("east", ServiceKey{Namespace: "ns", Name: name}, []ServicePort{tcp("http", 80)})))
	}
	all := slices.Collect(r.All())
	slices.SortFunc(all, func(a, b *Service) int { return a.Key.Compare(b.Key) })
	if !slices.Equal(all, r.Services()) {
		t.Errorf("All = %v, want the services %v", all, r.Services())
	}
}

// A full state that re-sends a shard equal to the held one keeps the held
// shard itself: what others keep by its pointer (the snapshot's compressed
// blocks) stays theirs through a spoke's resync.
func TestApplyKeepsTheHeldShardThroughAnEqualFullState(t *testing.T) {
	web, db := ServiceKey{Namespace: "shop", Name: "web"}, ServiceKey{Namespace: "shop", Name: "db"}
	r, _ := New().Apply(Change{Cluster: "east", Replace: true, Upserts: []*Shard{
		shard("east", web, []ServicePort{tcp("grpc", 8080)}, endpoint("10.0.0.1")),
		shard("east", db, []ServicePort{tcp("sql", 5432)}, endpoint("10.0.0.2")),
	}})
	heldWeb, _ := r.ClusterView("east").Get(web)
	r, d := r.Apply(Change{Cluster: "east", Replace: true, Upserts: []*Shard{
		shard("east", web, []ServicePort{tcp("grpc", 8080)}, endpoint("10.0.0.1")), // equal, another pointer
		shard("east", db, []ServicePort{tcp("sql", 5432)}, endpoint("10.0.0.3")),   // changed
	}})
	if got, _ := r.ClusterView("east").Get(web); got != heldWeb {
		t.Error("an equal shard in a full state replaced the held one")
	}
	if len(d.Services) != 1 || d.Services[0].Key != db {
		t.Errorf("diff %+v, want db only", d.Services)
	}
}
