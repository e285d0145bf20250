package replicas

import (
	"compress/flate"
	"fmt"
	"hash/maphash"
	"iter"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/internal/gzipparts"
	"github.com/navemesh/nave/registry"
)

// snapshotFormat is the format version EncodeSnapshot writes: the snapshot
// frame (registry.WriteSnapshotFrame) around a fedv1.Snapshot. Protobuf keeps
// it tolerant of fields added later within a version, and decodes three times
// faster than format 1 (JSON, registry.EncodeSnapshot), which earlier hubs
// wrote and DecodeSnapshot still reads.
const snapshotFormat = 2

// EncodeSnapshot encodes s compactly and deterministically: equal snapshots
// (clusters and shards in any order, shards normalized as the registry holds
// them) encode to equal bytes. It refuses what DecodeSnapshot would refuse,
// so nothing unreadable is ever written (errors wrap registry.ErrBadSnapshot,
// and registry.ErrInvalid for invalid content). Shards keep their export
// time to the second, as on the wire. s is not modified.
func EncodeSnapshot(s registry.Snapshot) ([]byte, error) {
	return newSnapshotEncoder().Encode(s)
}

// snapshotEncoder encodes snapshots as EncodeSnapshot does, and keeps what
// it encoded and compressed of the last one, so that the next costs what
// changed rather than what the registry holds. A cluster's shards (sorted)
// are cut into blocks after services picked by their names' hash, about one
// in blockSpread: a change, an added or a removed service moves no block
// boundary but its own (within a run of maxBlock services none of which
// ends a block, the cuts after it move), and every other block is joined
// as it was (gzipparts). Each shard is validated when its block is
// encoded, once. It keeps the last snapshot's shards (pointers) until the
// next. Blocks compress less than a whole body: a snapshot is about 17%
// larger than one compressed whole. Safe for concurrent use (encodes take
// turns).
type snapshotEncoder struct {
	mu     sync.Mutex
	z      *gzipparts.Compressor // created on first use
	blocks map[blockKey]shardBlock
	// deflated counts the blocks compressed (tests read it).
	deflated int
}

// blockKey names a block: its cluster and first service.
type blockKey struct {
	cluster registry.ClusterID
	first   registry.ServiceKey
}

// shardBlock is a block of shards as encoded: the shards (immutable, so
// the same pointers are the same content) and their wire form, deflated.
type shardBlock struct {
	shards []*registry.Shard
	part   gzipparts.Part
}

const (
	// blockSpread is how many services a block holds on average; maxBlock
	// bounds one (a run of services none of which ends a block).
	blockSpread = 32
	maxBlock    = 4 * blockSpread
)

func newSnapshotEncoder() *snapshotEncoder { return &snapshotEncoder{} }

// Encode encodes s (see EncodeSnapshot).
func (e *snapshotEncoder) Encode(s registry.Snapshot) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, err := e.encode(s)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Revision, err)
	}
	return b, nil
}

