package federation

import (
	"fmt"
	"net/netip"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/adminapi"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/changelog"
	"github.com/navemesh/nave/internal/pmap"
	"github.com/navemesh/nave/limits"
	"github.com/navemesh/nave/registry"
)

// CapabilityImports is the capability a spoke announces in its hello when
// it takes the import stream: the hub then sends it the imports its cluster
// must hold (ImportUpdate), for the namespaces the hello names.
const CapabilityImports = "imports"

// CapabilityImportProblems is the hub capability (in its welcome) of taking
// ImportProblems messages on the import stream: an older hub would end the
// session on one, so a spoke sends them only to a hub that announces it.
const CapabilityImportProblems = "import-problems"

// Reasons of an ImportProblem: an object that is not Nave's (a user's own)
// holds a name the import's objects need.
const (
	ReasonBlockedByServiceImport = "BlockedByServiceImport"
	ReasonBlockedByService       = "BlockedByService"
	ReasonBlockedByEndpointSlice = "BlockedByEndpointSlice"
)

// ImportProblem is an import the spoke's cluster cannot hold as the hub
// sent it (Reason: see ReasonBlockedByServiceImport); the admin API's JSON.
type ImportProblem = adminapi.ImportProblem

// Bounds of an ImportProblems message: the problems it carries (the first by
// service; the rest are counted), and the bytes of each reason.
const (
	MaxImportProblems     = 1000
	maxProblemReasonBytes = 64
)

// importProblemsToProto encodes a problem set (sorted by service, each
// service once) for the wire, within MaxImportProblems and the string bounds.
func importProblemsToProto(ps []ImportProblem) *fedv1.ImportProblems {
	out := &fedv1.ImportProblems{}
	if len(ps) > MaxImportProblems {
		out.Omitted = uint32(len(ps) - MaxImportProblems)
		ps = ps[:MaxImportProblems]
	}
	for _, p := range ps {
		out.Problems = append(out.Problems, &fedv1.ImportProblem{Service: KeyToProto(p.Service),
			Reason: truncateBytes(p.Reason, maxProblemReasonBytes), Message: truncateBytes(p.Message, limits.MaxLoggedBytes)})
	}
	return out
}

// importProblemsFromProto decodes and checks a problem set: at most
// MaxImportProblems, valid service keys sorted and unique, a reason of at
// most maxProblemReasonBytes; messages are truncated (limits.Truncate).
func importProblemsFromProto(m *fedv1.ImportProblems) ([]ImportProblem, error) {
	if n := len(m.GetProblems()); n > MaxImportProblems {
		return nil, fmt.Errorf("%d import problems, at most %d", n, MaxImportProblems)
	}
	out := make([]ImportProblem, 0, len(m.GetProblems()))
	for i, p := range m.GetProblems() {
		k := KeyFromProto(p.GetService())
		if err := registry.ValidateServiceKey(k); err != nil {
			return nil, fmt.Errorf("import problem %d: %w", i, err)
		}
		if i > 0 && k.Compare(out[i-1].Service) <= 0 {
			return nil, fmt.Errorf("import problems are not sorted and unique (%s after %s)", k, out[i-1].Service)
		}
		if r := p.GetReason(); r == "" || len(r) > maxProblemReasonBytes {
			return nil, fmt.Errorf("import problem of %s: a reason of %d bytes (1 to %d)", k, len(r), maxProblemReasonBytes)
		}
		out = append(out, ImportProblem{Service: k, Reason: p.GetReason(), Message: limits.Truncate(p.GetMessage())})
	}
	return out, nil
}

// truncateBytes cuts s to at most n bytes, on a rune boundary.
func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ImportSet is every import of the clusterset, as the hub holds it. It is
// immutable: a new set replaces it. A set made by Then knows which services
// changed since the sets before it (ChangedSince), so that a session sends
// its spoke what changed without comparing every import.
type ImportSet struct {
	// Imports holds each service's import (never nil). Persistent: the next
	// set shares all but what changed with this one.
	Imports ImportMap
	// Authoritative: the hub holds every cluster it knows of, so a spoke may
	// delete the imports the set does not name (see ImportUpdate.authoritative).
	Authoritative bool
	// CIDRs are the clusterset IP ranges (a spoke makes them routable in its cluster).
	CIDRs []string
	// changes names the services each set since a first one (NewImportSet:
	// changelog.New) changed, this one's last. A set made as a literal has
	// none: no set reaches back to it.
	changes *changelog.Log[registry.ServiceKey]
}

