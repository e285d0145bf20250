package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/internal/xdstest"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/spoke"
)

// TestTraceFromTheSource: a spoke reads the demo's east manifests from a
// directory; a real grpc-go client holds demo/echo. An endpoint turns
// not ready in the manifest, and `navectl trace demo/echo` shows that
// change through every stage: the file's change to the spoke seeing it
// (source), the spoke's own time (spoke), the link to the hub, the hub's
// stages and the client's ACK, summed end to end.
func TestTraceFromTheSource(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"echo.yaml", "nodes.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "demo", "east", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := startDemoHubWith(t, func(sc *spoke.Config) {
		if sc.Cluster == "east" { // east from a copy the test changes
			sc.Source, sc.PollInterval = "dir:"+dir, 50*time.Millisecond
		}
	})
	client := xdstest.NewClient(t, h.XDSAddr.String(), "client-1", registry.Locality{Region: "us-east", Zone: "us-east-1a"}, "echo.demo.svc.clusterset.local:8080")
	callCtx, callCancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, _ = client.Check(callCtx, &healthpb.HealthCheckRequest{}) // resolves the target
	callCancel()
	url := "http://" + h.AdminAddr.String()
	await(t, "client-1 holding echo's endpoints", 10*time.Second, func() bool {
		return strings.Contains(navectl(t, "--hub", url, "proxies"), "client-1")
	})

	// One endpoint turns not ready (twice, so that the link has an estimate: an acknowledged update).
	echo := filepath.Join(dir, "echo.yaml")
	raw, err := os.ReadFile(echo)
	if err != nil {
		t.Fatal(err)
	}
	for i, edit := range []string{
		strings.Replace(string(raw), "conditions: {ready: true, serving: true, terminating: false}", "conditions: {ready: false, serving: true, terminating: false}", 1),
		string(raw),
	} {
		if err := os.WriteFile(echo, []byte(edit), 0o644); err != nil {
			t.Fatal(err)
		}
		await(t, "the change acknowledged by client-1", 20*time.Second, func() bool {
			var traces []adminapi.Trace
			var out strings.Builder
			if err := run([]string{"--hub", url, "-o", "json", "trace", "demo/echo"}, &out); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(out.String()), &traces); err != nil {
				t.Fatal(err)
			}
			return len(traces) >= i+2 && traces[0].Acked == 1 && traces[0].Origin != nil
		})
	}
	var traces []adminapi.Trace
	var out strings.Builder
	if err := run([]string{"--hub", url, "-o", "json", "trace", "demo/echo", "--limit", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out.String()), &traces); err != nil || len(traces) != 1 {
		t.Fatalf("trace: %v %s", err, out.String())
	}
	tr := traces[0]
	o := tr.Origin
	if o.Source <= 0 || o.Spoke <= 0 || o.SpokeToHub <= 0 || tr.Type != "eds" || len(tr.Slowest) != 1 {
		t.Fatalf("the trace of the second change: %+v, origin %+v; want every stage measured", tr, o)
	}
	s := tr.Slowest[0]
	// End to end is the origin's stages and the hub's from the update's arrival: its apply, then hub to ACK.
	if want := o.Source + o.Spoke + o.SpokeToHub + s.HubToAck; s.NodeID != "client-1" || s.EndToEnd < want-0.01 || s.EndToEnd > want+2000 {
		t.Errorf("client-1: %+v; want end to end >= %.3f (origin + hub to ACK) and not far above", s, want)
	}
	table := navectl(t, "--hub", url, "trace", "demo/echo", "--limit", "1")
	t.Logf("navectl trace demo/echo:\n%s", table)
	for _, want := range []string{"SOURCE", "SPOKE", "LINK", "client-1", "eds"} {
		if !strings.Contains(table, want) {
			t.Errorf("trace table lacks %q:\n%s", want, table)
		}
	}
	_, metrics := getText(t, url+"/metrics")
	for _, stage := range []string{"source", "spoke", "spoke_to_hub", "hub_apply_to_push", "push_to_ack", "hub_to_ack", "end_to_end"} {
		if !strings.Contains(metrics, `nave_convergence_seconds_count{cluster="east",stage="`+stage+`"}`) {
			t.Errorf("no %s observation for east", stage)
		}
	}
}

func getText(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
