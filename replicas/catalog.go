package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/registry"
)

// Catalog keeps the cluster catalog and the per-cluster epoch counters in etcd.
// Every replica draws epochs (NextEpoch: fencing) and creates the record of
// a cluster new to the catalog as its first session begins (RecordNew);
// only the leader updates and removes records (RecordAll, Forget, under its
// term's LeaderFence).
//
// Keys (under prefix, default "/nave/"):
//
//	epochs/<cluster>    decimal counter, incremented by compare-and-swap
//	clusters/<cluster>  JSON ClusterRecord
type Catalog struct {
	etcd   *clientv3.Client
	prefix string
}

// ClusterRecord is what the catalog remembers of a cluster.
type ClusterRecord struct {
	Cluster   registry.ClusterID `json:"cluster"`
	Network   registry.Network   `json:"network,omitempty"`
	FirstSeen time.Time          `json:"firstSeen"`
	// LastSeen is when the cluster was last seen: in records the leader
	// writes, LiveAt; in those of earlier hubs, its last session's start.
	LastSeen time.Time `json:"lastSeen"`
	SpokeID  string    `json:"spokeID,omitempty"`
	Build    string    `json:"build,omitempty"`
	Epoch    uint64    `json:"epoch"`
	// LiveAt is when a live spoke last served the cluster at some replica,
	// as the leader saw it: refreshed now and then while one does, and
	// written once more when none does any more. A restarted hub takes the
	// cluster's drop timer from it. Zero in records of earlier hubs (whose
	// LastSeen is no such time): a restart starts those clusters' timers over.
	LiveAt time.Time `json:"liveAt,omitzero"`
}

// NewCatalog returns a catalog stored under prefix.
func NewCatalog(etcd *clientv3.Client, prefix string) *Catalog {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Catalog{etcd: etcd, prefix: prefix}
}

// NextEpoch increments and returns the cluster's epoch. Concurrent callers
// (other hub replicas) each get a distinct, larger value.
func (c *Catalog) NextEpoch(ctx context.Context, cluster registry.ClusterID) (uint64, error) {
	key := c.prefix + "epochs/" + string(cluster)
	for {
		resp, err := c.etcd.Get(ctx, key)
		if err != nil {
			return 0, fmt.Errorf("read epoch of %s: %w", cluster, err)
		}
		var cur uint64
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(resp.Kvs) == 1 {
			kv := resp.Kvs[0]
			if cur, err = strconv.ParseUint(string(kv.Value), 10, 64); err != nil {
				return 0, fmt.Errorf("epoch of %s is corrupt (%q): %w", cluster, kv.Value, err)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
		}
		next := cur + 1
		txn, err := c.etcd.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, strconv.FormatUint(next, 10))).Commit()
		if err != nil {
			return 0, fmt.Errorf("write epoch of %s: %w", cluster, err)
		}
		if txn.Succeeded {
			return next, nil
		}
	}
}

// Record stores what is known of a cluster, keeping its FirstSeen.
func (c *Catalog) Record(ctx context.Context, r ClusterRecord) error {
	key := c.prefix + "clusters/" + string(r.Cluster)
	resp, err := c.etcd.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("read catalog entry %s: %w", r.Cluster, err)
	}
	if len(resp.Kvs) == 1 {
		var old ClusterRecord
		if json.Unmarshal(resp.Kvs[0].Value, &old) == nil && !old.FirstSeen.IsZero() {
			r.FirstSeen = old.FirstSeen
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode catalog entry %s: %w", r.Cluster, err)
	}
	if _, err := c.etcd.Put(ctx, key, string(b)); err != nil {
		return fmt.Errorf("write catalog entry %s: %w", r.Cluster, err)
	}
	return nil
}

// ErrEpochPassed marks a record RecordNew did not write: the catalog has
// none of the cluster, and a newer epoch of it was issued meanwhile.
var ErrEpochPassed = errors.New("replicas: a newer epoch of the cluster was issued")

