package spoke

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/registry"
)

const waitFor = 10 * time.Second

var (
	webKey = registry.ServiceKey{Namespace: "shop", Name: "web"}
	dbKey  = registry.ServiceKey{Namespace: "shop", Name: "db"}
)

// logRecord is what the tests look at in a log record.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// recordingHandler hands every record to a channel (dropping them when nobody keeps up).
type recordingHandler struct {
	records chan logRecord
	attrs   []slog.Attr
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	select {
	case h.records <- rec:
	default:
	}
	return nil
}

func (h *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordingHandler{records: h.records, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *recordingHandler) WithGroup(string) slog.Handler { return h }

// harness runs a DirSource on a copy of testdata/cluster until the test ends.
type harness struct {
	t      *testing.T
	dir    string
	states chan State
	logs   chan logRecord
}

func startDirSource(t *testing.T, dir string, publish func(h *harness, s State)) *harness {
	t.Helper()
	return startDirSourceWith(t, dir, nil, publish)
}

// startDirSourceWith is startDirSource with setup applied to the source before it runs.
func startDirSourceWith(t *testing.T, dir string, setup func(*DirSource), publish func(h *harness, s State)) *harness {
	t.Helper()
	h := &harness{t: t, dir: dir, states: make(chan State), logs: make(chan logRecord, 10_000)}
	src := NewDirSource(dir, BuildOptions{Cluster: "east", DefaultRegion: "dc1"}, 5*time.Millisecond,
		slog.New(&recordingHandler{records: h.logs}))
	if setup != nil {
		setup(src)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- src.Run(ctx, sinkFunc(func(s State) {
			if publish != nil {
				publish(h, s)
			}
			select {
			case h.states <- s:
			case <-ctx.Done():
			}
		}))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitFor):
			t.Error("Run did not return after its context ended")
		}
	})
	return h
}

func copyTestdata(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/cluster")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// editFile replaces the first old in a file by new, before a source runs.
func editFile(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s does not contain %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// logged drains the records logged so far and returns those with this message.
func (h *harness) logged(msg string) []logRecord {
	var out []logRecord
	for {
		select {
		case r := <-h.logs:
			if r.msg == msg {
				out = append(out, r)
			}
		default:
			return out
		}
	}
}

// next returns the next published state.
func (h *harness) next() State {
	h.t.Helper()
	select {
	case s := <-h.states:
		return s
	case <-time.After(waitFor):
		h.t.Fatal("no state published")
		return nil
	}
}

// awaitLog waits for a record with this message about this file.
func (h *harness) awaitLog(msg, file string) logRecord {
	h.t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case r := <-h.logs:
			if r.msg == msg && (file == "" || r.attrs["file"] == file) {
				return r
			}
		case s := <-h.states:
			h.t.Fatalf("unexpected state published while waiting for log %q: %v", msg, describe(s))
		case <-deadline:
			h.t.Fatalf("no log %q about %q", msg, file)
		}
	}
}

func (h *harness) write(name, content string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.dir, name), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) read(name string) string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.dir, name))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// edit replaces the first old in the file by new.
func (h *harness) edit(name, old, new string) {
	h.t.Helper()
	content := h.read(name)
	if !strings.Contains(content, old) {
		h.t.Fatalf("%s does not contain %q", name, old)
	}
	h.write(name, strings.Replace(content, old, new, 1))
}

func describe(s State) map[string]int {
	out := map[string]int{}
	for k, sh := range s {
		if sh == nil {
			out[k.String()] = -1 // withheld
			continue
		}
		out[k.String()] = len(sh.Endpoints)
	}
	return out
}

func endpoint(t *testing.T, s State, k registry.ServiceKey, addr string) registry.Endpoint {
	t.Helper()
	sh := s[k]
	if sh == nil {
		t.Fatalf("no shard for %s in %v", k, describe(s))
	}
	for _, e := range sh.Endpoints {
		if e.Addresses[0] == netip.MustParseAddr(addr) {
			return e
		}
	}
	t.Fatalf("%s has no endpoint %s: %s", k, addr, mustJSON(sh))
	return registry.Endpoint{}
}

