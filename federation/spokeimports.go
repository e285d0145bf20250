package federation

import (
	"fmt"
	"maps"
	"slices"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

// MaxImportMessageBytes is what a spoke that takes imports accepts in one
// message: an import travels whole, and one service of many clusters with
// many endpoints can outgrow the hub's chunk budget (4 MiB by default).
const MaxImportMessageBytes = 64 << 20

// ImportState is what the spoke's cluster must hold, as the hub last said.
// It is immutable. It outlives a broken session (fail-static): only the
// next hub's updates change it.
type ImportState struct {
	// Epoch and Version name the session and update it is as of.
	Epoch, Version uint64
	// Imports are the imports the cluster must hold.
	Imports map[registry.ServiceKey]*imports.Import
	// Authoritative: the hub's last full state was authoritative, so anything
	// not in Imports may be deleted. Otherwise only what Removed names may be.
	Authoritative bool
	// Removed names imports the hub removed since its last authoritative full state.
	Removed map[registry.ServiceKey]bool
	// Retained names imports the spoke refused in the form the hub has now:
	// the cluster keeps whatever it holds for them (perhaps written by an
	// earlier spoke process), until the hub removes them.
	Retained map[registry.ServiceKey]bool
	// CIDRs are the clusterset IP ranges.
	CIDRs []string
}

// Deletable says whether the cluster may delete an import it holds: one the
// hub removed, or, after an authoritative full state, any the hub does not name.
func (s *ImportState) Deletable(k registry.ServiceKey) bool {
	if s.Imports[k] != nil || s.Retained[k] {
		return false
	}
	return s.Authoritative || s.Removed[k]
}

// SetNamespaces tells the publisher the cluster's namespaces (a service is
// imported into every cluster that has its namespace). Safe from any
// goroutine; the last list wins. With OnImports set, Run sends nothing
// before the first list.
func (p *Publisher) SetNamespaces(names []string) {
	names = slices.Sorted(slices.Values(names))
	p.nsMu.Lock()
	p.ns, p.nsKnown = names, true
	p.nsMu.Unlock()
	select {
	case p.nsChanged <- struct{}{}:
	default:
	}
}

func (p *Publisher) namespaces() ([]string, bool) {
	p.nsMu.Lock()
	defer p.nsMu.Unlock()
	return p.ns, p.nsKnown
}

// ImportsWritten tells the publisher that the cluster holds the imports of
// the given session and version (the writer's report; safe from any
// goroutine, never blocks). The hub shows it to operators.
func (p *Publisher) ImportsWritten(epoch, version uint64) {
	for {
		select {
		case p.written <- [2]uint64{epoch, version}:
			return
		default:
		}
		select {
		case <-p.written: // drop an older report not yet sent
		default:
		}
	}
}

// ImportProblems tells the publisher the imports the cluster cannot hold
// (the writer's report: the whole set each time, empty when none). Safe from
// any goroutine, never blocks; the hub is told when its set changes, if it
// takes them (CapabilityImportProblems).
func (p *Publisher) ImportProblems(problems []ImportProblem) {
	problems = slices.Clone(problems)
	slices.SortFunc(problems, func(a, b ImportProblem) int { return a.Service.Compare(b.Service) })
	problems = slices.CompactFunc(problems, func(a, b ImportProblem) bool { return a.Service == b.Service })
	p.problemsMu.Lock()
	p.problems = problems
	p.problemsMu.Unlock()
	select {
	case p.problemsChanged <- struct{}{}:
	default:
	}
}

func (p *Publisher) importProblems() []ImportProblem {
	p.problemsMu.Lock()
	defer p.problemsMu.Unlock()
	return p.problems
}

// spokeImports is the spoke end of one session's import stream, owned by Run's goroutine.
type spokeImports struct {
	s *spokeSession
	// version is the last update applied (or refused) in this session.
	version uint64
	// acc is the update whose chunks are arriving (nil between updates).
	acc *importChunks
	// spoiled is a version one of whose chunks was refused: its later chunks are dropped unanswered.
	spoiled uint64
	// problemsTaken: the hub takes ImportProblems (CapabilityImportProblems);
	// problemsSent is the set last sent in this session.
	problemsTaken bool
	problemsSent  []ImportProblem
}

// importChunks are the chunks of one update received so far.
type importChunks struct {
	version       uint64
	full          bool
	upserts       map[registry.ServiceKey]*imports.Import
	removes       []registry.ServiceKey
	retain        []registry.ServiceKey
	authoritative bool
	cidrs         []string
}

// update takes one chunk of an import update, applies the update once its
// last chunk arrives, and answers the chunk.
func (si *spokeImports) update(u *fedv1.ImportUpdate) error {
	p := si.s.p
	v := u.GetVersion()
	if v == si.spoiled {
		return nil // refused already, answered once
	}
	rj := si.check(u)
	if len(rj) == 0 {
		if si.acc == nil {
			si.acc = &importChunks{version: v, full: u.GetFullState(), upserts: map[registry.ServiceKey]*imports.Import{}}
		}
		for _, in := range u.GetUpserts() {
			imp, err := ImportFromProto(in, registry.DefaultLimits())
			if err != nil {
				k := KeyFromProto(in.GetService())
				rj = append(rj, reject(&k, "%v", err)...)
				continue
			}
			si.acc.upserts[imp.Service] = imp
		}
		for _, k := range u.GetRemoves() {
			si.acc.removes = append(si.acc.removes, KeyFromProto(k))
		}
		for _, k := range u.GetRetain() {
			si.acc.retain = append(si.acc.retain, KeyFromProto(k))
		}
		if u.GetLastChunk() {
			si.acc.authoritative, si.acc.cidrs = u.GetAuthoritative(), u.GetClustersetCidrs()
		}
	}
	if len(rj) > 0 {
		si.acc, si.spoiled, si.version = nil, v, max(si.version, v)
		p.log.Warn("refused an import update", "version", v, "reason", rj.Error())
		return si.s.send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportNack{ImportNack: &fedv1.Nack{
			Nonce: u.GetNonce(), Version: v, Rejections: rj}}})
	}
	if !u.GetLastChunk() {
		return si.ack(u)
	}
	next := si.acc.apply(p.imports, si.s.epoch)
	si.acc, si.version = nil, v
	p.imports = next
	if err := si.ack(u); err != nil {
		return err
	}
	p.cfg.OnImports(*next)
	return nil
}