// ImportMap holds imports by service.
type ImportMap = pmap.Map[registry.ServiceKey, *imports.Import]

// NewImportSet returns a first set, which the sets that follow it (Then)
// reach back to.
func NewImportSet(imps ImportMap, authoritative bool, cidrs []string) *ImportSet {
	return &ImportSet{Imports: imps, Authoritative: authoritative, CIDRs: cidrs, changes: changelog.New[registry.ServiceKey]()}
}

// Then returns the set that follows s, with s's CIDRs. changed names every
// service whose import differs between s and imps (added, replaced by one
// that is not Equal, removed); it may name others, and none when only the
// authority changed, in any order and any number of times each: the set
// keeps changed when it is sorted with each service once (as the hub's
// importer makes it), else a sorted copy without the repeats. Then is
// called once on each set (its owner makes the sets in turn): two sets
// made from one would look alike to ChangedSince.
func (s *ImportSet) Then(imps ImportMap, changed []registry.ServiceKey, authoritative bool) *ImportSet {
	for i := 1; i < len(changed); i++ {
		if changed[i-1].Compare(changed[i]) >= 0 {
			changed = slices.Clone(changed)
			slices.SortFunc(changed, registry.ServiceKey.Compare)
			changed = slices.Compact(changed)
			break
		}
	}
	return &ImportSet{Imports: imps, Authoritative: authoritative, CIDRs: s.CIDRs, changes: s.changes.Then(changed, imps.Len())}
}

// ChangedSince returns the services whose import may differ between older
// and s, each once (it may name some whose import did not change); not to
// be modified. False when s does not reach back to older (older is not a
// set s follows, or the chain was cut since): the caller compares whole.
func (s *ImportSet) ChangedSince(older *ImportSet) ([]registry.ServiceKey, bool) {
	if s == older {
		return nil, true
	}
	if older == nil {
		return nil, false
	}
	return s.changes.Since(older.changes.Position())
}

// ImportSource is where the hub's sessions get the imports from.
type ImportSource interface {
	// Imports returns the current set and a channel closed once it is
	// replaced. It must not block. Each set should follow the one before
	// (Then, from a NewImportSet): a session then looks at the services that
	// changed since the set it last saw, and compares whole only when the
	// chain does not reach back that far.
	Imports() (*ImportSet, <-chan struct{})
}

// ImportToProto encodes an import for the wire.
func ImportToProto(imp *imports.Import) *fedv1.Import {
	out := &fedv1.Import{
		Service: KeyToProto(imp.Service), Headless: imp.Headless,
		Ports: portsToProto(imp.Ports), Properties: propertiesToProto(&imp.Properties),
		Sources: make([]*fedv1.ImportSource, len(imp.Sources)),
	}
	for _, ip := range imp.IPs {
		out.Ips = append(out.Ips, ip.String())
	}
	for i := range imp.Sources {
		src := &imp.Sources[i]
		ps := &fedv1.ImportSource{ClusterId: string(src.Cluster), Stale: src.Stale, Ports: portsToProto(src.Ports),
			Endpoints: make([]*fedv1.Endpoint, len(src.Endpoints))}
		for j := range src.Endpoints {
			e := &src.Endpoints[j]
			pe := &fedv1.Endpoint{Hostname: e.Hostname, Ready: e.Conditions.Ready, Serving: e.Conditions.Serving,
				Terminating: e.Conditions.Terminating, Addresses: make([]string, len(e.Addresses)),
				Ports: make([]*fedv1.EndpointPort, len(e.Ports))}
			if e.Zone != "" {
				pe.Locality = &fedv1.Locality{Zone: e.Zone}
			}
			for k, a := range e.Addresses {
				pe.Addresses[k] = a.String()
			}
			for k, p := range e.Ports {
				pe.Ports[k] = &fedv1.EndpointPort{Name: p.Name, Port: p.Port}
			}
			ps.Endpoints[j] = pe
		}
		out.Sources[i] = ps
	}
	return out
}

