package federation

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/traffic"
)

// FuzzTrafficFromProto: a shard's routes and policy off the wire. Decoding,
// normalizing and validating never panic; a set that validates holds at
// most MaxSetBytes and survives the wire round trip unchanged.
func FuzzTrafficFromProto(f *testing.F) {
	f.Add(mustMarshal(f, trafficToProto(validTraffic())))
	f.Add(mustMarshal(f, trafficToProto(everyTrafficField())))
	f.Add(mustMarshal(f, trafficToProto(&traffic.Set{Policy: validTraffic().Policy})))
	f.Add(mustMarshal(f, trafficToProto(&traffic.Set{Routes: []traffic.Route{{Kind: traffic.HTTPRoute, Name: "r", Rules: []traffic.Rule{{}}}}})))
	// Unnormalized: routes out of order and header names in upper case.
	messy := trafficToProto(validTraffic())
	messy.Routes[0], messy.Routes[1] = messy.Routes[1], messy.Routes[0]
	messy.Routes[1].Rules[0].Matches[0].Headers[0].Name = "X-Tenant"
	messy.Policy.LoadBalancer.HashHeader = "X-Session"
	f.Add(mustMarshal(f, messy))
	// Invalid: a regular expression that does not compile, and a duplicate header.
	bad := trafficToProto(validTraffic())
	bad.Routes[1].Rules[0].Matches[2].Path.Value = "^/items/[0-9+$"
	bad.Routes[0].Rules[0].Matches[0].Headers[1].Name = "X-TENANT"
	f.Add(mustMarshal(f, bad))
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, b []byte) {
		var p fedv1.Traffic
		if err := proto.Unmarshal(b, &p); err != nil {
			return
		}
		s, problem := trafficFromProto(&p)
		if problem != "" {
			if !s.IsZero() {
				t.Fatalf("refused (%s), yet decoded %d routes", problem, len(s.Routes))
			}
			if proto.Size(&p) <= maxTrafficWireBytes {
				t.Fatalf("refused %d bytes: %s", proto.Size(&p), problem)
			}
			return
		}
		s.Normalize()
		again, _ := trafficFromProto(&p)
		again.Normalize()
		again.Normalize()
		if !again.Equal(&s) {
			t.Fatalf("normalizing twice differs from once:\n%+v\n%+v", again, s)
		}
		if err := s.Validate(); err != nil {
			if !errors.Is(err, traffic.ErrInvalid) {
				t.Fatalf("error %v does not wrap traffic.ErrInvalid", err)
			}
			return
		}
		if n := s.HeldBytes(); n > traffic.MaxSetBytes {
			t.Fatalf("a valid set holds %d bytes", n)
		}
		enc := trafficToProto(&s)
		if (enc == nil) != s.IsZero() {
			t.Fatalf("trafficToProto() = %v for a set with IsZero %t", enc, s.IsZero())
		}
		var back traffic.Set
		if enc != nil {
			var wire fedv1.Traffic
			if err := proto.Unmarshal(mustMarshal(t, enc), &wire); err != nil {
				t.Fatal(err)
			}
			if back, problem = trafficFromProto(&wire); problem != "" {
				t.Fatalf("a valid set is refused after encoding: %s", problem)
			}
		}
		back.Normalize()
		if !back.Equal(&s) {
			t.Fatalf("round trip changed a valid set:\n got %+v\nwant %+v", back, s)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("a valid set does not validate after the round trip: %v", err)
		}
	})
}
