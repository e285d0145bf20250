package hub

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/navemesh/nave/convergence"
	"github.com/navemesh/nave/dashboard"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/syncstatus"
	"github.com/navemesh/nave/xds"
)

// ServiceInfo is one merged service as /debug/services shows it.
type ServiceInfo struct {
	Service   registry.ServiceKey    `json:"service"`
	Hostname  string                 `json:"hostname"`
	Clusters  []registry.ClusterID   `json:"clusters"`
	Ports     []registry.ServicePort `json:"ports"`
	Headless  bool                   `json:"headless,omitempty"`
	Healthy   int                    `json:"healthy"`
	Draining  int                    `json:"draining"`
	NotReady  int                    `json:"notReady"`
	Conflicts []registry.Conflict    `json:"conflicts,omitempty"`
	Revision  uint64                 `json:"revision"`
}

// EndpointsInfo is what /debug/endpoints shows: the assignment a client in
// the given locality receives for every port of the service.
type EndpointsInfo struct {
	Service registry.ServiceKey `json:"service"`
	Client  registry.Locality   `json:"client"`
	// Network is the client's network ("": a client that names none).
	Network registry.Network `json:"network,omitempty"`
	Ports   []PortAssignment `json:"ports"`
}

// PortAssignment is one port's xDS target and assignment.
type PortAssignment struct {
	Port       registry.ServicePort `json:"port"`
	Target     string               `json:"target"`
	Assignment xds.Assignment       `json:"assignment"`
}

// ImportsInfo is what /debug/imports shows: every import of the clusterset,
// and how far each spoke session of this replica has taken them.
type ImportsInfo struct {
	// Authoritative: the hub holds every cluster it knows of (spokes may delete what it does not name).
	Authoritative bool                      `json:"authoritative"`
	CIDRs         []string                  `json:"clustersetCIDRs,omitempty"`
	Imports       []ImportInfo              `json:"imports"`
	Sessions      []federation.ImportStatus `json:"sessions"`
}

// ImportInfo is one import as /debug/imports shows it.
type ImportInfo struct {
	Service  registry.ServiceKey    `json:"service"`
	Type     string                 `json:"type"`
	IPs      []string               `json:"ips,omitempty"`
	Ports    []registry.ServicePort `json:"ports"`
	Sources  []ImportSourceInfo     `json:"sources"`
	Revision string                 `json:"hash"`
	// Skipped are endpoint addresses left out ("cluster address: reason"): loopback, link-local, ...
	Skipped []string `json:"skipped,omitempty"`
}

// ImportSourceInfo is one source cluster of an import.
type ImportSourceInfo struct {
	Cluster   registry.ClusterID `json:"cluster"`
	Stale     bool               `json:"stale,omitempty"`
	Endpoints int                `json:"endpoints"`
	Ready     int                `json:"ready"`
}

// Imports describes an import set, the addresses it leaves out, and the sessions taking it.
func Imports(set *federation.ImportSet, skipped map[registry.ServiceKey][]imports.Skipped, sessions []federation.ImportStatus) ImportsInfo {
	info := ImportsInfo{Authoritative: set.Authoritative, CIDRs: set.CIDRs, Imports: []ImportInfo{}, Sessions: sessions}
	for _, k := range slices.SortedFunc(maps.Keys(set.Imports), registry.ServiceKey.Compare) {
		imp := set.Imports[k]
		ii := ImportInfo{Service: k, Type: "ClusterSetIP", Ports: imp.Ports, Revision: imp.Hash().String()[:12]}
		if imp.Headless {
			ii.Type = "Headless"
		}
		for _, ip := range imp.IPs {
			ii.IPs = append(ii.IPs, ip.String())
		}
		for _, src := range imp.Sources {
			si := ImportSourceInfo{Cluster: src.Cluster, Stale: src.Stale, Endpoints: len(src.Endpoints)}
			for _, e := range src.Endpoints {
				if e.Conditions.Ready {
					si.Ready++
				}
			}
			ii.Sources = append(ii.Sources, si)
		}
		for _, s := range skipped[k] {
			ii.Skipped = append(ii.Skipped, fmt.Sprintf("%s %s: %s", s.Cluster, s.Address, s.Reason))
		}
		info.Imports = append(info.Imports, ii)
	}
	return info
}

