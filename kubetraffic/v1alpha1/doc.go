// Package v1alpha1 is the nave.io/v1alpha1 API: TrafficPolicy, a direct
// policy (Gateway API GEP-713 policy attachment) that targets Services of
// its namespace and says how their clients pick among the endpoints of
// every cluster that exports them: load balancing, locality preference and
// failover, outlier detection, a circuit breaker, a default timeout and
// retries.
//
// These are the Go types of the CRD in deploy/crds/trafficpolicies.yaml:
// `make generate` writes that CRD and zz_generated.deepcopy.go from them
// with controller-gen (tools/controller-gen pins it). The markers here are
// the CRD's validation; package kubetraffic reads a TrafficPolicy into
// package traffic's model, which validates it again.
//
// +groupName=nave.io
// +kubebuilder:object:generate=true
package v1alpha1
