package hub_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	fedv1 "github.com/navemesh/nave/federation/v1"
	"github.com/navemesh/nave/hub"
	"github.com/navemesh/nave/identity"
	"github.com/navemesh/nave/internal/testpki"
	"github.com/navemesh/nave/registry"
	navespoke "github.com/navemesh/nave/spoke"
)

// The Grafana dashboard (deploy/grafana/nave-hub.json) is checked against
// what a real hub exports: every metric its PromQL names, every label it
// matches, groups by or puts in a legend, must be on the hub's /metrics.

const dashboardFile = "../deploy/grafana/nave-hub.json"

// notYetExported are the families the dashboard may use although the hub
// does not export them yet, with the type and labels they will have (none
// now: keep it for the next family a dashboard row gets ahead of).
var notYetExported = map[string]promFamily{}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = labelSet("job", "instance")

// TestGrafanaDashboardIsWellFormed checks what Grafana needs of the JSON:
// unique panel ids, a grid position each, every panel and query on the
// ${datasource} variable, and every variable an expression uses defined.
func TestGrafanaDashboardIsWellFormed(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want a uid, a title and a schema of Grafana 10 or later", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]grafanaVariable{}
	for _, v := range d.Templating.List {
		if _, twice := vars[v.Name]; twice {
			t.Errorf("template variable %q is defined twice", v.Name)
		}
		vars[v.Name] = v
		if v.Type == "query" && !v.Datasource.isTemplated() {
			t.Errorf("template variable %q queries %+v, want the ${datasource} variable", v.Name, v.Datasource)
		}
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
		t.Errorf("no template variable datasource of type datasource choosing a Prometheus: %+v", ds)
	}

	ids := map[int]string{}
	for _, p := range d.allPanels() {
		where := fmt.Sprintf("panel %q", p.Title)
		switch {
		case p.ID == nil:
			t.Errorf("%s has no id", where)
		case ids[*p.ID] != "":
			t.Errorf("%s has id %d, as %s has", where, *p.ID, ids[*p.ID])
		default:
			ids[*p.ID] = where
		}
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("%s has gridPos %+v, want one inside the 24 columns", where, g)
		}
		if !p.Datasource.isTemplated() {
			t.Errorf("%s has datasource %+v, want the ${datasource} variable", where, p.Datasource)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("%s queries nothing", where)
		}
		if p.Type == "row" && !p.Collapsed && len(p.Panels) > 0 {
			t.Errorf("%s is an open row holding panels: an open row's panels follow it", where)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if !tg.Datasource.isTemplated() {
				t.Errorf("%s, query %s: datasource %+v, want the ${datasource} variable", where, tg.RefID, tg.Datasource)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: query refId %q is empty or repeated", where, tg.RefID)
			}
			refs[tg.RefID] = true
		}
	}
	for _, q := range d.queries() {
		for _, name := range grafanaVariablesIn(q.expr) {
			if _, ok := vars[name]; !ok && !grafanaBuiltins[name] {
				t.Errorf("%s uses $%s, which is no template variable", q.where, name)
			}
		}
	}
}

// TestGrafanaDashboardUsesExportedMetrics runs a hub with the demo's spokes
// and a client of every kind, has it count a case of everything the
// dashboard shows, and checks each query against the families on /metrics.
func TestGrafanaDashboardUsesExportedMetrics(t *testing.T) {
	d := loadDashboard(t)
	var queries []grafanaQuery
	wanted := map[string]bool{} // the series names the dashboard reads
	for _, q := range d.queries() {
		refs, err := promReferences(q.expr)
		if err != nil {
			t.Errorf("%s: %v\n\t%s", q.where, err, q.expr)
			continue
		}
		q.refs = refs
		queries = append(queries, q)
		for _, m := range refs.metrics {
			wanted[m.name] = true
		}
	}
	for name := range notYetExported {
		used := false
		for series := range wanted {
			_, _, err := resolve(map[string]promFamily{name: notYetExported[name]}, series)
			used = used || err == nil
		}
		if !used {
			t.Errorf("notYetExported names %s, which the dashboard does not use: remove it", name)
		}
	}

	admin := exerciseHub(t)
	families := scrapeUntil(t, admin, func(exported map[string]promFamily) bool {
		all := maps.Clone(exported)
		maps.Copy(all, notYetExported)
		for series := range wanted {
			if _, _, err := resolve(all, series); err != nil {
				return false
			}
		}
		return true
	})
	for name, f := range notYetExported {
		if _, ok := families[name]; ok {
			t.Errorf("%s is exported now: remove it from notYetExported in hub/grafana_test.go", name)
			continue
		}
		families[name] = f
	}
	for _, q := range queries {
		for _, problem := range q.refs.check(families) {
			t.Errorf("%s: %s\n\t%s", q.where, problem, q.expr)
		}
		for _, problem := range legendProblems(q, families) {
			t.Errorf("%s: %s", q.where, problem)
		}
	}
	if t.Failed() {
		t.Logf("the hub exports: %s", strings.Join(slices.Sorted(maps.Keys(families)), " "))
	}
}

