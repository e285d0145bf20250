package hub

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// endpointShard is east's shard of default/name with an endpoint at each address.
func endpointShard(name string, addrs ...string) *registry.Shard {
	s := &registry.Shard{Cluster: "east", Service: registry.ServiceKey{Namespace: "default", Name: name},
		Ports: []registry.ServicePort{{Name: "http", Port: 80, Protocol: registry.ProtocolTCP}}}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, registry.Endpoint{Addresses: []netip.Addr{netip.MustParseAddr(a)},
			Ports: []registry.EndpointPort{{Name: "http", Port: 8080}}, Conditions: registry.Conditions{Ready: true, Serving: true}})
	}
	s.Normalize()
	return s
}

// applyRound applies a change to reg, hands the importer the registry and
// its diff as the state would, runs a round, and returns the registry.
func applyRound(t *testing.T, im *importer, reg *registry.Registry, ch registry.Change) *registry.Registry {
	t.Helper()
	reg, d := reg.Apply(ch)
	im.Update(reg, d)
	im.round(context.Background(), View{})
	return reg
}

// changedKeys is what changed from older to set, sorted; it fails unless set reaches back to older.
func changedKeys(t *testing.T, set, older *federation.ImportSet) []string {
	t.Helper()
	keys, ok := set.ChangedSince(older)
	if !ok {
		t.Fatal("the set does not reach back to the one before it")
	}
	var out []string
	for _, k := range keys {
		out = append(out, k.String())
	}
	slices.Sort(out)
	return out
}

// Each round publishes the set it changed from the current one, naming
// exactly the services whose import changed; earlier sets stay as they were.
func TestImporterPublishesWhatChanged(t *testing.T) {
	im := newImporter(nil, nil, time.Hour, slog.New(slog.DiscardHandler))
	im.clusters = map[registry.ClusterID]ClusterStatus{"east": clusterStatus(adminapi.ClusterStatus{Cluster: "east", LastUpdate: time.Now()})}
	web, api := registry.ServiceKey{Namespace: "default", Name: "web"}, registry.ServiceKey{Namespace: "default", Name: "api"}
	set0, _ := im.Imports()
	reg := applyRound(t, im, registry.New(), registry.Change{Cluster: "east",
		Upserts: []*registry.Shard{endpointShard("web", "10.0.0.1", "127.0.0.1"), endpointShard("api", "10.0.0.2")}})
	set1, _ := im.Imports()
	if got := changedKeys(t, set1, set0); !slices.Equal(got, []string{"default/api", "default/web"}) || set1.Imports.Len() != 2 {
		t.Fatalf("first round: changed %v, %d imports", got, set1.Imports.Len())
	}
	// What an import leaves out is kept beside the set, and shown with it.
	info := Imports(set1, im.Skipped(), nil)
	if len(info.Imports) != 2 || info.Imports[1].Service != web || len(info.Imports[1].Skipped) != 1 || len(info.Imports[0].Skipped) != 0 {
		t.Fatalf("/debug/imports: %+v", info.Imports)
	}

	// A change the import does not show (the node's name) changes nothing, but a set is published.
	quiet := endpointShard("api", "10.0.0.2")
	quiet.Endpoints[0].NodeName = "node-1"
	reg = applyRound(t, im, reg, registry.Change{Cluster: "east", Upserts: []*registry.Shard{quiet}})
	set2, _ := im.Imports()
	if got := changedKeys(t, set2, set1); len(got) != 0 || set2 == set1 {
		t.Fatalf("a change the import does not show: changed %v (a new set: %v)", got, set2 != set1)
	}
	held1, _ := set1.Imports.Get(api)
	if held2, _ := set2.Imports.Get(api); held2 != held1 {
		t.Error("an equal rebuild replaced the held import")
	}

	// One endpoint changes: that service alone; its skipped address goes.
	reg = applyRound(t, im, reg, registry.Change{Cluster: "east", Upserts: []*registry.Shard{endpointShard("web", "10.0.0.3")}})
	set3, _ := im.Imports()
	if got := changedKeys(t, set3, set2); !slices.Equal(got, []string{"default/web"}) {
		t.Fatalf("one endpoint changed: changed %v", got)
	}
	if _, ok := im.Skipped().Get(web); ok {
		t.Error("web's skipped address is still held")
	}
	before, _ := set2.Imports.Get(web)
	after, _ := set3.Imports.Get(web)
	if before.Sources[0].Endpoints[0].Addresses[0].String() != "10.0.0.1" || after.Sources[0].Endpoints[0].Addresses[0].String() != "10.0.0.3" {
		t.Errorf("web before %v, after %v", before.Sources[0].Endpoints, after.Sources[0].Endpoints)
	}

	// A removal.
	applyRound(t, im, reg, registry.Change{Cluster: "east", Removes: []registry.ServiceKey{api}})
	set4, _ := im.Imports()
	if got := changedKeys(t, set4, set3); !slices.Equal(got, []string{"default/api"}) || set4.Imports.Len() != 1 {
		t.Fatalf("a removal: changed %v, %d imports", got, set4.Imports.Len())
	}
	if got := changedKeys(t, set4, set0); !slices.Equal(got, []string{"default/api", "default/web"}) {
		t.Errorf("since the first set: changed %v", got)
	}

	// The authority alone: a new set, nothing changed in it.
	im.catalogRead.Store(true)
	im.round(context.Background(), View{})
	set5, _ := im.Imports()
	if got := changedKeys(t, set5, set4); !set5.Authoritative || set4.Authoritative || len(got) != 0 || set5.Imports.Len() != 1 {
		t.Errorf("the authority alone: authoritative %v -> %v, changed %v", set4.Authoritative, set5.Authoritative, got)
	}
}

// BenchmarkImporterChange is the importer's round for one changed service,
// from the registry's diff to the published set, with 1,000 and 10,000
// imports: the cost of a change must not grow with the imports.
func BenchmarkImporterChange(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("imports=%d", n), func(b *testing.B) {
			im := newImporter(nil, nil, time.Hour, slog.New(slog.DiscardHandler))
			reg := registry.New()
			ch := registry.Change{Cluster: "east"}
			for i := range n {
				ch.Upserts = append(ch.Upserts, endpointShard(fmt.Sprintf("svc-%05d", i), fmt.Sprintf("10.%d.%d.1", i/250, i%250)))
			}
			reg, d := reg.Apply(ch)
			im.Update(reg, d)
			im.round(context.Background(), View{})
			forms := make([][2]*registry.Shard, n)
			for i := range forms {
				name := fmt.Sprintf("svc-%05d", i)
				forms[i] = [2]*registry.Shard{endpointShard(name, fmt.Sprintf("10.%d.%d.2", i/250, i%250)),
					endpointShard(name, fmt.Sprintf("10.%d.%d.1", i/250, i%250))}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				reg, d = reg.Apply(registry.Change{Cluster: "east", Upserts: []*registry.Shard{forms[i%n][i/n%2]}})
				im.Update(reg, d)
				im.round(context.Background(), View{})
			}
			if set, _ := im.Imports(); set.Imports.Len() != n {
				b.Fatalf("%d imports", set.Imports.Len())
			}
		})
	}
}