// admin serves health, metrics and debug JSON.
type admin struct {
	pprof   bool // serve /debug/pprof
	state   *state
	coord   *coordinator
	imports *importer
	fed     *federation.HubServer
	xds     *xds.Server
	tracer  *convergence.Tracer
	metrics prometheus.Gatherer
	ready   func() error
	log     *slog.Logger
	// token, when not nil, guards everything but /healthz, /readyz and the dashboard (/ui).
	token *adminToken
}

func (a *admin) handler() http.Handler {
	mux := http.NewServeMux()
	if a.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := a.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/hub", func(w http.ResponseWriter, _ *http.Request) {
		a.json(w, a.coord.status())
	})
	mux.HandleFunc("GET /debug/clusters", func(w http.ResponseWriter, _ *http.Request) {
		clusters := a.state.View().clustersSorted()
		var refused map[registry.ClusterID]map[registry.ServiceKey]string
		if a.fed != nil {
			refused = a.fed.RefusedExports()
		}
		for i := range clusters {
			for k, reason := range refused[clusters[i].Cluster] {
				if clusters[i].RefusedExports == nil {
					clusters[i].RefusedExports = map[string]string{}
				}
				clusters[i].RefusedExports[k.String()] = reason
			}
		}
		a.json(w, clusters)
	})
	mux.HandleFunc("GET /debug/networks", func(w http.ResponseWriter, _ *http.Request) {
		a.json(w, a.state.View().Networks())
	})
	mux.HandleFunc("GET /debug/services", func(w http.ResponseWriter, _ *http.Request) {
		a.json(w, Services(a.state.View().Registry))
	})
	mux.HandleFunc("GET /debug/imports", func(w http.ResponseWriter, _ *http.Request) {
		set, _ := a.imports.Imports()
		a.json(w, Imports(set, a.imports.Skipped(), a.fed.ImportStatuses()))
	})
	mux.HandleFunc("GET /debug/topology", func(w http.ResponseWriter, _ *http.Request) {
		a.json(w, TopologyInfo{Localities: Topology(a.state.View().Registry)})
	})
	mux.HandleFunc("GET /debug/clients", func(w http.ResponseWriter, r *http.Request) {
		a.json(w, ClientsInfo{Replica: a.coord.id, Clients: a.xds.Clients(r.URL.Query().Get("node"))})
	})
	mux.HandleFunc("GET /debug/trace", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var key registry.ServiceKey
		if svc := q.Get("service"); svc != "" {
			k, err := registry.ParseServiceKey(svc)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			key = k
		}
		limit := 20
		if l := q.Get("limit"); l != "" {
			n, err := strconv.Atoi(l)
			if err != nil || n < 1 {
				http.Error(w, fmt.Sprintf("limit %q: want a positive number", l), http.StatusBadRequest)
				return
			}
			limit = n
		}
		a.json(w, TraceInfo{Replica: a.coord.id, Traces: a.tracer.Traces(key, limit)})
	})
	mux.HandleFunc("GET /debug/endpoints", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		client := xds.Client{Network: registry.Network(q.Get("network")), Locality: registry.Locality{Region: q.Get("region"), Zone: q.Get("zone")}}
		info, err := Endpoints(a.state.View(), q.Get("service"), client)
		switch {
		case errors.Is(err, registry.ErrInvalid):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case err != nil:
			http.Error(w, err.Error(), http.StatusNotFound)
		default:
			a.json(w, info)
		}
	})
	var api http.Handler = mux
	if a.token != nil {
		api = a.token.require(mux)
	}
	// The dashboard's page and assets hold no data, and a browser cannot put
	// the token on a page load: they are open, and the page sends the token
	// on its /debug/* fetches (see package dashboard).
	root := http.NewServeMux()
	ui := dashboard.Handler()
	root.Handle("GET /ui", ui)
	root.Handle("GET /ui/", ui)
	root.Handle("/", api)
	return root
}

