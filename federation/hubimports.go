package federation

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/adminapi"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// ImportStatus is where one spoke session's import stream stands, for
// operators: the admin API's JSON (adminapi), served as it is.
type ImportStatus = adminapi.ImportStatus

// maxListed bounds the services an ImportStatus names.
const maxListed = 100

// ImportStatuses returns the import stream of every session this hub serves.
func (h *HubServer) ImportStatuses() []ImportStatus {
	h.importsMu.Lock()
	defer h.importsMu.Unlock()
	out := slices.Collect(maps.Values(h.importStatus))
	slices.SortFunc(out, func(a, b ImportStatus) int { return strings.Compare(string(a.Cluster), string(b.Cluster)) })
	return out
}

func (h *HubServer) setImportStatus(st ImportStatus) {
	h.importsMu.Lock()
	defer h.importsMu.Unlock()
	if old, ok := h.importStatus[st.Cluster]; ok && old.Epoch > st.Epoch {
		return
	}
	h.importStatus[st.Cluster] = st
}

func (h *HubServer) dropImportStatus(cluster registry.ClusterID, epoch uint64) {
	h.importsMu.Lock()
	defer h.importsMu.Unlock()
	if old, ok := h.importStatus[cluster]; ok && old.Epoch == epoch {
		delete(h.importStatus, cluster)
	}
}

// hubImports is the hub end of one session's import stream, owned by the
// session's goroutine. One update (the chunks of one full state) is in
// flight at a time; the next delta is computed against what the spoke acked,
// so changes that arrive meanwhile are merged into it.
//
// A delta looks only at the dirty services: those whose import changed in
// the hub's set since the session last looked (the set's chain says which),
// and those of an update the spoke refused. A full state, a change of
// namespaces, or a set the chain does not reach back to makes the next
// delta compare whole, as every delta did before. What report publishes is
// kept as those change, so that it costs what changed too.
type hubImports struct {
	s          *hubSession
	namespaces map[string]bool
	names      []string // the namespaces, sorted
	set        *ImportSet
	changed    <-chan struct{}
	version    uint64
	// acked is what the spoke acknowledged; sending what acked becomes once
	// the update in flight is acknowledged. Persistent, so that a delta
	// makes sending in what it changes.
	acked, sending         ImportMap
	ackedAuth, sendingAuth bool
	inflight               []string // nonces of the chunks in flight, oldest first
	inflightFull           bool
	// inflightKeys are the services the delta in flight upserts or removes:
	// the only ones whose acked form its ack changes, dirty again if refused.
	inflightKeys          []registry.ServiceKey
	spoiled               uint64 // a version the spoke refused: answers to its other chunks are ignored
	ackedVersion, written uint64
	refused               map[registry.ServiceKey]*imports.Import // forms the spoke refused
	refusedWhy            map[registry.ServiceKey]string
	// retained names imports the spoke keeps in its own form (sent in a full
	// state's retain list): a remove is sent for them once the hub has them no more.
	retained map[registry.ServiceKey]bool
	// unretain are the retained services the delta in flight upserts or
	// removes: kept no more once it is acknowledged.
	unretain []registry.ServiceKey
	sentOnce bool
	// dirty names the services whose import the spoke should hold may differ
	// from what it acked (or whose refusal or retention may have to go); with
	// whole, every service may, and the next delta compares whole.
	dirty map[registry.ServiceKey]struct{}
	whole bool
	// What report publishes, kept as the set, the namespaces and acks
	// change: how many imports the spoke should hold, how many of those it
	// acked as they are, and the services that differ from what it acked
	// (sorted by name).
	wanted, ackedCount int
	pending            []string
	// problems is the spoke's last problem set (ImportProblems), of imports
	// the cluster should hold or holds when it came; problemsOmitted counts
	// those the spoke left out of it.
	problems        []ImportProblem
	problemsOmitted int
}

func newHubImports(s *hubSession, namespaces []string) *hubImports {
	im := &hubImports{s: s, refused: map[registry.ServiceKey]*imports.Import{}, refusedWhy: map[registry.ServiceKey]string{},
		retained: map[registry.ServiceKey]bool{}, dirty: map[registry.ServiceKey]struct{}{}}
	im.setNamespaces(namespaces)
	return im
}