func (e *snapshotEncoder) encode(s registry.Snapshot) ([]byte, error) {
	s = s.Sorted()
	lim := registry.DefaultLimits()
	if err := registry.CheckSnapshotClusters(&s, lim); err != nil {
		return nil, fmt.Errorf("%w: %w", registry.ErrBadSnapshot, err)
	}
	if !s.Taken.IsZero() && (s.Taken.Year() < 1678 || s.Taken.Year() > 2261) {
		return nil, fmt.Errorf("%w: taken at %v, beyond what nanoseconds since 1970 hold", registry.ErrBadSnapshot, s.Taken)
	}
	if e.z == nil {
		z, err := gzipparts.NewCompressor(flate.DefaultCompression)
		if err != nil {
			return nil, err
		}
		e.z = z
	}
	// The body is what proto.Marshal (deterministic) makes of the
	// fedv1.Snapshot: its fields in order, each cluster's shards (field 4)
	// between its fields 1-3 and 5-6. Small pieces are stored; blocks deflated.
	var lead []byte // raw bytes not yet in a part
	pb := &fedv1.Snapshot{Revision: s.Revision}
	if !s.Taken.IsZero() {
		pb.TakenUnixNano = s.Taken.UnixNano()
	}
	lead, err := marshal(lead, pb)
	if err != nil {
		return nil, err
	}
	var parts []gzipparts.Part
	blocks := make(map[blockKey]shardBlock, len(e.blocks))
	for _, c := range s.Clusters {
		head, err := marshal(nil, &fedv1.SnapshotCluster{Cluster: string(c.Cluster), Network: string(c.Network),
			Stamp: &fedv1.Stamp{Epoch: c.Epoch, Version: c.Version}})
		if err != nil {
			return nil, err
		}
		tail, err := marshal(nil, &fedv1.SnapshotCluster{Gateways: federation.GatewaysToProto(c.Gateways), Resolved: resolvedToProto(c.Resolved)})
		if err != nil {
			return nil, err
		}
		size := int64(len(head) + len(tail))
		var cparts []gzipparts.Part
		for shards := range cutBlocks(c.Shards) {
			k := blockKey{c.Cluster, shards[0].Service}
			b, ok := e.blocks[k]
			if !ok || !slices.Equal(b.shards, shards) {
				if b, err = e.encodeBlock(c.Cluster, shards, lim); err != nil {
					return nil, err
				}
			}
			blocks[k] = b
			cparts = append(cparts, b.part)
			size += b.part.Len()
		}
		lead = protowire.AppendTag(lead, snapshotClustersField, protowire.BytesType)
		lead = append(protowire.AppendVarint(lead, uint64(size)), head...)
		if len(cparts) > 0 {
			parts = append(append(parts, gzipparts.Stored(lead)), cparts...)
			lead = nil
		}
		lead = append(lead, tail...)
	}
	parts = append(parts, gzipparts.Stored(lead))
	e.blocks = blocks // what this snapshot holds: blocks it no longer has are forgotten
	return gzipparts.Append(registry.AppendSnapshotFrameHeader(nil, snapshotFormat), parts...), nil
}

// encodeBlock validates and encodes one block of a cluster's shards.
func (e *snapshotEncoder) encodeBlock(cluster registry.ClusterID, shards []*registry.Shard, lim registry.Limits) (shardBlock, error) {
	var raw []byte
	for _, sh := range shards {
		if err := sh.Validate(lim); err != nil {
			return shardBlock{}, fmt.Errorf("%w: cluster %s: %w", registry.ErrBadSnapshot, cluster, err)
		}
		msg, err := marshal(nil, federation.ShardToProto(sh))
		if err != nil {
			return shardBlock{}, err
		}
		raw = protowire.AppendTag(raw, clusterShardsField, protowire.BytesType)
		raw = protowire.AppendBytes(raw, msg)
	}
	e.deflated++
	// The caller's slice may change under it later: the block keeps its own.
	return shardBlock{shards: slices.Clone(shards), part: e.z.Deflate(raw)}, nil
}

// cutBlocks yields a cluster's sorted shards in blocks: a block ends after
// a service whose name's hash is a multiple of blockSpread, or at maxBlock.
func cutBlocks(shards []*registry.Shard) iter.Seq[[]*registry.Shard] {
	return func(yield func([]*registry.Shard) bool) {
		start := 0
		for i, sh := range shards {
			if i+1-start < maxBlock && blockEnd(sh.Service)%blockSpread != 0 && i+1 < len(shards) {
				continue
			}
			if !yield(shards[start : i+1 : i+1]) {
				return
			}
			start = i + 1
		}
	}
}

// blockSeed is this process's: a spoke cannot pick names that each end a
// block (blocks of one shard each, compressed without a shared dictionary,
// would inflate the snapshot toward its bound). Equal snapshots still cut
// alike within a process, which is where blocks are kept.
var blockSeed = maphash.MakeSeed()

// blockEnd hashes a service's name.
func blockEnd(k registry.ServiceKey) uint64 { return maphash.Comparable(blockSeed, k) }

