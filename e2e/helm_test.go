package e2e

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/navemesh/nave/internal/kubetest"
)

const (
	// chartDir is the Helm chart users install.
	chartDir = "../deploy/helm/nave"
	// helmRenderEnv names the helm-render binary (tools/helm): Helm's own
	// library rendering a chart as `helm template --include-crds`; `make` exports it.
	helmRenderEnv = "NAVE_HELM_RENDER"
	// serviceMonitorCRDEnv names the directory holding the Prometheus
	// Operator's ServiceMonitor CRD (tools/prometheus-operator); `make` exports it.
	serviceMonitorCRDEnv = "NAVE_SERVICEMONITOR_CRD"
	// helmNamespace is the release namespace of most cases: deploy/'s.
	helmNamespace = "nave-system"
)

// helmCase is one install of the chart: the values files under the chart's
// ci/ directory, the release namespace, and what the render must show.
type helmCase struct {
	values    string
	namespace string
	check     func(t *testing.T, r helmRender)
}

var helmCases = []helmCase{
	{values: "default-values.yaml", namespace: helmNamespace, check: func(t *testing.T, r helmRender) {
		r.requireObjects(t, "StatefulSet/nave-etcd", "StatefulSet/nave-hub", "Deployment/nave-spoke", "DaemonSet/nave-node")
		r.forbidObjects(t, "Namespace", "Secret", "ServiceMonitor", "NetworkPolicy")
	}},
	{values: "external-etcd-tls-values.yaml", namespace: helmNamespace, check: func(t *testing.T, r helmRender) {
		r.forbidObjects(t, "StatefulSet/nave-etcd", "Service/nave-etcd", "PodDisruptionBudget/nave-etcd", "Secret")
		hub := r.container(t, "StatefulSet/nave-hub", "hub")
		hasArgs(t, hub, "--etcd-endpoints=https://etcd-0.etcd.storage.svc:2379,https://etcd-1.etcd.storage.svc:2379,https://etcd-2.etcd.storage.svc:2379",
			"--etcd-ca=/etc/nave-tls/etcd/ca.crt", "--etcd-cert=/etc/nave-tls/etcd/tls.crt", "--etcd-prefix=/nave-east/",
			"--tls-cert=/etc/nave-tls/replicas/$(POD_NAME)/tls.crt", "--client-ca=/etc/nave-tls/replicas/$(POD_NAME)/ca.crt",
			"--peer-ca=/etc/nave-tls/replicas/$(POD_NAME)/ca.crt", "--xds-client-ca=/etc/nave-tls/xds-ca/ca.crt",
			"--xds-policy=/etc/nave-policy/policy.yaml", "--admin-token-file=/etc/nave-admin/token")
		// External etcd: nothing of the embedded mode's.
		lacksArgs(t, hub, "--data-dir")
		if r.has("StatefulSet/nave-hub", "spec", "volumeClaimTemplates") {
			t.Error("StatefulSet nave-hub has volumeClaimTemplates with an external etcd")
		}
		lacksArgs(t, r.container(t, "Deployment/nave-spoke", "spoke"), "--token-file")
		hasArgs(t, r.container(t, "Deployment/nave-spoke", "spoke"), "--cert=/etc/nave-tls/hub/tls.crt", "--hub-ca=/etc/nave-tls/hub/ca.crt")
		hasArgs(t, r.container(t, "DaemonSet/nave-node", "node-agent"), "--cert=/etc/nave-tls/hub/tls.crt", "--hub-ca=/etc/nave-tls/hub/ca.crt")
		r.requireObjects(t, "ClusterRole/nave:coredns-multicluster", "NetworkPolicy/nave-node")
		// The node agents' NetworkPolicy is deploy/security's.
		plain := kubetest.ReadManifests(t, filepath.Join(deployDir, "security", "node-networkpolicy.yaml"))[0]
		if np, ok := r.find("NetworkPolicy/nave-node"); ok {
			for _, d := range yamlDiff("", withoutMetadata(plain.Unstructured), withoutMetadata(np.Unstructured)) {
				t.Errorf("NetworkPolicy nave-node differs from deploy/security/node-networkpolicy.yaml: %s", d)
			}
		}
	}},
	{values: "hub-only-values.yaml", namespace: "nave-hub", check: func(t *testing.T, r helmRender) {
		r.requireObjects(t, "Namespace/nave-hub", "StatefulSet/nave-hub")
		r.forbidObjects(t, "Deployment", "DaemonSet", "ConfigMap", "StatefulSet/nave-etcd", "ClusterRole")
		hub := r.container(t, "StatefulSet/nave-hub", "hub")
		hasArgs(t, hub, "--data-dir=/var/lib/nave", "--tls-cert=/etc/nave-tls/federation/tls.crt")
		// One replica, no gossip: no peers, no peer CA, no shared etcd.
		lacksArgs(t, hub, "--join", "--gossip-addr", "--advertise-host", "--peer-token-file", "--peer-ca", "--etcd-endpoints")
		if !r.has("StatefulSet/nave-hub", "spec", "volumeClaimTemplates") {
			t.Error("StatefulSet nave-hub has no volume for its embedded etcd")
		}
	}},
	{values: "spoke-only-values.yaml", namespace: helmNamespace, check: func(t *testing.T, r helmRender) {
		r.requireObjects(t, "Deployment/nave-spoke", "DaemonSet/nave-node", "ConfigMap/nave-spoke")
		r.forbidObjects(t, "StatefulSet", "Service/nave-hub", "Service/nave-hub-peers")
		data := r.field(t, "ConfigMap/nave-spoke", "data").(map[string]any)
		if data["hub-addr"] != "nave-hub.example.com:15010" || data["cluster-id"] != "west" {
			t.Errorf("ConfigMap nave-spoke: %v", data)
		}
	}},
	{values: "servicemonitor-values.yaml", namespace: helmNamespace, check: func(t *testing.T, r helmRender) {
		r.requireObjects(t, "ServiceMonitor/nave-hub", "ServiceMonitor/nave-spoke", "ServiceMonitor/nave-node",
			"Service/nave-hub-metrics", "Service/nave-spoke-metrics", "Service/nave-node-metrics")
		auth := r.field(t, "ServiceMonitor/nave-hub", "spec", "endpoints").([]any)[0].(map[string]any)["authorization"]
		if !reflect.DeepEqual(auth, map[string]any{"type": "Bearer", "credentials": map[string]any{"name": "nave-hub-admin-token", "key": "token"}}) {
			t.Errorf("ServiceMonitor nave-hub sends no admin token: authorization %v", auth)
		}
	}},
}