// TestGrafanaPromQLReferences checks the small PromQL reader the dashboard
// test relies on.
func TestGrafanaPromQLReferences(t *testing.T) {
	for _, tc := range []struct {
		expr    string
		metrics []string // name{label,label}, in order; "+rate" when under rate/irate/increase
		groups  []string // the labels of each by/without/on clause, comma-separated
		err     string
	}{
		{expr: `nave_hub_services`, metrics: []string{"nave_hub_services{}"}},
		{expr: `sum by (cluster) (nave_hub_cluster_stale{job=~"$job", cluster=~"$cluster"})`,
			metrics: []string{"nave_hub_cluster_stale{job,cluster}"}, groups: []string{"cluster"}},
		{expr: `histogram_quantile(0.99, sum by (le, type) (rate(nave_xds_push_latency_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`,
			metrics: []string{"nave_xds_push_latency_seconds_bucket{instance}+rate"}, groups: []string{"le,type"}},
		{expr: `sum(rate(a_total[5m])) without (x) / on (y) group_left () max(b{c!="d"}) > 0`,
			metrics: []string{"a_total{}+rate", "b{c}"}, groups: []string{"x", "y", ""}},
		{expr: "1 - nave_hub_etcd_up # comment naming not_a_metric\n", metrics: []string{"nave_hub_etcd_up{}"}},
		{expr: `max(x offset 5m) and count(y @ end()) or vector(0)`, metrics: []string{"x{}", "y{}"}},
		{expr: `changes(process_start_time_seconds{a="}{,="}[2m:30s]) > 0`, metrics: []string{"process_start_time_seconds{a}"}},
		{expr: `sum(nave_hub_servics_typo)`, metrics: []string{"nave_hub_servics_typo{}"}},
		{expr: `rated(x[5m])`, err: `unknown function "rated"`},
		{expr: `{__name__="x"}`, err: "without a metric name"},
		{expr: `sum(x{a="b"}`, err: "unbalanced"},
		{expr: `sum by (a, b + c) (x)`, err: "label list"},
		{expr: `sum by a (x)`, err: "label list"},
	} {
		refs, err := promReferences(tc.expr)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want one saying %q", tc.expr, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		var metrics, groups []string
		for _, m := range refs.metrics {
			s := m.name + "{" + strings.Join(m.labels, ",") + "}"
			if m.underRate {
				s += "+rate"
			}
			metrics = append(metrics, s)
		}
		for _, g := range refs.groups {
			groups = append(groups, strings.Join(g.labels, ","))
		}
		if !slices.Equal(metrics, tc.metrics) || !slices.Equal(groups, tc.groups) {
			t.Errorf("%s:\n\tmetrics %q, groups %q\n\twant    %q, groups %q", tc.expr, metrics, groups, tc.metrics, tc.groups)
		}
	}

	// A renamed family, label or suffix is caught, and so is a gauge under rate.
	families := map[string]promFamily{
		"nave_hub_services":             {typ: dto.MetricType_GAUGE, labels: labelSet()},
		"nave_xds_nacks_total":          {typ: dto.MetricType_COUNTER, labels: labelSet("type")},
		"nave_xds_push_latency_seconds": {typ: dto.MetricType_HISTOGRAM, labels: labelSet("type")},
	}
	for _, tc := range []struct{ expr, problem string }{
		{`sum(nave_hub_services{job="hub"})`, ""},
		{`histogram_quantile(0.5, sum by (le, type) (rate(nave_xds_push_latency_seconds_bucket[5m])))`, ""},
		{`sum(rate(nave_xds_push_latency_seconds_sum[5m])) / sum(rate(nave_xds_push_latency_seconds_count[5m]))`, ""},
		{`sum(nave_hub_service)`, "nave_hub_service is not exported"},
		{`sum by (kind) (rate(nave_xds_nacks_total[5m]))`, `label "kind"`},
		{`rate(nave_xds_nacks_total{typ="eds"}[5m])`, `label "typ"`},
		{`rate(nave_hub_services[5m])`, "a gauge"},
		{`nave_xds_push_latency_seconds`, "histogram"},
		{`nave_xds_nacks_total_bucket`, "not exported"},
		{`histogram_quantile(0.5, sum by (type) (rate(nave_xds_push_latency_seconds_bucket[5m])))`, `without "le"`},
	} {
		refs, err := promReferences(tc.expr)
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		problems := strings.Join(refs.check(families), "; ")
		if tc.problem == "" && problems != "" || !strings.Contains(problems, tc.problem) {
			t.Errorf("%s: problems %q, want %q", tc.expr, problems, tc.problem)
		}
	}
}