func (im *hubImports) setNamespaces(names []string) {
	im.namespaces = make(map[string]bool, len(names))
	for _, n := range names {
		im.namespaces[n] = true
	}
	im.names = slices.Sorted(maps.Keys(im.namespaces))
	im.whole = true // any import may come or go
	if im.set != nil {
		im.recount()
	}
}

// wants returns the import of k the spoke's cluster should hold of the current set, or nil.
func (im *hubImports) wants(k registry.ServiceKey) *imports.Import {
	if !imports.Wanted(k, func(ns string) bool { return im.namespaces[ns] }) {
		return nil
	}
	imp, _ := im.set.Imports.Get(k)
	return imp
}

// want is what the spoke's cluster should hold of the current set.
func (im *hubImports) want() map[registry.ServiceKey]*imports.Import {
	out := make(map[registry.ServiceKey]*imports.Import)
	for k, imp := range im.set.Imports.All() {
		if imports.Wanted(k, func(ns string) bool { return im.namespaces[ns] }) {
			out[k] = imp
		}
	}
	return out
}

// same says whether a and b are the same form of an import (either may be nil).
func same(a, b *imports.Import) bool { return a == b || a.Equal(b) }

// follow makes set the one the session looks at: the services that changed
// since the last one are dirty, and the counts follow them.
func (im *hubImports) follow(set *ImportSet) {
	if set == im.set {
		return
	}
	keys, ok := set.ChangedSince(im.set)
	if !ok {
		im.set, im.whole = set, true
		im.recount()
		return
	}
	for _, k := range keys {
		im.count(k, -1)
	}
	im.set = set
	for _, k := range keys {
		im.count(k, 1)
		if !im.whole { // a whole comparison is due: it looks at every key
			im.dirty[k] = struct{}{}
		}
	}
	// While an update is in flight (a spoke may never answer), sets keep
	// coming and name new services: past what the set and acked hold, the
	// next delta compares whole, which costs no more than the dirty set would.
	if len(im.dirty) > im.set.Imports.Len()+im.acked.Len()+64 {
		im.dirty, im.whole = map[registry.ServiceKey]struct{}{}, true
	}
}

// count adds (sign 1) or takes back (-1) what k adds to the counts report
// publishes, as the set and acked hold it now.
func (im *hubImports) count(k registry.ServiceKey, sign int) {
	imp := im.wants(k)
	old, held := im.acked.Get(k)
	switch {
	case imp != nil && same(old, imp):
		im.wanted += sign
		im.ackedCount += sign
	case imp != nil:
		im.wanted += sign
		im.countPending(k, sign)
	case held:
		im.countPending(k, sign)
	}
}

func (im *hubImports) countPending(k registry.ServiceKey, sign int) {
	name := k.String()
	i, found := slices.BinarySearch(im.pending, name)
	switch {
	case sign > 0 && !found:
		im.pending = slices.Insert(im.pending, i, name)
	case sign < 0 && found:
		im.pending = slices.Delete(im.pending, i, i+1)
	}
}

// recount makes the counts report publishes again from the whole set and
// acked: after what changed every service (a full state acknowledged, the
// namespaces) or a set the chain does not reach.
func (im *hubImports) recount() {
	im.wanted, im.ackedCount, im.pending = 0, 0, nil
	for k, imp := range im.set.Imports.All() {
		if !imports.Wanted(k, func(ns string) bool { return im.namespaces[ns] }) {
			continue
		}
		im.wanted++
		if old, _ := im.acked.Get(k); same(old, imp) {
			im.ackedCount++
		} else {
			im.pending = append(im.pending, k.String())
		}
	}
	for k := range im.acked.Keys() {
		if im.wants(k) == nil {
			im.pending = append(im.pending, k.String())
		}
	}
	slices.Sort(im.pending)
}

