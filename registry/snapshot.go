package registry

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"time"
)

// Snapshot is a versioned, self-contained copy of the merged registry: every
// cluster's shards with the stamp they were held at. A hub that restarts
// serves the last snapshot until live spokes confirm or replace it, so a full
// hub restart never blackholes gateways.
type Snapshot struct {
	// Revision orders snapshots; the writer sets it and makes it increase.
	Revision uint64    `json:"revision"`
	Taken    time.Time `json:"taken"`
	// Clusters are sorted by ID once encoded.
	Clusters []SnapshotCluster `json:"clusters"`
}

// SnapshotCluster is one cluster in a Snapshot: its network, the
// (epoch, version) of the state held, and its shards (sorted by service once
// encoded). A cluster may hold no shards.
type SnapshotCluster struct {
	Cluster ClusterID `json:"cluster"`
	Network Network   `json:"network,omitempty"`
	// Gateways are the east-west gateways the cluster announced for its network.
	Gateways []Gateway `json:"gateways,omitempty"`
	Epoch    uint64    `json:"epoch"`
	Version  uint64    `json:"version"`
	Shards   []*Shard  `json:"shards,omitempty"`
	// Resolved is what the hub last resolved the gateways known by a DNS
	// name to (names among Gateways' addresses, sorted): a restarted hub
	// hands them out until a newer answer comes, even while DNS fails.
	Resolved []ResolvedName `json:"resolved,omitempty"`
}

// ResolvedName is the addresses a gateway's DNS name resolved to.
type ResolvedName struct {
	Name      string       `json:"name"`
	Addresses []netip.Addr `json:"addresses"`
}

// MaxResolvedAddresses bounds the addresses kept of one gateway name.
const MaxResolvedAddresses = 64

// checkResolved refuses resolutions of names that are not among gws, and
// addresses no client could be handed.
func checkResolved(resolved []ResolvedName, gws []Gateway) error {
	for i, r := range resolved {
		if i > 0 && resolved[i-1].Name >= r.Name {
			return fmt.Errorf("%w: resolved gateway names not sorted or repeated at %q", ErrInvalid, r.Name)
		}
		if !slices.ContainsFunc(gws, func(g Gateway) bool { _, ip := g.IP(); return !ip && g.Address == r.Name }) {
			return fmt.Errorf("%w: %q resolved, but it is no gateway name of the cluster", ErrInvalid, r.Name)
		}
		if len(r.Addresses) == 0 || len(r.Addresses) > MaxResolvedAddresses {
			return fmt.Errorf("%w: gateway name %q resolved to %d addresses, want 1 to %d", ErrInvalid, r.Name, len(r.Addresses), MaxResolvedAddresses)
		}
		for _, a := range r.Addresses {
			if !Unicast(a) {
				return fmt.Errorf("%w: gateway name %q resolved to %v, no address to hand out", ErrInvalid, r.Name, a)
			}
		}
	}
	return nil
}

// Change is the registry change that restores the cluster: its full state.
func (c SnapshotCluster) Change() Change {
	return Change{Cluster: c.Cluster, Replace: true, Upserts: c.Shards}
}

// ClusterStamp is what a snapshot records of a cluster that the registry
// does not know: its network and the (epoch, version) of the state held.
type ClusterStamp struct {
	Network        Network
	Gateways       []Gateway
	Epoch, Version uint64
	// Resolved is what the gateways known by a DNS name last resolved to.
	Resolved []ResolvedName
}