// ----------------------------------------------------------------------------
// The hub, exercised.

// exerciseHub starts a hub (mTLS on its xDS port, low limits) with the
// demo's east, north and west spokes, then does something of every kind
// the dashboard counts: an xDS client that receives a push and NACKs it, a
// spoke that is throttled, NACKed and asked to resync, a replica that
// subscribes, a client certificate of an unknown CA and an xDS stream that
// never asks. It returns the admin address's URL.
func exerciseHub(t *testing.T) string {
	t.Helper()
	ca := testpki.NewCA(t, "nave")
	server := ca.Issue(t, "hub-xds", testpki.Cert{Hosts: []string{"127.0.0.1"}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	h, _ := startHub(t, t.TempDir(), func(c *hub.Config) {
		c.XDSTLSCertFile, c.XDSTLSKeyFile, c.XDSClientCAFile = server.CertFile, server.KeyFile, ca.File
		c.Connections.FirstRequestTimeout = 500 * time.Millisecond
		c.Federation.UpdatesPerSecond, c.Federation.UpdateBurst = 20, 1
		c.SnapshotInterval = 50 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)

	// The demo's spokes, as `nave demo` runs them: one network, three clusters.
	spokeCtx, stopSpokes := context.WithCancel(ctx)
	var spokes sync.WaitGroup
	for _, c := range []struct{ id, region string }{{"east", "us-east"}, {"north", "us-east"}, {"west", "us-west"}} {
		sc := navespoke.DefaultConfig()
		sc.Cluster, sc.Network, sc.Region, sc.HubAddr = registry.ClusterID(c.id), "demo-net", c.region, h.FederationAddr.String()
		sc.Source = "dir:" + filepath.Join("..", "deploy", "demo", c.id)
		sc.Federation.MinBackoff, sc.Federation.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
		spokes.Go(func() { _ = navespoke.Run(spokeCtx, sc, slog.New(slog.DiscardHandler)) })
	}
	t.Cleanup(func() { stopSpokes(); spokes.Wait() }) // before the hub stops
	awaitCond(t, "demo/echo from east, north and west", 20*time.Second, func() bool {
		svc := h.View().Registry.Services()
		return len(svc) == 1 && len(svc[0].Shards) == 3
	})

	// An xDS client (over mTLS) takes every cluster and acknowledges them.
	probe := ca.Issue(t, "probe", testpki.Cert{URI: "spiffe://cluster.local/ns/demo/sa/probe"})
	store, err := identity.Load(identity.Files{Cert: probe.CertFile, Key: probe.KeyFile, CA: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	xdsConn := dial(t, h.XDSAddr.String(), store.ClientCreds("", nil))
	ads, err := discovery.NewAggregatedDiscoveryServiceClient(xdsConn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: "probe", Locality: &core.Locality{Region: "us-east", Zone: "us-east-1a"}}
	sendADS(t, ads, &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType})
	first := recvADS(t, ads)
	sendADS(t, ads, &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()})
	taker, err := discovery.NewAggregatedDiscoveryServiceClient(xdsConn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sendADS(t, taker, &discovery.DiscoveryRequest{Node: &core.Node{Id: "taker"}, TypeUrl: resource.ClusterType})
	takerFirst := recvADS(t, taker)
	sendADS(t, taker, &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: takerFirst.GetVersionInfo(), ResponseNonce: takerFirst.GetNonce()})

	// A spoke of its own publishes a service: the client is pushed the
	// change, and NACKs it.
	fed, _ := rawSession(t, h, &fedv1.Hello{ClusterId: "probe", Network: "probe-net", SpokeId: "probe"})
	sendShards(t, fed, &fedv1.Update{Nonce: "1", Version: 1, FullState: true, LastChunk: true}, apiShard("probe", youngerExport, "grpc", "10.0.0.9"))
	if m := recv(t, fed); m.GetAck() == nil {
		t.Fatalf("the probe's full state was answered %v", m)
	}
	push := recvADS(t, ads)
	sendADS(t, ads, &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: first.GetVersionInfo(),
		ResponseNonce: push.GetNonce(), ErrorDetail: &rpcstatus.Status{Message: "the probe refuses it"}})
	// Another client takes the same push: the change's convergence is observed.
	taken := recvADS(t, taker)
	sendADS(t, taker, &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: taken.GetVersionInfo(), ResponseNonce: taken.GetNonce()})

	// The spoke sends two updates at once (the second waits for the rate):
	// an invalid one, NACKed, and a good one; then a digest that disagrees.
	sendShards(t, fed, &fedv1.Update{Nonce: "2", Version: 2, Removes: []*fedv1.ServiceKey{{Namespace: "", Name: ""}}})
	sendShards(t, fed, &fedv1.Update{Nonce: "3", Version: 3}, apiShard("probe", youngerExport, "grpc", "10.0.0.10"))
	if m := recv(t, fed); m.GetNack() == nil {
		t.Fatalf("an invalid update was answered %v", m)
	}
	if m := recv(t, fed); m.GetAck() == nil {
		t.Fatalf("the probe's delta was answered %v", m)
	}
	if err := fed.Send(&fedv1.SpokeMessage{Kind: &fedv1.SpokeMessage_Digest{Digest: &fedv1.Digest{Version: 3, Digest: "0000"}}}); err != nil {
		t.Fatal(err)
	}
	for m := recv(t, fed); m.GetResync() == nil; m = recv(t, fed) {
		t.Logf("awaiting the resync, the probe spoke got %v", m)
	}

	// A replica subscribes (replication is open without a peer token) and is sent full states.
	sub, err := fedv1.NewReplicationClient(dial(t, h.FederationAddr.String(), insecure.NewCredentials())).Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Send(&fedv1.ReplicaRequest{Kind: &fedv1.ReplicaRequest_Hello{Hello: &fedv1.ReplicaHello{ReplicaId: "probe-replica"}}}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the welcome, then an update
		if _, err := sub.Recv(); err != nil {
			t.Fatalf("replication subscription: %v", err)
		}
	}

	// A client certificate of an unknown CA is refused at the handshake.
	stranger := testpki.NewCA(t, "stranger")
	foreign := stranger.Issue(t, "intruder", testpki.Cert{URI: "spiffe://cluster.local/ns/demo/sa/intruder"})
	refusedHandshake(t, h.XDSAddr.String(), ca.File, foreign)

	// An xDS stream that never asks is ended after FirstRequestTimeout.
	silent, err := discovery.NewAggregatedDiscoveryServiceClient(xdsConn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := silent.Recv(); err == nil {
		t.Fatal("a silent xDS stream was answered")
	}
	return "http://" + h.AdminAddr.String()
}

// dial connects to addr with creds until the test ends.
func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func sendADS(t *testing.T, s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, req *discovery.DiscoveryRequest) {
	t.Helper()
	if err := s.Send(req); err != nil {
		t.Fatalf("send %s request: %v", req.GetTypeUrl(), err)
	}
}

func recvADS(t *testing.T, s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient) *discovery.DiscoveryResponse {
	t.Helper()
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("xDS response: %v", err)
	}
	return resp
}

// refusedHandshake dials addr over TLS presenting cert, which the server
// must refuse.
func refusedHandshake(t *testing.T, addr, caFile string, cert testpki.Issued) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert.CertFile, cert.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	conn, err := tls.Dial("tcp", addr, &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		return // refused within the handshake (TLS 1.2)
	}
	defer conn.Close()
	// TLS 1.3: the server verifies the client's certificate after the client's handshake is done; its alert comes with the first read.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("a certificate of an unknown CA was accepted")
	}
}