// TestHelmChartDryRun renders the chart with Helm's own library for each
// values file of its ci/ directory and has a real API server validate every
// object with a server-side apply, DryRun=All, in a namespace that enforces
// and warns about the "restricted" Pod Security Standard: a rejection or any
// warning fails. The chart's CRDs and the Prometheus Operator's real
// ServiceMonitor CRD are applied first, as Helm and the operator would. Each
// case also checks what its values must change, and that every flag the
// chart passes exists in the binaries.
func TestHelmChartDryRun(t *testing.T) {
	bin := helmRenderBinary(t)
	smCRDs := serviceMonitorCRDs(t)
	flags := naveFlags(t)
	c := kubetest.StartClusters(t, "helm")[0]
	// What `helm install` would read from the API server; a kube-apiserver
	// built from the module reports v0.0.0-master, so its module's version.
	kubeVersion := goModRequires(t, "../tools/kube-apiserver/go.mod", "k8s.io/kubernetes")

	// The chart's CRDs (the same for every case), the ServiceMonitor CRD and deploy/'s namespace, for real.
	first := renderChart(t, bin, "crds", helmNamespace, kubeVersion, "default-values.yaml")
	var crds []kubetest.Object
	for _, o := range first.objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		}
	}
	c.ApplyObjects(t, crds...)
	c.Apply(t, append(smCRDs, filepath.Join(deployDir, "base", "namespace.yaml"))...)

	for _, tc := range helmCases {
		t.Run(strings.TrimSuffix(tc.values, "-values.yaml"), func(t *testing.T) {
			r := renderChart(t, bin, tc.values, tc.namespace, kubeVersion, tc.values)
			// A namespace the chart makes is created for real first: the others are dry-run inside it.
			if tc.namespace != helmNamespace {
				ns, ok := r.byKey["Namespace/"+tc.namespace]
				if !ok {
					t.Fatalf("the chart does not make namespace %s, and the case needs it", tc.namespace)
				}
				c.ApplyObjects(t, ns)
			}
			for _, o := range r.objs {
				if ns := o.GetNamespace(); ns != "" && ns != tc.namespace {
					t.Errorf("%s: %s/%s is in namespace %s, not the release's %s", o.Source, o.GetKind(), o.GetName(), ns, tc.namespace)
				}
			}
			checkFlags(t, r, flags)
			tc.check(t, r)
			if err := c.DryRun(t.Context(), r.objs...); err != nil {
				t.Fatalf("the API server rejects or warns about the chart's objects:\n%v", err)
			}
			t.Logf("the API server accepts all %d objects without a warning", len(r.objs))
		})
	}
}

