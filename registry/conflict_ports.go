package registry

import (
	"fmt"
	"slices"
	"strings"
)

// portSetProperty is the Property of a conflict over which ports clusters
// export (as opposed to how they declare one port).
const portSetProperty = "ports"

// maxListedPorts bounds the ports a port-set conflict names on each side.
const maxListedPorts = 8

// IsPortSet reports whether the conflict is about which ports the clusters
// export: the import serves the union of them, so nothing of either cluster
// is ignored.
func (c Conflict) IsPortSet() bool { return c.Kind == PortConflict && c.Property == portSetProperty }

// mergePortSets appends a PortConflict for each shard whose set of ports
// (numbers and protocols) differs from the oldest export's (byAge is sorted
// oldest first). KEP-1645 and the upstream conformance suite want the
// import to expose the union of the ports and both ServiceExports to report
// the conflict. A port already reported by a conflict of its own (another
// name, or a name the oldest gives another port) is not named again: a
// shard whose differences are all reported so has no port-set conflict.
func mergePortSets(svc *Service, byAge []*Shard) {
	oldest := byAge[0]
	for _, s := range byAge[1:] {
		var onlyLoser, onlyOldest []ServicePort
		for _, p := range s.Ports {
			if _, ok := oldest.Port(p.Port, p.Protocol); !ok && slices.Contains(svc.Ports, p) {
				onlyLoser = append(onlyLoser, p)
			}
		}
		for _, p := range oldest.Ports {
			if _, ok := s.Port(p.Port, p.Protocol); ok || slices.ContainsFunc(s.Ports, func(q ServicePort) bool { return q.Name == p.Name }) {
				continue // the same port, or s names another port so: reported as a port name conflict
			}
			onlyOldest = append(onlyOldest, p)
		}
		if len(onlyLoser) == 0 && len(onlyOldest) == 0 {
			continue
		}
		var parts []string
		if len(onlyOldest) > 0 {
			parts = append(parts, fmt.Sprintf("%s only in %s", listPorts(onlyOldest), oldest.Cluster))
		}
		if len(onlyLoser) > 0 {
			parts = append(parts, fmt.Sprintf("%s only in %s", listPorts(onlyLoser), s.Cluster))
		}
		svc.Conflicts = append(svc.Conflicts, Conflict{
			Kind: PortConflict, Property: portSetProperty, Winner: oldest.Cluster, Loser: s.Cluster,
			Reason: "the clusters export different ports: " + strings.Join(parts, "; "),
		})
	}
}

// listPorts names ports as 443/TCP "https", at most maxListedPorts of them.
func listPorts(ps []ServicePort) string {
	var b strings.Builder
	for i, p := range ps {
		if i == maxListedPorts {
			fmt.Fprintf(&b, " and %d more", len(ps)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d/%s", p.Port, p.Protocol)
		if p.Name != "" {
			fmt.Fprintf(&b, " %q", p.Name)
		}
	}
	return b.String()
}