func TestDirSourceInitialState(t *testing.T) {
	h := startDirSource(t, copyTestdata(t), nil)
	s := h.next()
	if len(s) != 2 || s[webKey] == nil || s[dbKey] == nil {
		t.Fatalf("state = %v, want shop/web and shop/db", describe(s))
	}
	web := s[webKey]
	if want := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC); !web.ExportedAt.Equal(want) || web.Cluster != "east" || web.Headless {
		t.Errorf("web = %s", mustJSON(web))
	}
	wantPorts := []registry.ServicePort{
		{Name: "http", Port: 80, Protocol: registry.ProtocolTCP, AppProtocol: "http"},
		{Name: "grpc", Port: 9090, Protocol: registry.ProtocolTCP},
	}
	if got, want := mustJSON(web.Ports), mustJSON([]registry.ServicePort{wantPorts[0], wantPorts[1]}); got != want {
		t.Errorf("web ports = %s, want %s", got, want)
	}
	if len(web.Endpoints) != 3 {
		t.Fatalf("web endpoints = %s", mustJSON(web.Endpoints))
	}
	if e := endpoint(t, s, webKey, "10.0.1.1"); e.Locality != (registry.Locality{Region: "us-east-1", Zone: "us-east-1a"}) || !e.Conditions.Ready || e.NodeName != "node-a" {
		t.Errorf("10.0.1.1 = %s", mustJSON(e))
	}
	if e := endpoint(t, s, webKey, "10.0.2.1"); e.Locality != (registry.Locality{Region: "dc1", Zone: "us-east-1b"}) {
		t.Errorf("10.0.2.1 locality = %v, want the default region and the node's zone", e.Locality)
	}
	if e := endpoint(t, s, webKey, "fd00::1:1"); e.Locality.Region != "us-east-1" {
		t.Errorf("fd00::1:1 = %s", mustJSON(e))
	}
	if e := endpoint(t, s, webKey, "10.0.1.1"); !hasPort(e, "http", 8080) {
		t.Errorf("10.0.1.1 ports = %v, want http=8080", e.Ports)
	}
	db := s[dbKey]
	if !db.Headless || len(db.Endpoints) != 1 || db.Endpoints[0].Hostname != "db-0" {
		t.Errorf("db = %s", mustJSON(db))
	}
}

func TestDirSourceReadyFlipPublishes(t *testing.T) {
	h := startDirSource(t, copyTestdata(t), nil)
	h.next()
	h.edit("slices.yaml", "ready: true", "ready: false")
	s := h.next()
	if e := endpoint(t, s, webKey, "10.0.1.1"); e.Conditions.Ready {
		t.Errorf("10.0.1.1 still ready: %s", mustJSON(e))
	}
	if e := endpoint(t, s, webKey, "10.0.2.1"); !e.Conditions.Ready {
		t.Errorf("10.0.2.1 not ready: %s", mustJSON(e))
	}
}

func TestDirSourceGarbledEditKeepsState(t *testing.T) {
	garbles := map[string]func(string) string{
		"bad YAML":            func(s string) string { return s + "\n- : [unclosed\n" },
		"missing apiVersion":  func(s string) string { return strings.Replace(s, "apiVersion: discovery.k8s.io/v1\n  kind", "kind", 1) },
		"wrong type":          func(s string) string { return strings.Replace(s, "port: 8080", "port: eighty", 1) },
		"not an object":       func(string) string { return "just a string\n" },
		"truncated mid-write": func(s string) string { return s[:len(s)/2] + "  \"" },
	}
	for name, garble := range garbles {
		t.Run(name, func(t *testing.T) {
			h := startDirSource(t, copyTestdata(t), nil)
			before := h.next()
			original := h.read("slices.yaml")
			h.write("slices.yaml", garble(original))
			rec := h.awaitLog("cannot decode manifest; keeping its previous objects", "slices.yaml")
			if rec.level != slog.LevelWarn || rec.attrs["error"] == "" || rec.attrs["component"] != "dirsource" {
				t.Errorf("log = %+v", rec)
			}
			// The fix is the next thing published: the garbled file never changed the state.
			h.write("slices.yaml", strings.Replace(original, "ready: true", "ready: false", 1))
			s := h.next()
			if e := endpoint(t, s, webKey, "10.0.1.1"); e.Conditions.Ready {
				t.Errorf("fix not applied: %s", mustJSON(e))
			}
			if len(s[webKey].Endpoints) != len(before[webKey].Endpoints) {
				t.Errorf("endpoints %v, before %v", describe(s), describe(before))
			}
		})
	}
}