// TestHelmChartRefusesValues: values the binaries would refuse, or that
// leave a required setting out, fail the render with a message that says so.
func TestHelmChartRefusesValues(t *testing.T) {
	bin := helmRenderBinary(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "cluster.id is required"},
		{[]string{"cluster.id=east", "hub.enabled=false"}, "cluster.hubAddr is required"},
		{[]string{"cluster.id=east", "etcd.mode=embedded"}, "etcd.mode embedded runs one hub replica"},
		{[]string{"cluster.id=east", "etcd.mode=external"}, "etcd.external.endpoints is required"},
		{[]string{"cluster.id=east", "etcd.mode=sidecar"}, "etcd.mode must be bundled, external or embedded"},
		{[]string{"cluster.id=east", "hub.tls.xds.secretName=x", "hub.tls.xds.policy.configMapName=p"}, "needs hub.tls.xds.clientAuth"},
		{[]string{"cluster.id=east", "hub.tls.federation.clientAuth=true"}, "client certificates travel over TLS"},
		{[]string{"cluster.id=east", "hub.tls.federation.secretName=x", "hub.tls.federation.clientAuth=true", "hub.peerToken.secretName="}, "needs perReplica"},
	} {
		args := []string{"--release", "nave", "--namespace", helmNamespace}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := exec.Command(bin, append(args, chartDir)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("--set %v: want a failure saying %q; got %v:\n%s", tc.set, tc.want, err, out)
		}
	}
}

