package replicas

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/navemesh/nave/registry"
)

// Errors of the snapshot store.
var (
	// ErrSnapshotSuperseded: a snapshot of the same or a newer revision is
	// current (or being written), so this one was not stored.
	ErrSnapshotSuperseded = errors.New("replicas: snapshot superseded")
	// ErrSnapshotTooLarge: the encoded snapshot is larger than the store takes.
	ErrSnapshotTooLarge = errors.New("replicas: snapshot too large")
	// ErrSnapshotCorrupt: the stored snapshot does not match its pointer, or cannot be decoded.
	ErrSnapshotCorrupt = errors.New("replicas: stored snapshot corrupt")
	// ErrNotLeader: a save made within a leader term (see LeaderFence) found
	// that this replica no longer leads.
	ErrNotLeader = errors.New("replicas: not the leader")
)

const (
	// DefaultMaxSnapshotBytes is the encoded size NewSnapshotStore takes by default.
	DefaultMaxSnapshotBytes = 64 << 20
	// snapshotChunkBytes keeps every write well under etcd's default request limit (1.5 MiB).
	snapshotChunkBytes = 1 << 20
	// maxSnapshotChunks: the switch compares every chunk in one Txn, and etcd
	// allows 128 comparisons per Txn by default.
	maxSnapshotChunks = 120
	// loadAttempts bounds how often Load reads again after a compaction.
	loadAttempts = 3
)

// SnapshotStore keeps the current registry snapshot in etcd. Keys (under
// prefix, default "/nave/"):
//
//	snapshots/current           JSON pointer: revision, chunk count, size, sha256
//	snapshots/<revision>/<n>    the encoded snapshot, in chunks of at most 1 MiB
//
// Revisions are zero-padded to 20 digits, so they sort as numbers. A save
// writes its chunks first and then switches the pointer in one Txn, so a
// crash mid-save leaves the previous snapshot intact; readers only follow
// the pointer. Safe for concurrent use.
type SnapshotStore struct {
	etcd       *clientv3.Client
	dir        string // prefix + "snapshots/"
	maxBytes   int
	chunkBytes int
	encode     func(registry.Snapshot) ([]byte, error)
}

// snapshotPointer is the value of snapshots/current.
type snapshotPointer struct {
	Revision uint64    `json:"revision"`
	Chunks   int       `json:"chunks"`
	Bytes    int       `json:"bytes"`
	SHA256   string    `json:"sha256"`
	Taken    time.Time `json:"taken"`
}

// NewSnapshotStore returns a store under prefix that refuses snapshots whose
// encoding is larger than maxBytes (<= 0: DefaultMaxSnapshotBytes; at most
// 120 MiB, the most one Txn can switch).
func NewSnapshotStore(etcd *clientv3.Client, prefix string, maxBytes int) *SnapshotStore {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxSnapshotBytes
	}
	maxBytes = min(maxBytes, maxSnapshotChunks*snapshotChunkBytes)
	return &SnapshotStore{etcd: etcd, dir: prefix + "snapshots/", maxBytes: maxBytes, chunkBytes: snapshotChunkBytes,
		encode: newSnapshotEncoder().Encode} // one encoder per store: each save reuses what the last compressed
}

// WriteFormat sets the format Save writes: 2 (protobuf, the default) or 1
// (JSON), the only one that versions before format 2 read; write it before
// going back to such a version, so it restores the snapshot. Load reads both.
// Call it before the store is used.
func (s *SnapshotStore) WriteFormat(format int) error {
	switch format {
	case snapshotFormat:
		s.encode = newSnapshotEncoder().Encode
	case registry.SnapshotFormatJSON:
		s.encode = registry.EncodeSnapshot
	default:
		return fmt.Errorf("snapshot format %d: want %d or %d", format, registry.SnapshotFormatJSON, snapshotFormat)
	}
	return nil
}

func (s *SnapshotStore) currentKey() string { return s.dir + "current" }

// revisionDir is where the chunks of revision rev live.
func (s *SnapshotStore) revisionDir(rev uint64) string { return fmt.Sprintf("%s%020d/", s.dir, rev) }

func (s *SnapshotStore) chunkKey(rev uint64, n int) string {
	return fmt.Sprintf("%s%04d", s.revisionDir(rev), n)
}