// Snapshot returns every cluster's shards with its stamp from stamps, sorted
// by cluster and service. A cluster in stamps that holds no shard is included
// without shards (it is known and empty); a cluster missing from stamps gets
// a zero stamp. Revision and Taken are left for the writer to set. The shards
// are the registry's own (immutable) values, not copies.
func (r *Registry) Snapshot(stamps map[ClusterID]ClusterStamp) Snapshot {
	ids := slices.Collect(r.clusters.Keys())
	for id := range stamps {
		if _, ok := r.clusters.Get(id); !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	snap := Snapshot{Clusters: make([]SnapshotCluster, 0, len(ids))}
	for _, id := range ids {
		st := stamps[id]
		sc := SnapshotCluster{Cluster: id, Network: st.Network, Gateways: st.Gateways, Epoch: st.Epoch, Version: st.Version, Resolved: st.Resolved}
		if v := r.ClusterView(id); v.Len() > 0 {
			sc.Shards = make([]*Shard, 0, v.Len())
			for _, s := range v.All() {
				sc.Shards = append(sc.Shards, s)
			}
			slices.SortFunc(sc.Shards, compareShardService)
		}
		snap.Clusters = append(snap.Clusters, sc)
	}
	return snap
}

// ErrBadSnapshot marks every snapshot that cannot be encoded or decoded:
// an unknown format version, garbage, truncation, or invalid content.
var ErrBadSnapshot = errors.New("registry: bad snapshot")

// An encoded snapshot is framed: snapshotMagic, one byte of format version,
// then a single gzip member holding the body. gzip's CRC-32 and length
// trailer catch corruption and truncation. Format 1's body is the JSON of the
// Snapshot, readable with standard tools (tail -c +10 | gunzip | jq); hubs
// now write format 2 (protobuf, replicas.EncodeSnapshot), which decodes
// three times faster, and still read format 1.
const (
	snapshotMagic  = "NAVESNAP"
	snapshotHeader = len(snapshotMagic) + 1
	// SnapshotFormatJSON is format 1, which EncodeSnapshot writes.
	SnapshotFormatJSON = 1
	// maxSnapshotBody bounds what decoding may inflate (a gzip bomb stops here).
	maxSnapshotBody = 1 << 30
)

// WriteSnapshotFrame frames body as an encoded snapshot of the given format.
func WriteSnapshotFrame(format byte, body []byte) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(snapshotHeader + len(body)/4)
	buf.Write(AppendSnapshotFrameHeader(nil, format))
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(body); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// AppendSnapshotFrameHeader appends what precedes the gzip member of an
// encoded snapshot of the given format, for a writer that assembles the
// member itself.
func AppendSnapshotFrameHeader(b []byte, format byte) []byte {
	return append(append(b, snapshotMagic...), format)
}

// ReadSnapshotFrame checks an encoded snapshot's frame and returns its
// format version and inflated body. It refuses garbage, truncated input and
// bodies larger than 1 GiB; errors wrap ErrBadSnapshot.
func ReadSnapshotFrame(b []byte) (format byte, body []byte, err error) {
	bad := func(format string, args ...any) (byte, []byte, error) {
		return 0, nil, fmt.Errorf("%w: "+format, append([]any{ErrBadSnapshot}, args...)...)
	}
	if len(b) < snapshotHeader || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return bad("not a Nave snapshot (no %q header)", snapshotMagic)
	}
	in := bytes.NewReader(b[snapshotHeader:])
	zr, err := gzip.NewReader(in)
	if err != nil {
		return bad("not gzip: %v", readError(err))
	}
	zr.Multistream(false)
	body, err = io.ReadAll(io.LimitReader(zr, maxSnapshotBody+1))
	if err != nil {
		return bad("corrupt: %v", readError(err))
	}
	if len(body) > maxSnapshotBody {
		return bad("inflates to more than %d bytes", maxSnapshotBody)
	}
	if in.Len() > 0 {
		return bad("%d bytes of garbage after the data", in.Len())
	}
	return b[len(snapshotMagic)], body, nil
}

// Sorted returns s with its clusters sorted by ID and every cluster's shards
// by service, and Taken in UTC: the order both encodings write. s is not
// modified; slices are copied only where they need sorting.
func (s Snapshot) Sorted() Snapshot {
	s.Taken = s.Taken.UTC()
	s.Clusters = slices.Clone(s.Clusters)
	slices.SortFunc(s.Clusters, func(a, b SnapshotCluster) int { return cmp.Compare(a.Cluster, b.Cluster) })
	for i := range s.Clusters {
		c := &s.Clusters[i]
		if !slices.IsSortedFunc(c.Shards, compareShardService) {
			c.Shards = slices.Clone(c.Shards)
			slices.SortFunc(c.Shards, compareShardService)
		}
	}
	return s
}

// EncodeSnapshot encodes s in format 1 (JSON), deterministically: equal
// snapshots (clusters and shards in any order, shards normalized as the
// registry holds them) encode to equal bytes. It refuses what DecodeSnapshot
// would refuse, so nothing unreadable is ever written (its errors wrap
// ErrBadSnapshot, and ErrInvalid for invalid content). s is not modified.
func EncodeSnapshot(s Snapshot) ([]byte, error) {
	s = s.Sorted()
	if err := CheckSnapshot(&s, DefaultLimits()); err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w: %w", s.Revision, ErrBadSnapshot, err)
	}
	js, err := json.Marshal(&s)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w: %w", s.Revision, ErrBadSnapshot, err)
	}
	b, err := WriteSnapshotFrame(SnapshotFormatJSON, append(js, '\n'))
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Revision, err)
	}
	return b, nil
}