// ----------------------------------------------------------------------------
// /metrics, scraped.

// promFamily is what the test knows of a family: its type and its labels.
type promFamily struct {
	typ    dto.MetricType
	labels map[string]bool
}

func labelSet(names ...string) map[string]bool {
	s := map[string]bool{}
	for _, n := range names {
		s[n] = true
	}
	return s
}

// scrapeUntil scrapes url's /metrics until done holds of its families, for
// at most 20 seconds, and returns the last scrape.
func scrapeUntil(t *testing.T, url string, done func(map[string]promFamily) bool) map[string]promFamily {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		families := scrape(t, url)
		if done(families) || time.Now().After(deadline) {
			return families
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func scrape(t *testing.T, url string) map[string]promFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	families := map[string]promFamily{}
	for name, mf := range parsed {
		f := promFamily{typ: mf.GetType(), labels: map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				f.labels[l.GetName()] = true
			}
		}
		families[name] = f
	}
	return families
}

// resolve finds the family of a series name (a histogram's or summary's
// parts are named for it; a counter's family name keeps its _total) and
// says which labels its series carry once scraped, or why the name is wrong.
func resolve(families map[string]promFamily, series string) (promFamily, map[string]bool, error) {
	withTarget := func(f promFamily, extra ...string) map[string]bool {
		all := maps.Clone(f.labels)
		maps.Copy(all, targetLabels)
		maps.Copy(all, labelSet(extra...))
		return all
	}
	if f, ok := families[series]; ok {
		switch f.typ {
		case dto.MetricType_HISTOGRAM:
			return f, nil, fmt.Errorf("%s is a histogram: name its _bucket, _sum or _count", series)
		case dto.MetricType_SUMMARY:
			return f, withTarget(f, "quantile"), nil
		}
		return f, withTarget(f), nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suffix)
		if !ok {
			continue
		}
		f, ok := families[base]
		switch {
		case ok && f.typ == dto.MetricType_HISTOGRAM && suffix == "_bucket":
			return f, withTarget(f, "le"), nil
		case ok && (f.typ == dto.MetricType_HISTOGRAM || f.typ == dto.MetricType_SUMMARY) && suffix != "_bucket":
			return f, withTarget(f), nil
		}
	}
	return promFamily{}, nil, fmt.Errorf("%s is not exported by the hub (renamed? not registered? never used in the test's run?)", series)
}

