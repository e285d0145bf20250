// Command helm-render renders a Helm chart directory to stdout as `helm
// template --include-crds` does: the chart's CRDs, then its manifests in
// Helm's install order, then its hooks, as multi-document YAML. It is Helm's
// own code (loader, chartutil, engine, releaseutil, cli/values) pinned by
// this module, for Nave's chart test; it lives in a module of its own so that
// Nave's go.mod never depends on Helm.
//
//	helm-render [--release NAME] [--namespace NS] [-f VALUES.yaml]... [--set K=V]... [--kube-version V] CHART_DIR
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime/debug"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/releaseutil"
)

// Config is what one rendering needs.
type Config struct {
	// ChartDir is the chart's directory (or packaged .tgz).
	ChartDir string
	// Release and Namespace are .Release.Name and .Release.Namespace.
	Release, Namespace string
	// Values are the values files (-f) and --set assignments, merged as helm does: later ones win.
	Values values.Options
	// KubeVersion is .Capabilities.KubeVersion (and what the chart's
	// kubeVersion is checked against); empty: Helm's default.
	KubeVersion string
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var cfg Config
	fs := flag.NewFlagSet("helm-render", flag.ExitOnError)
	fs.StringVar(&cfg.Release, "release", "release-name", "release name (.Release.Name)")
	fs.StringVar(&cfg.Namespace, "namespace", "default", "release namespace (.Release.Namespace)")
	fs.Var((*stringList)(&cfg.Values.ValueFiles), "f", "values file (repeatable; later files win)")
	fs.Var((*stringList)(&cfg.Values.ValueFiles), "values", "same as -f")
	fs.Var((*stringList)(&cfg.Values.Values), "set", "KEY=VALUE on the command line, as helm's --set (repeatable)")
	fs.StringVar(&cfg.KubeVersion, "kube-version", clientGoKubeVersion(), "Kubernetes version for .Capabilities.KubeVersion")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: helm-render [flags] CHART_DIR")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() != 1 {
		fs.Usage()
		os.Exit(2)
	}
	cfg.ChartDir = fs.Arg(0)
	if err := Run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "helm-render:", err)
		os.Exit(1)
	}
}

// clientGoKubeVersion is the Kubernetes version of the client-go Helm is
// built with, v1.MINOR.0: what Helm's release builds make the default
// .Capabilities.KubeVersion (by -ldflags); empty when unknown, leaving
// chartutil's own default.
func clientGoKubeVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range info.Deps {
		// client-go v0.MINOR.PATCH goes with Kubernetes v1.MINOR.PATCH.
		if _, minor, ok := strings.Cut(m.Version, "."); ok && m.Path == "k8s.io/client-go" && strings.HasPrefix(m.Version, "v0.") {
			minor, _, _ = strings.Cut(minor, ".")
			return "v1." + minor + ".0"
		}
	}
	return ""
}

// Run renders the chart and writes every object to w, as `helm template
// --include-crds` prints them (each document headed by "# Source: FILE").
func Run(cfg Config, w io.Writer) error {
	chrt, err := loader.Load(cfg.ChartDir)
	if err != nil {
		return fmt.Errorf("load chart: %w", err)
	}
	if err := chartutil.ValidateReleaseName(cfg.Release); err != nil {
		return err
	}
	vals, err := cfg.Values.MergeValues(getter.Providers{})
	if err != nil {
		return fmt.Errorf("values: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	if cfg.KubeVersion != "" {
		kv, err := chartutil.ParseKubeVersion(cfg.KubeVersion)
		if err != nil {
			return err
		}
		caps.KubeVersion = *kv
	}
	if kv := chrt.Metadata.KubeVersion; kv != "" && !chartutil.IsCompatibleRange(kv, caps.KubeVersion.String()) {
		return fmt.Errorf("chart requires kubeVersion %s, not Kubernetes %s", kv, caps.KubeVersion.String())
	}
	// As an install: .Release.IsInstall, revision 1; values.schema.json is enforced here.
	opts := chartutil.ReleaseOptions{Name: cfg.Release, Namespace: cfg.Namespace, Revision: 1, IsInstall: true}
	renderVals, err := chartutil.ToRenderValues(chrt, vals, opts, caps)
	if err != nil {
		return err
	}
	files, err := engine.Render(chrt, renderVals)
	if err != nil {
		return err
	}
	// NOTES.txt is rendered too but is neither a manifest nor a hook.
	for name := range files {
		if path.Base(name) == "NOTES.txt" {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, caps.APIVersions, releaseutil.InstallOrder)
	if err != nil {
		return fmt.Errorf("split manifests: %w", err)
	}
	for _, crd := range chrt.CRDObjects() {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", crd.Filename, crd.File.Data)
	}
	for _, m := range manifests {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	for _, h := range hooks {
		fmt.Fprintf(w, "---\n# Source: %s\n%s\n", h.Path, h.Manifest)
	}
	return nil
}
