package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/agent"
)

func TestGatewayFlags(t *testing.T) {
	cfg, lf, err := parseGatewayFlags([]string{
		"--role=ingress", "--network=net-a", "--cluster-id=east", "--region=r1", "--zone=z1", "--subzone=s1", "--node-id=gw-0",
		"--hub=nave-hub:15011", "--hub-ca=/ca.crt", "--hub-server-name=hub.example",
		"--secret", "shop=/s/tls.crt,/s/tls.key", "--secret=api=/a/tls.crt,/a/tls.key,/a/ca.crt",
		"--expose-namespaces=shop", "--expose-selector=tier=public", "--listeners=8443/https:shop",
		"--work-dir=/run/gw", "--envoy=/usr/local/bin/envoy", "--envoy-admin-port=15001", "--status-port=15022",
		"--drain-duration=20s", "--parent-shutdown=90s", "--drain-time=60s", "--base-id=3", "--concurrency=2", "--log-level=debug",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := agent.Node{ID: "gw-0", Role: "ingress", Network: "net-a", ClusterID: "east", Region: "r1", Zone: "z1", SubZone: "s1",
		ExposeNamespaces: "shop", ExposeSelector: "tier=public", Listeners: "8443/https:shop"}
	if cfg.Node != want {
		t.Errorf("node %+v, want %+v", cfg.Node, want)
	}
	if cfg.Hub != (agent.Hub{Addr: "nave-hub:15011", CAFile: "/ca.crt", ServerName: "hub.example"}) {
		t.Errorf("hub %+v", cfg.Hub)
	}
	if len(cfg.Secrets) != 2 || cfg.Secrets[1] != (agent.SecretFiles{Name: "api", CertFile: "/a/tls.crt", KeyFile: "/a/tls.key", CAFile: "/a/ca.crt"}) {
		t.Errorf("secrets %+v", cfg.Secrets)
	}
	e := cfg.Envoy
	if cfg.StatusAddr != ":15022" || cfg.AdminPort != 15001 || cfg.WorkDir != "/run/gw" || e.Binary != "/usr/local/bin/envoy" ||
		e.DrainDuration != 20*time.Second || e.ParentShutdown != 90*time.Second || e.DrainTime != time.Minute || e.BaseID != 3 || e.Concurrency != 2 || lf.Level != "debug" {
		t.Errorf("config %+v", cfg)
	}
}

func TestGatewayFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--role is required"},
		{[]string{"--role=sidecar"}, `--role "sidecar"`},
		{[]string{"--role=east-west"}, "--network"},
		{[]string{"--role=ingress", "--secret=shop=/c"}, "NAME=CERT,KEY"},
		{[]string{"--role=ingress", "--secret=/c,/k"}, "NAME=CERT,KEY"},
		{[]string{"--role=ingress", "--status-port=15000"}, "both 15000"},
		{[]string{"--role=ingress", "extra"}, "unexpected arguments"},
	} {
		if _, _, err := parseGatewayFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseGatewayFlags(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}

func TestGatewayInstall(t *testing.T) {
	dir := t.TempDir()
	if err := installSelf([]string{dir}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "nave"))
	if err != nil || fi.Mode().Perm()&0o111 == 0 || fi.Size() == 0 {
		t.Fatalf("installed binary: %v %v", fi, err)
	}
	if err := installSelf(nil); err == nil {
		t.Error("install without a directory succeeded")
	}
}