func TestDirSourceDeletedFileRemovesObjects(t *testing.T) {
	h := startDirSource(t, copyTestdata(t), nil)
	h.next()
	if err := os.Remove(filepath.Join(h.dir, "db-slice.yml")); err != nil {
		t.Fatal(err)
	}
	s := h.next()
	if db := s[dbKey]; db == nil || len(db.Endpoints) != 0 || len(s[webKey].Endpoints) != 3 {
		t.Fatalf("after removing db's slice: %v", describe(s))
	}
	if err := os.Remove(filepath.Join(h.dir, "services.yaml")); err != nil {
		t.Fatal(err)
	}
	if s := h.next(); len(s) != 0 {
		t.Fatalf("after removing the services: %v", describe(s))
	}
}

func TestDirSourceUnchangedRewriteDoesNotPublish(t *testing.T) {
	h := startDirSource(t, copyTestdata(t), nil)
	h.next()
	// The same bytes with a new modification time.
	h.write("services.yaml", h.read("services.yaml"))
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(h.dir, "services.yaml"), later, later); err != nil {
		t.Fatal(err)
	}
	h.awaitLog("manifest rewritten without changes", "services.yaml")
	// Different bytes, same objects.
	h.write("nodes.json", strings.ReplaceAll(h.read("nodes.json"), "\n", "\n\n"))
	h.awaitLog("read manifest", "nodes.json")
	// A new file with nothing we watch.
	h.write("other.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
	h.awaitLog("read manifest", "other.yaml")
	// Only a real change is published (awaitLog failed on any publish so far).
	h.edit("db-slice.yml", "10.0.1.5", "10.0.1.6")
	s := h.next()
	endpoint(t, s, dbKey, "10.0.1.6")
}

func TestDirSourceEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	h := startDirSource(t, dir, nil)
	if s := h.next(); len(s) != 0 {
		t.Fatalf("state of an empty directory = %v", describe(s))
	}
	services, err := os.ReadFile("testdata/cluster/services.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h.write("services.yaml", string(services))
	if s := h.next(); len(s) != 2 {
		t.Fatalf("state = %v", describe(s))
	}
	if err := os.Remove(filepath.Join(dir, "services.yaml")); err != nil {
		t.Fatal(err)
	}
	if s := h.next(); len(s) != 0 {
		t.Fatalf("state of an emptied directory = %v", describe(s))
	}
}

func TestDirSourceMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nope")
	src := NewDirSource(dir, BuildOptions{Cluster: "east"}, time.Millisecond, nil)
	err := src.Run(context.Background(), sinkFunc(func(State) { t.Error("published") }))
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Run = %v, want an error naming %s", err, dir)
	}
	if got := src.Name(); got != "dir:"+dir {
		t.Errorf("Name = %q", got)
	}
}

func TestDirSourceRecoversFromPanics(t *testing.T) {
	calls := 0 // only touched from Run's goroutine
	h := startDirSource(t, copyTestdata(t), func(h *harness, s State) {
		calls++
		if calls == 1 {
			panic("publish failed")
		}
	})
	h.awaitLog("panic while polling manifests", "")
	h.edit("slices.yaml", "ready: true", "ready: false")
	s := h.next()
	if e := endpoint(t, s, webKey, "10.0.1.1"); e.Conditions.Ready {
		t.Errorf("change after the panic not applied: %s", mustJSON(e))
	}
}

