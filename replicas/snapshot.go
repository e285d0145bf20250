package replicas

import (
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/navemesh/nave/federation"
	fedv1 "github.com/navemesh/nave/federation/v1"
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
	s = s.Sorted()
	if err := registry.CheckSnapshot(&s, registry.DefaultLimits()); err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w: %w", s.Revision, registry.ErrBadSnapshot, err)
	}
	if !s.Taken.IsZero() && (s.Taken.Year() < 1678 || s.Taken.Year() > 2261) {
		return nil, fmt.Errorf("encode snapshot %d: %w: taken at %v, beyond what nanoseconds since 1970 hold", s.Revision, registry.ErrBadSnapshot, s.Taken)
	}
	pb := &fedv1.Snapshot{Revision: s.Revision, Clusters: make([]*fedv1.SnapshotCluster, len(s.Clusters))}
	if !s.Taken.IsZero() {
		pb.TakenUnixNano = s.Taken.UnixNano()
	}
	for i, c := range s.Clusters {
		pc := &fedv1.SnapshotCluster{Cluster: string(c.Cluster), Network: string(c.Network), Gateways: federation.GatewaysToProto(c.Gateways),
			Stamp: &fedv1.Stamp{Epoch: c.Epoch, Version: c.Version}, Shards: make([]*fedv1.Shard, len(c.Shards))}
		for j, sh := range c.Shards {
			pc.Shards[j] = federation.ShardToProto(sh)
		}
		for _, r := range c.Resolved {
			pr := &fedv1.ResolvedName{Name: r.Name, Addresses: make([]string, len(r.Addresses))}
			for j, a := range r.Addresses {
				pr.Addresses[j] = a.String()
			}
			pc.Resolved = append(pc.Resolved, pr)
		}
		pb.Clusters[i] = pc
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(pb)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Revision, err)
	}
	b, err := registry.WriteSnapshotFrame(snapshotFormat, body)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %d: %w", s.Revision, err)
	}
	return b, nil
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