// Save encodes and stores snap, and reports its encoded size. It refuses,
// writing nothing, a snapshot larger than the store's limit
// (ErrSnapshotTooLarge) and one whose revision is not newer than the
// current one (ErrSnapshotSuperseded), so a deposed leader never overwrites
// a newer snapshot. When ctx comes from a leader term (LeaderFence), every
// write also requires that this replica still leads (ErrNotLeader). Once the
// pointer is switched, the chunks of older revisions are deleted in the same
// Txn. Saves of different revisions may run concurrently.
func (s *SnapshotStore) Save(ctx context.Context, snap registry.Snapshot) (int, error) {
	b, err := s.encode(snap)
	if err != nil {
		return 0, fmt.Errorf("save snapshot %d: %w", snap.Revision, err)
	}
	if len(b) > s.maxBytes {
		return 0, fmt.Errorf("save snapshot %d: %w: %d bytes encoded, more than the limit of %d",
			snap.Revision, ErrSnapshotTooLarge, len(b), s.maxBytes)
	}
	sum := sha256.Sum256(b)
	var chunks [][]byte
	for rest := b; len(rest) > 0; {
		n := min(len(rest), s.chunkBytes)
		chunks, rest = append(chunks, rest[:n]), rest[n:]
	}
	ptr, err := json.Marshal(snapshotPointer{Revision: snap.Revision, Chunks: len(chunks), Bytes: len(b),
		SHA256: hex.EncodeToString(sum[:]), Taken: snap.Taken.UTC()})
	if err != nil {
		return 0, fmt.Errorf("save snapshot %d: %w", snap.Revision, err)
	}
	w := &snapshotWrite{store: s, rev: snap.Revision}
	w.fence, w.fenced = LeaderFence(ctx)
	if err := w.look(ctx); err != nil {
		return 0, err
	}
	// Leftovers of an earlier attempt at this revision (a crash mid-save) go first.
	if err := w.do(ctx, "clear leftovers", nil, clientv3.OpDelete(s.revisionDir(snap.Revision), clientv3.WithPrefix())); err != nil {
		return 0, err
	}
	// The switch requires every chunk exactly as written: no other writer of the same revision interfered.
	written := make([]clientv3.Cmp, 0, len(chunks))
	for i, c := range chunks {
		key := s.chunkKey(snap.Revision, i)
		err := w.do(ctx, fmt.Sprintf("write chunk %d of %d", i+1, len(chunks)), nil, clientv3.OpPut(key, string(c)))
		if err != nil {
			return 0, err
		}
		written = append(written, clientv3.Compare(clientv3.ModRevision(key), "=", w.at))
	}
	older := clientv3.OpDelete(s.dir, clientv3.WithRange(s.revisionDir(snap.Revision))) // [snapshots/, snapshots/<rev>/): older revisions only
	if err := w.do(ctx, "switch", written, clientv3.OpPut(s.currentKey(), string(ptr)), older); err != nil {
		return 0, err
	}
	return len(b), nil
}

// maxPointerMoves bounds how often one save follows the pointer moving to
// older snapshots saved concurrently (each move is another save succeeding).
const maxPointerMoves = 100

// snapshotWrite is one Save in progress. Each of its writes is a Txn that
// runs only while the pointer is where it last looked (so it never touches
// the chunks of a revision that has become current) and, within a leader
// term, while this replica leads.
type snapshotWrite struct {
	store  *SnapshotStore
	rev    uint64
	fence  clientv3.Cmp
	fenced bool
	curMod int64 // the pointer's ModRevision when last looked at (0: none)
	moves  int
	at     int64 // the etcd revision of the last write
}

// look reads the pointer, and refuses to go on if it is at this revision or
// newer. A pointer that cannot be read is overwritten: it protects nothing,
// and would otherwise stop every save.
func (w *snapshotWrite) look(ctx context.Context) error {
	cur, mod, err := w.store.pointer(ctx)
	if err != nil && !errors.Is(err, ErrSnapshotCorrupt) {
		return fmt.Errorf("save snapshot %d: %w", w.rev, err)
	}
	if err == nil && mod != 0 && cur.Revision >= w.rev {
		return fmt.Errorf("save snapshot %d: %w: revision %d is current", w.rev, ErrSnapshotSuperseded, cur.Revision)
	}
	w.curMod = mod
	return nil
}

// do runs ops when the guard and conds hold. When they do not, it finds out
// why: leadership lost, a newer snapshot current, the same revision written
// by another writer; or the pointer moved to an older snapshot, and it tries again.
func (w *snapshotWrite) do(ctx context.Context, what string, conds []clientv3.Cmp, ops ...clientv3.Op) error {
	for {
		guard := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(w.store.currentKey()), "=", w.curMod)}, conds...)
		if w.fenced {
			guard = append(guard, w.fence)
		}
		resp, err := w.store.etcd.Txn(ctx).If(guard...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("save snapshot %d: %s: %w", w.rev, what, err)
		}
		if resp.Succeeded {
			w.at = resp.Header.Revision
			return nil
		}
		if w.fenced {
			resp, err := w.store.etcd.Txn(ctx).If(w.fence).Commit()
			if err != nil {
				return fmt.Errorf("save snapshot %d: check leadership: %w", w.rev, err)
			}
			if !resp.Succeeded {
				return fmt.Errorf("save snapshot %d: %w", w.rev, ErrNotLeader)
			}
		}
		was := w.curMod
		if err := w.look(ctx); err != nil {
			return err
		}
		if w.curMod == was {
			return fmt.Errorf("save snapshot %d: %w: another writer is writing the same revision", w.rev, ErrSnapshotSuperseded)
		}
		if w.moves++; w.moves > maxPointerMoves {
			return fmt.Errorf("save snapshot %d: the current snapshot moved %d times during the save", w.rev, w.moves)
		}
	}
}