// marshal appends m's deterministic wire form to b.
func marshal(b []byte, m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.MarshalAppend(b, m)
}

func resolvedToProto(rs []registry.ResolvedName) []*fedv1.ResolvedName {
	var out []*fedv1.ResolvedName
	for _, r := range rs {
		pr := &fedv1.ResolvedName{Name: r.Name, Addresses: make([]string, len(r.Addresses))}
		for j, a := range r.Addresses {
			pr.Addresses[j] = a.String()
		}
		out = append(out, pr)
	}
	return out
}

// DecodeSnapshot decodes what EncodeSnapshot encoded, and format 1 (what
// earlier hubs wrote). It refuses unknown format versions, garbage and
// truncated input, and content that is not valid (registry.CheckSnapshot).
// Every error wraps registry.ErrBadSnapshot (and registry.ErrInvalid for
// invalid content). The shards returned are normalized.
func DecodeSnapshot(b []byte) (registry.Snapshot, error) {
	format, body, err := registry.ReadSnapshotFrame(b)
	switch {
	case err != nil:
		return registry.Snapshot{}, err
	case format == registry.SnapshotFormatJSON:
		return registry.DecodeSnapshotJSON(body)
	case format != snapshotFormat:
		return registry.Snapshot{}, fmt.Errorf("%w: format version %d is not supported (this build reads versions %d and %d)",
			registry.ErrBadSnapshot, format, registry.SnapshotFormatJSON, snapshotFormat)
	}
	// Count before decoding: a hostile snapshot's size bounds its bytes,
	// not the memory of millions of tiny messages decoded from them.
	if err := countSnapshot(body, registry.DefaultLimits()); err != nil {
		return registry.Snapshot{}, fmt.Errorf("%w: %w", registry.ErrBadSnapshot, err)
	}
	var pb fedv1.Snapshot
	if err := proto.Unmarshal(body, &pb); err != nil {
		return registry.Snapshot{}, fmt.Errorf("%w: corrupt: %v", registry.ErrBadSnapshot, err)
	}
	lim := registry.DefaultLimits()
	s := registry.Snapshot{Revision: pb.GetRevision(), Clusters: make([]registry.SnapshotCluster, len(pb.GetClusters()))}
	if n := pb.GetTakenUnixNano(); n != 0 {
		s.Taken = time.Unix(0, n).UTC()
	}
	for i, pc := range pb.GetClusters() {
		id := registry.ClusterID(pc.GetCluster())
		c := registry.SnapshotCluster{Cluster: id, Network: registry.Network(pc.GetNetwork()),
			Epoch: pc.GetStamp().GetEpoch(), Version: pc.GetStamp().GetVersion()}
		gws, err := federation.GatewaysFromProto(pc.GetGateways())
		if err != nil {
			return registry.Snapshot{}, fmt.Errorf("%w: cluster %s: %w", registry.ErrBadSnapshot, id, err)
		}
		c.Gateways = gws
		if c.Resolved, err = resolvedFromProto(pc.GetResolved()); err != nil {
			return registry.Snapshot{}, fmt.Errorf("%w: cluster %s: %w", registry.ErrBadSnapshot, id, err)
		}
		if len(pc.GetShards()) > lim.MaxServicesPerCluster {
			return registry.Snapshot{}, fmt.Errorf("%w: %w: cluster %s: %d services, more than the limit of %d",
				registry.ErrBadSnapshot, registry.ErrInvalid, id, len(pc.GetShards()), lim.MaxServicesPerCluster)
		}
		c.Shards = make([]*registry.Shard, len(pc.GetShards()))
		for j, ps := range pc.GetShards() {
			sh, err := federation.ShardFromProtoUnvalidated(id, ps, lim)
			if err != nil {
				return registry.Snapshot{}, fmt.Errorf("%w: cluster %s: %w", registry.ErrBadSnapshot, id, err)
			}
			c.Shards[j] = sh
		}
		s.Clusters[i] = c
	}
	// Every shard is validated here, once.
	if err := registry.CheckSnapshot(&s, lim); err != nil {
		return registry.Snapshot{}, fmt.Errorf("%w: %w", registry.ErrBadSnapshot, err)
	}
	return s, nil
}

