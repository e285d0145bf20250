package e2e

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/navemesh/nave/internal/kubetest"
)

// deployDir holds the manifests users apply.
const deployDir = "../deploy"

// TestManifestsDryRun has a real API server validate every manifest under
// deploy/: the CRDs and the nave-system namespace are applied for real, then
// every object is server-side applied with DryRun=All, which runs the same
// validation and admission as a real apply. The demo's dir: source files and
// kind's cluster configs are not Kubernetes objects for an API server.
func TestManifestsDryRun(t *testing.T) {
	files := manifestFiles(t, deployDir)
	var objs []kubetest.Object
	for _, o := range kubetest.ReadManifests(t, files...) {
		if !strings.HasPrefix(o.GetAPIVersion(), "kind.x-k8s.io") {
			objs = append(objs, o)
		}
	}
	if len(objs) == 0 {
		t.Fatalf("no Kubernetes manifests under %s", deployDir)
	}

	c := kubetest.StartClusters(t, "manifests")[0]
	crds, err := filepath.Glob(filepath.Join(deployDir, "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// deploy/security holds cert-manager Certificates and Issuers: its real CRDs first.
	crds = append(crds, kubetest.CertManagerCRDs(t)...)
	c.Apply(t, append(crds, filepath.Join(deployDir, "base", "namespace.yaml"))...)

	if err := c.DryRun(t.Context(), objs...); err != nil {
		t.Fatalf("the API server rejects manifests:\n%v", err)
	}
	t.Logf("the API server accepts all %d objects of %d files", len(objs), len(files))
}

// manifestFiles lists the YAML files under dir, except the demo's and the Helm chart's (tested on its own: e2e/helm_test.go).
func manifestFiles(t testing.TB, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (path == filepath.Join(dir, "demo") || path == filepath.Join(dir, "helm")):
			return filepath.SkipDir
		case !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")):
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