// pointer reads the current pointer and its ModRevision (0 when there is
// none); an error wrapping ErrSnapshotCorrupt comes with the ModRevision.
func (s *SnapshotStore) pointer(ctx context.Context) (snapshotPointer, int64, error) {
	resp, err := s.etcd.Get(ctx, s.currentKey())
	if err != nil {
		return snapshotPointer{}, 0, fmt.Errorf("read the current snapshot pointer: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return snapshotPointer{}, 0, nil
	}
	var p snapshotPointer
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil {
		return snapshotPointer{}, resp.Kvs[0].ModRevision, fmt.Errorf("%w: pointer %s: %w", ErrSnapshotCorrupt, s.currentKey(), err)
	}
	return p, resp.Kvs[0].ModRevision, nil
}

// Load returns the current snapshot, or false when none was saved. The
// pointer and its chunks are read at one etcd revision, so a concurrent
// save cannot tear them; the size and sha256 are checked before decoding.
func (s *SnapshotStore) Load(ctx context.Context) (registry.Snapshot, bool, error) {
	for attempt := 1; ; attempt++ {
		snap, ok, err := s.load(ctx)
		// A compaction between reading the pointer and its chunks: read again.
		if errors.Is(err, rpctypes.ErrCompacted) && attempt < loadAttempts {
			continue
		}
		return snap, ok, err
	}
}

func (s *SnapshotStore) load(ctx context.Context) (registry.Snapshot, bool, error) {
	resp, err := s.etcd.Get(ctx, s.currentKey())
	if err != nil {
		return registry.Snapshot{}, false, fmt.Errorf("load snapshot: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return registry.Snapshot{}, false, nil
	}
	at := resp.Header.Revision
	var p snapshotPointer
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil {
		return registry.Snapshot{}, false, fmt.Errorf("load snapshot: %w: pointer: %w", ErrSnapshotCorrupt, err)
	}
	corrupt := func(format string, args ...any) (registry.Snapshot, bool, error) {
		return registry.Snapshot{}, false, fmt.Errorf("load snapshot %d: %w: "+format,
			append([]any{p.Revision, ErrSnapshotCorrupt}, args...)...)
	}
	if p.Chunks < 1 || p.Chunks > maxSnapshotChunks || p.Bytes < 0 || p.Bytes > p.Chunks*snapshotChunkBytes {
		return corrupt("pointer names %d chunks of %d bytes in all", p.Chunks, p.Bytes)
	}
	want, err := hex.DecodeString(p.SHA256)
	if err != nil || len(want) != sha256.Size {
		return corrupt("pointer's sha256 %q is not a sha256", p.SHA256)
	}
	b := make([]byte, 0, p.Bytes)
	for i := range p.Chunks {
		key := s.chunkKey(p.Revision, i)
		cr, err := s.etcd.Get(ctx, key, clientv3.WithRev(at))
		if err != nil {
			return registry.Snapshot{}, false, fmt.Errorf("load snapshot %d: chunk %d of %d: %w", p.Revision, i+1, p.Chunks, err)
		}
		if len(cr.Kvs) == 0 {
			return corrupt("chunk %d of %d (%s) is missing", i+1, p.Chunks, key)
		}
		if len(b)+len(cr.Kvs[0].Value) > p.Bytes {
			return corrupt("chunks hold more than the %d bytes the pointer names", p.Bytes)
		}
		b = append(b, cr.Kvs[0].Value...)
	}
	if len(b) != p.Bytes {
		return corrupt("chunks hold %d bytes, the pointer names %d", len(b), p.Bytes)
	}
	if sum := sha256.Sum256(b); !bytes.Equal(sum[:], want) {
		return corrupt("sha256 %x does not match the pointer's %s", sum, p.SHA256)
	}
	snap, err := DecodeSnapshot(b)
	if err != nil {
		return registry.Snapshot{}, false, fmt.Errorf("load snapshot %d: %w: %w", p.Revision, ErrSnapshotCorrupt, err)
	}
	if snap.Revision != p.Revision {
		return corrupt("it holds revision %d", snap.Revision)
	}
	return snap, true, nil
}
