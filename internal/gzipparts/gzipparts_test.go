package gzipparts

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"testing"
)

// TestJoinedPartsReadAsOneMember: parts deflated apart, stored, empty and
// larger than a stored block read back, with a reader that takes one
// member only, as the concatenation of their raw bytes.
func TestJoinedPartsReadAsOneMember(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c, err := NewCompressor(flate.DefaultCompression)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 50 {
		var want []byte
		var parts []Part
		for range rng.IntN(8) {
			raw := make([]byte, rng.IntN(3)*rng.IntN(70000))
			for i := range raw {
				raw[i] = byte('a' + rng.IntN(4)) // compressible
			}
			want = append(want, raw...)
			if rng.IntN(2) == 0 {
				parts = append(parts, c.Deflate(raw))
			} else {
				parts = append(parts, Stored(raw))
			}
		}
		b := Append([]byte("head"), parts...)
		if !bytes.HasPrefix(b, []byte("head")) {
			t.Fatalf("round %d: the prefix is gone", round)
		}
		zr, err := gzip.NewReader(bytes.NewReader(b[4:]))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		zr.Multistream(false)
		got, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: read %d bytes, want %d", round, len(got), len(want))
		}
	}
}

// TestCombine: the CRC-32 combined from two parts' is the CRC-32 of both.
func TestCombine(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		a, b := make([]byte, rng.IntN(5000)), make([]byte, rng.IntN(5000))
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		want := crc32.ChecksumIEEE(append(bytes.Clone(a), b...))
		if got := combine(crc32.ChecksumIEEE(a), crc32.ChecksumIEEE(b), xpow8n(int64(len(b)))); got != want {
			t.Fatalf("combine(%d bytes, %d bytes) = %08x, want %08x", len(a), len(b), got, want)
		}
	}
}

// TestCorruptPartIsCaught: a flipped byte in a joined part fails the reader's CRC.
func TestCorruptPartIsCaught(t *testing.T) {
	raw := bytes.Repeat([]byte("nave "), 1000)
	b := Append(nil, Stored(raw[:100]), Stored(raw[100:]))
	b[len(header)+5+50] ^= 1 // inside the first part's raw bytes
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(zr); err == nil {
		t.Fatal("a corrupt part read back without an error")
	}
}