// RecordNew writes r when the catalog has no record of r.Cluster, so that a
// cluster is in the catalog before anything of it is served (a replica that
// starts cold waits for the clusters its catalog names). It never replaces
// a record (the leader keeps those current, see RecordAll), and writes only
// while r.Epoch is the cluster's newest epoch: a session that a newer one,
// or a drop, has superseded cannot bring back a record the leader has
// forgotten. It reports whether it wrote r; with no record and a newer
// epoch, it fails with ErrEpochPassed. A cluster the catalog holds costs one
// read.
func (c *Catalog) RecordNew(ctx context.Context, r ClusterRecord) (bool, error) {
	key := c.prefix + "clusters/" + string(r.Cluster)
	resp, err := c.etcd.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("read catalog entry %s: %w", r.Cluster, err)
	}
	if resp.Count > 0 {
		return false, nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return false, fmt.Errorf("encode catalog entry %s: %w", r.Cluster, err)
	}
	epochKey := c.prefix + "epochs/" + string(r.Cluster)
	txn, err := c.etcd.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		clientv3.Compare(clientv3.Value(epochKey), "=", strconv.FormatUint(r.Epoch, 10)),
	).Then(clientv3.OpPut(key, string(b))).Else(clientv3.OpGet(key, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return false, fmt.Errorf("write catalog entry %s: %w", r.Cluster, err)
	}
	if txn.Succeeded {
		return true, nil
	}
	if txn.Responses[0].GetResponseRange().GetCount() > 0 {
		return false, nil // written meanwhile (another session, or the leader)
	}
	return false, fmt.Errorf("record cluster %s at epoch %d: %w", r.Cluster, r.Epoch, ErrEpochPassed)
}

// maxRecordsPerTxn bounds the records one transaction writes: etcd refuses
// a transaction of more than 128 operations (its default --max-txn-ops).
const maxRecordsPerTxn = 64

// maxTxnBytes bounds what one transaction carries: etcd refuses a request
// of more than 1.5 MiB (its default --max-request-bytes).
const maxTxnBytes = 512 << 10

// MaxRecordBytes bounds one encoded record. Hellos bound what a record
// holds (IDs, build and network of at most 256 bytes each, so a record is
// about 1 KiB); a record beyond this is refused alone, never taking the
// records written with it down.
const MaxRecordBytes = 16 << 10

// RecordAll stores the records as they are (FirstSeen included: a caller
// that keeps it has read it, see List), in transactions of up to
// maxRecordsPerTxn records and maxTxnBytes. One record never stops
// another's: a record that cannot be encoded or is over MaxRecordBytes is
// left out, and a transaction etcd refuses as too large is written again
// one record at a time; the error names each record left out. Under the
// context of a leader term (see LeaderFence), each transaction writes only
// while that term's leadership holds, and RecordAll stops with ErrNotLeader
// otherwise; it stops too when etcd cannot be reached. It returns the
// records it wrote, also with an error.
func (c *Catalog) RecordAll(ctx context.Context, records []ClusterRecord) ([]ClusterRecord, error) {
	var written []ClusterRecord
	var errs []error
	var batch []ClusterRecord
	var ops []clientv3.Op
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		defer func() { batch, ops, size = batch[:0], ops[:0], 0 }()
		err := c.commit(ctx, ops)
		if errors.Is(err, rpctypes.ErrRequestTooLarge) && len(batch) == 1 {
			errs = append(errs, fmt.Errorf("catalog entry %.64s: %w", batch[0].Cluster, err))
			return nil
		}
		if errors.Is(err, rpctypes.ErrRequestTooLarge) {
			for i := range batch { // one at a time: the one too large fails alone
				if err := c.commit(ctx, ops[i:i+1]); err != nil {
					if !errors.Is(err, rpctypes.ErrRequestTooLarge) {
						return err
					}
					errs = append(errs, fmt.Errorf("catalog entry %.64s: %w", batch[i].Cluster, err))
					continue
				}
				written = append(written, batch[i])
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("write %d catalog entries: %w", len(batch), err)
		}
		written = append(written, batch...)
		return nil
	}
	for _, r := range records {
		b, err := json.Marshal(r.bounded())
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("encode catalog entry %.64s: %w", r.Cluster, err))
			continue
		case len(b) > MaxRecordBytes:
			errs = append(errs, fmt.Errorf("catalog entry %.64s: %d bytes encoded, more than %d", r.Cluster, len(b), MaxRecordBytes))
			continue
		}
		if len(batch) == maxRecordsPerTxn || size+len(b) > maxTxnBytes {
			if err := flush(); err != nil {
				return written, errors.Join(append(errs, err)...)
			}
		}
		batch = append(batch, r)
		ops = append(ops, clientv3.OpPut(c.prefix+"clusters/"+string(r.Cluster), string(b)))
		size += len(b)
	}
	if err := flush(); err != nil {
		errs = append(errs, err)
	}
	return written, errors.Join(errs...)
}

