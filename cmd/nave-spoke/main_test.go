package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksOnlyWhatASpokeUses guards the candidate's footprint (every
// candidate pod pays for its binary's pages and package inits): client-go's
// typed clientset registers every built-in API group at start (about 8 MiB of
// RSS), its leader election imports that clientset, html/template makes the
// linker keep every exported method (see -tags grpcnotrace), and the hub's
// embedded etcd is the hub's. client-go's fake clients (client-go/testing,
// which client-go's gentype imports) bring server-side apply and OpenAPI
// models, about 0.9 MB of binary.
func TestLinksOnlyWhatASpokeUses(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "grpcnotrace", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, banned := range []string{
		"k8s.io/client-go/kubernetes/scheme",
		"k8s.io/client-go/tools/leaderelection",
		"k8s.io/client-go/informers",
		"html/template",
		"go.etcd.io/etcd/server/v3/embed",
		"k8s.io/client-go/testing",
	} {
		for _, d := range deps {
			if d == banned || strings.HasPrefix(d, banned+"/") {
				t.Errorf("nave-spoke links %s", d)
			}
		}
	}
}
