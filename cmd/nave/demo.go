package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver of the demo client
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/navemesh/nave/adminapi"
)

// backendHeader names the response header in which a demo backend says who it is.
const backendHeader = "x-nave-backend"

// demoBackend is one gRPC backend the sample EndpointSlices name.
type demoBackend struct{ cluster, zone, addr string }

var demoBackends = []demoBackend{
	{"east", "us-east-1a", "127.0.1.1:50051"},
	{"east", "us-east-1b", "127.0.1.2:50051"},
	{"north", "us-east-1c", "127.0.3.1:50051"},
	{"west", "us-west-1a", "127.0.2.1:50051"},
}

// demoClusters are the sample clusters and the --region their spokes get.
var demoClusters = []struct{ id, region string }{{"east", "us-east"}, {"north", "us-east"}, {"west", "us-west"}}

const demoTarget = "xds:///echo.demo.svc.clusterset.local:8080"

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nave demo", flag.ContinueOnError)
	manifests := fs.String("manifests", "deploy/demo", "directory of sample manifests, one subdirectory per cluster")
	workDir := fs.String("work-dir", "", "where the demo keeps its files and logs (default: a new temporary directory)")
	once := fs.Bool("once", false, "stop after the failover script instead of running until Ctrl-C")
	step := fs.Duration("step", 4*time.Second, "how long each step of the script lasts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *workDir == "" {
		if *workDir, err = os.MkdirTemp("", "nave-demo-"); err != nil {
			return err
		}
	}
	d := &demo{self: self, work: *workDir}
	defer d.stop()
	say("Nave demo. Files and logs: %s", d.work)

	// 1. Copy the sample manifests: the demo edits its copies, never the originals.
	for _, c := range demoClusters {
		if err := copyDir(filepath.Join(*manifests, c.id), filepath.Join(d.work, "clusters", c.id)); err != nil {
			return fmt.Errorf("copy sample manifests (run from the repository root, or pass --manifests): %w", err)
		}
	}
	// 2. One token per cluster: each spoke may only publish for its own cluster.
	tokens := map[string]string{}
	for _, c := range demoClusters {
		tokens[c.id] = randomToken()
		if err := os.WriteFile(filepath.Join(d.work, c.id+".token"), []byte(tokens[c.id]+"\n"), 0o600); err != nil {
			return err
		}
	}
	tb, _ := yaml.Marshal(tokens)
	if err := os.WriteFile(filepath.Join(d.work, "tokens.yaml"), tb, 0o600); err != nil {
		return err
	}
	// 3. The backends the EndpointSlices name.
	for _, b := range demoBackends {
		if err := d.serveBackend(b); err != nil {
			return fmt.Errorf("start backend %s (is another demo running?): %w", b.addr, err)
		}
	}
	say("Started %d gRPC backends: %s", len(demoBackends), describeBackends())

	// 4. The hub, with its embedded etcd, and one spoke per cluster: separate processes, as you would run them.
	fedAddr, xdsAddr, adminAddr := freePort(), freePort(), freePort()
	if err := d.start(ctx, "hub", "hub", "--id", "demo-hub", "--data-dir", filepath.Join(d.work, "hub"),
		"--federation-addr", fedAddr, "--xds-addr", xdsAddr, "--admin-addr", adminAddr,
		"--tokens", filepath.Join(d.work, "tokens.yaml")); err != nil {
		return err
	}
	admin := "http://" + adminAddr
	if err := waitFor(ctx, 60*time.Second, func() bool { return httpOK(admin + "/readyz") }); err != nil {
		return fmt.Errorf("hub did not become ready (see %s): %w", d.logPath("hub"), err)
	}
	say("Hub ready: federation %s, xDS %s, admin %s", fedAddr, xdsAddr, admin)
	for _, c := range demoClusters {
		if err := d.start(ctx, "spoke-"+c.id, "spoke", "--cluster-id", c.id, "--network", "demo-net",
			"--hub", fedAddr, "--token-file", filepath.Join(d.work, c.id+".token"), "--region", c.region,
			"--source", "dir:"+filepath.Join(d.work, "clusters", c.id), "--poll", "100ms", "--spoke-id", "demo-"+c.id); err != nil {
			return err
		}
	}
	if err := waitFor(ctx, 30*time.Second, func() bool { return echoClusters(admin) == 3 }); err != nil {
		return fmt.Errorf("the three clusters did not publish echo (see the spoke logs in %s): %w", d.work, err)
	}
	say("Spokes east, north and west publish demo/echo; the hub merged them. Try: bin/navectl --hub %s endpoints demo/echo --region us-east --zone us-east-1a", admin)

	// 5. A proxyless gRPC client in us-east-1a, configured only by its xDS bootstrap.
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":%q,"channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],`+
		`"node":{"id":"demo-client","locality":{"region":"us-east","zone":"us-east-1a"}}}`, xdsAddr)
	client := exec.CommandContext(ctx, d.self, "demo-client", "--target", demoTarget)
	client.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP_CONFIG="+bootstrap)
	client.Stdout = os.Stdout
	client.Stderr = d.logFile("client")
	if err := d.startCmd("client", client); err != nil {
		return err
	}
	say("Client in us-east/us-east-1a dials %s; each line is one second of its RPCs.", demoTarget)

	// 6. The script: take zones away and give them back, by editing the manifests as a controller would.
	eastSlice := filepath.Join(d.work, "clusters", "east", "echo.yaml")
	northSlice := filepath.Join(d.work, "clusters", "north", "echo.yaml")
	steps := []struct {
		say  string
		edit func() error
	}{
		{"Client's own zone us-east-1a is healthy: all traffic stays in the zone.", nil},
		{"Marking east's us-east-1a endpoint not ready: traffic fails over within region us-east (east/us-east-1b, north/us-east-1c).",
			func() error { return setReady(eastSlice, "us-east-1a", false) }},
		{"Marking every us-east endpoint not ready: traffic fails over to region us-west.",
			func() error {
				return errors.Join(setReady(eastSlice, "us-east-1b", false), setReady(northSlice, "us-east-1c", false))
			}},
		{"Marking us-east ready again: traffic comes back to zone us-east-1a.",
			func() error {
				return errors.Join(setReady(eastSlice, "", true), setReady(northSlice, "", true))
			}},
	}
	for _, s := range steps {
		say("%s", s.say)
		if s.edit != nil {
			if err := s.edit(); err != nil {
				return err
			}
		}
		if !sleepCtx(ctx, *step) {
			return nil
		}
	}
	if *once {
		say("Script done.")
		return nil
	}
	say("Script done. Nave keeps running: edit the manifests under %s and watch the client. Ctrl-C stops everything.", filepath.Join(d.work, "clusters"))
	<-ctx.Done()
	return nil
}

// demo holds the processes and servers it started, to stop them in reverse order.
type demo struct {
	self, work string
	mu         sync.Mutex
	stops      []func()
}

func (d *demo) onStop(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stops = append(d.stops, f)
}

func (d *demo) stop() {
	d.mu.Lock()
	stops := d.stops
	d.stops = nil
	d.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
	say("Stopped everything.")
}

func (d *demo) logPath(name string) string { return filepath.Join(d.work, name+".log") }

func (d *demo) logFile(name string) io.Writer {
	f, err := os.Create(d.logPath(name))
	if err != nil {
		return io.Discard
	}
	d.onStop(func() { f.Close() })
	return f
}

// start runs `nave args...` in the background, logging to name.log.
func (d *demo) start(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, d.self, args...)
	cmd.Stdout = d.logFile(name)
	cmd.Stderr = cmd.Stdout
	return d.startCmd(name, cmd)
}

func (d *demo) startCmd(name string, cmd *exec.Cmd) error {
	// Stop politely (SIGTERM), then firmly.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	d.onStop(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return nil
}

func (d *demo) serveBackend(b demoBackend) error {
	lis, err := net.Listen("tcp", b.addr)
	if err != nil {
		return err
	}
	srv := newBackend(b.cluster + "/" + b.zone)
	go func() { _ = srv.Serve(lis) }()
	d.onStop(srv.Stop)
	return nil
}

// newBackend is a gRPC server answering health checks and naming itself
// (name) in a response header: what the demo and the kind lab call.
func newBackend(name string) *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs(backendHeader, name))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv
}

// runDemoBackend serves one demo backend until ctx ends (the kind lab's pods run it).
func runDemoBackend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nave demo-backend", flag.ContinueOnError)
	addr := fs.String("addr", ":50051", "listen address (gRPC)")
	name := fs.String("name", "", "the name the backend answers with (default: the host name)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" {
		*name, _ = os.Hostname()
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := newBackend(*name)
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	return srv.Serve(lis)
}

// setReady sets the ready (and serving) condition of the endpoints in zone
// (every zone when empty) of the EndpointSlices in a manifest file.
func setReady(path, zone string, ready bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	docs := strings.Split(string(b), "\n---\n")
	for i, doc := range docs {
		if !strings.Contains(doc, "kind: EndpointSlice") {
			continue
		}
		var es discoveryv1.EndpointSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &es); err != nil {
			return fmt.Errorf("parse %s: %w", path, err)
		}
		for j := range es.Endpoints {
			e := &es.Endpoints[j]
			if zone == "" || (e.Zone != nil && *e.Zone == zone) {
				e.Conditions.Ready, e.Conditions.Serving = &ready, &ready
			}
		}
		out, err := yaml.Marshal(&es)
		if err != nil {
			return err
		}
		docs[i] = string(out)
	}
	// Write a new file and rename it, so the spoke never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func echoClusters(admin string) int {
	resp, err := http.Get(admin + "/debug/services")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var services []adminapi.ServiceInfo
	if json.NewDecoder(resp.Body).Decode(&services) != nil {
		return 0
	}
	for _, s := range services {
		if s.Service.String() == "demo/echo" {
			return len(s.Clusters)
		}
	}
	return 0
}

func describeBackends() string {
	var parts []string
	for _, b := range demoBackends {
		parts = append(parts, fmt.Sprintf("%s/%s=%s", b.cluster, b.zone, b.addr))
	}
	return strings.Join(parts, ", ")
}

func copyDir(from, to string) error {
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("gave up after %s", limit)
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func say(format string, args ...any) {
	fmt.Printf("%s  ==> %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// runDemoClient is the demo's proxyless gRPC client: it calls the target ten
// times a second and prints, each second, who answered and how many failed.
func runDemoClient(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nave demo-client", flag.ContinueOnError)
	target := fs.String("target", demoTarget, "xds:/// target to call")
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	counts, failed, last := map[string]int{}, 0, time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		var md metadata.MD
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := hc.Check(rctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		cancel()
		if err != nil {
			failed++
		} else if v := md.Get(backendHeader); len(v) > 0 {
			counts[v[0]]++
		}
		if time.Since(last) >= time.Second {
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(counts)) {
				parts = append(parts, fmt.Sprintf("%s x%d", k, counts[k]))
			}
			if len(parts) == 0 {
				parts = []string{"nobody"}
			}
			fmt.Printf("%s  client us-east-1a: answered by %s; %d failed\n", time.Now().Format("15:04:05"), strings.Join(parts, ", "), failed)
			counts, failed, last = map[string]int{}, 0, time.Now()
		}
	}
}