// resolvedFromProto decodes a cluster's resolved gateway names; what they
// may hold is checked with the rest (registry.CheckSnapshot).
func resolvedFromProto(prs []*fedv1.ResolvedName) ([]registry.ResolvedName, error) {
	if len(prs) > registry.MaxGateways {
		return nil, fmt.Errorf("%w: %d resolved gateway names, more than %d", registry.ErrInvalid, len(prs), registry.MaxGateways)
	}
	var out []registry.ResolvedName
	for _, pr := range prs {
		if len(pr.GetAddresses()) > registry.MaxResolvedAddresses {
			return nil, fmt.Errorf("%w: gateway name %q resolved to %d addresses, more than %d", registry.ErrInvalid, pr.GetName(), len(pr.GetAddresses()), registry.MaxResolvedAddresses)
		}
		r := registry.ResolvedName{Name: pr.GetName(), Addresses: make([]netip.Addr, len(pr.GetAddresses()))}
		for i, a := range pr.GetAddresses() {
			addr, err := netip.ParseAddr(a)
			if err != nil {
				return nil, fmt.Errorf("%w: gateway name %q resolved to %q: %v", registry.ErrInvalid, r.Name, a, err)
			}
			r.Addresses[i] = addr
		}
		out = append(out, r)
	}
	return out, nil
}

// Field numbers countSnapshot walks: Snapshot.clusters, SnapshotCluster.shards,
// Shard.endpoints.
var (
	snapshotClustersField = (&fedv1.Snapshot{}).ProtoReflect().Descriptor().Fields().ByName("clusters").Number()
	clusterShardsField    = (&fedv1.SnapshotCluster{}).ProtoReflect().Descriptor().Fields().ByName("shards").Number()
	shardEndpointsField   = (&fedv1.Shard{}).ProtoReflect().Descriptor().Fields().ByName("endpoints").Number()
)

// countSnapshot walks an encoded snapshot's wire form without decoding it
// and refuses one with more clusters, services per cluster or endpoints per
// cluster than lim allows (clusters are bounded by MaxServicesPerCluster
// too: a generous bound no real clusterset nears).
func countSnapshot(body []byte, lim registry.Limits) error {
	clusters := 0
	return eachField(body, snapshotClustersField, func(cluster []byte) error {
		if clusters++; clusters > lim.MaxServicesPerCluster {
			return fmt.Errorf("%w: more than %d clusters", registry.ErrInvalid, lim.MaxServicesPerCluster)
		}
		shards, endpoints := 0, 0
		return eachField(cluster, clusterShardsField, func(shard []byte) error {
			if shards++; shards > lim.MaxServicesPerCluster {
				return fmt.Errorf("%w: a cluster with more than %d services", registry.ErrInvalid, lim.MaxServicesPerCluster)
			}
			return eachField(shard, shardEndpointsField, func([]byte) error {
				if endpoints++; endpoints > lim.MaxEndpointsPerCluster {
					return fmt.Errorf("%w: a cluster with more than %d endpoints", registry.ErrInvalid, lim.MaxEndpointsPerCluster)
				}
				return nil
			})
		})
	})
}

// eachField calls f with the bytes of every length-delimited occurrence of
// field num in the message b, skipping other fields; malformed wire data is
// an error.
func eachField(b []byte, num protowire.Number, f func([]byte) error) error {
	for len(b) > 0 {
		n, typ, tagLen := protowire.ConsumeTag(b)
		if tagLen < 0 {
			return fmt.Errorf("corrupt: %v", protowire.ParseError(tagLen))
		}
		b = b[tagLen:]
		valLen := protowire.ConsumeFieldValue(n, typ, b)
		if valLen < 0 {
			return fmt.Errorf("corrupt: %v", protowire.ParseError(valLen))
		}
		if n == num && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[:valLen])
			if err := f(v); err != nil {
				return err
			}
		}
		b = b[valLen:]
	}
	return nil
}
