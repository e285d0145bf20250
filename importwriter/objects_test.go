package importwriter

import (
	"testing"

	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// A ServiceImport says which of its source clusters are stale.
func TestServiceImportNamesStaleClusters(t *testing.T) {
	imp := &imports.Import{Service: registry.ServiceKey{Namespace: "shop", Name: "web"}, Headless: true,
		Sources: []imports.Source{{Cluster: "east"}, {Cluster: "north", Stale: true}, {Cluster: "west", Stale: true}}}
	if got := desiredServiceImport(imp, nil).Annotations[StaleClustersAnnotation]; got != "north,west" {
		t.Errorf("stale clusters annotation = %q, want north,west", got)
	}
	imp.Sources[1].Stale, imp.Sources[2].Stale = false, false
	if _, ok := desiredServiceImport(imp, nil).Annotations[StaleClustersAnnotation]; ok {
		t.Error("an import without stale sources still names some")
	}
}