// maxRecordField bounds a record's spoke ID and build as a hello bounds
// them: a record an older hub wrote from an unbounded hello is cut, not
// left unwritten (its LiveAt would never be refreshed).
const maxRecordField = 256

// bounded returns r with its spoke ID and build cut to maxRecordField bytes.
func (r ClusterRecord) bounded() ClusterRecord {
	if len(r.SpokeID) > maxRecordField {
		r.SpokeID = r.SpokeID[:maxRecordField]
	}
	if len(r.Build) > maxRecordField {
		r.Build = r.Build[:maxRecordField]
	}
	return r
}

// commit writes ops in one transaction, fenced by the leader term of ctx
// if it has one.
func (c *Catalog) commit(ctx context.Context, ops []clientv3.Op) error {
	txn := c.etcd.Txn(ctx)
	if fence, fenced := LeaderFence(ctx); fenced {
		txn = txn.If(fence)
	}
	resp, err := txn.Then(ops...).Commit()
	switch {
	case err != nil:
		return err
	case !resp.Succeeded:
		return ErrNotLeader
	}
	return nil
}

// List returns every cluster in the catalog, sorted by ID.
func (c *Catalog) List(ctx context.Context) ([]ClusterRecord, error) {
	resp, err := c.etcd.Get(ctx, c.prefix+"clusters/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list catalog: %w", err)
	}
	out := make([]ClusterRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r ClusterRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("catalog entry %s is corrupt: %w", kv.Key, err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ClusterRecord) int { return strings.Compare(string(a.Cluster), string(b.Cluster)) })
	return out, nil
}

// Forget removes a dropped cluster's record, so that a replica starting
// cold no longer waits for it: only when the record predates the drop's
// epoch (a cluster whose spoke came back since keeps its newer record).
// The cluster's epoch counter stays, so its epochs never repeat. Under the
// context of a leader term (see LeaderFence), it forgets only while that
// term's leadership holds, and fails with ErrNotLeader otherwise.
func (c *Catalog) Forget(ctx context.Context, cluster registry.ClusterID, dropEpoch uint64) (bool, error) {
	key := c.prefix + "clusters/" + string(cluster)
	resp, err := c.etcd.Get(ctx, key)
	if err != nil {
		return false, fmt.Errorf("read catalog entry %s: %w", cluster, err)
	}
	if len(resp.Kvs) == 0 {
		return false, nil
	}
	var r ClusterRecord
	if json.Unmarshal(resp.Kvs[0].Value, &r) == nil && r.Epoch >= dropEpoch {
		return false, nil // recorded by a session since the drop
	}
	unchanged := clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)
	fence, fenced := LeaderFence(ctx)
	if !fenced {
		txn, err := c.etcd.Txn(ctx).If(unchanged).Then(clientv3.OpDelete(key)).Commit()
		if err != nil {
			return false, fmt.Errorf("forget catalog entry %s: %w", cluster, err)
		}
		return txn.Succeeded, nil
	}
	// Fenced: the nested transaction tells a lost leadership (ErrNotLeader)
	// from a record written meanwhile (kept).
	txn, err := c.etcd.Txn(ctx).If(fence).Then(clientv3.OpTxn([]clientv3.Cmp{unchanged}, []clientv3.Op{clientv3.OpDelete(key)}, nil)).Commit()
	if err != nil {
		return false, fmt.Errorf("forget catalog entry %s: %w", cluster, err)
	}
	if !txn.Succeeded {
		return false, fmt.Errorf("forget catalog entry %s: %w", cluster, ErrNotLeader)
	}
	return txn.Responses[0].GetResponseTxn().Succeeded, nil
}