func (a *admin) json(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		a.log.Warn("write admin response", "err", err)
	}
}

// TopologyInfo is what /debug/topology serves: every cluster's endpoints
// (of every service, each counted once per service) by locality and health.
type TopologyInfo struct {
	Localities []LocalityCount `json:"localities"`
}

// LocalityCount is one cluster's endpoints in one region and zone.
type LocalityCount struct {
	Region   string             `json:"region"`
	Zone     string             `json:"zone"`
	Cluster  registry.ClusterID `json:"cluster"`
	Healthy  int                `json:"healthy"`
	Draining int                `json:"draining"`
	NotReady int                `json:"notReady"`
}

// Topology counts every cluster's endpoints by region, zone and health,
// sorted by region, zone and cluster.
func Topology(r *registry.Registry) []LocalityCount {
	type at struct {
		region, zone string
		cluster      registry.ClusterID
	}
	counts := map[at]*LocalityCount{}
	for _, svc := range r.Services() {
		for _, sh := range svc.Shards {
			for i := range sh.Endpoints {
				e := &sh.Endpoints[i]
				k := at{e.Locality.Region, e.Locality.Zone, sh.Cluster}
				c := counts[k]
				if c == nil {
					c = &LocalityCount{Region: k.region, Zone: k.zone, Cluster: k.cluster}
					counts[k] = c
				}
				switch e.Health() {
				case registry.Healthy:
					c.Healthy++
				case registry.Draining:
					c.Draining++
				default:
					c.NotReady++
				}
			}
		}
	}
	out := make([]LocalityCount, 0, len(counts))
	for _, c := range counts {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b LocalityCount) int {
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.Zone, b.Zone), strings.Compare(string(a.Cluster), string(b.Cluster)))
	})
	return out
}

// ClientsInfo is what /debug/clients serves: the xDS clients of one replica
// and their sync status. With ?node=ID, only that node's streams, each with
// its subscribed names and what it holds that differs from what the
// replica would send it now.
type ClientsInfo struct {
	Replica string              `json:"replica"`
	Clients []syncstatus.Client `json:"clients"`
}

// TraceInfo is what /debug/trace serves: one replica's last traced changes
// (?service=NS/NAME: of one service; ?limit=N: at most N, default 20),
// newest first.
type TraceInfo struct {
	Replica string              `json:"replica"`
	Traces  []convergence.Trace `json:"traces"`
}

// Services describes every merged service.
func Services(r *registry.Registry) []ServiceInfo {
	out := []ServiceInfo{}
	for _, svc := range r.Services() {
		info := ServiceInfo{
			Service: svc.Key, Hostname: svc.Key.Hostname(), Clusters: svc.Clusters(), Ports: svc.Ports,
			Headless: svc.Headless, Conflicts: svc.Conflicts, Revision: svc.Revision,
		}
		for _, sh := range svc.Shards {
			h, d, x := sh.EndpointCount()
			info.Healthy, info.Draining, info.NotReady = info.Healthy+h, info.Draining+d, info.NotReady+x
		}
		out = append(out, info)
	}
	return out
}

// Endpoints computes what a client gets for service ("ns/name"): one in the
// client's locality and, when it names one, on its network.
func Endpoints(v *View, service string, client xds.Client) (EndpointsInfo, error) {
	key, err := registry.ParseServiceKey(service)
	if err != nil {
		return EndpointsInfo{}, err
	}
	svc := v.Registry.Service(key)
	if svc == nil {
		return EndpointsInfo{}, fmt.Errorf("service %s is not federated", key)
	}
	info := EndpointsInfo{Service: key, Client: client.Locality, Network: client.Network}
	for _, p := range xds.ServicePorts(svc) {
		info.Ports = append(info.Ports, PortAssignment{
			Port: p, Target: "xds:///" + xds.ListenerName(key, p.Port), Assignment: xds.AssignFor(svc, p, client, v.Topology),
		})
	}
	return info, nil
}