func TestDecodeManifests(t *testing.T) {
	tests := []struct {
		name                    string
		doc                     string
		services, slices, nodes int
		wantErr                 string
	}{
		{name: "empty", doc: ""},
		{name: "comments and separators", doc: "# nothing\n---\n---\n"},
		{name: "unknown kind", doc: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: 1}\n"},
		{name: "known but unwatched kind", doc: "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"},
		{name: "unknown fields are fine", doc: "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80}], shiny: true}\n", services: 1},
		{name: "JSON", doc: `{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}`, nodes: 1},
		{name: "list of mixed kinds", doc: `
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {name: a}}
- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: a-1}, addressType: IPv4, endpoints: []}
- {apiVersion: apps/v1, kind: Deployment, metadata: {name: a}}
`, services: 1, slices: 1},
		{name: "typed list", doc: "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a}\n- metadata: {name: b}\n", services: 2},
		{name: "missing apiVersion", doc: "kind: Service\nmetadata: {name: x}\n", wantErr: "document 1"},
		{name: "missing kind", doc: "apiVersion: v1\nmetadata: {name: x}\n", wantErr: "document 1"},
		{name: "wrong type in second document", doc: "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n---\napiVersion: v1\nkind: Service\nspec: {ports: 80}\n", wantErr: "document 2"},
		{name: "bad item in a list", doc: "apiVersion: v1\nkind: List\nitems:\n- {kind: Service}\n", wantErr: "list item 0"},
		{name: "bad YAML", doc: "apiVersion: v1\nkind: Service\nmetadata: {name: [x\n", wantErr: "document 1"},
		{name: "scalar", doc: "hello\n", wantErr: "document 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := decodeManifests([]byte(tt.doc))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(objs.Services) != tt.services || len(objs.EndpointSlices) != tt.slices || len(objs.Nodes) != tt.nodes {
				t.Fatalf("got %d services, %d slices, %d nodes", len(objs.Services), len(objs.EndpointSlices), len(objs.Nodes))
			}
			for _, s := range objs.Services {
				if s.Namespace != "default" {
					t.Errorf("service %s in namespace %q, want default", s.Name, s.Namespace)
				}
			}
		})
	}
}

func hasPort(e registry.Endpoint, name string, number int32) bool {
	got, ok := e.PortNumber(name)
	return ok && got == number
}

func TestDirSourceInvalidEndpointLeavesTheRest(t *testing.T) {
	h := startDirSource(t, copyTestdata(t), nil)
	h.next()
	h.edit("slices.yaml", "zone: us-east-1a", "zone: us east 1a")
	s := h.next()
	if got := describe(s); got["shop/web"] != 2 || got["shop/db"] != 1 {
		t.Fatalf("state = %v, want web without 10.0.1.1 and db as before", got)
	}
	endpoint(t, s, webKey, "10.0.2.1")
	endpoint(t, s, webKey, "fd00::1:1")
	recs := h.logged("ignored invalid input; the rest of the service is published")
	if len(recs) != 1 || !strings.Contains(recs[0].attrs["error"], "service shop/web: endpointslice web-ipv4, endpoint 0 left out") ||
		recs[0].level != slog.LevelWarn {
		t.Errorf("logs = %+v, want one warning naming the endpoint", recs)
	}
}

func TestDirSourceInvalidServiceKeepsLastGoodShard(t *testing.T) {
	h := startDirSource(t, copyTestdata(t), nil)
	before := h.next()

	// awaitLog fails on any publish: the invalid form changes nothing.
	h.edit("services.yaml", "name: grpc", "name: GRPC")
	rec := h.awaitLog("invalid service; still publishing its last good form", "")
	if !strings.Contains(rec.attrs["error"], `service shop/web: port name "GRPC"`) || rec.level != slog.LevelWarn {
		t.Errorf("log = %+v", rec)
	}

	// Other changes are published, with web's last good shard; the error is
	// reported again for this change only, not at every poll in between.
	h.edit("db-slice.yml", "10.0.1.5", "10.0.1.6")
	s := h.next()
	endpoint(t, s, dbKey, "10.0.1.6")
	if !s[webKey].Equal(before[webKey]) {
		t.Errorf("web = %s, want its last good form %s", mustJSON(s[webKey]), mustJSON(before[webKey]))
	}
	if recs := h.logged("invalid service; still publishing its last good form"); len(recs) != 1 {
		t.Errorf("reported %d times after one change: %+v", len(recs), recs)
	}

	// The fixed form is published.
	h.edit("services.yaml", "name: GRPC", "name: rpc")
	s = h.next()
	if !slices.ContainsFunc(s[webKey].Ports, func(p registry.ServicePort) bool { return p.Name == "rpc" }) {
		t.Errorf("web ports = %v, want the fixed form", s[webKey].Ports)
	}
	if len(s[webKey].Endpoints) != 3 {
		t.Errorf("state = %v", describe(s))
	}
}

