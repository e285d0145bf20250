// Package kubetest runs real Kubernetes API servers for Nave's tests: one
// kube-apiserver process per cluster over a shared in-process etcd, with
// admin and spoke credentials, server-side apply of manifests, and test hosts
// in network namespaces whose addresses EndpointSlices may name.
package kubetest

import (
	"bufio"
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
func APIServerBinary(t testing.TB) string {
	t.Helper()
	path := os.Getenv(BinaryEnv)
	if path == "" {
		var err error
		if path, err = cachedBinaryPath(); err != nil {
			unavailable(t, "kube-apiserver: %v; run `make kube-apiserver` or set %s", err, BinaryEnv)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		unavailable(t, "kube-apiserver binary %s is missing: run `make kube-apiserver` (about 10 minutes, once per machine) or set %s", path, BinaryEnv)
	}
	return path
}

// cachedBinaryPath is the Makefile's $(NAVE_CACHE)/kube-apiserver-$(KUBE_VERSION).
func cachedBinaryPath() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	version, err := kubernetesVersion(filepath.Join(root, "tools", "kube-apiserver", "go.mod"))
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
	return filepath.Join(cache, "kube-apiserver-"+version), nil
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

// kubernetesVersion reads the k8s.io/kubernetes version a go.mod requires,
// as the Makefile's awk does.
func kubernetesVersion(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 2 && (fields[0] == "k8s.io/kubernetes" || fields[1] == "k8s.io/kubernetes") {
			return fields[len(fields)-1], nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s does not require k8s.io/kubernetes", gomod)
}