// lookAt returns the services the next delta looks at, sorted: the dirty
// ones, or every one the spoke should hold, acked or retained.
func (im *hubImports) lookAt() []registry.ServiceKey {
	var keys []registry.ServiceKey
	if im.whole {
		for k := range im.set.Imports.Keys() {
			if imports.Wanted(k, func(ns string) bool { return im.namespaces[ns] }) {
				keys = append(keys, k)
			}
		}
		keys = slices.AppendSeq(keys, im.acked.Keys())
		keys = slices.AppendSeq(keys, maps.Keys(im.retained))
	} else {
		keys = slices.AppendSeq(make([]registry.ServiceKey, 0, len(im.dirty)), maps.Keys(im.dirty))
	}
	slices.SortFunc(keys, registry.ServiceKey.Compare)
	return slices.Compact(keys)
}

// next sends what the spoke should hold next, unless an update is in flight:
// a full state first (and again when the hub's set turns authoritative), then deltas.
func (im *hubImports) next() error {
	var set *ImportSet
	set, im.changed = im.s.h.imports.Imports()
	im.follow(set)
	if len(im.inflight) > 0 {
		return nil // the answer sends what changed meanwhile
	}
	// Refusals are few (and report lists them all): looked at whole.
	for k := range im.refused {
		if im.wants(k) == nil { // gone from the hub: its refusal means nothing any more
			delete(im.refused, k)
			delete(im.refusedWhy, k)
		}
	}
	if !im.sentOnce || im.set.Authoritative && !im.ackedAuth {
		return im.sendFull()
	}
	keys := im.lookAt()
	im.dirty, im.whole = map[registry.ServiceKey]struct{}{}, false // not clear: its cost is the most it ever held
	var upserts []*imports.Import
	var removes []registry.ServiceKey
	for _, k := range keys {
		imp := im.wants(k)
		old, held := im.acked.Get(k)
		switch {
		case imp == nil:
			if held {
				removes = append(removes, k)
			}
		case same(old, imp):
		case im.refused[k] != nil && same(im.refused[k], imp):
			// refused in this form: not again until it changes
		default:
			upserts = append(upserts, imp)
		}
	}
	// What the spoke keeps in its own form goes too once the hub has it no
	// more; it is kept no more once the spoke acknowledges that, or takes
	// the hub's form again (a refused update leaves it kept).
	im.unretain = im.unretain[:0]
	for _, k := range keys {
		if im.retained[k] && im.wants(k) == nil {
			removes = append(removes, k)
			im.unretain = append(im.unretain, k)
		}
	}
	for _, imp := range upserts {
		if im.retained[imp.Service] {
			im.unretain = append(im.unretain, imp.Service)
		}
	}
	if len(upserts) == 0 && len(removes) == 0 {
		im.report()
		return nil
	}
	next := im.acked.Builder()
	for _, imp := range upserts {
		next.Set(imp.Service, imp)
	}
	for _, k := range removes {
		next.Delete(k)
	}
	return im.send(false, next.Map(), removes, upserts, nil)
}

// sendFull sends everything the spoke should hold, but for the services
// whose form it refused: it keeps its own form of those (retain), even
// under an authoritative full state.
func (im *hubImports) sendFull() error {
	want := im.want()
	clear(im.retained)
	var list []*imports.Import
	var retain []*fedv1.ServiceKey
	next := ImportMap{}.Builder()
	for _, k := range slices.SortedFunc(maps.Keys(want), registry.ServiceKey.Compare) {
		if r := im.refused[k]; r != nil && same(r, want[k]) {
			retain = append(retain, KeyToProto(k))
			im.retained[k] = true
			continue
		}
		list = append(list, want[k])
		next.Set(k, want[k])
	}
	// The full state is the whole comparison: what changes after it is dirty.
	im.dirty, im.whole, im.unretain = map[registry.ServiceKey]struct{}{}, false, im.unretain[:0]
	return im.send(true, next.Map(), nil, list, retain)
}

