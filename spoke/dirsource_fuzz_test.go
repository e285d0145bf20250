package spoke

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// FuzzDecodeManifests: a manifest file of the directory source, decoded and
// built into shards as DirSource does. A file that does not decode yields
// nothing; every shard built is valid, canonical (normalized, empty lists
// non-nil), independent of the order of slices and nodes, and reaches the
// hub unchanged: it survives federation's wire round trip with its hash,
// which is what the spoke and the hub compare.
func FuzzDecodeManifests(f *testing.F) {
	var all []byte
	for _, name := range []string{"services.yaml", "slices.yaml", "db-slice.yml", "nodes.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "cluster", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		all = append(append(all, b...), "\n---\n"...)
	}
	f.Add(all) // the whole cluster in one file
	f.Add([]byte(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"api","labels":{"nave.io/export":"true"}},` +
		`"spec":{"clusterIP":"None","sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}},"internalTrafficPolicy":"Local","trafficDistribution":"PreferClose",` +
		`"ports":[{"name":"grpc","port":9090,"appProtocol":"kubernetes.io/h2c"}]}},` +
		`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"api-1","labels":{"kubernetes.io/service-name":"api"}},"addressType":"IPv6",` +
		`"ports":[{"name":"grpc","port":9090}],"endpoints":[{"addresses":["fd00::7"],"hostname":"api-0","zone":"z1","conditions":{"ready":false,"serving":true,"terminating":true}}]}]}`))
	// Export times at the ends of what the wire and the registry's hash hold.
	for _, at := range []string{"1970-01-01T00:00:01Z", "9999-12-31T23:59:59Z"} {
		f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop, creationTimestamp: \"" + at + "\"}\nspec: {ports: [{name: http, port: 80}]}\n"))
	}
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: Bad_Name, labels: {nave.io/export: \"true\"}}\nspec: {ports: [{port: 0}]}\n"))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: [unclosed\n"))

	opts := BuildOptions{Cluster: "east", DefaultRegion: "dc1", ExportAll: true}
	lim := registry.DefaultLimits()
	f.Fuzz(func(t *testing.T, b []byte) {
		objs, err := decodeManifests(b)
		if err != nil {
			if len(objs.Services)+len(objs.EndpointSlices)+len(objs.Nodes) != 0 {
				t.Fatalf("a file that does not decode (%v) yielded objects", err)
			}
			return
		}
		for _, s := range objs.Services {
			if s.Namespace == "" {
				t.Fatalf("service %q without a namespace", s.Name)
			}
		}
		for _, es := range objs.EndpointSlices {
			if es.Namespace == "" {
				t.Fatalf("endpoint slice %q without a namespace", es.Name)
			}
		}
		shards, invalid, errs := BuildShards(objs, opts)
		for k, err := range invalid {
			var ve *registry.ValidationError
			if !errors.As(err, &ve) || ve.Service != k || shards[k] != nil {
				t.Fatalf("invalid %v: %v", k, err)
			}
		}
		for _, err := range errs {
			if ve := (*registry.ValidationError)(nil); !errors.As(err, &ve) {
				t.Fatalf("error %v is not a ValidationError", err)
			}
		}
		for k, s := range shards {
			if s.Service != k || s.Cluster != opts.Cluster {
				t.Fatalf("shard %v/%v filed under %v", s.Cluster, s.Service, k)
			}
			if err := s.Validate(lim); err != nil {
				t.Fatalf("built an invalid shard: %v", err)
			}
			if s.Ports == nil || s.Endpoints == nil {
				t.Fatalf("%v: nil ports or endpoints", k)
			}
			// What the hub decodes is what the spoke holds, hash and all.
			hub, err := federation.ShardFromProto(opts.Cluster, federation.ShardToProto(s), lim)
			if err != nil {
				t.Fatalf("the hub refuses shard %v: %v", k, err)
			}
			if !hub.Equal(s) {
				t.Fatalf("the hub decodes shard %v differently:\n  hub %+v\nspoke %+v", k, hub, s)
			}
			if hub.Hash() != s.Hash() {
				t.Fatalf("the hub's hash of shard %v differs from the spoke's", k)
			}
		}
		// The order of slices and nodes does not matter (when no two share a name).
		if !uniqueNames(objs) {
			return
		}
		reversed := Objects{Services: objs.Services, EndpointSlices: slices.Clone(objs.EndpointSlices), Nodes: slices.Clone(objs.Nodes)}
		slices.Reverse(reversed.EndpointSlices)
		slices.Reverse(reversed.Nodes)
		again, _, _ := BuildShards(reversed, opts)
		if len(again) != len(shards) {
			t.Fatalf("%d shards, %d from the reversed input", len(shards), len(again))
		}
		for k, s := range shards {
			if !again[k].Equal(s) {
				t.Fatalf("shard %v depends on input order:\n%+v\n%+v", k, s, again[k])
			}
		}
	})
}

// uniqueNames reports whether no two endpoint slices (in one namespace) and
// no two nodes share a name.
func uniqueNames(objs Objects) bool {
	seen := map[[2]string]bool{}
	for _, es := range objs.EndpointSlices {
		k := [2]string{es.Namespace, es.Name}
		if seen[k] {
			return false
		}
		seen[k] = true
	}
	nodes := map[string]bool{}
	for _, n := range objs.Nodes {
		if nodes[n.Name] {
			return false
		}
		nodes[n.Name] = true
	}
	return true
}
