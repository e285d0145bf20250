package spoke

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/fsnotify/fsnotify"

	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/registry"
)

// State is a cluster's complete desired state: one shard per exported service.
type State = federation.State

// DirSource watches a directory of Kubernetes manifests (.yaml, .yml, .json;
// several documents per file, kind: List) and builds the cluster's state from
// the Services, EndpointSlices and Nodes in it. It is meant for demos and
// tests. Files whose names start with "." and subdirectories are ignored
// (which also skips the ..data links of a mounted ConfigMap). Objects
// without a namespace are in "default"; a Service defined in two files is
// taken from the first by file name.
//
// Bad input never removes what was good: a file that stops decoding keeps its
// previous objects, an invalid endpoint is left out of its service, and a
// service that turns invalid keeps the last good shard published for it.
//
// It notices changes from the file system's events (fsnotify: inotify on
// Linux): the files a burst of events names are read once the burst has
// been quiet for 20ms, so an edit is published within a few tens of
// milliseconds. A file is not read while writes to it come less than 20ms
// apart; one rewritten in place by a writer that pauses for longer may be
// read half written (and published, if that half decodes), so tools should
// write a complete file and rename it into place, as a mounted ConfigMap's
// updates do. An event for any other name (such as the ..data link a
// ConfigMap volume swaps) re-reads every manifest. The directory is also
// rescanned in full every poll interval (see NewDirSource).
type DirSource struct {
	// StartupGrace is how long the first publish waits for every manifest
	// to decode once: a spoke restarting while a file is garbled would
	// otherwise publish a state without that file's services, and the hub,
	// which replaces the whole state, would drop what the previous process
	// published. After the grace, the state is published without those
	// files. Zero or less publishes at once. Set it before Run.
	StartupGrace time.Duration
	// Origins, if not nil, is told when each service's manifests changed
	// (set before Run).
	Origins *federation.Origins

	dir  string
	opts BuildOptions
	poll time.Duration
	log  *slog.Logger

	quiet      time.Duration                     // watchQuiet (tests change it)
	newWatcher func() (*fsnotify.Watcher, error) // fsnotify.NewWatcher (tests change it)

	// The Services last read (Run's goroutine writes them), for the
	// gateways they offer (OnGateways).
	servicesMu   sync.Mutex
	services     []*corev1.Service
	servicesRead bool
	gateways     gatewayServices
}

// DefaultStartupGrace is DirSource.StartupGrace unless changed.
const DefaultStartupGrace = 30 * time.Second

// racyWindow: a file modified this close to when it was read may have
// changed again within the file system's timestamp granularity without
// changing its size, so it is re-read (and its content compared) until it
// is older than that.
const racyWindow = 2 * time.Second

// minSettle is the least time a changed file must keep its size and
// modification time before it is read: a file rewritten in place is briefly
// empty or half written, and must not be taken for its new content. (Writers
// that rename a complete file into place are never seen half written.)
const minSettle = 100 * time.Millisecond

// watchQuiet is how long the files a burst of events names must go without
// another event before they are read: a writer truncating and rewriting a
// file, or copying it in chunks, is done by then unless it pauses.
const watchQuiet = 20 * time.Millisecond

// watchMaxDelay bounds how long a burst of events that does not end (a file
// written to without pause) holds back the files of the burst that did go
// quiet: about this long, up to twice for a file whose events came just
// before an overdue read (the next burst starts then).
const watchMaxDelay = 100 * time.Millisecond

// NewDirSource returns a source for dir. It watches the directory for
// changes and reads the files an event names once their events have been
// quiet for 20ms (see DirSource). poll (a second when not positive) is how
// often it also rescans the whole directory: a safety net for changes no
// event tells of (events lost to an overflow of the kernel's queue, the
// directory removed and created again, a file system that sends no events
// such as a network one, a manifest that is a link to a file outside the
// directory), and, when the directory cannot be watched (which is logged),
// the only way changes are found, as polling. A change that only a rescan
// finds is read once the file's size and modification time have held still
// for a poll interval (and at least 100ms). A nil log means slog.Default().
func NewDirSource(dir string, opts BuildOptions, poll time.Duration, log *slog.Logger) *DirSource {
	if poll <= 0 {
		poll = time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "dirsource", "dir", dir)
	return &DirSource{
		StartupGrace: DefaultStartupGrace,
		dir:          dir,
		opts:         opts,
		poll:         poll,
		log:          log,
		quiet:        watchQuiet,
		newWatcher:   fsnotify.NewWatcher,
		gateways:     gatewayServices{log: log},
	}
}