// send sends a full state or a delta, in chunks, and records what acked
// becomes once they are acknowledged.
func (im *hubImports) send(full bool, next ImportMap, removes []registry.ServiceKey, list []*imports.Import, retain []*fedv1.ServiceKey) error {
	im.version++
	encoded := make([]*fedv1.Import, len(list))
	for i, imp := range list {
		encoded[i] = ImportToProto(imp)
	}
	head := &fedv1.ImportUpdate{Version: im.version, FullState: full, Authoritative: full && im.set.Authoritative}
	if full {
		head.ClustersetCidrs = im.set.CIDRs
	}
	chunks := chunkImports(head, removes, encoded, im.s.h.cfg.MaxMessageBytes-retainBytes(retain))
	chunks[len(chunks)-1].Retain = retain
	im.inflight, im.inflightFull = im.inflight[:0], full
	im.inflightKeys = im.inflightKeys[:0]
	if !full {
		for _, imp := range list {
			im.inflightKeys = append(im.inflightKeys, imp.Service)
		}
		im.inflightKeys = append(im.inflightKeys, removes...)
	}
	for i, c := range chunks {
		c.Nonce = fmt.Sprintf("import-%d.%d", im.version, i)
		im.inflight = append(im.inflight, c.Nonce)
	}
	for _, c := range chunks {
		if err := im.s.send(&fedv1.HubMessage{Kind: &fedv1.HubMessage_Imports{Imports: c}}); err != nil {
			return err
		}
	}
	im.sending, im.sendingAuth, im.sentOnce = next, head.Authoritative || !full && im.ackedAuth, true
	im.s.log.Debug("sent imports", "version", im.version, "full", full, "upserts", len(list), "removes", len(removes), "chunks", len(chunks))
	im.report()
	return nil
}

// retainBytes is what a retain list adds to the last chunk.
func retainBytes(retain []*fedv1.ServiceKey) int {
	n := 0
	for _, k := range retain {
		n += proto.Size(k) + 8
	}
	return n
}

// answered takes the answer to the oldest chunk in flight; stale is an
// answer to a chunk of an update the spoke already refused (ignored).
func (im *hubImports) answered(nonce string, version uint64) (last, stale bool, err error) {
	if version == im.spoiled && version != im.version {
		return false, true, nil
	}
	if len(im.inflight) == 0 || im.inflight[0] != nonce || version != im.version {
		return false, false, fmt.Errorf("import answer for nonce %q (version %d), which is not the oldest in flight", nonce, version)
	}
	im.inflight = im.inflight[1:]
	return len(im.inflight) == 0, false, nil
}

func (im *hubImports) ack(a *fedv1.Ack) error {
	last, stale, err := im.answered(a.GetNonce(), a.GetVersion())
	if err != nil || !last || stale {
		return err
	}
	if im.inflightFull {
		im.acked = im.sending
		im.recount()
	} else {
		for _, k := range im.inflightKeys {
			im.count(k, -1)
		}
		im.acked = im.sending
		for _, k := range im.inflightKeys {
			im.count(k, 1)
		}
	}
	im.ackedAuth, im.ackedVersion = im.sendingAuth, a.GetVersion()
	for _, k := range im.unretain {
		delete(im.retained, k)
	}
	im.unretain = im.unretain[:0]
	// A refusal ends once the spoke holds the hub's current form: not while
	// it holds an older one (that form would be sent, and refused, again
	// after every acknowledgement).
	for k, r := range im.refused {
		if cur, _ := im.acked.Get(k); cur != nil && !same(cur, r) && same(cur, im.wants(k)) {
			delete(im.refused, k)
			delete(im.refusedWhy, k)
			im.dirty[k] = struct{}{} // its current form may be sent again
		}
	}
	return im.next()
}

