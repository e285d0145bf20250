package hub

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/navemesh/nave/adminapi"
	"github.com/navemesh/nave/convergence"
	"github.com/navemesh/nave/dashboard"
	"github.com/navemesh/nave/federation"
	"github.com/navemesh/nave/imports"
	"github.com/navemesh/nave/internal/pmap"
	"github.com/navemesh/nave/registry"
	"github.com/navemesh/nave/xds"
)

// Imports describes an import set, the addresses it leaves out, and the sessions taking it.
func Imports(set *federation.ImportSet, skipped pmap.Map[registry.ServiceKey, []imports.Skipped], sessions []federation.ImportStatus) adminapi.ImportsInfo {
	info := adminapi.ImportsInfo{Authoritative: set.Authoritative, CIDRs: set.CIDRs, Imports: []adminapi.ImportInfo{},
		Sessions: sessions}
	for _, k := range slices.SortedFunc(set.Imports.Keys(), registry.ServiceKey.Compare) {
		imp, _ := set.Imports.Get(k)
		ii := adminapi.ImportInfo{Service: k, Type: "ClusterSetIP", Ports: imp.Ports, Revision: imp.Hash().String()[:12]}
		if imp.Headless {
			ii.Type = "Headless"
		}
		for _, ip := range imp.IPs {
			ii.IPs = append(ii.IPs, ip.String())
		}
		for _, src := range imp.Sources {
			si := adminapi.ImportSourceInfo{Cluster: src.Cluster, Stale: src.Stale, Endpoints: len(src.Endpoints)}
			for _, e := range src.Endpoints {
				if e.Conditions.Ready {
					si.Ready++
				}
			}
			ii.Sources = append(ii.Sources, si)
		}
		held, _ := skipped.Get(k)
		for _, s := range held {
			ii.Skipped = append(ii.Skipped, fmt.Sprintf("%s %s: %s", s.Cluster, s.Address, s.Reason))
		}
		info.Imports = append(info.Imports, ii)
	}
	return info
}

// admin serves health, metrics and the debug JSON, package adminapi's types.
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
		clusters := convertAll(a.state.View().clustersSorted(), func(c ClusterStatus) adminapi.ClusterStatus { return c.ClusterStatus })
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
		a.json(w, adminapi.TopologyInfo{Localities: Topology(a.state.View().Registry)})
	})
	mux.HandleFunc("GET /debug/clients", func(w http.ResponseWriter, r *http.Request) {
		a.json(w, adminapi.ClientsInfo{Replica: a.coord.id, Clients: a.xds.Clients(r.URL.Query().Get("node"))})
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
		a.json(w, adminapi.TraceInfo{Replica: a.coord.id, Traces: a.tracer.Traces(key, limit)})
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
	mux.HandleFunc("GET /debug/routes", func(w http.ResponseWriter, r *http.Request) {
		reg := a.state.View().Registry
		service := r.URL.Query().Get("service")
		if service == "" {
			a.json(w, Routes(reg))
			return
		}
		info, err := ServiceRoutes(reg, service)
		switch {
		case errors.Is(err, registry.ErrInvalid):
			a.jsonError(w, http.StatusBadRequest, err)
		case err != nil:
			a.jsonError(w, http.StatusNotFound, err)
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

// jsonError answers code with the error as JSON (adminapi.ErrorInfo).
func (a *admin) jsonError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(adminapi.ErrorInfo{Error: err.Error()}); err != nil {
		a.log.Warn("write admin response", "err", err)
	}
}

// Topology counts every cluster's endpoints by region, zone and health,
// sorted by region, zone and cluster.
func Topology(r *registry.Registry) []adminapi.LocalityCount {
	type at struct {
		region, zone string
		cluster      registry.ClusterID
	}
	counts := map[at]*adminapi.LocalityCount{}
	for _, svc := range r.Services() {
		for _, sh := range svc.Shards {
			for i := range sh.Endpoints {
				e := &sh.Endpoints[i]
				k := at{e.Locality.Region, e.Locality.Zone, sh.Cluster}
				c := counts[k]
				if c == nil {
					c = &adminapi.LocalityCount{Region: k.region, Zone: k.zone, Cluster: k.cluster}
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
	out := make([]adminapi.LocalityCount, 0, len(counts))
	for _, c := range counts {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b adminapi.LocalityCount) int {
		return cmp.Or(strings.Compare(a.Region, b.Region), strings.Compare(a.Zone, b.Zone), strings.Compare(string(a.Cluster), string(b.Cluster)))
	})
	return out
}

// Services describes every merged service.
func Services(r *registry.Registry) []adminapi.ServiceInfo {
	out := []adminapi.ServiceInfo{}
	for _, svc := range r.Services() {
		info := adminapi.ServiceInfo{
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
func Endpoints(v *View, service string, client xds.Client) (adminapi.EndpointsInfo, error) {
	key, err := registry.ParseServiceKey(service)
	if err != nil {
		return adminapi.EndpointsInfo{}, err
	}
	svc := v.Registry.Service(key)
	if svc == nil {
		return adminapi.EndpointsInfo{}, fmt.Errorf("service %s is not federated", key)
	}
	info := adminapi.EndpointsInfo{Service: key, Client: client.Locality, Network: client.Network}
	for _, p := range xds.ServicePorts(svc) {
		info.Ports = append(info.Ports, adminapi.PortAssignment{
			Port: p, Target: "xds:///" + xds.ListenerName(key, p.Port), Assignment: xds.AssignFor(svc, p, client, v.Topology),
		})
	}
	return info, nil
}

// convertAll converts each of in; nil stays nil (JSON null, not []).
func convertAll[S, T any](in []S, convert func(S) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = convert(v)
	}
	return out
}