// OnGateways makes the source tell f the gateways that the Services of its
// manifests labelled for network offer, now (once it has read its
// manifests) and whenever they change, until the next call replaces f
// (nil: nobody). f must not block.
func (d *DirSource) OnGateways(network registry.Network, f func([]registry.Gateway)) {
	d.gateways.set(network, f)
	d.offerGateways()
}

// offerGateways tells the gateways of the Services last read, if any were.
func (d *DirSource) offerGateways() {
	d.servicesMu.Lock()
	svcs, read := d.services, d.servicesRead
	d.servicesMu.Unlock()
	if !read {
		return
	}
	d.gateways.offer(func(network registry.Network) []*corev1.Service {
		var out []*corev1.Service
		for _, svc := range svcs {
			if svc.Labels[NetworkGatewayLabel] == string(network) {
				out = append(out, svc)
			}
		}
		return out
	})
}

// Name identifies the source in logs and status.
func (d *DirSource) Name() string { return "dir:" + d.dir }

// Run hands the complete state to out once the directory has been read
// (and every manifest in it decoded, or StartupGrace passed), then the
// services each change of the directory changes (never nothing), until ctx
// ends; then it returns nil. The directory missing at start is an error. Later, a file
// that cannot be read or decoded is logged and its previous objects stay in
// effect; a directory that cannot be listed keeps the whole previous state.
func (d *DirSource) Run(ctx context.Context, out Sink) error {
	fi, err := os.Stat(d.dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", d.dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("read %s: not a directory", d.dir)
	}
	w := &dirWatch{
		src: d, files: map[string]*manifestFile{}, polled: map[string]polledStat{}, settle: max(d.poll, minSettle),
		begun: time.Now(), dirPath: filepath.Clean(d.dir), pending: map[string]time.Time{},
	}
	// Watch before the first scan, so that no change after it goes unseen.
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w.watch(); w.watcher != nil {
		defer w.watcher.Close()
		events, watchErrs = w.watcher.Events, w.watcher.Errors
	}
	w.pollOnce(ctx, out)
	ticker := time.NewTicker(d.poll)
	defer ticker.Stop()
	wake := time.NewTimer(time.Hour) // when the events seen are due
	wake.Stop()
	defer wake.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok { // closed only by Close
				events = nil
				continue
			}
			w.sawEvent(ev, time.Now())
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			d.log.Warn("file events may have been missed; reading every manifest again", "error", err)
			w.touchAll(time.Now())
		case <-ticker.C:
			w.rewatch()
			w.pollOnce(ctx, out)
		case <-wake.C:
			w.pollOnce(ctx, out)
		}
		if at := w.nextWake(); at.IsZero() {
			wake.Stop()
		} else {
			wake.Reset(time.Until(at))
		}
	}
}

// dirWatch is the state of one Run, owned by its goroutine.
type dirWatch struct {
	src       *DirSource
	files     map[string]*manifestFile // by file name
	polled    map[string]polledStat    // every manifest's stat at the previous poll
	scanned   bool                     // the directory was read once
	settle    time.Duration            // how long a changed file must hold still before it is read
	published State
	started   bool      // published at least once
	dirty     bool      // rebuild even if no file changed (after a panic)
	begun     time.Time // when Run started, for StartupGrace
	heldBack  bool      // the first publish was held back (and that logged)
	changedAt time.Time // the newest modification time of a file this poll read (for Origins)

	// Watching the directory (watcher is nil when it cannot be: then Run polls).
	dirPath  string // the directory, as event names start
	watcher  *fsnotify.Watcher
	watching bool        // the watcher watches the directory
	watched  os.FileInfo // the directory watched, to tell when it is replaced
	warned   bool        // that it cannot be watched was logged (since it last was)

	// The events seen and not yet acted on: a file an event names is read
	// (and one that is gone removed) once the burst of events is quiet, or,
	// in a burst longer than watchMaxDelay, once the file's events are.
	pending    map[string]time.Time // manifest name: its last event
	allAt      time.Time            // the last event for another name (every manifest is read again), if any
	lastEvent  time.Time            // the last event pending
	burstStart time.Time            // since when events have been pending (or a scan left some)
}