// TestHelmChartMatchesManifests: the chart's default render is deploy/'s
// plain manifests for every part both have (the CRDs, the hub and its etcd,
// the spoke, the node agents), so that neither drifts from the other: the same
// objects (kind, namespace, name), and each the same but for metadata (the
// chart adds Helm's labels to deploy/'s) and the ConfigMap's values (deploy/'s
// are placeholders). deploy/'s Secrets are templates the chart never makes.
func TestHelmChartMatchesManifests(t *testing.T) {
	bin := helmRenderBinary(t)
	chart := renderChart(t, bin, "default", helmNamespace, "", "default-values.yaml")

	var files []string
	for _, glob := range []string{"crds/*.yaml", "hub/*.yaml", "spoke/*.yaml", "node/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(deployDir, glob))
		if err != nil || len(m) == 0 {
			t.Fatalf("%s: %v %v", glob, m, err)
		}
		files = append(files, m...)
	}
	plain := map[string]kubetest.Object{}
	for _, o := range kubetest.ReadManifests(t, files...) {
		if o.GetKind() != "Secret" {
			plain[objectKey(o)] = o
		}
	}

	if got, want := slices.Sorted(maps.Keys(chart.byKey)), slices.Sorted(maps.Keys(plain)); !slices.Equal(got, want) {
		t.Fatalf("the chart renders\n  %s\ndeploy/ has\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for key, p := range plain {
		c := chart.byKey[key]
		for k, v := range p.GetLabels() {
			if c.GetLabels()[k] != v {
				t.Errorf("%s: label %s=%q, deploy/ (%s) has %q", c.Source, k, c.GetLabels()[k], p.Source, v)
			}
		}
		want, got := withoutMetadata(p.Unstructured), withoutMetadata(c.Unstructured)
		if key == "ConfigMap/"+helmNamespace+"/nave-spoke" {
			want["data"], got["data"] = slices.Sorted(maps.Keys(want["data"].(map[string]any))), slices.Sorted(maps.Keys(got["data"].(map[string]any)))
		}
		for _, d := range yamlDiff("", want, got) {
			t.Errorf("%s differs from deploy/ (%s): %s", c.Source, p.Source, d)
		}
	}
	if !t.Failed() {
		t.Logf("the chart's %d objects are deploy/'s", len(plain))
	}
}

// TestHelmChartCRDsAreDeploys: the chart's crds/ are deploy/crds (which
// `make generate` writes), byte for byte.
func TestHelmChartCRDsAreDeploys(t *testing.T) {
	want, err := filepath.Glob(filepath.Join(deployDir, "crds", "*.yaml"))
	if err != nil || len(want) == 0 {
		t.Fatalf("deploy/crds: %v %v", want, err)
	}
	got, err := filepath.Glob(filepath.Join(chartDir, "crds", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if g, w := baseNames(got), baseNames(want); !slices.Equal(g, w) {
		t.Fatalf("the chart's crds/ holds %v, deploy/crds %v", g, w)
	}
	for _, w := range want {
		g := filepath.Join(chartDir, "crds", filepath.Base(w))
		if !bytes.Equal(fileBytes(t, g), fileBytes(t, w)) {
			t.Errorf("%s is not %s: copy it (cp deploy/crds/*.yaml deploy/helm/nave/crds/)", g, w)
		}
	}
}

// fileBytes is a file's content; failing to read it fails the test.
func fileBytes(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// helmRender is the chart rendered for one case.
type helmRender struct {
	objs  []kubetest.Object
	byKey map[string]kubetest.Object // by objectKey
}

// renderChart renders the chart as release "nave" in namespace with the
// given ci/ values files (and Kubernetes version, if not empty), and reads
// the objects back, each with its template as Source.
func renderChart(t testing.TB, bin, name, namespace, kubeVersion string, values ...string) helmRender {
	t.Helper()
	args := []string{"--release", "nave", "--namespace", namespace}
	if kubeVersion != "" {
		args = append(args, "--kube-version", kubeVersion)
	}
	for _, v := range values {
		args = append(args, "-f", filepath.Join(chartDir, "ci", v))
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, append(args, chartDir)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm-render %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}

	// Like `helm template --output-dir`: one file per template, so that each
	// object's Source names its template.
	dir := filepath.Join(t.TempDir(), name)
	docs := map[string][]string{}
	var order []string
	for doc := range strings.SplitSeq(stdout.String(), "\n---\n") {
		m := sourceLine.FindStringSubmatch(doc)
		if m == nil {
			continue // the empty document before the first separator
		}
		if _, ok := docs[m[1]]; !ok {
			order = append(order, m[1])
		}
		docs[m[1]] = append(docs[m[1]], doc)
	}
	var files []string
	for _, src := range order {
		path := filepath.Join(dir, filepath.FromSlash(src))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(strings.Join(docs[src], "\n---\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, path)
	}
	r := helmRender{byKey: map[string]kubetest.Object{}}
	for _, o := range kubetest.ReadManifests(t, files...) {
		o.Source = strings.TrimPrefix(o.Source, dir+string(filepath.Separator))
		if _, dup := r.byKey[objectKey(o)]; dup {
			t.Fatalf("%s: %s rendered twice", o.Source, objectKey(o))
		}
		r.objs = append(r.objs, o)
		r.byKey[objectKey(o)] = o
	}
	if len(r.objs) == 0 {
		t.Fatalf("helm-render %s rendered nothing", strings.Join(args, " "))
	}
	return r
}

var sourceLine = regexp.MustCompile(`(?m)^# Source: (\S+)$`)

// objectKey names an object: Kind/namespace/name, or Kind/name when cluster-scoped.
func objectKey(o kubetest.Object) string {
	if ns := o.GetNamespace(); ns != "" {
		return o.GetKind() + "/" + ns + "/" + o.GetName()
	}
	return o.GetKind() + "/" + o.GetName()
}

// find returns the object "Kind/name" (in any namespace).
func (r helmRender) find(kindName string) (kubetest.Object, bool) {
	for _, o := range r.objs {
		if o.GetKind()+"/"+o.GetName() == kindName {
			return o, true
		}
	}
	return kubetest.Object{}, false
}

// requireObjects fails unless every "Kind/name" is rendered.
func (r helmRender) requireObjects(t *testing.T, kindNames ...string) {
	t.Helper()
	for _, kn := range kindNames {
		if _, ok := r.find(kn); !ok {
			t.Errorf("no %s rendered", kn)
		}
	}
}

// forbidObjects fails when any "Kind/name", or any object of a "Kind", is rendered.
func (r helmRender) forbidObjects(t *testing.T, kindNames ...string) {
	t.Helper()
	for _, kn := range kindNames {
		for _, o := range r.objs {
			if kn == o.GetKind() || kn == o.GetKind()+"/"+o.GetName() {
				t.Errorf("%s: %s/%s rendered", o.Source, o.GetKind(), o.GetName())
			}
		}
	}
}

// has reports whether the object "Kind/name" has the field.
func (r helmRender) has(kindName string, fields ...string) bool {
	o, ok := r.find(kindName)
	if !ok {
		return false
	}
	_, found, _ := unstructured.NestedFieldNoCopy(o.Object, fields...)
	return found
}

// field returns a field of the object "Kind/name", failing the test when either is missing.
func (r helmRender) field(t *testing.T, kindName string, fields ...string) any {
	t.Helper()
	o, ok := r.find(kindName)
	if !ok {
		t.Fatalf("no %s rendered", kindName)
	}
	v, found, err := unstructured.NestedFieldNoCopy(o.Object, fields...)
	if !found || err != nil {
		t.Fatalf("%s: %s has no %s (%v)", o.Source, kindName, strings.Join(fields, "."), err)
	}
	return v
}

// container returns the args of a workload's container.
func (r helmRender) container(t *testing.T, kindName, name string) []string {
	t.Helper()
	for _, c := range r.field(t, kindName, "spec", "template", "spec", "containers").([]any) {
		c := c.(map[string]any)
		if c["name"] == name {
			args, _, _ := unstructured.NestedStringSlice(c, "args")
			return args
		}
	}
	t.Fatalf("%s has no container %s", kindName, name)
	return nil
}

// hasArgs fails unless every arg is among args.
func hasArgs(t *testing.T, args []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("no %s in %q", w, args)
		}
	}
}

// lacksArgs fails when a flag (--name, with or without a value) is among args.
func lacksArgs(t *testing.T, args []string, flags ...string) {
	t.Helper()
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if slices.Contains(flags, name) {
			t.Errorf("%s in %q", a, args)
		}
	}
}

// naveFlags lists the flags of `nave hub`, `nave spoke` and `nave node`
// (the image's /nave-spoke and /nave-node are the latter two alone), from
// their -help output.
func naveFlags(t *testing.T) map[string][]string {
	t.Helper()
	bin := buildNave(t)
	flags := map[string][]string{}
	for _, cmd := range []string{"hub", "spoke", "node"} {
		out, _ := exec.Command(bin, cmd, "-help").CombinedOutput() // flag's -help exits 0 or 2: the usage is what counts
		for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
			flags[cmd] = append(flags[cmd], m[1])
		}
		if len(flags[cmd]) == 0 {
			t.Fatalf("nave %s -help lists no flags:\n%s", cmd, out)
		}
	}
	return flags
}

var flagLine = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)

// checkFlags fails for any flag a Nave container of the render passes that
// its binary does not have, and for a Nave container whose command it does
// not know (its flags would go unchecked).
func checkFlags(t *testing.T, r helmRender, flags map[string][]string) {
	t.Helper()
	for _, o := range r.objs {
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			command, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "command")
			args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
			var cmd string
			switch {
			case slices.Equal(command, []string{"/nave-spoke"}):
				cmd = "spoke"
			case slices.Equal(command, []string{"/nave-node"}):
				cmd = "node"
			case len(command) == 0 && len(args) > 0 && args[0] == "hub":
				cmd, args = "hub", args[1:]
			default:
				if image, _, _ := unstructured.NestedString(c.(map[string]any), "image"); !strings.Contains(image, "etcd") {
					name, _, _ := unstructured.NestedString(c.(map[string]any), "name")
					t.Errorf("%s: %s/%s container %q (%s) runs no command this test knows: its flags go unchecked", o.Source, o.GetKind(), o.GetName(), name, image)
				}
				continue // etcd's
			}
			for _, a := range args {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if !strings.HasPrefix(a, "--") || !slices.Contains(flags[cmd], name) {
					t.Errorf("%s: %s/%s passes %q, which `nave %s` does not take", o.Source, o.GetKind(), o.GetName(), a, cmd)
				}
			}
		}
	}
}