// ----------------------------------------------------------------------------
// The dashboard.

type grafanaDashboard struct {
	UID           string         `json:"uid"`
	Title         string         `json:"title"`
	SchemaVersion int            `json:"schemaVersion"`
	Panels        []grafanaPanel `json:"panels"`
	Templating    struct {
		List []grafanaVariable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name       string             `json:"name"`
			Datasource *grafanaDatasource `json:"datasource"`
			Expr       string             `json:"expr"`
			TextFormat string             `json:"textFormat"`
		} `json:"list"`
	} `json:"annotations"`
}

type grafanaPanel struct {
	ID         *int               `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource *grafanaDatasource `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Collapsed bool `json:"collapsed"`
	Targets   []struct {
		Datasource   *grafanaDatasource `json:"datasource"`
		Expr         string             `json:"expr"`
		LegendFormat string             `json:"legendFormat"`
		RefID        string             `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func (d *grafanaDatasource) isTemplated() bool {
	return d != nil && d.Type == "prometheus" && d.UID == "${datasource}"
}

type grafanaVariable struct {
	Name       string             `json:"name"`
	Type       string             `json:"type"`
	Datasource *grafanaDatasource `json:"datasource"`
	Query      json.RawMessage    `json:"query"` // a string, or {"query": "..."}
}

// grafanaQuery is one PromQL expression of the dashboard and where it is.
type grafanaQuery struct {
	where, expr, legend string
	// label, for a label_values variable: the label whose values it lists.
	label string
	refs  promRefs
}

func loadDashboard(t *testing.T) *grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if len(d.allPanels()) == 0 {
		t.Fatalf("%s has no panels", dashboardFile)
	}
	return &d
}

// allPanels is every panel, a collapsed row's included.
func (d *grafanaDashboard) allPanels() []grafanaPanel {
	var all []grafanaPanel
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return all
}

var labelValuesQuery = regexp.MustCompile(`^\s*label_values\(\s*(?:(.*\S)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// queries is every PromQL expression: the panels' queries, the
// annotations' and the template variables'.
func (d *grafanaDashboard) queries() []grafanaQuery {
	var qs []grafanaQuery
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			qs = append(qs, grafanaQuery{where: fmt.Sprintf("panel %q query %s", p.Title, tg.RefID), expr: tg.Expr, legend: tg.LegendFormat})
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			qs = append(qs, grafanaQuery{where: fmt.Sprintf("annotation %q", a.Name), expr: a.Expr, legend: a.TextFormat})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		if json.Unmarshal(v.Query, &q) != nil {
			var obj struct {
				Query string `json:"query"`
			}
			_ = json.Unmarshal(v.Query, &obj)
			q = obj.Query
		}
		where := fmt.Sprintf("variable %q", v.Name)
		if m := labelValuesQuery.FindStringSubmatch(q); m != nil {
			if m[1] == "" {
				qs = append(qs, grafanaQuery{where: where, expr: "", label: m[2]}) // any series: nothing to check
				continue
			}
			qs = append(qs, grafanaQuery{where: where, expr: m[1], legend: "{{" + m[2] + "}}", label: m[2]})
			continue
		}
		qs = append(qs, grafanaQuery{where: where, expr: q})
	}
	return qs
}

// grafanaBuiltins are the variables Grafana defines itself.
var grafanaBuiltins = labelSet("__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms",
	"__from", "__to", "__dashboard", "__org", "__user", "__all", "__name", "__auto")

var grafanaVariableRef = regexp.MustCompile(`\$\{([a-zA-Z0-9_]+)(?::[^}]*)?\}|\$([a-zA-Z0-9_]+)|\[\[([a-zA-Z0-9_]+)(?::[^\]]*)?\]\]`)

// grafanaVariablesIn names the variables an expression uses.
func grafanaVariablesIn(expr string) []string {
	var names []string
	for _, m := range grafanaVariableRef.FindAllStringSubmatch(expr, -1) {
		names = append(names, m[1]+m[2]+m[3])
	}
	return names
}

var legendLabel = regexp.MustCompile(`\{\{\s*([^}\s]+)\s*\}\}`)

// legendProblems names the labels a query's legend shows that none of the
// series it reads carries.
func legendProblems(q grafanaQuery, families map[string]promFamily) []string {
	var problems []string
	for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
		label, found := m[1], false
		for _, ref := range q.refs.metrics {
			if _, labels, err := resolve(families, ref.name); err == nil && labels[label] {
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("legend or variable label %q is on none of the series it reads", label))
		}
	}
	return problems
}

// ----------------------------------------------------------------------------
// PromQL, read far enough to name the series and labels an expression uses.

// promRefs is what an expression refers to.
type promRefs struct {
	metrics []promMetricRef
	groups  []promGrouping
	// quantiles are the token ranges of histogram_quantile's arguments.
	quantiles [][2]int
}

// promMetricRef is a series name in an expression, with the labels its matchers name.
type promMetricRef struct {
	name   string
	labels []string
	pos    int // its token's index
	// underRate: the direct argument of rate, irate or increase (which want counters).
	underRate bool
}

// promGrouping is a by, without, on, ignoring or group_* clause: its labels
// must be on every series within its scope (tokens from..to).
type promGrouping struct {
	clause   string
	labels   []string
	from, to int
}

type promToken struct {
	kind byte // 'i' identifier, 's' string, 'n' number, 'r' range or subquery [...], 'v' variable, 'o' operator or punctuation
	text string
}

var promAggregators = labelSet("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio")

var promFunctions = labelSet("abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
	"day_of_month", "day_of_week", "day_of_year", "days_in_month", "delta", "deriv", "exp", "floor",
	"histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
	"histogram_stdvar", "histogram_sum", "hour", "idelta", "increase", "irate", "label_join", "label_replace",
	"ln", "log2", "log10", "minute", "month", "predict_linear", "rate", "resets", "round", "scalar", "sgn",
	"sort", "sort_desc", "sort_by_label", "sort_by_label_desc", "sqrt", "time", "timestamp", "vector", "year",
	"avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time",
	"stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time", "mad_over_time",
	"acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh",
	"deg", "pi", "rad", "double_exponential_smoothing", "holt_winters", "start", "end")

var promKeywords = labelSet("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "by", "without",
	"on", "ignoring", "group_left", "group_right")

var promRateFunctions = labelSet("rate", "irate", "increase")

func lexPromQL(expr string) ([]promToken, error) {
	var toks []promToken
	isIdentStart := func(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c == ':' || c >= '0' && c <= '9' }
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, promToken{'s', expr[i+1 : j]})
			i = j + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated range at %d", i)
			}
			toks = append(toks, promToken{'r', expr[i+1 : i+j]})
			i += j + 1
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated variable at %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdent(expr[j]) {
					j++
				}
			}
			toks = append(toks, promToken{'v', expr[i:j]})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			toks = append(toks, promToken{'i', expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.':
			j := i
			for j < len(expr) && (isIdent(expr[j]) || expr[j] == '.' ||
				(expr[j] == '+' || expr[j] == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E')) {
				j++
			}
			toks = append(toks, promToken{'n', expr[i:j]})
			i = j
		default:
			op := string(c)
			if i+1 < len(expr) && slices.Contains([]string{"==", "!=", "=~", "!~", ">=", "<="}, expr[i:i+2]) {
				op = expr[i : i+2]
			} else if !strings.ContainsRune("(){},+-*/%^=<>@", rune(c)) {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			toks = append(toks, promToken{'o', op})
			i += len(op)
		}
	}
	return toks, nil
}

// promReferences reads the series, labels and groupings of a PromQL
// expression. It is no parser: it knows just enough of the grammar (an
// identifier is a function before "(", a label in braces or a label list,
// a keyword, or else a series name) to be strict about what it reads.
func promReferences(expr string) (promRefs, error) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return promRefs{}, err
	}
	closing := map[int]int{} // "(" or "{" at i -> its closing token
	var open []int
	for i, tk := range toks {
		switch {
		case tk.kind == 'o' && (tk.text == "(" || tk.text == "{"):
			open = append(open, i)
		case tk.kind == 'o' && (tk.text == ")" || tk.text == "}"):
			if len(open) == 0 || (toks[open[len(open)-1]].text == "(") != (tk.text == ")") {
				return promRefs{}, fmt.Errorf("unbalanced %q at token %d", tk.text, i)
			}
			closing[open[len(open)-1]] = i
			open = open[:len(open)-1]
		}
	}
	if len(open) > 0 {
		return promRefs{}, fmt.Errorf("unbalanced %q", toks[open[0]].text)
	}
	is := func(i int, kind byte, text string) bool {
		return i >= 0 && i < len(toks) && toks[i].kind == kind && (text == "" || toks[i].text == text)
	}
	// labelList reads "( a, b, ... )" at i; it returns the labels and the index after ")".
	labelList := func(i int) ([]string, int, error) {
		if !is(i, 'o', "(") {
			return nil, i, fmt.Errorf("a label list must follow at token %d", i)
		}
		end := closing[i]
		var labels []string
		for j := i + 1; j < end; j++ {
			switch {
			case is(j, 'i', "") || is(j, 's', ""):
				labels = append(labels, toks[j].text)
			case is(j, 'o', ","):
			default:
				return nil, i, fmt.Errorf("%q in a label list", toks[j].text)
			}
		}
		return labels, end + 1, nil
	}

	var refs promRefs
	skip := map[int]bool{} // tokens already read as labels
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		if skip[i] {
			continue
		}
		if is(i, 'o', "{") {
			return refs, fmt.Errorf("a selector without a metric name at token %d: name the series", i)
		}
		if tk.kind != 'i' {
			continue
		}
		name := tk.text
		switch {
		case promAggregators[strings.ToLower(name)]:
			args := i + 1
			var labels []string
			clause := ""
			if is(args, 'i', "by") || is(args, 'i', "without") {
				clause = toks[args].text
				if labels, args, err = labelList(args + 1); err != nil {
					return refs, err
				}
			}
			if !is(args, 'o', "(") {
				return refs, fmt.Errorf("aggregation %s without arguments", name)
			}
			end := closing[args]
			if clause == "" && (is(end+1, 'i', "by") || is(end+1, 'i', "without")) {
				clause = toks[end+1].text
				var after int
				if labels, after, err = labelList(end + 2); err != nil {
					return refs, err
				}
				for j := end + 1; j < after; j++ {
					skip[j] = true
				}
			}
			if clause != "" {
				refs.groups = append(refs.groups, promGrouping{clause: clause, labels: labels, from: args, to: end})
			}
			i = args // read the arguments
		case name == "on" || name == "ignoring" || name == "group_left" || name == "group_right":
			if !is(i+1, 'o', "(") {
				continue // group_left without labels
			}
			labels, after, err := labelList(i + 1)
			if err != nil {
				return refs, err
			}
			refs.groups = append(refs.groups, promGrouping{clause: name, labels: labels, from: 0, to: len(toks)})
			i = after - 1
		case promKeywords[strings.ToLower(name)]:
		case is(i+1, 'o', "("):
			if !promFunctions[name] {
				return refs, fmt.Errorf("unknown function %q", name)
			}
			if name == "histogram_quantile" {
				refs.quantiles = append(refs.quantiles, [2]int{i + 1, closing[i+1]})
			}
		case strings.EqualFold(name, "inf") || strings.EqualFold(name, "nan"):
		default:
			ref := promMetricRef{name: name, pos: i,
				underRate: is(i-1, 'o', "(") && i >= 2 && toks[i-2].kind == 'i' && promRateFunctions[toks[i-2].text]}
			if is(i+1, 'o', "{") {
				end := closing[i+1]
				for j := i + 2; j < end; j++ {
					if is(j, 'o', ",") {
						continue
					}
					if !(is(j, 'i', "") || is(j, 's', "")) || j+2 >= end || toks[j+1].kind != 'o' || !is(j+2, 's', "") {
						return refs, fmt.Errorf("cannot read the matchers of %s", name)
					}
					if toks[j].text == "__name__" {
						return refs, fmt.Errorf("%s: match the series by its name, not __name__", name)
					}
					ref.labels = append(ref.labels, toks[j].text)
					j += 2
				}
				i = end
			}
			refs.metrics = append(refs.metrics, ref)
		}
	}
	return refs, nil
}

