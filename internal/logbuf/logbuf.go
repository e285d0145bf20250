// Package logbuf is a log's output in memory for tests, written by the
// goroutines of the server under test while the test reads it.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use; the zero value is empty.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