// withoutMetadata is an object's content but its metadata.
func withoutMetadata(u *unstructured.Unstructured) map[string]any {
	m := u.DeepCopy().Object
	delete(m, "metadata")
	return m
}

// yamlDiff describes where two decoded YAML values differ, by path.
func yamlDiff(path string, want, got any) []string {
	wm, wok := want.(map[string]any)
	gm, gok := got.(map[string]any)
	if wok && gok {
		var out []string
		keys := slices.Collect(maps.Keys(wm))
		for k := range gm {
			if _, ok := wm[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			out = append(out, yamlDiff(path+"."+k, wm[k], gm[k])...)
		}
		return out
	}
	ws, wok := want.([]any)
	gs, gok := got.([]any)
	if wok && gok && len(ws) == len(gs) {
		var out []string
		for i := range ws {
			out = append(out, yamlDiff(fmt.Sprintf("%s[%d]", path, i), ws[i], gs[i])...)
		}
		return out
	}
	if reflect.DeepEqual(want, got) {
		return nil
	}
	return []string{fmt.Sprintf("%s: deploy/ has %v, the chart %v", path, want, got)}
}

// baseNames are the sorted base names of paths.
func baseNames(paths []string) []string {
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	sort.Strings(names)
	return names
}

// helmRenderBinary returns the helm-render binary: $NAVE_HELM_RENDER, else
// where `make helm-render` caches it.
func helmRenderBinary(t testing.TB) string {
	t.Helper()
	path := cachedTool(t, helmRenderEnv, "helm-render", "../tools/helm/go.mod", "helm.sh/helm/v3")
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		toolMissing(t, "helm-render binary %s is missing: run `make helm-render` (about 2 minutes, once per machine) or set %s", path, helmRenderEnv)
	}
	return path
}

