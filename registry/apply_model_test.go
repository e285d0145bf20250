package registry

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// applyModel is what Change means, on plain maps: the cluster's shards after ch.
func applyModel(held map[ServiceKey]*Shard, ch Change) map[ServiceKey]*Shard {
	next := map[ServiceKey]*Shard{}
	if ch.Replace {
		for _, k := range ch.Retain {
			if s, ok := held[k]; ok {
				next[k] = s
			}
		}
	} else {
		maps.Copy(next, held)
	}
	for _, k := range ch.Removes {
		delete(next, k)
	}
	for _, s := range ch.Upserts {
		if h, ok := held[s.Service]; ok && h.Equal(s) {
			s = h // an equal shard keeps the one held
		}
		next[s.Service] = s
	}
	return next
}

// TestApplyAgainstModel applies random changes to a registry large enough
// for its maps to be several levels deep, and checks it after each against
// a reference rebuilt from scratch out of plain maps; at the end, that every
// older registry still shows what it showed.
func TestApplyAgainstModel(t *testing.T) {
	ids := []ClusterID{"a", "b", "c", "d"}
	keys := make([]ServiceKey, 200)
	for i := range keys {
		keys[i] = ServiceKey{Namespace: fmt.Sprint("ns", i%7), Name: fmt.Sprint("svc", i)}
	}
	// variant v of a shard: ports that clusters may disagree on, 0 to 2 endpoints.
	shardOf := func(c ClusterID, k ServiceKey, v int) *Shard {
		ports := [][]ServicePort{{tcp("http", 80)}, {tcp("http", 80), tcp("grpc", 9090)}, {tcp("web", 80)}}[v%3]
		s := &Shard{Cluster: c, Service: k, ExportedAt: t0.Add(time.Duration(v%2) * time.Hour), Headless: v == 7, Ports: ports}
		for i := range v % 3 {
			e := endpoint(fmt.Sprintf("10.%d.%d.%d", slices.Index(ids, c), v, i))
			for _, p := range ports {
				e.Ports = append(e.Ports, eport(p.Name, p.Port+1000))
			}
			s.Endpoints = append(s.Endpoints, e)
		}
		s.Normalize()
		return s
	}
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			pick := func() ServiceKey { return keys[rng.IntN(len(keys))] }
			model := map[ClusterID]map[ServiceKey]*Shard{}
			r := New()
			type kept struct {
				r     *Registry
				print string
			}
			var history []kept
			for step := range 150 {
				c := ids[rng.IntN(len(ids))]
				held := model[c]
				ch := Change{Cluster: c}
				switch rng.IntN(5) {
				case 0: // a full state, retaining a few services
					ch.Replace = true
					for range rng.IntN(5) {
						ch.Retain = append(ch.Retain, pick())
					}
					for range rng.IntN(len(keys)) {
						ch.Upserts = append(ch.Upserts, shardOf(c, pick(), rng.IntN(8)))
					}
				case 1: // removes, some of services not held
					for range 1 + rng.IntN(10) {
						ch.Removes = append(ch.Removes, pick())
					}
				case 2: // upserts, and removes the upserts win over
					for range 1 + rng.IntN(10) {
						ch.Upserts = append(ch.Upserts, shardOf(c, pick(), rng.IntN(8)))
					}
					for _, s := range ch.Upserts[:rng.IntN(len(ch.Upserts))] {
						ch.Removes = append(ch.Removes, s.Service)
					}
				case 3: // equal copies of what is held: changes nothing
					ch.Replace = rng.IntN(2) == 0
					for _, s := range held {
						if ch.Replace || rng.IntN(3) == 0 {
							ch.Upserts = append(ch.Upserts, cloneShard(s))
						}
					}
				case 4: // one endpoint change, as most updates are
					ch.Upserts = []*Shard{shardOf(c, pick(), rng.IntN(8))}
				}
				next := applyModel(held, ch)
				want := map[ServiceKey]bool{}
				for _, k := range keys {
					if !held[k].Equal(next[k]) {
						want[k] = true
					}
				}

				if step%10 == 0 {
					history = append(history, kept{r, fingerprint(t, r)})
				}
				nr, d := r.Apply(ch)
				if len(want) == 0 {
					if nr != r || !d.Empty() || d.Version != r.Version() {
						t.Fatalf("step %d: a change of nothing returned version %d, diff %+v", step, nr.Version(), d)
					}
					continue
				}
				if nr.Version() != r.Version()+1 || d.Version != nr.Version() {
					t.Fatalf("step %d: version %d -> %d, diff version %d", step, r.Version(), nr.Version(), d.Version)
				}
				if !slices.IsSortedFunc(d.Services, func(a, b ServiceDiff) int { return a.Key.Compare(b.Key) }) {
					t.Errorf("step %d: diff not sorted", step)
				}
				got := map[ServiceKey]bool{}
				for _, sd := range d.Services {
					got[sd.Key] = true
					prev, now := r.Service(sd.Key), nr.Service(sd.Key)
					kind := Updated
					if prev == nil {
						kind = Added
					} else if now == nil {
						kind = Removed
					}
					if sd.Kind != kind {
						t.Errorf("step %d: %s is %v, want %v", step, sd.Key, sd.Kind, kind)
					}
				}
				if !maps.Equal(got, want) {
					t.Fatalf("step %d: diff names %v, want %v", step, got, want)
				}
				if model[c] = next; len(next) == 0 {
					delete(model, c)
				}
				r = nr
				checkModel(t, r, model, ids)
				if t.Failed() {
					t.FailNow()
				}
			}
			for _, k := range history {
				if fingerprint(t, k.r) != k.print {
					t.Errorf("registry at version %d changed after later Applies", k.r.Version())
				}
			}
		})
	}
}

