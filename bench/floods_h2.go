package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// A raw HTTP/2 client for flood d: one gRPC stream whose headers ignore the
// bound the server advertises (SETTINGS_MAX_HEADER_LIST_SIZE), which every
// real HTTP/2 client (grpc-go's, net/http's) enforces on itself. It
// encodes headers as HPACK literals (no Huffman, no table) and tells what
// the server did with the stream by the frames it answers with; it does
// not decode the server's headers.

// HTTP/2 frame types and flags (RFC 9113).
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2Settings     = 0x4
	h2Ping         = 0x6
	h2GoAway       = 0x7
	h2WindowUpdate = 0x8
	h2Continuation = 0x9

	h2FlagEndStream  = 0x1
	h2FlagAck        = 0x1
	h2FlagEndHeaders = 0x4

	// h2MaxFrame is the frame size every server takes (the protocol's default).
	h2MaxFrame = 16 << 10
)

// h2Served is the outcome of a stream the server answered with data: it
// took the headers and served the request.
const h2Served = "served (answered with data)"

var h2ErrCodes = []string{"NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
	"STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR",
	"ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"}

func h2ErrCode(c uint32) string {
	if int(c) < len(h2ErrCodes) {
		return h2ErrCodes[c]
	}
	return fmt.Sprintf("0x%x", c)
}

// h2Conn is one raw HTTP/2 connection carrying stream 1.
type h2Conn struct {
	c   net.Conn
	wmu sync.Mutex
	// result receives the first thing that decides stream 1's fate.
	result chan string
	once   sync.Once
}

// dialH2 connects from from to addr and sends the connection preface and
// settings: large windows, so the client never has to update them.
func dialH2(ctx context.Context, from netip.Addr, addr string) (*h2Conn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	h := &h2Conn{c: c, result: make(chan string, 1)}
	settings := make([]byte, 6)
	binary.BigEndian.PutUint16(settings, 0x4) // SETTINGS_INITIAL_WINDOW_SIZE
	binary.BigEndian.PutUint32(settings[2:], 1<<30)
	window := make([]byte, 4)
	binary.BigEndian.PutUint32(window, 1<<30-65535)
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	if err := h.write(h2Settings, 0, 0, settings); err != nil {
		c.Close()
		return nil, err
	}
	if err := h.write(h2WindowUpdate, 0, 0, window); err != nil {
		c.Close()
		return nil, err
	}
	go h.read()
	return h, nil
}

// write sends one frame.
func (h *h2Conn) write(typ, flags byte, stream uint32, payload []byte) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return writeFrame(h.c, typ, flags, stream, payload)
}

func writeFrame(w io.Writer, typ, flags byte, stream uint32, payload []byte) error {
	var hdr [9]byte
	hdr[0], hdr[1], hdr[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	hdr[3], hdr[4] = typ, flags
	binary.BigEndian.PutUint32(hdr[5:], stream&0x7fffffff)
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// stream opens stream 1: a gRPC request to path with the extra headers,
// in HEADERS and CONTINUATION frames, then msg as one gRPC message (the
// stream stays open, as an ADS stream does).
func (h *h2Conn) stream(path, authority string, extra [][2]string, msg []byte) error {
	block := hpackHeaders(append([][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", authority},
		{"content-type", "application/grpc"}, {"te", "trailers"}}, extra...))
	// Nothing may come between a header block's frames (the reader's
	// settings and ping acknowledgements wait): the block holds the lock.
	h.wmu.Lock()
	first := true
	for len(block) > 0 || first {
		n := min(len(block), h2MaxFrame)
		var flags byte
		if n == len(block) {
			flags = h2FlagEndHeaders
		}
		typ := byte(h2Continuation)
		if first {
			typ = h2Headers
		}
		if err := writeFrame(h.c, typ, flags, 1, block[:n]); err != nil {
			h.wmu.Unlock()
			return err
		}
		block, first = block[n:], false
	}
	h.wmu.Unlock()
	data := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(data[1:], uint32(len(msg)))
	copy(data[5:], msg)
	return h.write(h2Data, 0, 1, data)
}

// decide records stream 1's fate, once.
func (h *h2Conn) decide(outcome string) {
	h.once.Do(func() { h.result <- outcome })
}

// read answers the server's settings and pings, and decides stream 1's
// fate from the first frame that tells it, until the connection ends.
func (h *h2Conn) read() {
	r := bufio.NewReader(h.c)
	var hdr [9]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			h.decide(connClosed(err))
			return
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags, stream := hdr[3], hdr[4], binary.BigEndian.Uint32(hdr[5:])&0x7fffffff
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			h.decide(connClosed(err))
			return
		}
		switch typ {
		case h2Settings:
			if flags&h2FlagAck == 0 {
				_ = h.write(h2Settings, h2FlagAck, 0, nil)
			}
		case h2Ping:
			if flags&h2FlagAck == 0 {
				_ = h.write(h2Ping, h2FlagAck, 0, payload)
			}
		case h2Data:
			if stream == 1 && n > 0 {
				h.decide(h2Served)
			}
		case h2Headers:
			if stream == 1 && flags&h2FlagEndStream != 0 {
				h.decide("ended by trailers (gRPC status not decoded)")
			}
		case h2RSTStream:
			if stream == 1 && n >= 4 {
				h.decide("RST_STREAM " + h2ErrCode(binary.BigEndian.Uint32(payload)))
			}
		case h2GoAway:
			if n >= 8 {
				last, code := binary.BigEndian.Uint32(payload)&0x7fffffff, binary.BigEndian.Uint32(payload[4:])
				if last < 1 || code != 0 {
					what := "GOAWAY " + h2ErrCode(code)
					if debug := payload[8:]; len(debug) > 0 {
						what += fmt.Sprintf(" (%.80s)", debug)
					}
					h.decide(what)
				}
			}
		}
	}
}

// connClosed says how the connection ended, without addresses.
func connClosed(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the server"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by the server"
	case errors.Is(err, net.ErrClosed):
		return "connection closed by the client"
	}
	return "connection error: " + firstLine(err.Error())
}

// outcome waits (at most d) for stream 1's fate.
func (h *h2Conn) outcome(d time.Duration) string {
	select {
	case o := <-h.result:
		return o
	case <-time.After(d):
		return "no answer"
	}
}

func (h *h2Conn) close() { _ = h.c.Close() }

// hpackHeaders encodes headers as HPACK literals without indexing, with new
// names and no Huffman coding (RFC 7541, 6.2.2): valid for any decoder.
func hpackHeaders(headers [][2]string) []byte {
	var b []byte
	for _, h := range headers {
		b = append(b, 0x00)
		b = hpackString(b, h[0])
		b = hpackString(b, h[1])
	}
	return b
}

func hpackString(b []byte, s string) []byte {
	b = hpackInt(b, 0x00, 7, uint64(len(s)))
	return append(b, s...)
}

// hpackInt encodes v with an n-bit prefix after the bits of first (RFC 7541, 5.1).
func hpackInt(b []byte, first byte, n uint, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	v -= limit
	for v >= 128 {
		b = append(b, byte(v%128+128))
		v /= 128
	}
	return append(b, byte(v))
}