// An invalid service with no good form yet is published as withheld (nil):
// the hub keeps what an earlier spoke gave it, and nothing else is sent.
func TestDirSourceInvalidServiceFromStartIsWithheld(t *testing.T) {
	dir := copyTestdata(t)
	editFile(t, filepath.Join(dir, "services.yaml"), "name: grpc", "name: GRPC")
	h := startDirSource(t, dir, nil)
	s := h.next()
	if web, ok := s[webKey]; len(s) != 2 || s[dbKey] == nil || !ok || web != nil {
		t.Fatalf("state = %v, want shop/db and shop/web withheld", describe(s))
	}
	if recs := h.logged("invalid service; the hub keeps whatever it holds for it"); len(recs) != 1 || !strings.Contains(recs[0].attrs["error"], "service shop/web") {
		t.Errorf("logs = %+v, want one warning naming shop/web", recs)
	}
	h.edit("services.yaml", "name: GRPC", "name: rpc")
	s = h.next()
	if web := s[webKey]; web == nil || len(web.Endpoints) != 3 {
		t.Fatalf("after the fix: %v", describe(s))
	}
}

func TestDirSourceHoldsBackFirstStateWhileAFileNeverDecoded(t *testing.T) {
	dir := copyTestdata(t)
	path := filepath.Join(dir, "slices.yaml")
	original, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(string(original)+"\n- : [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := startDirSourceWith(t, dir, func(d *DirSource) { d.StartupGrace = time.Hour }, nil)
	rec := h.awaitLog("holding back the first state until every manifest decodes", "")
	if rec.level != slog.LevelWarn || rec.attrs["files"] != "[slices.yaml]" {
		t.Errorf("log = %+v", rec)
	}
	// The first state published is the complete one.
	h.write("slices.yaml", string(original))
	if s := h.next(); len(s) != 2 || len(s[webKey].Endpoints) != 3 {
		t.Fatalf("first state = %v, want web with its 3 endpoints", describe(s))
	}
	if recs := h.logged("holding back the first state until every manifest decodes"); len(recs) != 0 {
		t.Errorf("hold-back logged again: %+v", recs)
	}
}

func TestDirSourceStartupGraceExpires(t *testing.T) {
	dir := copyTestdata(t)
	editFile(t, filepath.Join(dir, "slices.yaml"), "kind: List", "kind: [List")
	const grace = 200 * time.Millisecond
	begun := time.Now()
	h := startDirSourceWith(t, dir, func(d *DirSource) { d.StartupGrace = grace }, nil)
	h.awaitLog("holding back the first state until every manifest decodes", "")
	s := h.next()
	if waited := time.Since(begun); waited < grace {
		t.Errorf("published after %v, before the grace of %v", waited, grace)
	}
	if got := describe(s); len(got) != 2 || got["shop/web"] != 0 {
		t.Fatalf("state = %v, want web without the garbled file's endpoints", got)
	}
	if recs := h.logged("publishing the first state without manifests that never decoded"); len(recs) != 1 ||
		recs[0].attrs["files"] != "[slices.yaml]" || recs[0].level != slog.LevelWarn {
		t.Errorf("logs = %+v", recs)
	}
	// From then on the file is read as usual.
	h.edit("slices.yaml", "kind: [List", "kind: List")
	if s := h.next(); len(s[webKey].Endpoints) != 3 {
		t.Fatalf("after the fix: %v", describe(s))
	}
}