// watch starts watching the directory; when no watcher can be had, Run polls.
func (w *dirWatch) watch() {
	watcher, err := w.src.newWatcher()
	if err != nil {
		w.src.log.Warn("cannot watch the directory for changes; polling it", "error", err, "poll", w.src.poll)
		return
	}
	w.watcher = watcher
	if w.rewatch() {
		w.src.log.Debug("watching the directory for changes")
	}
}

// rewatch makes sure that the directory is watched: again after it was
// removed, renamed or replaced, and reports whether it started watching it
// now. Until it can, the rescans are all there is (polling).
func (w *dirWatch) rewatch() bool {
	if w.watcher == nil {
		return false
	}
	fi, err := os.Stat(w.src.dir)
	if err != nil {
		w.watching = false // the scan logs that it cannot be listed
		return false
	}
	if w.watching && os.SameFile(fi, w.watched) && len(w.watcher.WatchList()) > 0 {
		return false
	}
	again := w.watched != nil || w.warned
	_ = w.watcher.Remove(w.src.dir) // what was watched before, if the watch is still there
	if err := w.watcher.Add(w.src.dir); err != nil {
		w.watching = false
		if !w.warned {
			w.warned = true
			w.src.log.Warn("cannot watch the directory for changes; polling it", "error", err, "poll", w.src.poll)
		}
		return false
	}
	w.watching, w.watched, w.warned = true, fi, false
	if again {
		// What changed while it was not watched: every file is read once quiet.
		w.src.log.Info("watching the directory for changes again")
		w.touchAll(time.Now())
	}
	return true
}

// sawEvent notes an event of the directory's watch.
func (w *dirWatch) sawEvent(ev fsnotify.Event, now time.Time) {
	name := filepath.Clean(ev.Name)
	if name == w.dirPath { // the directory itself
		if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			w.watching = false // its watch is gone: the next rescan watches what is there then
		}
		return
	}
	if len(w.pending) == 0 && w.allAt.IsZero() {
		w.burstStart = now
	}
	w.lastEvent = now
	base := filepath.Base(name)
	if filepath.Dir(name) != w.dirPath || strings.HasPrefix(base, ".") || !isManifest(base) {
		// Not a manifest: perhaps what manifests link to (a ConfigMap's ..data).
		w.allAt = now
		return
	}
	w.pending[base] = now
}

// touchAll has every manifest read again once the events are quiet.
func (w *dirWatch) touchAll(now time.Time) {
	if len(w.pending) == 0 && w.allAt.IsZero() {
		w.burstStart = now
	}
	w.lastEvent, w.allAt = now, now
}

// nextWake is when events pending are due, or zero with none.
func (w *dirWatch) nextWake() time.Time {
	if len(w.pending) == 0 && w.allAt.IsZero() {
		return time.Time{}
	}
	at := w.lastEvent.Add(w.src.quiet)
	if limit := w.burstStart.Add(watchMaxDelay); limit.Before(at) {
		at = limit
	}
	return at
}

// dueEvents returns the manifests whose events are due now (the burst is
// quiet, or has gone on too long and theirs are), and whether every manifest
// is to be read again; the other manifests pending wait.
func (w *dirWatch) dueEvents(now time.Time) (due map[string]bool, all bool) {
	quiet := w.src.quiet
	settled := now.Sub(w.lastEvent) >= quiet
	overdue := now.Sub(w.burstStart) >= watchMaxDelay
	due = make(map[string]bool, len(w.pending))
	for name, at := range w.pending {
		if settled || overdue && now.Sub(at) >= quiet {
			due[name] = true
		}
	}
	all = !w.allAt.IsZero() && (settled || overdue && now.Sub(w.allAt) >= quiet)
	return due, all
}

