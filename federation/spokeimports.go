package federation

import (
	"fmt"
	"maps"
	"slices"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
)

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
	// CIDRs are the clusterset IP ranges.
	CIDRs []string
}

// Deletable says whether the cluster may delete an import it holds: one the
// hub removed, or, after an authoritative full state, any the hub does not name.
func (s *ImportState) Deletable(k registry.ServiceKey) bool {
	if s.Imports[k] != nil {
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

// spokeImports is the spoke end of one session's import stream, owned by Run's goroutine.
type spokeImports struct {
	s *spokeSession
	// version is the last update applied (or refused) in this session.
	version uint64
	// A full state in progress: its version and the imports of its chunks so far.
	fullVersion uint64
	full        map[registry.ServiceKey]*imports.Import
	spoiled     uint64
}

// update applies one import update (a full state once its last chunk
// arrives) and answers it.
func (si *spokeImports) update(u *fedv1.ImportUpdate) error {
	p := si.s.p
	v := u.GetVersion()
	rj := si.check(u)
	var upserts []*imports.Import
	if len(rj) == 0 {
		for _, in := range u.GetUpserts() {
			imp, err := ImportFromProto(in, registry.DefaultLimits())
			if err != nil {
				k := KeyFromProto(in.GetService())
				rj = append(rj, reject(&k, "%v", err)...)
				continue
			}
			upserts = append(upserts, imp)
		}
	}
	if len(rj) > 0 {
		if u.GetFullState() {
			si.full, si.spoiled = nil, v
		}
		si.version = max(si.version, v)
		p.log.Warn("refused an import update", "version", v, "reason", rj.Error())
		return si.s.send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_ImportNack{ImportNack: &fedv1.Nack{
			Nonce: u.GetNonce(), Version: v, Rejections: rj}}})
	}
	held := p.imports
	next := ImportState{Epoch: si.s.epoch, Version: v, Authoritative: held.Authoritative, CIDRs: held.CIDRs}
	switch {
	case u.GetFullState():
		if si.full == nil || si.fullVersion != v {
			si.full, si.fullVersion = map[registry.ServiceKey]*imports.Import{}, v
		}
		for _, imp := range upserts {
			si.full[imp.Service] = imp
		}
		if !u.GetLastChunk() {
			return si.ack(u)
		}
		next.CIDRs = u.GetClustersetCidrs()
		if u.GetAuthoritative() {
			next.Imports, next.Authoritative, next.Removed = si.full, true, map[registry.ServiceKey]bool{}
		} else {
			// Not authoritative: add and update, delete nothing (but what a hub removed by name).
			next.Imports, next.Removed, next.Authoritative = maps.Clone(held.Imports), maps.Clone(held.Removed), false
			for k, imp := range si.full {
				next.Imports[k] = imp
				delete(next.Removed, k)
			}
		}
		si.full = nil
	default:
		next.Imports, next.Removed = maps.Clone(held.Imports), maps.Clone(held.Removed)
		for _, imp := range upserts {
			next.Imports[imp.Service] = imp
			delete(next.Removed, imp.Service)
		}
		for _, pk := range u.GetRemoves() {
			k := KeyFromProto(pk)
			delete(next.Imports, k)
			next.Removed[k] = true
		}
	}
	if next.Imports == nil {
		next.Imports = map[registry.ServiceKey]*imports.Import{}
	}
	if next.Removed == nil {
		next.Removed = map[registry.ServiceKey]bool{}
	}
	si.version = v
	p.imports = &next
	if err := si.ack(u); err != nil {
		return err
	}
	p.cfg.OnImports(next)
	return nil
}

// check refuses an update out of order or of the wrong shape (nothing of it is applied).
func (si *spokeImports) check(u *fedv1.ImportUpdate) rejection {
	v := u.GetVersion()
	switch {
	case u.GetFullState() && v == si.spoiled:
		return reject(nil, "import full state %d was already refused", v)
	case u.GetFullState() && len(u.GetRemoves()) > 0:
		return reject(nil, "an import full state cannot remove imports")
	case u.GetFullState() && si.full != nil && si.fullVersion == v:
		return nil // the next chunk
	case v <= si.version:
		return reject(nil, "import version %d is not above the last applied version %d", v, si.version)
	case !u.GetFullState() && si.full != nil:
		return reject(nil, "import delta %d in the middle of full state %d", v, si.fullVersion)
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

func (s *spokeSession) send(m *fedv1.SpokeMessage) error {
	if err := s.stream.Send(m); err != nil {
		return fmt.Errorf("send %T: %w", m.GetKind(), err)
	}
	return nil
}