// DecodeSnapshot decodes what EncodeSnapshot encoded (format 1). It refuses
// other format versions, garbage and truncated input, and content that is
// not valid (CheckSnapshot). Every error wraps ErrBadSnapshot (and ErrInvalid
// for invalid content). The shards returned are normalized.
func DecodeSnapshot(b []byte) (Snapshot, error) {
	format, body, err := ReadSnapshotFrame(b)
	if err != nil {
		return Snapshot{}, err
	}
	if format != SnapshotFormatJSON {
		return Snapshot{}, fmt.Errorf("%w: format version %d is not supported (this decoder reads version %d)", ErrBadSnapshot, format, SnapshotFormatJSON)
	}
	return DecodeSnapshotJSON(body)
}

// DecodeSnapshotJSON decodes the body of a format 1 snapshot, as DecodeSnapshot does.
func DecodeSnapshotJSON(body []byte) (Snapshot, error) {
	var s Snapshot
	if err := json.Unmarshal(body, &s); err != nil {
		return Snapshot{}, fmt.Errorf("%w: corrupt: %v", ErrBadSnapshot, err)
	}
	if err := CheckSnapshot(&s, DefaultLimits()); err != nil {
		return Snapshot{}, fmt.Errorf("%w: %w", ErrBadSnapshot, err)
	}
	for _, c := range s.Clusters {
		for _, sh := range c.Shards {
			sh.Normalize()
		}
	}
	return s, nil
}

// readError names truncation plainly; gzip reports it as an unexpected EOF.
func readError(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return errors.New("truncated")
	}
	return err
}

// CheckSnapshot validates every cluster and shard of s against lim: cluster
// IDs, every shard (Shard.Validate), per-cluster limits, shards filed under
// another cluster, and duplicates. Errors wrap ErrInvalid.
func CheckSnapshot(s *Snapshot, lim Limits) error { return checkSnapshot(s, lim, true) }

// CheckSnapshotClusters is CheckSnapshot without Shard.Validate, for a
// writer that has validated the shards itself (each once, not on every
// snapshot that holds it).
func CheckSnapshotClusters(s *Snapshot, lim Limits) error { return checkSnapshot(s, lim, false) }

func checkSnapshot(s *Snapshot, lim Limits, validateShards bool) error {
	clusters := make(map[ClusterID]bool, len(s.Clusters))
	for _, c := range s.Clusters {
		if err := ValidateClusterID(c.Cluster); err != nil {
			return err
		}
		if clusters[c.Cluster] {
			return fmt.Errorf("%w: cluster %s appears twice", ErrInvalid, c.Cluster)
		}
		clusters[c.Cluster] = true
		if _, err := NormalizeGateways(c.Gateways); err != nil {
			return fmt.Errorf("cluster %s: %w", c.Cluster, err)
		}
		if err := checkResolved(c.Resolved, c.Gateways); err != nil {
			return fmt.Errorf("cluster %s: %w", c.Cluster, err)
		}
		if len(c.Shards) > lim.MaxServicesPerCluster {
			return fmt.Errorf("%w: cluster %s: %d services, more than the limit of %d",
				ErrInvalid, c.Cluster, len(c.Shards), lim.MaxServicesPerCluster)
		}
		// Sorted shards (what writers check) show a duplicate next to its
		// twin; others (what readers check) are looked up in a set.
		sorted := slices.IsSortedFunc(c.Shards, compareShardService)
		var services map[ServiceKey]bool
		if !sorted {
			services = make(map[ServiceKey]bool, len(c.Shards))
		}
		endpoints := 0
		for i, sh := range c.Shards {
			if sh == nil {
				return fmt.Errorf("%w: cluster %s: shard %d is null", ErrInvalid, c.Cluster, i)
			}
			if sh.Cluster != c.Cluster {
				return fmt.Errorf("%w: cluster %s holds a shard of cluster %q (service %s)",
					ErrInvalid, c.Cluster, sh.Cluster, sh.Service)
			}
			if validateShards {
				if err := sh.Validate(lim); err != nil {
					return fmt.Errorf("cluster %s: %w", c.Cluster, err)
				}
			}
			twice := services[sh.Service]
			if sorted {
				twice = i > 0 && c.Shards[i-1].Service == sh.Service
			} else {
				services[sh.Service] = true
			}
			if twice {
				return fmt.Errorf("%w: cluster %s: service %s appears twice", ErrInvalid, c.Cluster, sh.Service)
			}
			endpoints += len(sh.Endpoints)
		}
		if endpoints > lim.MaxEndpointsPerCluster {
			return fmt.Errorf("%w: cluster %s: %d endpoints, more than the limit of %d",
				ErrInvalid, c.Cluster, endpoints, lim.MaxEndpointsPerCluster)
		}
	}
	return nil
}

func compareShardService(a, b *Shard) int {
	switch { // a nil shard is refused by CheckSnapshot; only keep sorting from panicking
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return a.Service.Compare(b.Service)
}