// check says what is wrong with the references against the families exported.
func (r promRefs) check(families map[string]promFamily) []string {
	var problems []string
	labelsOf := map[int]map[string]bool{} // by token index
	for _, m := range r.metrics {
		f, labels, err := resolve(families, m.name)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		labelsOf[m.pos] = labels
		for _, l := range m.labels {
			if !labels[l] {
				problems = append(problems, fmt.Sprintf("%s has no label %q (it has %s)", m.name, l, strings.Join(slices.Sorted(maps.Keys(labels)), ", ")))
			}
		}
		if m.underRate && f.typ != dto.MetricType_COUNTER && f.typ != dto.MetricType_HISTOGRAM && f.typ != dto.MetricType_SUMMARY {
			problems = append(problems, fmt.Sprintf("%s is a %s: rate, irate and increase want a counter", m.name, strings.ToLower(f.typ.String())))
		}
	}
	for _, g := range r.groups {
		for _, m := range r.metrics {
			labels, ok := labelsOf[m.pos]
			if !ok || m.pos < g.from || m.pos > g.to {
				continue
			}
			for _, l := range g.labels {
				if !labels[l] {
					problems = append(problems, fmt.Sprintf("%s (%s): %s has no label %q", g.clause, strings.Join(g.labels, ", "), m.name, l))
				}
			}
		}
	}
	for _, q := range r.quantiles {
		for _, m := range r.metrics {
			if m.pos > q[0] && m.pos < q[1] && !strings.HasSuffix(m.name, "_bucket") {
				problems = append(problems, fmt.Sprintf("histogram_quantile over %s, not a _bucket series", m.name))
			}
		}
		for _, g := range r.groups {
			if g.from > q[0] && g.to < q[1] && g.clause == "by" && !slices.Contains(g.labels, "le") {
				problems = append(problems, fmt.Sprintf("histogram_quantile over a sum by (%s), without \"le\"", strings.Join(g.labels, ", ")))
			}
		}
	}
	return problems
}