// doneWith forgets the events a scan at now acted on.
func (w *dirWatch) doneWith(due map[string]bool, all bool, now time.Time) {
	for name := range due {
		delete(w.pending, name)
	}
	if all {
		w.allAt = time.Time{}
	}
	if len(w.pending) == 0 && w.allAt.IsZero() {
		w.burstStart = time.Time{}
	} else {
		w.burstStart = now // what is left waits for its own quiet, or watchMaxDelay more
	}
}

// polledStat is a file's stat and since when it has not changed.
type polledStat struct {
	stat  fileStat
	since time.Time
}

// fileStat is what a poll sees of a file without reading it.
type fileStat struct {
	modTime time.Time
	size    int64
}

func statOf(fi os.FileInfo) fileStat { return fileStat{modTime: fi.ModTime(), size: fi.Size()} }

func (s fileStat) same(o fileStat) bool { return s.modTime.Equal(o.modTime) && s.size == o.size }

// manifestFile is what was last read of one file.
type manifestFile struct {
	stat    fileStat // when last read
	readAt  time.Time
	sum     [sha256.Size]byte // of the last content read, good or not; zero until then
	objs    Objects           // from the last content that decoded
	decoded bool              // some content decoded
}

func (w *dirWatch) pollOnce(ctx context.Context, out Sink) {
	defer func() {
		if r := recover(); r != nil {
			w.src.log.Error("panic while polling manifests", "panic", r, "stack", string(debug.Stack()))
			// What was half done is unknown: decode every file again next time.
			for _, f := range w.files {
				f.sum = [sha256.Size]byte{}
			}
			w.dirty = true
		}
	}()
	w.changedAt = time.Time{} // this poll's: a file read now, or unknown (a file removed)
	changed, err := w.scan()
	if err != nil {
		w.src.log.Warn("cannot list manifests; keeping the previous state", "error", err)
		return
	}
	if !changed && !w.dirty && w.started {
		return
	}
	if !w.started && w.holdBack() {
		return
	}
	w.dirty = false
	state := w.build()
	if w.started && statesEqual(state, w.published) {
		return
	}
	if ctx.Err() != nil {
		return
	}
	w.src.log.Info("manifests changed", "services", len(state))
	first := !w.started
	var set State
	var removed []registry.ServiceKey
	if !first {
		set, removed = w.changes(state)
	}
	w.started = true
	w.published = state
	if first {
		out.Set(maps.Clone(state))
	} else {
		out.Apply(set, removed)
	}
}

// changes returns the services state changes from what was published (their
// new shards, and those removed), and tells the source's Origins of them:
// they changed when the newest file read did.
func (w *dirWatch) changes(state State) (set State, removed []registry.ServiceKey) {
	o := w.src.Origins
	set = State{}
	for k, sh := range state {
		if old, ok := w.published[k]; !ok || old == nil || sh == nil || !old.Equal(sh) {
			set[k] = sh
			o.Saw(k, "", w.changedAt)
		}
	}
	for k := range w.published {
		if _, ok := state[k]; !ok {
			removed = append(removed, k)
			o.Saw(k, "", w.changedAt)
		}
	}
	return set, removed
}

