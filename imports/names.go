package imports

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"

	"github.com/navemesh/nave/registry"
)

var base32hex = base32.HexEncoding.WithPadding(base32.NoPadding)

// DerivedServiceName is the name of the Service an importing cluster
// derives from the ServiceImport of key, so that kube-proxy programs the
// clusterset IP: "derived-" and the first 10 characters of the lower-case,
// unpadded base32hex encoding of sha256("namespace/name").
//
// This is the reference implementation's recipe, checked against
// kubernetes-sigs/mcs-api (commit ded161a, controllers/common.go,
// derivedName(types.NamespacedName)): sha256 over NamespacedName.String()
// ("ns/name"), base32.HexEncoding without padding, strings.ToLower, [:10].
// (An early commit, d5778e3 of July 2020, used an "import-" prefix and
// hash.Sum(name) by mistake; it was replaced days later and is not used.)
// Using the same name lets the reference controller and Nave's writer
// agree on the derived Service.
func DerivedServiceName(key registry.ServiceKey) string {
	sum := sha256.Sum256([]byte(key.String()))
	return "derived-" + strings.ToLower(base32hex.EncodeToString(sum[:]))[:10]
}

// Imported EndpointSlice names are
//
//	<service name>-<source cluster>-<ipv4|ipv6>-<hash>-<index>
//
// where hash is the first 8 characters of the lower-case base32hex of
// sha256("nave.imports.slice/v1\x00" + namespace + "\x00" + name + "\x00" +
// cluster + "\x00" + family), and index is a decimal number, the smallest
// not in use when the slice is made. The readable parts tell an operator
// what the slice is; the hash keeps names of different services and
// clusters apart (the hyphen-joined parts alone are ambiguous: service
// "a-b" from cluster "c" and service "a" from cluster "b-c") and makes a
// clash with a user's own objects unlikely. A service name and a cluster ID
// are DNS labels of at most 63 characters, so a name is at most about 150
// characters, a valid DNS subdomain (object names are limited to 253).
// Names are only ever derived when a slice is made: a slice keeps its name
// for as long as it has endpoints.

// slicePrefix is a slice name without its index.
func slicePrefix(key registry.ServiceKey, cluster registry.ClusterID, family registry.IPFamily) string {
	h := sha256.New()
	for i, part := range []string{"nave.imports.slice/v1", key.Namespace, key.Name, string(cluster), string(family)} {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(part))
	}
	var sum [sha256.Size]byte
	hash := strings.ToLower(base32hex.EncodeToString(h.Sum(sum[:0])))[:8]
	fam := "ipv6"
	if family == registry.IPv4 {
		fam = "ipv4"
	}
	return nameLabel(key.Name) + "-" + nameLabel(string(cluster)) + "-" + fam + "-" + hash + "-"
}

// sliceName is the slice name of the given index.
func sliceName(prefix string, index int) string { return prefix + strconv.Itoa(index) }

// nameLabel keeps a name part a lower-case DNS label of at most 63
// characters. Registry keys and cluster IDs already are; this only keeps a
// name valid for input that bypassed validation (the hash still tells such
// names apart).
func nameLabel(s string) string {
	if len(s) > 63 {
		s = s[:63]
	}
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	s = strings.Trim(string(b), "-")
	if s == "" {
		return "x"
	}
	return s
}
