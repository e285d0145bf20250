// Package gzipparts builds one gzip member out of parts deflated one by one,
// so that a large body that changes in a few places is compressed again
// only where it changed: a part kept from an earlier body is joined as it
// is. Every gzip reader reads the result as a single member.
//
// Each part is deflated with a fresh dictionary and ends byte-aligned (a
// sync flush), which is what lets deflated parts be concatenated; the CRC-32
// of the whole is combined from the parts' own, without their raw bytes.
package gzipparts

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"hash/crc32"
	"slices"
)

// Part is a piece of the body, deflated.
type Part struct {
	raw      int64  // the length of the raw bytes
	crc      uint32 // their CRC-32 (IEEE)
	shift    uint32 // x^(8·raw) modulo the CRC polynomial (see combine)
	deflated []byte // non-final deflate blocks, ending byte-aligned
}

// Len is the length of the part's raw bytes.
func (p Part) Len() int64 { return p.raw }

// Size is the length of the part deflated.
func (p Part) Size() int { return len(p.deflated) }

// Compressor deflates parts at one level. It reuses its state from part to
// part; it is not safe for concurrent use.
type Compressor struct {
	w   *flate.Writer
	buf bytes.Buffer
}

// NewCompressor returns a compressor at a compress/flate level.
func NewCompressor(level int) (*Compressor, error) {
	c := &Compressor{}
	w, err := flate.NewWriter(&c.buf, level)
	if err != nil {
		return nil, err
	}
	c.w = w
	return c, nil
}

// Deflate returns raw as a part, compressed.
func (c *Compressor) Deflate(raw []byte) Part {
	c.buf.Reset()
	c.w.Reset(&c.buf) // a fresh dictionary: the part reads nothing before it
	c.w.Write(raw)    // a bytes.Buffer takes everything
	c.w.Flush()       // not Close: the part's last block must not be the final one
	return Part{raw: int64(len(raw)), crc: crc32.ChecksumIEEE(raw), shift: xpow8n(int64(len(raw))), deflated: bytes.Clone(c.buf.Bytes())}
}

// Stored returns raw as a part left uncompressed (cheaper for small pieces).
func Stored(raw []byte) Part {
	p := Part{raw: int64(len(raw)), crc: crc32.ChecksumIEEE(raw), shift: xpow8n(int64(len(raw)))}
	for len(raw) > 0 || p.deflated == nil {
		n := min(len(raw), 0xffff)
		// A stored block: BFINAL 0, BTYPE 00, padded to the byte; LEN and its complement.
		p.deflated = append(p.deflated, 0)
		p.deflated = binary.LittleEndian.AppendUint16(p.deflated, uint16(n))
		p.deflated = binary.LittleEndian.AppendUint16(p.deflated, ^uint16(n))
		p.deflated, raw = append(p.deflated, raw[:n]...), raw[n:]
	}
	return p
}

// header is a gzip member's header: deflate, no flags, no time, unknown OS.
var header = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}

// final is an empty stored block with BFINAL set: the deflate stream's end.
var final = []byte{1, 0, 0, 0xff, 0xff}

// Append appends to dst one gzip member holding the parts' raw bytes in order.
func Append(dst []byte, parts ...Part) []byte {
	n := len(header) + len(final) + 8
	for _, p := range parts {
		n += len(p.deflated)
	}
	dst = append(slices.Grow(dst, n), header...)
	var crc uint32
	var size int64
	for _, p := range parts {
		dst = append(dst, p.deflated...)
		crc = combine(crc, p.crc, p.shift)
		size += p.raw
	}
	dst = append(dst, final...)
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	return binary.LittleEndian.AppendUint32(dst, uint32(size)) // ISIZE is the length modulo 2^32
}

// combine returns the CRC-32 of a || b from a's CRC, b's and shift, which
// is x^(8n) modulo the polynomial for b's length n (xpow8n).
//
// A CRC is linear over GF(2): the CRC of a followed by n bytes is a's CRC
// times x^(8n) modulo the polynomial, plus b's CRC (the pre- and
// post-conditioning cancel out). Polynomials are held reflected, as in
// hash/crc32: the x^0 coefficient in the top bit.
func combine(a, b, shift uint32) uint32 { return mulmod(shift, a) ^ b }

// mulmod returns a·b modulo the CRC-32 polynomial.
func mulmod(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		// b times x: a shift toward the low bits, reduced by the polynomial.
		if b&1 != 0 {
			b = b>>1 ^ crc32.IEEE
		} else {
			b >>= 1
		}
	}
	return p
}

// xpow8n returns x^(8n) modulo the polynomial, by squaring: x^(8·2^k) for
// each bit k of n.
func xpow8n(n int64) uint32 {
	p := uint32(1) << 31                      // x^0
	sq := mulmod(1<<30, 1<<30)                // x^2
	sq = mulmod(sq, sq)                       // x^4
	for sq = mulmod(sq, sq); n > 0; n >>= 1 { // x^8, then x^16, ...
		if n&1 != 0 {
			p = mulmod(sq, p)
		}
		sq = mulmod(sq, sq)
	}
	return p
}