// apply returns the state held after the update, given the state held before.
func (c *importChunks) apply(held *ImportState, epoch uint64) *ImportState {
	next := &ImportState{Epoch: epoch, Version: c.version, Authoritative: held.Authoritative, CIDRs: held.CIDRs,
		Imports: maps.Clone(held.Imports), Removed: maps.Clone(held.Removed), Retained: maps.Clone(held.Retained)}
	if next.Retained == nil {
		next.Retained = map[registry.ServiceKey]bool{}
	}
	if c.full {
		next.CIDRs = c.cidrs
		if c.authoritative {
			// What the hub names, and what the spoke refused and keeps; nothing else.
			next.Imports, next.Removed, next.Retained, next.Authoritative =
				c.upserts, map[registry.ServiceKey]bool{}, map[registry.ServiceKey]bool{}, true
			for _, k := range c.retain {
				next.Retained[k] = true
				if imp := held.Imports[k]; imp != nil {
					next.Imports[k] = imp
				}
			}
			return next
		}
		// Not authoritative: add and update; delete only what a hub removed by name.
		next.Authoritative = false
		for _, k := range c.retain {
			next.Retained[k] = true
		}
	}
	for k, imp := range c.upserts {
		next.Imports[k] = imp
		delete(next.Removed, k)
		delete(next.Retained, k)
	}
	for _, k := range c.removes {
		delete(next.Imports, k)
		delete(next.Retained, k)
		next.Removed[k] = true
	}
	return next
}

// check refuses a chunk out of order or of the wrong shape (nothing of its update is applied).
func (si *spokeImports) check(u *fedv1.ImportUpdate) rejection {
	v := u.GetVersion()
	switch {
	case u.GetFullState() && len(u.GetRemoves()) > 0:
		return reject(nil, "an import full state cannot remove imports")
	case !u.GetFullState() && len(u.GetRetain()) > 0:
		return reject(nil, "only an import full state can retain imports")
	case si.acc != nil && si.acc.version == v && si.acc.full == u.GetFullState():
		return nil // the next chunk
	case si.acc != nil:
		return reject(nil, "import update %d before the last chunk of update %d", v, si.acc.version)
	case v <= si.version:
		return reject(nil, "import version %d is not above the last applied version %d", v, si.version)
	}
	return nil
}

func (si *spokeImports) ack(u *fedv1.ImportUpdate) error {
	return si.s.send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportAck{ImportAck: &fedv1.Ack{
		Nonce: u.GetNonce(), Version: u.GetVersion()}}})
}

// sendNamespaces tells the hub the cluster's namespaces changed.
func (si *spokeImports) sendNamespaces() error {
	names, _ := si.s.p.namespaces()
	return si.s.send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Namespaces{Namespaces: &fedv1.Namespaces{Names: names}}})
}

// sendWritten forwards the writer's report when it is about this session.
func (si *spokeImports) sendWritten(w [2]uint64) error {
	if w[0] != si.s.epoch || w[1] > si.version {
		return nil
	}
	return si.s.send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportsWritten{ImportsWritten: &fedv1.ImportsWritten{Version: w[1]}}})
}

// sendProblems sends the writer's problem set when it differs from what the
// session last sent, to a hub that takes it.
func (si *spokeImports) sendProblems() error {
	ps := si.s.p.importProblems()
	if !si.problemsTaken || slices.Equal(ps, si.problemsSent) {
		return nil
	}
	if err := si.s.send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportProblems{ImportProblems: importProblemsToProto(ps)}}); err != nil {
		return err
	}
	si.problemsSent = ps
	return nil
}

func (s *spokeSession) send(m *fedv1.SpokeMessage) error {
	if err := s.stream.Send(m); err != nil {
		return fmt.Errorf("send %T: %w", m.GetKind(), err)
	}
	return nil
}