// nack records what the spoke refused. Nothing of the update was applied
// (a refused chunk spoils its whole full state): the services it names are
// not sent again in that form, and the rest is sent again.
func (im *hubImports) nack(n *fedv1.Nack) error {
	if _, stale, err := im.answered(n.GetNonce(), n.GetVersion()); err != nil || stale {
		return err
	}
	// The update is dropped whole: its later chunks go unanswered.
	im.inflight, im.spoiled = nil, n.GetVersion()
	if im.inflightFull {
		im.sentOnce = false // send a full state again, without what was refused
	}
	for _, k := range im.inflightKeys { // not applied: looked at again
		im.dirty[k] = struct{}{}
	}
	im.unretain = im.unretain[:0] // still kept by the spoke
	named := false
	for _, r := range n.GetRejections() {
		if r.GetService() == nil {
			continue
		}
		k := KeyFromProto(r.GetService())
		if imp, _ := im.sending.Get(k); imp != nil {
			im.refused[k], im.refusedWhy[k], named = imp, r.GetReason(), true
			im.dirty[k] = struct{}{}
		}
	}
	im.s.log.Warn("spoke refused imports", "version", n.GetVersion(), "services", len(n.GetRejections()))
	if !named {
		// Nothing to hold back by name: retrying the same update would loop.
		return fmt.Errorf("spoke refused import update %d: %s", n.GetVersion(), rejection(n.GetRejections()).Error())
	}
	return im.next()
}

func (im *hubImports) report() {
	st := ImportStatus{Cluster: im.s.cluster, Epoch: im.s.epoch, Namespaces: len(im.namespaces), Imports: im.wanted,
		Acked: im.ackedCount, Pending: len(im.pending), SentVersion: im.version, AckedVersion: im.ackedVersion,
		WrittenVersion: im.written, Authoritative: im.ackedAuth, NamespaceNames: im.names, UpdatedAt: time.Now()}
	if len(im.pending) > 0 { // a copy: the status outlives this list's changes
		st.PendingServices = slices.Clone(im.pending[:min(len(im.pending), maxListed)])
	}
	if len(im.refusedWhy) > 0 {
		st.Refused = map[string]string{}
		for k, why := range im.refusedWhy {
			st.Refused[k.String()] = why
		}
	}
	for _, p := range im.problems {
		if im.wants(p.Service) != nil {
			if st.BlockedCount++; len(st.Blocked) < maxListed {
				st.Blocked = append(st.Blocked, p)
			}
		}
	}
	st.BlockedCount += im.problemsOmitted
	im.s.h.setImportStatus(st)
}

// setProblems takes the spoke's problem set. Only problems of imports the
// cluster should hold or holds are kept: a set is bounded by its imports.
func (im *hubImports) setProblems(m *fedv1.ImportProblems) error {
	ps, err := importProblemsFromProto(m)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	kept := ps[:0]
	for _, p := range ps {
		if _, held := im.acked.Get(p.Service); held || im.wants(p.Service) != nil {
			kept = append(kept, p)
		}
	}
	im.problems = slices.Clip(kept)
	im.problemsOmitted = min(int(m.GetOmitted()), max(im.wanted, im.acked.Len()))
	im.s.log.Debug("spoke reports imports it cannot write", "blocked", len(kept)+im.problemsOmitted)
	im.report()
	return nil
}

// handle takes one of the spoke's import-stream messages.
func (im *hubImports) handle(m *fedv1.SpokeMessage) error {
	switch k := m.GetKind().(type) {
	case *fedv1.SpokeMessage_Namespaces:
		im.setNamespaces(k.Namespaces.GetNames())
		return im.next()
	case *fedv1.SpokeMessage_ImportAck:
		return im.ack(k.ImportAck)
	case *fedv1.SpokeMessage_ImportNack:
		return im.nack(k.ImportNack)
	case *fedv1.SpokeMessage_ImportProblems:
		return im.setProblems(k.ImportProblems)
	case *fedv1.SpokeMessage_ImportsWritten:
		if v := k.ImportsWritten.GetVersion(); v <= im.version && v > im.written {
			im.written = v
			im.report()
		}
		return nil
	}
	return fmt.Errorf("unexpected %T", m.GetKind())
}

// welcomeCapabilities are what the hub's welcome announces: import problems
// only when it serves imports.
func (h *HubServer) welcomeCapabilities() []string {
	caps := []string{CapabilityGateways, CapabilityTraffic}
	if h.imports != nil {
		caps = append(caps, CapabilityImportProblems)
	}
	return caps
}