// scan stats every manifest, re-reads those that changed and reports whether
// any file's objects changed. A file whose events are due is read whatever
// its stat; one whose events are not is left as it was (not read, not
// removed) until they are.
func (w *dirWatch) scan() (bool, error) {
	log := w.src.log
	now := time.Now()
	due, allDue := w.dueEvents(now)
	entries, err := os.ReadDir(w.src.dir)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", w.src.dir, err) // the due events stay due: read once the listing works
	}
	defer w.doneWith(due, allDue, now)
	changed := false
	seen := map[string]bool{}
	polledNow := make(map[string]polledStat, len(w.polled))
	defer func() { w.polled, w.scanned = polledNow, true }()
	for _, de := range entries {
		name := de.Name()
		if strings.HasPrefix(name, ".") || !isManifest(name) {
			continue
		}
		if _, ok := w.pending[name]; ok && !due[name] {
			continue // still being written, renamed or removed (kept below)
		}
		forced := due[name] || allDue
		path := filepath.Join(w.src.dir, name)
		fi, err := os.Stat(path) // follows symlinks, as in a mounted ConfigMap
		if errors.Is(err, os.ErrNotExist) {
			continue // removed since listed (or a dangling link): gone
		}
		if err != nil {
			log.Warn("cannot read manifest; keeping its previous objects", "file", name, "error", err)
			if w.files[name] != nil {
				seen[name] = true
			}
			continue
		}
		if fi.IsDir() {
			continue
		}
		seen[name] = true
		st := statOf(fi)
		now := time.Now()
		ps, polled := w.polled[name]
		if !polled || !ps.stat.same(st) {
			ps = polledStat{stat: st, since: now}
		}
		polledNow[name] = ps
		f := w.files[name]
		statChanged := f == nil || !st.same(f.stat)
		if statChanged && w.scanned && !forced && now.Sub(ps.since) < w.settle {
			// Perhaps still being written (truncated, half copied): read it once it
			// has held still a while. Only the first scan trusts files at once,
			// and events, once quiet, tell when the writing is over.
			continue
		}
		racy := f != nil && f.readAt.Sub(f.stat.modTime) < racyWindow
		if !statChanged && !racy && !forced {
			continue
		}
		data, readStat, err := readFile(path)
		if err != nil {
			log.Warn("cannot read manifest; keeping its previous objects", "file", name, "error", err)
			continue
		}
		if !readStat.same(st) || int64(len(data)) != readStat.size {
			// Written to since the stat above: what was read may be half of it.
			polledNow[name] = polledStat{stat: readStat, since: time.Now()}
			continue
		}
		if f == nil {
			f = &manifestFile{}
			w.files[name] = f
		}
		f.stat, f.readAt = st, time.Now()
		if st.modTime.After(w.changedAt) {
			w.changedAt = st.modTime // the newest change read: where this state's changes began
		}
		sum := sha256.Sum256(data)
		if sum == f.sum {
			if statChanged {
				log.Debug("manifest rewritten without changes", "file", name)
			}
			continue
		}
		f.sum = sum
		objs, err := decodeManifests(data)
		if err != nil {
			log.Warn("cannot decode manifest; keeping its previous objects", "file", name, "error", err)
			continue
		}
		log.Debug("read manifest", "file", name,
			"services", len(objs.Services), "endpointSlices", len(objs.EndpointSlices), "nodes", len(objs.Nodes))
		f.objs, f.decoded = objs, true
		changed = true
	}
	for name := range w.pending {
		if !due[name] { // waiting for its events to be quiet: as it was
			if ps, ok := w.polled[name]; ok {
				polledNow[name] = ps
			}
			if w.files[name] != nil {
				seen[name] = true
			}
		}
	}
	for name := range w.files {
		if !seen[name] {
			log.Debug("manifest removed", "file", name)
			delete(w.files, name)
			changed = true
		}
	}
	return changed, nil
}

// readFile reads a file and stats it after reading, so the caller can tell
// whether it changed since an earlier stat.
func readFile(path string) ([]byte, fileStat, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileStat{}, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fileStat{}, fmt.Errorf("read %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStat{}, err
	}
	return data, statOf(fi), nil
}

// holdBack reports whether the first publish must wait: some manifest has
// never decoded and the startup grace is not over.
func (w *dirWatch) holdBack() bool {
	var pending []string
	for name := range w.polled {
		if f := w.files[name]; f == nil || !f.decoded {
			pending = append(pending, name)
		}
	}
	if len(pending) == 0 {
		return false
	}
	slices.Sort(pending)
	grace := w.src.StartupGrace
	if time.Since(w.begun) < grace {
		if !w.heldBack {
			w.heldBack = true
			w.src.log.Warn("holding back the first state until every manifest decodes",
				"files", pending, "grace", grace)
		}
		return true
	}
	w.src.log.Warn("publishing the first state without manifests that never decoded", "files", pending, "grace", grace)
	return false
}