// serviceMonitorCRDs returns the ServiceMonitor CRD's file: from
// $NAVE_SERVICEMONITOR_CRD, else where `make servicemonitor-crd` caches it.
func serviceMonitorCRDs(t testing.TB) []string {
	t.Helper()
	dir := cachedTool(t, serviceMonitorCRDEnv, "prometheus-operator", "../tools/prometheus-operator/go.mod", "github.com/prometheus-operator/prometheus-operator")
	files, err := filepath.Glob(filepath.Join(dir, "*servicemonitors.yaml"))
	if err != nil || len(files) == 0 {
		toolMissing(t, "the ServiceMonitor CRD is missing from %s: run `make servicemonitor-crd` or set %s", dir, serviceMonitorCRDEnv)
	}
	return files
}

// cachedTool is $env, else the Makefile's $(NAVE_CACHE)/NAME-VERSION, the
// version being what gomod requires of module.
func cachedTool(t testing.TB, env, name, gomod, module string) string {
	t.Helper()
	if path := os.Getenv(env); path != "" {
		return path
	}
	version := goModRequires(t, gomod, module)
	cache := os.Getenv("NAVE_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			toolMissing(t, "%s: %v; set %s", name, err, env)
		}
		cache = filepath.Join(base, "nave")
	}
	return filepath.Join(cache, name+"-"+version)
}

// goModRequires is the version of module that gomod requires, as the Makefile's awk reads it.
func goModRequires(t testing.TB, gomod, module string) string {
	t.Helper()
	for line := range strings.Lines(string(fileBytes(t, gomod))) {
		if f := strings.Fields(line); len(f) >= 2 && (f[0] == module || f[1] == module) {
			return f[len(f)-1]
		}
	}
	t.Fatalf("%s does not require %s", gomod, module)
	return ""
}

// toolMissing fails the test under NAVE_E2E_REQUIRE=1 (`make test`), and skips it otherwise.
func toolMissing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(kubetest.RequireEnv) == "1" {
		t.Fatalf(format+" (%s=1)", append(args, kubetest.RequireEnv)...)
	}
	t.Skipf(format, args...)
}