func portsToProto(ports []registry.ServicePort) []*fedv1.ServicePort {
	out := make([]*fedv1.ServicePort, len(ports))
	for i, p := range ports {
		out[i] = &fedv1.ServicePort{Name: p.Name, Port: p.Port, Protocol: string(p.Protocol), AppProtocol: p.AppProtocol}
	}
	return out
}

// ImportFromProto decodes and validates an import: its service, ports and
// properties, and each source as a shard of its cluster would be validated
// (names, addresses, ports, sizes). The error names the service.
func ImportFromProto(in *fedv1.Import, lim registry.Limits) (*imports.Import, error) {
	key := KeyFromProto(in.GetService())
	bad := func(format string, args ...any) error {
		return &registry.ValidationError{Service: key, Reason: fmt.Sprintf(format, args...)}
	}
	if len(in.GetIps()) > 2 {
		return nil, bad("%d clusterset IPs, at most 2", len(in.GetIps()))
	}
	if len(in.GetSources()) > maxImportSources {
		return nil, bad("%d source clusters, more than the limit of %d", len(in.GetSources()), maxImportSources)
	}
	// The merged service validates as a shard without endpoints.
	merged, err := ShardFromProtoUnvalidated("hub", &fedv1.Shard{Service: in.GetService(), Headless: in.GetHeadless(),
		Ports: in.GetPorts(), Properties: in.GetProperties()}, lim)
	if err == nil {
		err = merged.Validate(lim)
	}
	if err != nil {
		return nil, err
	}
	imp := &imports.Import{Service: key, Headless: in.GetHeadless(), Ports: merged.Ports, Properties: merged.Properties,
		Sources: make([]imports.Source, len(in.GetSources()))}
	for _, s := range in.GetIps() {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return nil, bad("clusterset IP %q is not an IP address", s)
		}
		imp.IPs = append(imp.IPs, ip)
	}
	if imp.Headless && len(imp.IPs) > 0 {
		return nil, bad("a headless import has clusterset IPs")
	}
	for i, src := range in.GetSources() {
		cluster := registry.ClusterID(src.GetClusterId())
		if i > 0 && cluster <= imp.Sources[i-1].Cluster {
			return nil, bad("source clusters are not sorted and unique (%s after %s)", cluster, imp.Sources[i-1].Cluster)
		}
		sh, err := ShardFromProto(cluster, &fedv1.Shard{Service: in.GetService(), Headless: in.GetHeadless(),
			Ports: src.GetPorts(), Endpoints: src.GetEndpoints()}, lim)
		if err != nil {
			return nil, fmt.Errorf("source cluster %q: %w", cluster, err)
		}
		out := imports.Source{Cluster: cluster, Stale: src.GetStale(), Ports: sh.Ports,
			Endpoints: make([]imports.Endpoint, len(sh.Endpoints))}
		for j := range sh.Endpoints {
			e := &sh.Endpoints[j]
			out.Endpoints[j] = imports.Endpoint{Addresses: e.Addresses, Ports: e.Ports, Hostname: e.Hostname,
				Zone: e.Locality.Zone, Conditions: e.Conditions}
		}
		imp.Sources[i] = out
	}
	return imp, nil
}

// maxImportSources bounds the source clusters of one import.
const maxImportSources = 1000

// chunkImports splits an import update into messages of at most budget
// bytes each (an import larger than the budget travels alone).
func chunkImports(head *fedv1.ImportUpdate, removes []registry.ServiceKey, upserts []*fedv1.Import, budget int) []*fedv1.ImportUpdate {
	next := func() *fedv1.ImportUpdate {
		return &fedv1.ImportUpdate{Version: head.Version, FullState: head.FullState, Authoritative: head.Authoritative,
			ClustersetCidrs: head.ClustersetCidrs}
	}
	var out []*fedv1.ImportUpdate
	c := Chunker{Budget: budget - proto.Size(head)} // every chunk repeats the head's fields
	cur := next()
	room := func(n int) {
		if c.Next(n) {
			out = append(out, cur)
			cur = next()
		}
	}
	for _, k := range removes {
		p := KeyToProto(k)
		room(ItemBytes(p))
		cur.Removes = append(cur.Removes, p)
	}
	for _, p := range upserts {
		room(ItemBytes(p))
		cur.Upserts = append(cur.Upserts, p)
	}
	out = append(out, cur)
	out[len(out)-1].LastChunk = true
	return out
}