// checkModel checks everything r shows against model: each cluster's view,
// shards, summary and snapshot, and every service merged afresh.
func checkModel(t *testing.T, r *Registry, model map[ClusterID]map[ServiceKey]*Shard, ids []ClusterID) {
	t.Helper()
	byService := map[ServiceKey][]*Shard{}
	for _, id := range ids {
		want := model[id]
		v := r.ClusterView(id)
		if v.Len() != len(want) || !maps.Equal(maps.Collect(v.All()), want) {
			t.Errorf("view of %s holds %d shards, want %d", id, v.Len(), len(want))
		}
		for k, s := range want {
			if got, ok := v.Get(k); got != s || !ok {
				t.Errorf("view of %s: Get(%s) = %p, want %p", id, k, got, s)
			}
			byService[k] = append(byService[k], s)
		}
		if shards := r.ClusterShards(id); !maps.Equal(shards, want) || (shards == nil) != (want == nil) {
			t.Errorf("ClusterShards(%s) = %v, want %v", id, shards, want)
		}
		endpoints := 0
		for _, s := range want {
			endpoints += len(s.Endpoints)
		}
		sum := ClusterSummary{Cluster: id, Services: len(want), Endpoints: endpoints, Digest: Digest(want)}
		if got := r.Cluster(id); got != sum || r.ClusterDigest(id) != sum.Digest || v.Digest() != sum.Digest {
			t.Errorf("Cluster(%s) = %+v, want %+v", id, got, sum)
		}
	}
	snap := r.Snapshot(nil)
	if len(snap.Clusters) != len(model) {
		t.Errorf("snapshot of %d clusters, want %d", len(snap.Clusters), len(model))
	}
	for i, sc := range snap.Clusters {
		want := slices.SortedFunc(maps.Values(model[sc.Cluster]), compareShardService)
		if i > 0 && snap.Clusters[i-1].Cluster >= sc.Cluster || !slices.Equal(sc.Shards, want) {
			t.Errorf("snapshot of %s: %d shards, want %d, sorted", sc.Cluster, len(sc.Shards), len(want))
		}
	}

	services := r.Services()
	if len(services) != len(byService) || r.Len() != len(byService) {
		t.Errorf("%d services (Len %d), want %d", len(services), r.Len(), len(byService))
	}
	if !slices.IsSortedFunc(services, func(a, b *Service) int { return a.Key.Compare(b.Key) }) {
		t.Error("Services not sorted")
	}
	all := slices.SortedFunc(r.All(), func(a, b *Service) int { return a.Key.Compare(b.Key) })
	if !slices.Equal(all, services) {
		t.Error("All and Services differ")
	}
	for k, shards := range byService {
		slices.SortFunc(shards, func(a, b *Shard) int { return cmp.Compare(a.Cluster, b.Cluster) })
		svc, want := r.Service(k), merge(k, shards)
		if svc == nil {
			t.Errorf("service %s missing", k)
			continue
		}
		if !slices.EqualFunc(svc.Shards, shards, (*Shard).Equal) || !slices.Equal(svc.Ports, want.Ports) ||
			svc.Headless != want.Headless || !slices.Equal(svc.Conflicts, want.Conflicts) || !svc.Properties.Equal(&want.Properties) {
			t.Errorf("service %s merged as %+v, a fresh merge gives %+v", k, svc, want)
		}
		if svc.ShapeRevision > svc.Revision || svc.Revision > r.Version() {
			t.Errorf("service %s: ShapeRevision %d, Revision %d, version %d", k, svc.ShapeRevision, svc.Revision, r.Version())
		}
	}
}

// TestReadersNeedNoLocks reads every registry handed out while later ones
// are made: with -race, it catches an Apply that writes what an older
// registry shares.
func TestReadersNeedNoLocks(t *testing.T) {
	published := make(chan *Registry, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range published {
			for range 3 {
				n := 0
				for _, s := range r.Services() {
					n += len(s.Shards)
				}
				for _, id := range []ClusterID{"east", "west"} {
					v := r.ClusterView(id)
					for k, s := range v.All() {
						if got, _ := v.Get(k); got != s {
							t.Errorf("view of %s: Get(%s) differs from All", id, k)
						}
						n--
					}
				}
				if n != 0 {
					t.Errorf("version %d: services hold %d shards more than the clusters", r.Version(), n)
				}
			}
		}
	}()
	r := New()
	for i := range 200 {
		c := []ClusterID{"east", "west"}[i%2]
		ch := Change{Cluster: c, Replace: i%20 == 0}
		for j := range 1 + i%40 {
			k := ServiceKey{Namespace: "ns", Name: fmt.Sprint("svc", (i*7+j)%150)}
			ch.Upserts = append(ch.Upserts, shard(c, k, []ServicePort{tcp("http", 80)}, endpoint(fmt.Sprintf("10.0.%d.%d", i%2, i%200))))
		}
		r, _ = r.Apply(ch)
		published <- r
	}
	close(published)
	<-done
}
