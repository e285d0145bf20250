package registry

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPropertiesValidate(t *testing.T) {
	tests := []struct {
		name  string
		props Properties
		want  string // a substring of the reason; empty: valid
	}{
		{name: "defaults", props: Properties{}},
		{name: "everything set", props: Properties{
			SessionAffinity: SessionAffinityClientIP, SessionAffinityTimeout: 600, InternalTrafficPolicy: InternalTrafficPolicyLocal,
			TrafficDistribution: "PreferClose", IPFamilies: []IPFamily{IPv6, IPv4},
			Labels: map[string]string{"app.example.com/tier": "web", "team": ""}, Annotations: map[string]string{"note": "any text, even with spaces"},
		}},
		{name: "unknown affinity", props: Properties{SessionAffinity: "Cookie"}, want: `unknown sessionAffinity "Cookie"`},
		{name: "explicit None is not the canonical form", props: Properties{SessionAffinity: "None"}, want: "unknown sessionAffinity"},
		{name: "timeout without ClientIP", props: Properties{SessionAffinityTimeout: 10}, want: "timeout without ClientIP"},
		{name: "timeout too long", props: Properties{SessionAffinity: SessionAffinityClientIP, SessionAffinityTimeout: 86401}, want: "out of range"},
		{name: "unknown policy", props: Properties{InternalTrafficPolicy: "Node"}, want: "unknown internalTrafficPolicy"},
		{name: "bad distribution", props: Properties{TrafficDistribution: "prefer close"}, want: "trafficDistribution"},
		{name: "three families", props: Properties{IPFamilies: []IPFamily{IPv4, IPv6, IPv4}}, want: "at most 2"},
		{name: "family twice", props: Properties{IPFamilies: []IPFamily{IPv4, IPv4}}, want: "IPv4 twice"},
		{name: "unknown family", props: Properties{IPFamilies: []IPFamily{"IPv5"}}, want: "unknown IP family"},
		{name: "bad label key", props: Properties{Labels: map[string]string{"-bad": "x"}}, want: "label key"},
		{name: "bad label prefix", props: Properties{Labels: map[string]string{"Example.com/x": "x"}}, want: "label key"},
		{name: "bad label value", props: Properties{Labels: map[string]string{"x": "a b"}}, want: "invalid value"},
		{name: "bad annotation key", props: Properties{Annotations: map[string]string{"a/b/c": "x"}}, want: "annotation key"},
		{name: "too much metadata", props: Properties{Annotations: map[string]string{"big": strings.Repeat("x", 70<<10)}}, want: "more than the limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validShard()
			s.Properties = tt.props
			err := s.Validate(DefaultLimits())
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// A shard without properties hashes as before they existed, so digests
// held by spokes, peers and snapshots of earlier versions stay valid.
func TestPropertiesLeaveOldDigestsAlone(t *testing.T) {
	s := validShard()
	s.Normalize()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"sessionAffinity", "internalTrafficPolicy", "trafficDistribution", "ipFamilies", "labels", "annotations"} {
		if strings.Contains(string(b), field) {
			t.Errorf("a shard without properties encodes %q: %s", field, b)
		}
	}
	with := cloneShard(s)
	with.Labels = map[string]string{"a": "b"}
	if with.Hash() == s.Hash() || with.Equal(s) || with.SamePorts(s) {
		t.Error("a label change is invisible to Hash, Equal or SamePorts")
	}
}

func TestMergeProperties(t *testing.T) {
	const hour = time.Hour
	with := func(cluster ClusterID, age time.Duration, p Properties) *Shard {
		s := exported(cluster, age, false, tcp("http", 80))
		s.Properties = p
		return s
	}
	affinity := Properties{SessionAffinity: SessionAffinityClientIP, SessionAffinityTimeout: 60}
	tests := []struct {
		name      string
		shards    []*Shard
		want      Properties
		conflicts []Conflict // Kind, Winner and Loser compared
	}{
		{
			name:   "agreeing clusters",
			shards: []*Shard{with("east", 0, affinity), with("west", hour, affinity)},
			want:   affinity,
		},
		{
			name:   "oldest affinity wins",
			shards: []*Shard{with("east", hour, Properties{}), with("west", 0, affinity)},
			want:   affinity,
			conflicts: []Conflict{
				{Kind: SessionAffinityConflict, Winner: "west", Loser: "east"},
				{Kind: SessionAffinityConfigConflict, Winner: "west", Loser: "east"},
			},
		},
		{
			name: "only the timeout differs",
			shards: []*Shard{with("east", 0, affinity),
				with("west", hour, Properties{SessionAffinity: SessionAffinityClientIP, SessionAffinityTimeout: 30})},
			want:      affinity,
			conflicts: []Conflict{{Kind: SessionAffinityConfigConflict, Winner: "east", Loser: "west"}},
		},
		{
			name: "policy, distribution, labels and annotations",
			shards: []*Shard{
				with("east", 0, Properties{InternalTrafficPolicy: InternalTrafficPolicyLocal, TrafficDistribution: "PreferClose",
					Labels: map[string]string{"tier": "web"}, Annotations: map[string]string{"a": "1"}}),
				with("west", hour, Properties{Labels: map[string]string{"tier": "api"}}),
			},
			want: Properties{InternalTrafficPolicy: InternalTrafficPolicyLocal, TrafficDistribution: "PreferClose",
				Labels: map[string]string{"tier": "web"}, Annotations: map[string]string{"a": "1"}},
			conflicts: []Conflict{
				{Kind: InternalTrafficPolicyConflict, Winner: "east", Loser: "west"},
				{Kind: TrafficDistributionConflict, Winner: "east", Loser: "west"},
				{Kind: LabelsConflict, Winner: "east", Loser: "west"},
				{Kind: AnnotationsConflict, Winner: "east", Loser: "west"},
			},
		},
		{
			name: "IP families: a shard that states none conflicts with none",
			shards: []*Shard{
				with("east", 0, Properties{}),
				with("west", hour, Properties{IPFamilies: []IPFamily{IPv6}}),
				with("north", 2*hour, Properties{IPFamilies: []IPFamily{IPv4}}),
			},
			want:      Properties{IPFamilies: []IPFamily{IPv6}},
			conflicts: []Conflict{{Kind: IPFamilyConflict, Winner: "west", Loser: "north"}},
		},
		{
			name:   "same age: the lower cluster ID wins",
			shards: []*Shard{with("west", 0, Properties{TrafficDistribution: "PreferClose"}), with("east", 0, Properties{})},
			want:   Properties{},
			conflicts: []Conflict{
				{Kind: TrafficDistributionConflict, Winner: "east", Loser: "west"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := mergeByApply(t, tt.shards)
			if !svc.Properties.Equal(&tt.want) {
				t.Errorf("properties = %+v, want %+v", svc.Properties, tt.want)
			}
			var got []Conflict
			for _, c := range svc.Conflicts {
				if !strings.Contains(c.Reason, " in "+string(c.Winner)+" but ") || !strings.HasSuffix(c.Reason, " in "+string(c.Loser)) {
					t.Errorf("conflict reason %q does not name both values", c.Reason)
				}
				got = append(got, Conflict{Kind: c.Kind, Winner: c.Winner, Loser: c.Loser})
			}
			if !slices.Equal(got, tt.conflicts) {
				t.Errorf("conflicts = %+v, want %+v", got, tt.conflicts)
			}
		})
	}
}

// A change of properties alone is a change of the service's shape.
func TestPropertiesChangeTheShape(t *testing.T) {
	r := New()
	s := exported("east", 0, false, tcp("http", 80))
	r, _ = mustApply(t, r, upsert("east", s))
	before := r.Service(keyWeb)
	changed := cloneShard(s)
	changed.InternalTrafficPolicy = InternalTrafficPolicyLocal
	r, _ = mustApply(t, r, upsert("east", changed))
	after := r.Service(keyWeb)
	if after.ShapeRevision == before.ShapeRevision || after.InternalTrafficPolicy != InternalTrafficPolicyLocal {
		t.Errorf("shape revision %d -> %d, policy %q: a property change is not a shape change",
			before.ShapeRevision, after.ShapeRevision, after.InternalTrafficPolicy)
	}
}

func TestShapeConflictKinds(t *testing.T) {
	svc := mergeByApply(t, []*Shard{
		exported("east", 0, false, tcp("http", 80)),
		exported("west", time.Hour, true, tcp("web", 80)),
	})
	var kinds []ConflictKind
	for _, c := range svc.Conflicts {
		kinds = append(kinds, c.Kind)
	}
	if want := []ConflictKind{TypeConflict, PortConflict}; !slices.Equal(kinds, want) {
		t.Errorf("conflict kinds = %v, want %v", kinds, want)
	}
}
