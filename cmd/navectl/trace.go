package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/registry"
)

// trace prints the last changes of a service as every replica traced
// them, newest first: each stage, and the slowest clients.
func (c client) trace(service string, limit int) error {
	if _, err := registry.ParseServiceKey(service); err != nil {
		return fmt.Errorf("trace needs a service NAMESPACE/NAME: %w", err)
	}
	path := fmt.Sprintf("/debug/trace?service=%s&limit=%d", url.QueryEscape(service), limit)
	traces := []adminapi.Trace{}
	err := c.everyReplica(path, func() any { return &adminapi.TraceInfo{} }, func(v any) string { return v.(*adminapi.TraceInfo).Replica },
		func(v any) { traces = append(traces, v.(*adminapi.TraceInfo).Traces...) })
	if err != nil {
		return err
	}
	slices.SortFunc(traces, func(a, b adminapi.Trace) int {
		return cmp.Or(b.Received.Compare(a.Received), strings.Compare(a.Replica, b.Replica))
	})
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(traces)
	}
	if len(traces) == 0 {
		fmt.Fprintf(c.out, "no replica traced a change of %s (a replica keeps its last changes only: 1,024 by default)\n", service)
		return nil
	}
	fmt.Fprintf(c.out, "changes of %s, newest first, in ms. SOURCE (the source's change -> the spoke saw it), SPOKE (-> sent) and LINK\n"+
		"(one way to the hub) are the spoke's clock; the rest is the replica's, from applying the change. \"-\": not known\n"+
		"(a Kubernetes object has no precise change time; a replica's copy has no origin).\n\n", service)
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "REPLICA\tCHANGE\tFROM\tSOURCE\tSPOKE\tLINK\tAPPLIED\tTRANSLATED\tCARRIED BY\tPUSHES\tACKED\tNACKED\tLAST ACK\tSLOWEST CLIENTS (apply->push + push->ack = at the hub; end to end)")
	for _, t := range traces {
		source, spokeMs, link := "-", "-", "-"
		if o := t.Origin; o != nil {
			source, spokeMs, link = msOrDash(o.Source), msOrDash(o.Spoke), msOrDash(o.SpokeToHub)
		}
		translated, carried, last := "-", "-", "-"
		if t.Translated != nil {
			translated = "+" + msSince(t.Received, *t.Translated)
		}
		switch {
		case t.NoChange:
			carried = "(no client-visible change)"
		case t.Type != "":
			carried = fmt.Sprintf("%s %s", t.Type, strings.Join(t.Resources, ","))
		}
		if t.LastAck != nil {
			last = "+" + msSince(t.Received, *t.LastAck)
		}
		var slow []string
		for _, s := range t.Slowest {
			e := fmt.Sprintf("%s %.1f+%.1f=%.1f", s.NodeID, s.ApplyToPush, s.PushToAck, s.HubToAck)
			if s.EndToEnd > 0 {
				e += fmt.Sprintf("; %.1f", s.EndToEnd)
			}
			slow = append(slow, e)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", t.Replica, t.ID, t.Cluster, source, spokeMs, link,
			ago(t.Received), translated, carried, t.Pushed, t.Acked, t.Nacked, last, dash(strings.Join(slow, " | ")))
	}
	return w.Flush()
}

func msOrDash(ms float64) string {
	if ms <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", ms)
}

func msSince(from, to time.Time) string {
	return fmt.Sprintf("%.1f", float64(to.Sub(from).Microseconds())/1000)
}