// build merges every file's objects (in file name order) and builds the
// state. A service that is invalid keeps the shard last published for it, or,
// with none, a nil shard (the hub keeps what it holds).
// It runs only when some file's objects changed, so problems are logged
// again after each change, not at every poll.
func (w *dirWatch) build() State {
	var all Objects
	for _, name := range slices.Sorted(maps.Keys(w.files)) {
		o := w.files[name].objs
		all.Services = append(all.Services, o.Services...)
		all.EndpointSlices = append(all.EndpointSlices, o.EndpointSlices...)
		all.Nodes = append(all.Nodes, o.Nodes...)
	}
	w.src.servicesMu.Lock()
	w.src.services, w.src.servicesRead = all.Services, true
	w.src.servicesMu.Unlock()
	w.src.offerGateways()
	state, invalid, errs := BuildShards(all, w.src.opts)
	for _, k := range slices.SortedFunc(maps.Keys(invalid), registry.ServiceKey.Compare) {
		if last := w.published[k]; last != nil {
			state[k] = last
			w.src.log.Warn("invalid service; still publishing its last good form", "error", invalid[k])
		} else {
			// nil: the service exists but cannot be sent; a hub that holds a form
			// of it from an earlier spoke keeps that form.
			state[k] = nil
			w.src.log.Warn("invalid service; the hub keeps whatever it holds for it", "error", invalid[k])
		}
	}
	for _, err := range errs {
		w.src.log.Warn("ignored invalid input; the rest of the service is published", "error", err)
	}
	return state
}

func statesEqual(a, b State) bool {
	return maps.EqualFunc(a, b, (*registry.Shard).Equal)
}

func isManifest(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// manifestDecoder decodes the kinds a source cares about. Defaulting is not
// registered: BuildShards applies the few defaults it needs itself.
var manifestDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(fmt.Sprintf("spoke: register scheme: %v", err))
		}
	}
	return serializer.NewCodecFactory(scheme).UniversalDeserializer()
}()

// decodeManifests decodes every document of a YAML or JSON file. Objects of
// other kinds are ignored; any document that does not decode fails the
// whole file. Objects without a namespace are put in "default", as kubectl
// apply would.
func decodeManifests(data []byte) (Objects, error) {
	var objs Objects
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return Objects{}, fmt.Errorf("document %d: %w", i, err)
		}
		if err := decodeDocument(doc, &objs); err != nil {
			return Objects{}, fmt.Errorf("document %d: %w", i, err)
		}
	}
}

func decodeDocument(doc []byte, objs *Objects) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return nil // empty document, or only comments
	}
	obj, _, err := manifestDecoder.Decode(js, nil, nil)
	if runtime.IsNotRegisteredError(err) {
		return nil // a kind we do not watch
	}
	if err != nil {
		return err
	}
	switch o := obj.(type) {
	case *corev1.Service:
		defaultNamespace(&o.Namespace)
		objs.Services = append(objs.Services, o)
	case *discoveryv1.EndpointSlice:
		defaultNamespace(&o.Namespace)
		objs.EndpointSlices = append(objs.EndpointSlices, o)
	case *corev1.Node:
		objs.Nodes = append(objs.Nodes, o)
	case *corev1.List:
		for i, item := range o.Items {
			if err := decodeDocument(item.Raw, objs); err != nil {
				return fmt.Errorf("list item %d: %w", i, err)
			}
		}
	case *corev1.ServiceList:
		for i := range o.Items {
			defaultNamespace(&o.Items[i].Namespace)
			objs.Services = append(objs.Services, &o.Items[i])
		}
	case *discoveryv1.EndpointSliceList:
		for i := range o.Items {
			defaultNamespace(&o.Items[i].Namespace)
			objs.EndpointSlices = append(objs.EndpointSlices, &o.Items[i])
		}
	case *corev1.NodeList:
		for i := range o.Items {
			objs.Nodes = append(objs.Nodes, &o.Items[i])
		}
	}
	return nil
}

func defaultNamespace(ns *string) {
	if *ns == "" {
		*ns = corev1.NamespaceDefault
	}
}
