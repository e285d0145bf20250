package xds

import (
	"testing"

	"github.com/navemesh/nave/registry"
)

// Every locality group's EDS cache has a version prefix of its own, even
// when names hold the separators.
func TestEDSPrefixesAreUnique(t *testing.T) {
	groups := []Client{
		{Locality: registry.Locality{Region: "r1", Zone: "z1"}},
		{Locality: registry.Locality{Region: "a/b", Zone: "c"}},
		{Locality: registry.Locality{Region: "a", Zone: "b/c"}},
		{Network: "eu", NetworkOnly: true},
		{Network: "euonly"},
		{Network: "eu|only"},
		{Network: "eu"},
		{Network: "eu", Locality: registry.Locality{Region: "r1", Zone: "z1"}},
	}
	seen := map[string]Client{}
	for _, g := range groups {
		p := edsPrefix(g)
		if other, ok := seen[p]; ok {
			t.Errorf("%+v and %+v share the prefix %q", g, other, p)
		}
		seen[p] = g
	}
	if got := edsPrefix(groups[0]); got != "eds-r1/z1-" {
		t.Errorf("a plain group's prefix is %q, want eds-r1/z1-", got)
	}
}
