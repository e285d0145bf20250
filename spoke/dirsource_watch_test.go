package spoke

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/navemesh/nave/registry"
)

// These tests run the source with a rescan interval of an hour unless they
// say otherwise: what they see published, the directory's events brought.
const noRescan = time.Hour

var apiKey = registry.ServiceKey{Namespace: "shop", Name: "api"}

const apiService = `apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: shop
  labels: {nave.io/export: "true"}
spec:
  ports: [{name: http, port: 80}]
`

// startWatchedDirSource is startDirSourceWith with the rescan (poll) interval given.
func startWatchedDirSource(t *testing.T, dir string, poll time.Duration, setup func(*DirSource)) *harness {
	t.Helper()
	h := &harness{t: t, dir: dir, states: make(chan State), logs: make(chan logRecord, 10_000)}
	src := NewDirSource(dir, BuildOptions{Cluster: "east", DefaultRegion: "dc1"}, poll,
		slog.New(&recordingHandler{records: h.logs}))
	if setup != nil {
		setup(src)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- src.Run(ctx, sinkFunc(func(s State) {
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

// awaitState waits for a published state that satisfies cond (the ones
// before it may be steps on the way).
func (h *harness) awaitState(what string, cond func(State) bool) State {
	h.t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case s := <-h.states:
			if cond(s) {
				return s
			}
		case <-deadline:
			h.t.Fatalf("no state with %s", what)
			return nil
		}
	}
}

// endpointReady reports whether the endpoint at addr of s's service k is ready (false when it is missing).
func endpointReady(s State, k registry.ServiceKey, addr string) bool {
	sh := s[k]
	if sh == nil {
		return false
	}
	for _, e := range sh.Endpoints {
		if e.Addresses[0].String() == addr {
			return e.Conditions.Ready
		}
	}
	return false
}

func TestDirSourceWatchSeesEdit(t *testing.T) {
	h := startWatchedDirSource(t, copyTestdata(t), noRescan, nil)
	h.next()
	h.edit("slices.yaml", "ready: true", "ready: false")
	s := h.next()
	if endpointReady(s, webKey, "10.0.1.1") || !endpointReady(s, webKey, "10.0.2.1") {
		t.Fatalf("after the edit: %s", mustJSON(s[webKey]))
	}
}

func TestDirSourceWatchSeesCreateAndRemove(t *testing.T) {
	h := startWatchedDirSource(t, copyTestdata(t), noRescan, nil)
	h.next()
	h.write("api.yaml", apiService)
	if s := h.next(); len(s) != 3 || s[apiKey] == nil {
		t.Fatalf("after creating api.yaml: %v", describe(s))
	}
	if err := os.Remove(filepath.Join(h.dir, "api.yaml")); err != nil {
		t.Fatal(err)
	}
	if s := h.next(); len(s) != 2 || s[apiKey] != nil {
		t.Fatalf("after removing api.yaml: %v", describe(s))
	}
	if err := os.Remove(filepath.Join(h.dir, "db-slice.yml")); err != nil {
		t.Fatal(err)
	}
	if s := h.next(); s[dbKey] == nil || len(s[dbKey].Endpoints) != 0 {
		t.Fatalf("after removing db's slice: %v", describe(s))
	}
}

// Written complete under another name and renamed into place, as careful
// writers (and the e2e harness) do; and a manifest renamed to another name
// changes nothing: no state without its objects is published on the way.
func TestDirSourceWatchSeesRenameIntoPlace(t *testing.T) {
	h := startWatchedDirSource(t, copyTestdata(t), noRescan, nil)
	h.next()
	path := filepath.Join(h.dir, "slices.yaml")
	if err := os.WriteFile(path+".tmp", []byte(strings.Replace(h.read("slices.yaml"), "ready: true", "ready: false", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	if s := h.next(); endpointReady(s, webKey, "10.0.1.1") || len(s[webKey].Endpoints) != 3 {
		t.Fatalf("after the rename: %s", mustJSON(s[webKey]))
	}

	if err := os.Rename(filepath.Join(h.dir, "services.yaml"), filepath.Join(h.dir, "svc.yaml")); err != nil {
		t.Fatal(err)
	}
	h.awaitLog("manifest removed", "services.yaml") // awaitLog fails on any publish
	// The next state published is the next edit's, with every service.
	h.edit("db-slice.yml", "10.0.1.5", "10.0.1.6")
	s := h.next()
	if len(s) != 2 || len(s[webKey].Endpoints) != 3 {
		t.Fatalf("after renaming services.yaml and editing: %v", describe(s))
	}
	endpoint(t, s, dbKey, "10.0.1.6")
}

// configMapVolume lays out dir as the kubelet does a ConfigMap volume: each
// key a link to ..data/key, ..data a link to a timestamped directory with
// the files. update swaps in a new version as the kubelet's AtomicWriter
// does.
type configMapVolume struct {
	t   *testing.T
	dir string
	ts  string // the current timestamped directory
	n   int
}

func (v *configMapVolume) update(files map[string]string) {
	t := v.t
	t.Helper()
	v.n++
	ts := "..2026_01_02_03_04_05.00000000" + string(rune('0'+v.n))
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(v.dir, ts), 0o755))
	for name, content := range files {
		must(os.WriteFile(filepath.Join(v.dir, ts, name), []byte(content), 0o644))
	}
	// Links for new keys (dangling until the swap).
	for name := range files {
		if _, err := os.Lstat(filepath.Join(v.dir, name)); errors.Is(err, os.ErrNotExist) {
			must(os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)))
		}
	}
	must(os.Symlink(ts, filepath.Join(v.dir, "..data_tmp")))
	must(os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")))
	if v.ts != "" {
		old, err := os.ReadDir(filepath.Join(v.dir, v.ts))
		must(err)
		for _, e := range old {
			if _, ok := files[e.Name()]; !ok {
				must(os.Remove(filepath.Join(v.dir, e.Name())))
			}
		}
		must(os.RemoveAll(filepath.Join(v.dir, v.ts)))
	}
	v.ts = ts
}

func TestDirSourceWatchSeesConfigMapUpdate(t *testing.T) {
	files := map[string]string{}
	for _, name := range []string{"services.yaml", "slices.yaml", "db-slice.yml", "nodes.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "cluster", name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = string(b)
	}
	v := &configMapVolume{t: t, dir: t.TempDir()}
	v.update(files)
	h := startWatchedDirSource(t, v.dir, noRescan, nil)
	if s := h.next(); len(s) != 2 || len(s[webKey].Endpoints) != 3 || len(s[dbKey].Endpoints) != 1 {
		t.Fatalf("first state: %v", describe(s))
	}

	// A key changed: the links stay as they are, ..data is swapped.
	files["slices.yaml"] = strings.Replace(files["slices.yaml"], "ready: true", "ready: false", 1)
	v.update(files)
	if s := h.next(); endpointReady(s, webKey, "10.0.1.1") || len(s[webKey].Endpoints) != 3 {
		t.Fatalf("after the update: %s", mustJSON(s[webKey]))
	}

	// A key added and one removed, in one update.
	files["api.yaml"] = apiService
	delete(files, "db-slice.yml")
	v.update(files)
	if s := h.next(); len(s) != 3 || s[apiKey] == nil || len(s[dbKey].Endpoints) != 0 || endpointReady(s, webKey, "10.0.1.1") {
		t.Fatalf("after adding api.yaml and removing db-slice.yml: %v", describe(s))
	}
}

// A file rewritten in place by a writer that pauses is not read until its
// events have been quiet: neither emptied nor half written is published.
// (Quiet is a second here, and the pauses longer than a rescan's settle:
// rescans leave the file alone too.)
func TestDirSourceWatchHalfWrittenFileIsNotRead(t *testing.T) {
	h := startWatchedDirSource(t, copyTestdata(t), 5*time.Millisecond, func(d *DirSource) { d.quiet = time.Second })
	h.next()
	content := strings.Replace(h.read("services.yaml"), "name: grpc", "name: rpc", 1)
	cut := strings.Index(content, "---\n") // the first part: web only (db gone, web changed)
	if cut < 0 {
		t.Fatal("services.yaml has one document")
	}
	if objs, err := decodeManifests([]byte(content[:cut])); err != nil || len(objs.Services) != 1 {
		t.Fatalf("the first part decodes to %d services, %v; want web alone", len(objs.Services), err)
	}
	f, err := os.OpenFile(filepath.Join(h.dir, "services.yaml"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pause := 2 * minSettle
	for _, part := range []string{"", content[:cut], content[cut:]} { // truncated, then two parts
		if _, err := f.WriteString(part); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	s := h.next()
	if len(s) != 2 || s[dbKey] == nil || len(s[webKey].Endpoints) != 3 || s[webKey].Ports[1].Name != "rpc" {
		t.Fatalf("first state after the write: %v %s", describe(s), mustJSON(s[webKey]))
	}
}

// A file written faster than the quiet interval is read once, complete.
func TestDirSourceWatchRewritesCoalesce(t *testing.T) {
	h := startWatchedDirSource(t, copyTestdata(t), noRescan, func(d *DirSource) { d.quiet = time.Second })
	h.next()
	h.logged("") // drains the first reads' logs
	original := h.read("slices.yaml")
	for i := range 5 {
		if i%2 == 0 {
			h.write("slices.yaml", strings.Replace(original, "ready: true", "ready: false", 1))
		} else {
			h.write("slices.yaml", original+"\n- : [unclosed\n") // garbled
		}
	}
	h.write("slices.yaml", strings.Replace(original, "10.0.2.1", "10.0.2.2", 1))
	s := h.next()
	if !endpointReady(s, webKey, "10.0.1.1") || !endpointReady(s, webKey, "10.0.2.2") {
		t.Fatalf("first state after the writes: %s", mustJSON(s[webKey]))
	}
	if recs := h.logged("read manifest"); len(recs) != 1 {
		t.Errorf("read %d times: %+v", len(recs), recs)
	}
	if recs := h.logged("cannot decode manifest; keeping its previous objects"); len(recs) != 0 {
		t.Errorf("a garbled version was read: %+v", recs)
	}
}

// Without a watcher the source polls, as it always did.
func TestDirSourceWatchFallsBackToPolling(t *testing.T) {
	h := startWatchedDirSource(t, copyTestdata(t), 5*time.Millisecond, func(d *DirSource) {
		d.newWatcher = func() (*fsnotify.Watcher, error) { return nil, errors.New("too many open files") }
	})
	h.next()
	if recs := h.logged("cannot watch the directory for changes; polling it"); len(recs) != 1 ||
		recs[0].level != slog.LevelWarn || recs[0].attrs["error"] != "too many open files" || recs[0].attrs["poll"] != "5ms" {
		t.Errorf("logs = %+v", recs)
	}
	h.edit("slices.yaml", "ready: true", "ready: false")
	if s := h.next(); endpointReady(s, webKey, "10.0.1.1") {
		t.Fatalf("after the edit: %s", mustJSON(s[webKey]))
	}
}

// The directory replaced by another: a rescan finds it, reads it and
// watches it instead.
func TestDirSourceWatchDirectoryReplaced(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "cluster")
	if err := os.CopyFS(dir, os.DirFS("testdata/cluster")); err != nil {
		t.Fatal(err)
	}
	h := startWatchedDirSource(t, dir, 20*time.Millisecond, nil)
	h.next()
	next := filepath.Join(root, "next")
	if err := os.CopyFS(next, os.DirFS("testdata/cluster")); err != nil {
		t.Fatal(err)
	}
	editFile(t, filepath.Join(next, "slices.yaml"), "ready: true", "ready: false")
	if err := os.Rename(dir, filepath.Join(root, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, dir); err != nil {
		t.Fatal(err)
	}
	h.awaitState("the new directory's slices", func(s State) bool { return !endpointReady(s, webKey, "10.0.1.1") })
	for deadline := time.After(waitFor); ; {
		select {
		case r := <-h.logs:
			if r.msg != "watching the directory for changes again" {
				continue
			}
		case s := <-h.states:
			t.Fatalf("unexpected state: %v", describe(s))
		case <-deadline:
			t.Fatal("the new directory is not watched")
		}
		break
	}
	// The edit rewrites the file in place: on a busy machine the source may
	// read it half written first (see DirSource), so the test awaits the
	// state rather than take the next one.
	h.edit("slices.yaml", "ready: false", "ready: true")
	h.awaitState("an edit in the new directory", func(s State) bool { return endpointReady(s, webKey, "10.0.1.1") })
}

// Run's watcher is closed when its context ends: no goroutine of it is left.
func TestDirSourceWatchEndsWithItsContext(t *testing.T) {
	src := NewDirSource(copyTestdata(t), BuildOptions{Cluster: "east"}, noRescan, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	published := make(chan struct{}, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- src.Run(ctx, sinkFunc(func(State) {
			select {
			case published <- struct{}{}:
			default:
			}
		}))
	}()
	select {
	case <-published:
	case <-time.After(waitFor):
		t.Fatal("no state published")
	}
	if !fsnotifyRunning() {
		t.Fatal("no goroutine of fsnotify while Run watches")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(waitFor); fsnotifyRunning(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("fsnotify's goroutine still runs after Run returned")
		}
	}
}

// fsnotifyRunning reports whether a goroutine runs fsnotify's code (only
// this test's source watches while it runs: the spoke's tests are not parallel).
func fsnotifyRunning() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), "github.com/fsnotify/fsnotify.")
		}
		buf = make([]byte, 2*len(buf))
	}
}
