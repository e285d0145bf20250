package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/navemesh/nave/adminapi"
)

// typeLabels are the xDS types in the order navectl shows them.
var typeLabels = []string{"lds", "rds", "cds", "eds"}

// proxies prints every xDS client of every replica (a client's stream
// lives at one), merged into one table; with a node ID, that node's
// streams in full.
func (c client) proxies(node string) error {
	clients, err := c.allClients(node)
	if err != nil {
		return err
	}
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(clients)
	}
	if node != "" {
		if len(clients) == 0 {
			return fmt.Errorf("no replica has a client of node %q", node)
		}
		for i, cl := range clients {
			if i > 0 {
				fmt.Fprintln(c.out)
			}
			if err := c.proxy(cl); err != nil {
				return err
			}
		}
		return nil
	}
	counts := map[string]int{}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tREPLICA\tSTREAM\tLOCALITY\tCONNECTED\tSTATE\tLDS\tRDS\tCDS\tEDS")
	for _, cl := range clients {
		counts[cl.State]++
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s", cl.NodeID, cl.Replica, streamName(cl.Stream), locality(cl.Locality),
			ago(cl.ConnectedSince), clientState(cl))
		for _, label := range typeLabels {
			fmt.Fprintf(w, "\t%s", typeState(cl.Types[label]))
		}
		fmt.Fprintln(w)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "\n%d clients: %d synced, %d stale, %d nacked\n", len(clients), counts[adminapi.Synced], counts[adminapi.Stale], counts[adminapi.Nacked])
	return nil
}

// allClients asks every replica (see otherReplicas) for its clients (of
// node, if given).
func (c client) allClients(node string) ([]adminapi.Client, error) {
	path := "/debug/clients"
	if node != "" {
		path += "?node=" + url.QueryEscape(node)
	}
	clients := []adminapi.Client{}
	err := c.everyReplica(path, func() any { return &adminapi.ClientsInfo{} }, func(v any) string { return v.(*adminapi.ClientsInfo).Replica },
		func(v any) { clients = append(clients, v.(*adminapi.ClientsInfo).Clients...) })
	if err != nil {
		return nil, err
	}
	slices.SortFunc(clients, func(a, b adminapi.Client) int {
		return cmp.Or(strings.Compare(a.NodeID, b.NodeID), strings.Compare(a.Replica, b.Replica), cmp.Compare(a.Stream.ID, b.Stream.ID))
	})
	return clients, nil
}

// everyReplica asks the replica navectl was pointed at for path, then
// every member it lists in /debug/hub. Each answer is decoded into a fresh
// value of next; replica names the replica that answered, and add takes
// the answer of each replica once (behind a load balancer, /debug/hub may
// come from another replica than the first answer). The first replica
// must answer; another that does not is reported on stderr and left out.
func (c client) everyReplica(path string, next func() any, replica func(any) string, add func(any)) error {
	raw := c
	raw.json = false
	own := next()
	if err := raw.get(path, own); err != nil {
		return err
	}
	seen := map[string]bool{replica(own): true}
	add(own)
	var coord adminapi.Coordination
	if err := raw.get("/debug/hub", &coord); err != nil {
		fmt.Fprintf(os.Stderr, "navectl: the other replicas are unknown: %v\n", err)
	}
	for _, m := range coord.Members {
		if m.Admin == "" || seen[m.Name] {
			continue
		}
		peer := raw
		peer.base = "http://" + m.Admin
		v := next()
		if err := peer.get(path, v); err != nil {
			fmt.Fprintf(os.Stderr, "navectl: replica %s: %v\n", m.Name, err)
			continue
		}
		if name := replica(v); !seen[name] {
			seen[name] = true
			add(v)
		}
	}
	return nil
}

// proxy prints one stream in full.
func (c client) proxy(cl adminapi.Client) error {
	fmt.Fprintf(c.out, "node %s (cluster %q) at replica %s, %s stream, locality %s, connected %s\n", cl.NodeID, cl.Cluster,
		cl.Replica, streamName(cl.Stream), locality(cl.Locality), ago(cl.ConnectedSince))
	fmt.Fprintf(c.out, "state: %s\n", clientState(cl))
	for _, label := range typeLabels {
		t, ok := cl.Types[label]
		if !ok {
			continue
		}
		fmt.Fprintf(c.out, "\n%s: %s\n", strings.ToUpper(label), typeState(t))
		subscribed := fmt.Sprintf("%d names", t.Subscribed)
		if t.Wildcard {
			subscribed = "every resource (wildcard)"
		}
		fmt.Fprintf(c.out, "  subscribes to: %s\n", subscribed)
		for _, name := range t.Names {
			fmt.Fprintf(c.out, "    %s\n", name)
		}
		fmt.Fprintf(c.out, "  sent:  %s %s\n", orNone(t.Sent), at(t.SentAt))
		fmt.Fprintf(c.out, "  acked: %s %s\n", orNone(t.Acked), at(t.AckedAt))
		if n := t.LastNACK; n != nil {
			current := "since accepted a later response"
			if t.Rejecting {
				current = "still rejecting"
			}
			fmt.Fprintf(c.out, "  last NACK %s (%s): version %s, %d resources (%s): %s\n", ago(n.At), current, n.Version,
				n.Count, strings.Join(n.Resources, ", "), n.Detail)
		}
		if len(t.Differences) == 0 {
			fmt.Fprintln(c.out, "  holds what this replica would send it now")
			continue
		}
		fmt.Fprintf(c.out, "  differs from what this replica would send it now:\n")
		w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "    RESOURCE\tHELD (ACKED)\tCURRENT\tWHY")
		for _, d := range t.Differences {
			fmt.Fprintf(w, "    %s\t%s\t%s\t%s\n", d.Resource, orNone(d.Held), orNone(d.Current), d.Reason)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func clientState(cl adminapi.Client) string {
	if cl.State == adminapi.Stale && cl.StaleSince != nil {
		return fmt.Sprintf("%s (%s)", cl.State, time.Since(*cl.StaleSince).Round(time.Millisecond))
	}
	return cl.State
}

// typeState is one type's state: "-" (not asked for), NACKED, STALE with
// the age of the response not answered, or SYNCED.
func typeState(t adminapi.Exchange) string {
	switch {
	case t.Sent == "" && !t.Pending && t.LastNACK == nil:
		if t.Subscribed == 0 && !t.Wildcard {
			return "-"
		}
		return "ASKED"
	case t.Rejecting:
		return adminapi.Nacked
	case t.Pending:
		return fmt.Sprintf("%s (%s)", adminapi.Stale, time.Since(t.SentAt).Round(time.Millisecond))
	default:
		return adminapi.Synced
	}
}

func streamName(s adminapi.Stream) string {
	if s.Delta {
		return fmt.Sprintf("delta-%d", s.ID)
	}
	return fmt.Sprintf("sotw-%d", s.ID)
}

func locality(l adminapi.NodeLocality) string {
	parts := []string{l.Region, l.Zone, l.SubZone}
	for len(parts) > 0 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	return dash(strings.Join(parts, "/"))
}

func at(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return "(" + ago(t) + ")"
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
