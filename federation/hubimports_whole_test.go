package federation

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// wholeImports is hubImports as it was before it looked only at what
// changed (issue 25; its code as it was, but for reading the set's
// persistent map): every delta and every report compared the whole set
// with what the spoke acked. It is the model TestHubImportsAgainstWhole
// holds hubImports to, message for message and status for status.
type wholeImports struct {
	s          *hubSession
	namespaces map[string]bool
	set        *ImportSet
	changed    <-chan struct{}
	version    uint64
	// acked is what the spoke acknowledged; sending what acked becomes once
	// the update in flight is acknowledged.
	acked, sending         map[registry.ServiceKey]*imports.Import
	ackedAuth, sendingAuth bool
	inflight               []string // nonces of the chunks in flight, oldest first
	inflightFull           bool
	spoiled                uint64 // a version the spoke refused: answers to its other chunks are ignored
	ackedVersion, written  uint64
	refused                map[registry.ServiceKey]*imports.Import // forms the spoke refused
	refusedWhy             map[registry.ServiceKey]string
	// retained names imports the spoke keeps in its own form (sent in a full
	// state's retain list): a remove is sent for them once the hub has them no more.
	retained map[registry.ServiceKey]bool
	unretain []registry.ServiceKey // retained services the delta in flight upserts or removes
	sentOnce bool
	// problems is the spoke's last problem set (ImportProblems), of imports
	// the cluster should hold or holds when it came; problemsOmitted counts
	// those the spoke left out of it.
	problems        []ImportProblem
	problemsOmitted int
}

func newWholeImports(s *hubSession, namespaces []string) *wholeImports {
	im := &wholeImports{s: s, acked: map[registry.ServiceKey]*imports.Import{},
		refused: map[registry.ServiceKey]*imports.Import{}, refusedWhy: map[registry.ServiceKey]string{},
		retained: map[registry.ServiceKey]bool{}}
	im.setNamespaces(namespaces)
	return im
}

func (im *wholeImports) setNamespaces(names []string) {
	im.namespaces = make(map[string]bool, len(names))
	for _, n := range names {
		im.namespaces[n] = true
	}
}

// want is what the spoke's cluster should hold of the current set.
func (im *wholeImports) want() map[registry.ServiceKey]*imports.Import {
	out := make(map[registry.ServiceKey]*imports.Import)
	for k, imp := range im.set.Imports.All() {
		if imports.Wanted(k, func(ns string) bool { return im.namespaces[ns] }) {
			out[k] = imp
		}
	}
	return out
}

// next sends what the spoke should hold next, unless an update is in flight:
// a full state first (and again when the hub's set turns authoritative), then deltas.
func (im *wholeImports) next() error {
	im.set, im.changed = im.s.h.imports.Imports()
	if len(im.inflight) > 0 {
		return nil // the answer sends what changed meanwhile
	}
	want := im.want()
	for k := range im.refused {
		if want[k] == nil { // gone from the hub: its refusal means nothing any more
			delete(im.refused, k)
			delete(im.refusedWhy, k)
		}
	}
	if !im.sentOnce || im.set.Authoritative && !im.ackedAuth {
		return im.send(true, want, nil, want)
	}
	var upserts []*imports.Import
	var removes []registry.ServiceKey
	for _, k := range slices.SortedFunc(maps.Keys(want), registry.ServiceKey.Compare) {
		imp := want[k]
		if old := im.acked[k]; old == imp || old != nil && old.Equal(imp) {
			continue
		}
		if r := im.refused[k]; r != nil && (r == imp || r.Equal(imp)) {
			continue // refused in this form: not again until it changes
		}
		upserts = append(upserts, imp)
	}
	for _, k := range slices.SortedFunc(maps.Keys(im.acked), registry.ServiceKey.Compare) {
		if want[k] == nil {
			removes = append(removes, k)
		}
	}
	// What the spoke keeps in its own form goes too once the hub has it no more.
	im.unretain = nil
	for _, k := range slices.SortedFunc(maps.Keys(im.retained), registry.ServiceKey.Compare) {
		if want[k] == nil {
			removes = append(removes, k)
			im.unretain = append(im.unretain, k)
		}
	}
	for _, imp := range upserts {
		if im.retained[imp.Service] {
			im.unretain = append(im.unretain, imp.Service) // the spoke takes the hub's form again, once it acks
		}
	}
	if len(upserts) == 0 && len(removes) == 0 {
		im.report()
		return nil
	}
	next := maps.Clone(im.acked)
	for _, imp := range upserts {
		next[imp.Service] = imp
	}
	for _, k := range removes {
		delete(next, k)
	}
	return im.send(false, next, removes, upserts)
}

