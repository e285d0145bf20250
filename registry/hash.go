package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Hash is a content digest. Digests of sets combine by XOR, so a set's digest
// can be kept up to date one member at a time and does not depend on order.
type Hash [16]byte

// ZeroHash is the digest of the empty set.
var ZeroHash Hash

// Xor combines two digests (and removes one from a combination).
func (h Hash) Xor(o Hash) Hash {
	for i := range h {
		h[i] ^= o[i]
	}
	return h
}

// String renders the hash as hex.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// MarshalText renders the hash as hex.
func (h Hash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText parses hex.
func (h *Hash) UnmarshalText(b []byte) error {
	if len(b) != 2*len(h) {
		return fmt.Errorf("%w: digest %s is not %d hex digits", ErrInvalid, quoted(string(b)), 2*len(h))
	}
	_, err := hex.Decode(h[:], b)
	return err
}

// Hash is the digest of a normalized shard. nil and empty slices hash alike
// (the encoding omits both), as Equal treats them alike.
func (s *Shard) Hash() Hash {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("registry: encode shard: %v", err)) // every field is plain data
	}
	sum := sha256.Sum256(b)
	var h Hash
	copy(h[:], sum[:])
	return h
}

// Digest is the digest of a set of shards, equal to Registry.ClusterDigest
// for a cluster holding exactly these shards.
func Digest[S ~map[K]*Shard, K comparable](shards S) Hash {
	var h Hash
	for _, s := range shards {
		h = h.Xor(s.Hash())
	}
	return h
}
