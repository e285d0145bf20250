package registry

import (
	"slices"
	"testing"
	"time"
)

func TestDiff(t *testing.T) {
	base := func() *Shard { return webShard("east", "10.0.0.1", "10.0.0.2") }
	with := func(s *Shard, change func(s *Shard)) *Shard {
		s = cloneShard(s)
		change(s)
		s.Normalize()
		return s
	}
	type step struct {
		name      string
		change    Change
		kind      ChangeKind
		shape     bool // ShapeChanged
		endpoints bool // EndpointsChanged
	}
	steps := []step{
		{name: "added", change: upsert("east", base()), kind: Added, shape: true, endpoints: true},
		{name: "endpoint added", change: upsert("east", with(base(), func(s *Shard) {
			s.Endpoints = append(s.Endpoints, endpoint("10.0.0.3", eport("http", 8080)))
		})), kind: Updated, endpoints: true},
		{name: "endpoint draining", change: upsert("east", with(base(), func(s *Shard) {
			s.Endpoints[0].Conditions = draining()
		})), kind: Updated, endpoints: true},
		{name: "endpoint target port", change: upsert("east", with(base(), func(s *Shard) {
			s.Endpoints[0].Ports[0].Port = 8081
		})), kind: Updated, endpoints: true},
		{name: "endpoint locality", change: upsert("east", with(base(), func(s *Shard) {
			s.Endpoints[0].Locality = Locality{Region: "us", Zone: "us-1a"}
		})), kind: Updated, endpoints: true},
		{name: "same ports, endpoints from a second cluster", change: upsert("west", webShard("west", "10.1.0.1")),
			kind: Updated, endpoints: true},
		{name: "second cluster's endpoints change", change: upsert("west", webShard("west", "10.1.0.1", "10.1.0.2")),
			kind: Updated, endpoints: true},
		{name: "port added", change: upsert("east", with(base(), func(s *Shard) {
			s.Ports = append(s.Ports, tcp("grpc", 9090))
		})), kind: Updated, shape: true, endpoints: true},
		{name: "appProtocol changed", change: upsert("east", with(base(), func(s *Shard) {
			s.Ports = []ServicePort{tcp("grpc", 9090), {Name: "http", Port: 80, Protocol: ProtocolTCP, AppProtocol: "http"}}
		})), kind: Updated, shape: true, endpoints: true},
		{name: "port removed", change: upsert("east", base()), kind: Updated, shape: true, endpoints: true},
		{name: "headless", change: upsert("east", with(base(), func(s *Shard) { s.Headless = true })),
			kind: Updated, shape: true, endpoints: true}, // west now conflicts on type
		{name: "conflict gone", change: upsert("east", base()), kind: Updated, shape: true, endpoints: true},
		{name: "one cluster leaves", change: Change{Cluster: "west", Removes: []ServiceKey{keyWeb}},
			kind: Updated, endpoints: true},
		{name: "removed", change: Change{Cluster: "east", Removes: []ServiceKey{keyWeb}}, kind: Removed, shape: true, endpoints: true},
	}
	r := New()
	for _, st := range steps {
		prev := r.Service(keyWeb)
		next, d := mustApply(t, r, st.change)
		if len(d.Services) != 1 {
			t.Fatalf("%s: diff %+v, want one service", st.name, d)
		}
		sd := d.Services[0]
		if sd.Key != keyWeb || sd.Kind != st.kind || sd.ShapeChanged != st.shape || sd.EndpointsChanged != st.endpoints {
			t.Errorf("%s: diff %+v, want kind %v, ShapeChanged %t, EndpointsChanged %t", st.name, sd, st.kind, st.shape, st.endpoints)
		}
		if shapeChanged(d) != st.shape {
			t.Errorf("%s: shapeChanged(Diff) = %t", st.name, shapeChanged(d))
		}
		if now := next.Service(keyWeb); now != nil {
			if now.Revision != next.Version() {
				t.Errorf("%s: Revision %d, want %d", st.name, now.Revision, next.Version())
			}
			switch {
			case st.kind == Added || st.shape:
				if now.ShapeRevision != next.Version() {
					t.Errorf("%s: ShapeRevision %d, want %d", st.name, now.ShapeRevision, next.Version())
				}
			default:
				if now.ShapeRevision != prev.ShapeRevision {
					t.Errorf("%s: ShapeRevision %d, want it unchanged at %d", st.name, now.ShapeRevision, prev.ShapeRevision)
				}
			}
		}
		r = next
	}
}

// A losing cluster that renames its port keeps the merged port (the winner's), but its endpoints now
// serve that port on another target port: endpoint assignments must be pushed.
func TestDiffLoserRenamesPort(t *testing.T) {
	east := shard("east", keyWeb, []ServicePort{tcp("http", 80)}, endpoint("10.0.0.1", eport("http", 8080)))
	west := &Shard{Cluster: "west", Service: keyWeb, ExportedAt: t0.Add(time.Hour), Ports: []ServicePort{tcp("web", 80)},
		Endpoints: []Endpoint{endpoint("10.1.0.1", eport("web", 9000), eport("www", 9001))}}
	west.Normalize()
	renamed := cloneShard(west)
	renamed.Ports[0].Name = "www"

	r, _ := mustApply(t, New(), upsert("east", east))
	r, _ = mustApply(t, r, upsert("west", west))
	before := r.Service(keyWeb)
	r2, d := mustApply(t, r, upsert("west", renamed))
	after := r2.Service(keyWeb)

	if !slices.Equal(before.Ports, after.Ports) {
		t.Fatalf("merged ports changed: %v -> %v", before.Ports, after.Ports)
	}
	p := after.Ports[0]
	if slices.Equal(before.Endpoints(p), after.Endpoints(p)) {
		t.Fatalf("fixture: endpoints of %v did not change", p)
	}
	if got := after.Endpoints(p); len(got) != 2 || got[1].Cluster != "west" || got[1].Port != 9001 {
		t.Errorf("Endpoints(%v) = %+v, want west's endpoint on 9001", p, got)
	}
	if len(d.Services) != 1 || d.Services[0].Kind != Updated || !d.Services[0].EndpointsChanged {
		t.Errorf("diff %+v, want an update with EndpointsChanged", d)
	}
}

func TestDiffHelpers(t *testing.T) {
	if !(Diff{}).Empty() || shapeChanged(Diff{}) {
		t.Error("zero Diff is not empty / reports a shape change")
	}
	d := Diff{Services: []ServiceDiff{{Key: keyWeb, Kind: Updated, EndpointsChanged: true}}}
	if d.Empty() || shapeChanged(d) {
		t.Errorf("endpoint-only diff: Empty %t, ShapeChanged %t", d.Empty(), shapeChanged(d))
	}
	d.Services = append(d.Services, ServiceDiff{Key: keyAPI, Kind: Added, ShapeChanged: true})
	if !shapeChanged(d) {
		t.Error("diff with an added service reports no shape change")
	}
	for k, want := range map[ChangeKind]string{Added: "added", Updated: "updated", Removed: "removed"} {
		if k.String() != want {
			t.Errorf("%d.String() = %q, want %q", k, k.String(), want)
		}
	}
}

// shapeChanged reports whether any service was added, removed or changed shape.
func shapeChanged(d Diff) bool {
	return slices.ContainsFunc(d.Services, func(s ServiceDiff) bool { return s.ShapeChanged })
}
