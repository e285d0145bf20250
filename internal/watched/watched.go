// Package watched holds a file parsed into a value, read again when the
// file changes: a version that is empty, does not parse, or that a check
// refuses changes nothing.
package watched

import (
	"bytes"
	"fmt"
	"os"
	"sync/atomic"
)

// File is a file parsed into T.
type File[T any] struct {
	what  string // what it holds, for errors
	path  string
	parse func(path string, raw []byte) (T, error)
	check func(T) error // nil: none
	cur   atomic.Pointer[T]
	raw   []byte // what cur was read from; owned by Reload's caller
}

// Open reads the file at path, which holds what (for errors), with parse;
// check (nil: none) must accept every version of it.
func Open[T any](what, path string, parse func(path string, raw []byte) (T, error), check func(T) error) (*File[T], error) {
	f := &File[T]{what: what, path: path, parse: parse, check: check}
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Get returns what the file last held when it read cleanly.
func (f *File[T]) Get() T { return *f.cur.Load() }

// Reload reads the file again and reports whether it changed; a version
// that does not read cleanly changes nothing. Call it from one goroutine
// at a time.
func (f *File[T]) Reload() (bool, error) {
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", f.what, err)
	}
	if f.cur.Load() != nil && bytes.Equal(raw, f.raw) {
		return false, nil
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		// Caught half-written, or templated empty: never a version to apply.
		return false, fmt.Errorf("%s %s is empty", f.what, f.path)
	}
	v, err := f.parse(f.path, raw)
	if err != nil {
		return false, err
	}
	if f.check != nil {
		if err := f.check(v); err != nil {
			return false, fmt.Errorf("%s %s: %w", f.what, f.path, err)
		}
	}
	f.raw = raw
	f.cur.Store(&v)
	return true, nil
}
