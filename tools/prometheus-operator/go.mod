// The Prometheus Operator release whose ServiceMonitor CRD the chart test
// applies before it dry-runs the chart's ServiceMonitors
// (deploy/helm/nave, serviceMonitor.enabled). `make servicemonitor-crd`
// copies it from the module's example/prometheus-operator-crd into the cache.
module github.com/navemesh/nave/tools/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
