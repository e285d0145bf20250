package hub

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/syncstatus"
)

// TestAdminConversions: what the admin API shows of the hub's data (the
// adminapi types the conversions of admin.go produce) has the JSON the data
// has: the same names, omitempty and omitzero, every field copied, nil
// kept nil.
func TestAdminConversions(t *testing.T) {
	checkConversion(t, adminImportStatus)
	checkConversion(t, adminAssignment)
	checkConversion(t, adminClient)
	checkConversion(t, adminTrace)

	if adminapi.Nacked != syncstatus.Nacked || adminapi.Stale != syncstatus.Stale || adminapi.Synced != syncstatus.Synced {
		t.Error("adminapi's client states are not syncstatus's")
	}
	for _, s := range []federation.ImportStatus{{}, {AckedVersion: 2, WrittenVersion: 2}, {AckedVersion: 2, WrittenVersion: 1},
		{AckedVersion: 2, WrittenVersion: 2, BlockedCount: 1}, {AckedVersion: 2, WrittenVersion: 2, Refused: map[string]string{"a/b": "x"}}} {
		if got, want := adminImportStatus(s).Written(), s.Written(); got != want {
			t.Errorf("Written of %+v: adminapi %v, federation %v", s, got, want)
		}
	}
}

// checkConversion checks convert: the JSON fields of T are those of S, but
// for extra; and S's values, zero, with empty slices and maps, or with one
// element each, have the same JSON converted.
func checkConversion[S, T any](t *testing.T, convert func(S) T, extra ...string) {
	t.Helper()
	from, to := jsonFields(reflect.TypeFor[S]()), jsonFields(reflect.TypeFor[T]())
	for _, f := range from {
		if !slices.Contains(to, f) {
			t.Errorf("%v shows %s, %v does not", reflect.TypeFor[S](), f, reflect.TypeFor[T]())
		}
	}
	for _, f := range to {
		name, _, _ := strings.Cut(strings.TrimPrefix(f, "."), "(")
		if !slices.Contains(from, f) && !slices.Contains(extra, name) {
			t.Errorf("%v shows %s, %v does not", reflect.TypeFor[T](), f, reflect.TypeFor[S]())
		}
	}
	values := make([]S, 3) // zero; filled with empty slices and maps; with one element each
	fill(reflect.ValueOf(&values[1]).Elem(), 0)
	fill(reflect.ValueOf(&values[2]).Elem(), 1)
	for _, s := range values {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(convert(s))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%v converted shows\n%s\nwant\n%s", reflect.TypeFor[S](), got, want)
		}
	}
}

// jsonFields lists the JSON fields of type t as "path(options) type", the
// type a kind or, for a type that marshals itself, its name.
func jsonFields(t reflect.Type) []string {
	var out []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		if pt := reflect.PointerTo(t); pt.Implements(reflect.TypeFor[json.Marshaler]()) || pt.Implements(reflect.TypeFor[encoding.TextMarshaler]()) {
			out = append(out, path+" "+t.String())
			return
		}
		switch t.Kind() {
		case reflect.Pointer:
			walk(t.Elem(), path+"*")
		case reflect.Slice, reflect.Array:
			walk(t.Elem(), path+"[]")
		case reflect.Map:
			walk(t.Elem(), path+"{"+t.Key().String()+"}")
		case reflect.Struct:
			for _, f := range reflect.VisibleFields(t) {
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				switch {
				case len(f.Index) > 1 || !f.IsExported() || name == "-":
					// reached through its embedding struct, or not shown
				case f.Anonymous && name == "":
					walk(f.Type, path)
				default:
					walk(f.Type, path+"."+cmp.Or(name, f.Name)+"("+opts+")")
				}
			}
		default:
			out = append(out, path+" "+t.Kind().String())
		}
	}
	walk(t, "")
	return out
}

// fill sets every exported field v holds: each pointer to a filled value,
// each slice and map to n filled elements.
func fill(v reflect.Value, n int) {
	switch v.Type() {
	case reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
		return
	case reflect.TypeFor[netip.Addr]():
		v.Set(reflect.ValueOf(netip.MustParseAddr("10.0.0.1")))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Float64:
		v.SetFloat(1.5)
	case reflect.String:
		v.SetString("x")
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), n)
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), n, n))
		for i := range n {
			fill(v.Index(i), n)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for range n {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(k, n)
			fill(e, n)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n)
			}
		}
	default:
		panic("fill: " + v.Type().String())
	}
}
