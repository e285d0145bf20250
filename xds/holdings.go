package xds

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/navemesh/nave/internal/xdstype"
	"github.com/navemesh/nave/syncstatus"
)

// maxDifferences bounds the differences reported per client and type.
const maxDifferences = 100

// Clients returns the sync status of every stream the server serves (see
// syncstatus.Tracker.Clients); with a node ID, only that node's streams,
// each with the resources it subscribes to and the differences between
// what it acknowledged and what the server would send it now.
func (s *Server) Clients(nodeID string) []syncstatus.Client {
	cs := s.status.Clients(nodeID)
	if nodeID == "" {
		return cs
	}
	for i := range cs {
		node := s.status.Node(cs[i].Stream)
		for label, t := range cs[i].Types {
			t.Differences = s.differences(node, typeURLOf(label), t)
			cs[i].Types[label] = t
		}
	}
	return cs
}

func typeURLOf(label string) string {
	switch label {
	case xdstype.LDS:
		return resource.ListenerType
	case xdstype.RDS:
		return resource.RouteType
	case xdstype.CDS:
		return resource.ClusterType
	case xdstype.EDS:
		return resource.EndpointType
	default:
		return ""
	}
}

// differences compares what a stream acknowledged of a type with what the
// cache that serves it holds now: each resource it asks for (each the
// cache holds, for a wildcard) that changed after the version it
// acknowledged, or that the cache does not hold. The versions of one cache
// count up, so the comparison is exact while the acknowledged version is
// that cache's; a version of another cache (another replica, or the
// client's former locality group) says nothing of what it holds.
func (s *Server) differences(node *core.Node, typeURL string, t syncstatus.Type) []syncstatus.Difference {
	if node == nil || typeURL == "" {
		return nil
	}
	c := s.dispatch.cacheFor(typeURL, node)
	if c == nil {
		return nil
	}
	if t.Resumed && t.Sent == "" {
		return nil // a delta stream that came back holding what it had, sent nothing newer since
	}
	allow := s.restrictionOf(node)
	allowed := func(name string) bool {
		ns, ok := NamespaceOf(name)
		return allow == nil || ok && allow(ns)
	}
	names := slices.Clone(t.Names)
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	if t.Wildcard {
		for name := range c.published {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	names = slices.DeleteFunc(names, func(n string) bool { return !allowed(n) }) // never sent to this stream
	acked, ours := uint64(0), strings.HasPrefix(t.Acked, c.prefix)
	if ours {
		n, err := strconv.ParseUint(strings.TrimPrefix(t.Acked, c.prefix), 10, 64)
		acked, ours = n, err == nil
	}
	var out []syncstatus.Difference
	for _, name := range names {
		if name == "*" {
			continue
		}
		p, held := c.published[name]
		d := syncstatus.Difference{Resource: name, Held: t.Acked}
		if held {
			d.Current = c.prefix + strconv.FormatUint(p.version, 10)
		}
		switch {
		case !held:
			d.Reason = "this replica serves no such resource"
		case t.AllUnresolved || slices.Contains(t.Unresolved, name):
			d.Reason = "the client rejected it, and has accepted no response carrying it since (it is resent once it changes)"
		case t.Acked == "":
			d.Reason = "the client acknowledged nothing of this type yet"
		case !ours:
			d.Reason = fmt.Sprintf("the client acknowledged another cache's version (%s is not one of %s*: another replica or locality group)", t.Acked, c.prefix)
		case p.version > acked:
			d.Reason = "changed after the version the client acknowledged"
		default:
			continue
		}
		if len(out) == maxDifferences {
			out = append(out, syncstatus.Difference{Reason: fmt.Sprintf("and more: the first %d are shown", maxDifferences)})
			break
		}
		out = append(out, d)
	}
	return out
}
