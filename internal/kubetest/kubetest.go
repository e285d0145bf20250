// Package kubetest runs real Kubernetes API servers for Nave's tests: one
// kube-apiserver process per cluster over a shared in-process etcd, with
// admin and spoke credentials, server-side apply of manifests, and test hosts
// in network namespaces whose addresses EndpointSlices may name.
package kubetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// RequireEnv is the environment variable that turns a missing prerequisite
// (API server binary, root, iproute2) from a skip into a failure; `make test` sets it to 1.
const RequireEnv = "NAVE_E2E_REQUIRE"

// BinaryEnv names the kube-apiserver binary to run; `make` exports it.
const BinaryEnv = "NAVE_KUBE_APISERVER"

// unavailable stops a test whose prerequisite is missing: it fails under
// NAVE_E2E_REQUIRE=1 (CI must not silently skip end-to-end tests) and skips otherwise.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s (%s=1)", msg, RequireEnv)
	}
	t.Skip(msg)
}

// APIServerBinary returns the path of the kube-apiserver binary: $NAVE_KUBE_APISERVER,
// else where `make kube-apiserver` caches it. A missing binary skips the test, or
// fails it under NAVE_E2E_REQUIRE=1.
func APIServerBinary(t testing.TB) string { return apiServerTool.binary(t) }

// tool is a server the tests run, built from a Go module of its own
// (tools/NAME) and cached by the Makefile as $(NAVE_CACHE)/NAME-VERSION.
type tool struct {
	name, module, env, buildTime string
}

var (
	apiServerTool = tool{name: "kube-apiserver", module: "k8s.io/kubernetes", env: BinaryEnv, buildTime: "about 10 minutes"}
	coreDNSTool   = tool{name: "coredns", module: "github.com/coredns/coredns", env: CoreDNSEnv, buildTime: "about 4 minutes"}
	certManager   = tool{name: "cert-manager", module: "github.com/cert-manager/cert-manager", env: CertManagerCRDsEnv, buildTime: "a download"}
)

// CertManagerCRDsEnv names the directory holding cert-manager's CRDs; `make` exports it.
const CertManagerCRDsEnv = "NAVE_CERT_MANAGER_CRDS"

// CertManagerCRDs returns cert-manager's CRD files: from $NAVE_CERT_MANAGER_CRDS,
// else where `make cert-manager-crds` caches them. Missing ones skip the
// test, or fail it under NAVE_E2E_REQUIRE=1.
func CertManagerCRDs(t testing.TB) []string {
	t.Helper()
	dir := os.Getenv(CertManagerCRDsEnv)
	if dir == "" {
		var err error
		if dir, err = certManager.cachedPath(); err != nil {
			unavailable(t, "cert-manager CRDs: %v; run `make cert-manager-crds`", err)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		unavailable(t, "cert-manager CRDs are missing from %s: run `make cert-manager-crds` or set %s", dir, CertManagerCRDsEnv)
	}
	return files
}

// binary returns the tool's path: $env, else the Makefile's cache. A
// missing binary skips the test, or fails it under NAVE_E2E_REQUIRE=1.
func (tl tool) binary(t testing.TB) string {
	t.Helper()
	path := os.Getenv(tl.env)
	if path == "" {
		var err error
		if path, err = tl.cachedPath(); err != nil {
			unavailable(t, "%s: %v; run `make %s` or set %s", tl.name, err, tl.name, tl.env)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		unavailable(t, "%s binary %s is missing: run `make %s` (%s, once per machine) or set %s", tl.name, path, tl.name, tl.buildTime, tl.env)
	}
	return path
}

// cachedPath is the Makefile's $(NAVE_CACHE)/NAME-VERSION, the version being
// what tools/NAME/go.mod requires of the module.
func (tl tool) cachedPath() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	version, err := requiredVersion(filepath.Join(root, "tools", tl.name, "go.mod"), tl.module)
	if err != nil {
		return "", err
	}
	cache := os.Getenv("NAVE_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("find the cache directory: %w", err)
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "nave")
	}
	return filepath.Join(cache, tl.name+"-"+version), nil
}

// requiredVersion reads the version of module that a go.mod requires, as the Makefile's awk does.
func requiredVersion(gomod, module string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		fields := strings.Fields(line)
		if len(fields) >= 2 && (fields[0] == module || fields[1] == module) {
			return fields[len(fields)-1], nil
		}
	}
	return "", fmt.Errorf("%s does not require %s", gomod, module)
}

// repoRoot walks up from the working directory (a test's package directory)
// to the directory holding tools/kube-apiserver.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "tools", "kube-apiserver", "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no tools/kube-apiserver/go.mod above the working directory")
		}
		dir = parent
	}
}
