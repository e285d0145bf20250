package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/navemesh/nave/adminapi"
)

// imports prints the clusterset's imports as the hub holds them and, from
// every replica (a spoke's session lives at one), how far each cluster's
// spoke has taken them.
func (c client) imports(cluster string) error {
	var info adminapi.ImportsInfo
	raw := c
	raw.json = false
	if err := raw.get("/debug/imports", &info); err != nil {
		return err
	}
	info.Sessions = c.allSessions(info.Sessions)
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(info)
	}
	if cluster != "" {
		return c.clusterImports(info, cluster)
	}
	fmt.Fprintf(c.out, "%d imports; the hub is %s\n\n", len(info.Imports), authority(info.Authoritative))
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tSHOULD HOLD\tACKED\tPENDING\tREFUSED\tBLOCKED\tWRITTEN\tVERSION (SENT/ACKED/WRITTEN)\tDELETES")
	for _, s := range info.Sessions {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d/%d/%d\t%s\n", s.Cluster, s.Imports, s.Acked, s.Pending, len(s.Refused),
			s.BlockedCount, yesNo(s.Written()), s.SentVersion, s.AckedVersion, s.WrittenVersion, deletes(s.Authoritative))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	// What blocks an import: a user's own object holding a name Nave would write.
	for _, s := range info.Sessions {
		for _, b := range s.Blocked {
			fmt.Fprintf(c.out, "%s: %s blocked: %s: %s\n", s.Cluster, b.Service, b.Reason, b.Message)
		}
		if more := s.BlockedCount - len(s.Blocked); more > 0 {
			fmt.Fprintf(c.out, "%s: %d more imports blocked\n", s.Cluster, more)
		}
	}
	if len(info.Sessions) == 0 {
		fmt.Fprintln(c.out, "(no spoke takes imports at any replica)")
	}
	return nil
}

// clusterImports lists every import one cluster should hold.
func (c client) clusterImports(info adminapi.ImportsInfo, cluster string) error {
	i := slices.IndexFunc(info.Sessions, func(s adminapi.ImportStatus) bool { return string(s.Cluster) == cluster })
	if i < 0 {
		return fmt.Errorf("no spoke of cluster %q takes imports at any replica", cluster)
	}
	s := info.Sessions[i]
	fmt.Fprintf(c.out, "cluster %s: %d imports of %d namespaces; %s; written: %s", cluster, s.Imports, s.Namespaces,
		deletes(s.Authoritative), yesNo(s.Written()))
	if s.BlockedCount > 0 {
		fmt.Fprintf(c.out, "; %d blocked", s.BlockedCount)
	}
	fmt.Fprint(c.out, "\n\n")
	blocked := map[string]adminapi.ImportProblem{}
	for _, b := range s.Blocked {
		blocked[b.Service.String()] = b
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVICE\tTYPE\tIPS\tSOURCES\tSTATE")
	for _, imp := range info.Imports {
		if !slices.Contains(s.NamespaceNames, imp.Service.Namespace) {
			continue
		}
		var sources []string
		for _, src := range imp.Sources {
			d := fmt.Sprintf("%s(%d/%d ready)", src.Cluster, src.Ready, src.Endpoints)
			if src.Stale {
				d += ",stale"
			}
			sources = append(sources, d)
		}
		state := "acked"
		switch {
		case s.Refused[imp.Service.String()] != "":
			state = "refused: " + s.Refused[imp.Service.String()]
		case slices.Contains(s.PendingServices, imp.Service.String()):
			state = "pending"
		case blocked[imp.Service.String()].Reason != "":
			b := blocked[imp.Service.String()]
			state = "blocked: " + b.Reason + ": " + b.Message
		case s.WrittenVersion >= s.AckedVersion:
			state = "written"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", imp.Service, imp.Type, dash(strings.Join(imp.IPs, ",")), strings.Join(sources, " "), state)
	}
	return w.Flush()
}

// allSessions adds the import sessions of every other replica (members of /debug/hub).
func (c client) allSessions(local []adminapi.ImportStatus) []adminapi.ImportStatus {
	var coord adminapi.Coordination
	raw := c
	raw.json = false
	if err := raw.get("/debug/hub", &coord); err != nil {
		return local
	}
	byCluster := map[string]adminapi.ImportStatus{}
	for _, s := range local {
		byCluster[string(s.Cluster)] = s
	}
	for _, m := range coord.Members {
		if m.Self || m.Admin == "" {
			continue
		}
		var info adminapi.ImportsInfo
		peer := raw
		peer.base = "http://" + m.Admin
		if err := peer.get("/debug/imports", &info); err != nil {
			fmt.Fprintf(os.Stderr, "navectl: replica %s: %v\n", m.Name, err)
			continue
		}
		for _, s := range info.Sessions {
			if old, ok := byCluster[string(s.Cluster)]; !ok || s.Epoch > old.Epoch {
				byCluster[string(s.Cluster)] = s
			}
		}
	}
	out := make([]adminapi.ImportStatus, 0, len(byCluster))
	for _, s := range byCluster {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b adminapi.ImportStatus) int { return strings.Compare(string(a.Cluster), string(b.Cluster)) })
	return out
}

func authority(auth bool) string {
	if auth {
		return "authoritative (it holds every cluster it knows of)"
	}
	return "not yet authoritative (waiting for clusters it knows of): spokes delete nothing it does not name"
}

func deletes(auth bool) string {
	if auth {
		return "may delete"
	}
	return "deletes nothing"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