// send sends a full state (upserts is every import, given as a map) or a
// delta, in chunks, and records what acked becomes once they are acknowledged.
func (im *wholeImports) send(full bool, next map[registry.ServiceKey]*imports.Import, removes []registry.ServiceKey, upserts any) error {
	var list []*imports.Import
	var retain []*fedv1.ServiceKey
	switch u := upserts.(type) {
	case map[registry.ServiceKey]*imports.Import:
		clear(im.retained)
		im.unretain = nil
		for _, k := range slices.SortedFunc(maps.Keys(u), registry.ServiceKey.Compare) {
			if r := im.refused[k]; r != nil && (r == u[k] || r.Equal(u[k])) {
				// The spoke keeps its own form of a refused import, even under an authoritative full state.
				delete(next, k)
				retain = append(retain, KeyToProto(k))
				im.retained[k] = true
				continue
			}
			list = append(list, u[k])
		}
	case []*imports.Import:
		list = u
	}
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

// answered takes the answer to the oldest chunk in flight; stale is an
// answer to a chunk of an update the spoke already refused (ignored).
func (im *wholeImports) answered(nonce string, version uint64) (last, stale bool, err error) {
	if version == im.spoiled && version != im.version {
		return false, true, nil
	}
	if len(im.inflight) == 0 || im.inflight[0] != nonce || version != im.version {
		return false, false, fmt.Errorf("import answer for nonce %q (version %d), which is not the oldest in flight", nonce, version)
	}
	im.inflight = im.inflight[1:]
	return len(im.inflight) == 0, false, nil
}

func (im *wholeImports) ack(a *fedv1.Ack) error {
	last, stale, err := im.answered(a.GetNonce(), a.GetVersion())
	if err != nil || !last || stale {
		return err
	}
	im.acked, im.ackedAuth, im.ackedVersion = im.sending, im.sendingAuth, a.GetVersion()
	for _, k := range im.unretain {
		delete(im.retained, k)
	}
	im.unretain = nil
	want := im.want()
	for k, r := range im.refused {
		if cur := im.acked[k]; cur != nil && cur != r && !cur.Equal(r) && want[k] != nil && (cur == want[k] || cur.Equal(want[k])) {
			delete(im.refused, k)
			delete(im.refusedWhy, k)
		}
	}
	return im.next()
}

// nack records what the spoke refused. Nothing of the update was applied
// (a refused chunk spoils its whole full state): the services it names are
// not sent again in that form, and the rest is sent again.
func (im *wholeImports) nack(n *fedv1.Nack) error {
	if _, stale, err := im.answered(n.GetNonce(), n.GetVersion()); err != nil || stale {
		return err
	}
	// The update is dropped whole: its later chunks go unanswered.
	im.inflight, im.spoiled, im.unretain = nil, n.GetVersion(), nil
	if im.inflightFull {
		im.sentOnce = false // send a full state again, without what was refused
	}
	named := false
	for _, r := range n.GetRejections() {
		if r.GetService() == nil {
			continue
		}
		k := KeyFromProto(r.GetService())
		if imp := im.sending[k]; imp != nil {
			im.refused[k], im.refusedWhy[k], named = imp, r.GetReason(), true
		}
	}
	im.s.log.Warn("spoke refused imports", "version", n.GetVersion(), "services", len(n.GetRejections()))
	if !named {
		// Nothing to hold back by name: retrying the same update would loop.
		return fmt.Errorf("spoke refused import update %d: %s", n.GetVersion(), rejection(n.GetRejections()).Error())
	}
	return im.next()
}

func (im *wholeImports) report() {
	want := im.want()
	st := ImportStatus{Cluster: im.s.cluster, Epoch: im.s.epoch, Namespaces: len(im.namespaces), Imports: len(want),
		SentVersion: im.version, AckedVersion: im.ackedVersion, WrittenVersion: im.written,
		Authoritative: im.ackedAuth, UpdatedAt: time.Now()}
	var pending []string
	for k, imp := range want {
		if old := im.acked[k]; old == imp || old != nil && old.Equal(imp) {
			st.Acked++
		} else {
			pending = append(pending, k.String())
		}
	}
	for k := range im.acked {
		if want[k] == nil {
			pending = append(pending, k.String())
		}
	}
	slices.Sort(pending)
	st.Pending, st.PendingServices = len(pending), pending[:min(len(pending), maxListed)]
	st.NamespaceNames = slices.Sorted(maps.Keys(im.namespaces))
	if len(im.refusedWhy) > 0 {
		st.Refused = map[string]string{}
		for k, why := range im.refusedWhy {
			st.Refused[k.String()] = why
		}
	}
	for _, p := range im.problems {
		if want[p.Service] != nil {
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
func (im *wholeImports) setProblems(m *fedv1.ImportProblems) error {
	ps, err := importProblemsFromProto(m)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	want := im.want()
	kept := ps[:0]
	for _, p := range ps {
		if want[p.Service] != nil || im.acked[p.Service] != nil {
			kept = append(kept, p)
		}
	}
	im.problems = slices.Clip(kept)
	im.problemsOmitted = min(int(m.GetOmitted()), max(len(want), len(im.acked)))
	im.s.log.Debug("spoke reports imports it cannot write", "blocked", len(kept)+im.problemsOmitted)
	im.report()
	return nil
}

// handle takes one of the spoke's import-stream messages.
func (im *wholeImports) handle(m *fedv1.SpokeMessage) error {
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
