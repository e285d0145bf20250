package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TrafficPolicy says how the clients of the Services it targets pick among
// their endpoints, in every cluster that exports them: load balancing,
// locality preference and failover, outlier detection, a circuit breaker, a
// default timeout and retries. Nave's hub sends it to Envoy and proxyless
// gRPC clients over xDS. It is a Direct policy (Gateway API GEP-713): it
// applies to the Services it names, in its own namespace.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:resource:scope=Namespaced,shortName=tp,categories=nave
// +kubebuilder:metadata:labels="gateway.networking.k8s.io/policy=Direct"
// +kubebuilder:printcolumn:name="Algorithm",type=string,JSONPath=`.spec.loadBalancer.algorithm`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TrafficPolicy struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the policy: the Services it targets and what their clients do.
	// +required
	Spec TrafficPolicySpec `json:"spec"`

	// Status says, per ancestor (the targeted Service) and controller, whether
	// the policy was accepted (condition Accepted; reasons Accepted,
	// Conflicted, Invalid, TargetNotFound).
	// +optional
	Status gwv1.PolicyStatus `json:"status,omitempty"`
}

// TrafficPolicyList is a list of TrafficPolicies.
//
// +kubebuilder:object:root=true
type TrafficPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TrafficPolicy `json:"items"`
}

// TrafficPolicySpec is what a TrafficPolicy says. Every part is optional:
// a part left out is the clients' default.
type TrafficPolicySpec struct {
	// TargetRefs are the Services of the policy's namespace it applies to
	// (group "" and kind Service), 1-16. As GEP-713 has it, where two
	// TrafficPolicies target one Service the older applies, and the other
	// is not accepted (reason Conflicted).
	//
	// +required
	// +listType=map
	// +listMapKey=group
	// +listMapKey=kind
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(r, r.group == '' && r.kind == 'Service')",message="a TrafficPolicy targets only Services: each targetRef must have group '' and kind Service"
	TargetRefs []gwv1.LocalPolicyTargetReference `json:"targetRefs"`

	// LoadBalancer says how a client picks an endpoint within a locality
	// (unset: the client's default, round robin).
	// +optional
	LoadBalancer *LoadBalancer `json:"loadBalancer,omitempty"`

	// Locality says how clients prefer endpoints by where they are (unset:
	// the client's zone first, then its region, then the rest, or what the
	// Service's trafficDistribution says).
	// +optional
	Locality *Locality `json:"locality,omitempty"`

	// OutlierDetection ejects endpoints that fail for a while.
	// Proxyless gRPC clients apply only failurePercentage and successRate (gRFC A50); consecutiveErrors is applied by Envoy only.
	// +optional
	OutlierDetection *OutlierDetection `json:"outlierDetection,omitempty"`

	// MaxRequests is a circuit breaker: the most requests each client has
	// outstanding to the service at once; more fail at once (gRPC:
	// UNAVAILABLE). Unset: the client's default (1024 in gRPC, gRFC A32).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxRequests *int32 `json:"maxRequests,omitempty"`

	// Timeout bounds every request to the service that no route rule sets a
	// timeout for (a GRPCRoute sets none; an HTTPRoute's timeouts.request
	// wins). gRPC clients apply it as max_stream_duration (gRFC A31), so a
	// shorter deadline of the caller's still wins. At most 24h; unset or 0s:
	// none.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="timeout must be at most 24h"
	Timeout *gwv1.Duration `json:"timeout,omitempty"`

	// Retry retries requests that fail with one of the given gRPC statuses,
	// for every request to the service that no route rule sets a retry for.
	// Proxyless gRPC clients apply it (gRFC A44).
	// +optional
	Retry *Retry `json:"retry,omitempty"`
}

// Algorithm is a load-balancing algorithm.
// +kubebuilder:validation:Enum=RoundRobin;LeastRequest;RingHash;WeightedRoundRobin
type Algorithm string

// The algorithms.
const (
	RoundRobin         Algorithm = "RoundRobin"
	LeastRequest       Algorithm = "LeastRequest"
	RingHash           Algorithm = "RingHash"
	WeightedRoundRobin Algorithm = "WeightedRoundRobin"
)

// LoadBalancer says how a client picks an endpoint within a locality.
//
// +kubebuilder:validation:XValidation:rule="!has(self.choiceCount) || self.algorithm == 'LeastRequest'",message="choiceCount applies only to the LeastRequest algorithm",fieldPath=".choiceCount"
// +kubebuilder:validation:XValidation:rule="!has(self.hashHeader) || self.algorithm == 'RingHash'",message="hashHeader applies only to the RingHash algorithm",fieldPath=".hashHeader"
type LoadBalancer struct {
	// Algorithm is how an endpoint is picked: RoundRobin (each in turn),
	// LeastRequest (the one with the fewest outstanding requests of
	// choiceCount picked at random), RingHash (by a hash of the request, so
	// that requests alike go to one endpoint) or WeightedRoundRobin (in turn,
	// weighted by the load each endpoint reports). A client without
	// LeastRequest or WeightedRoundRobin (grpc-js by default) falls back to
	// RoundRobin; RingHash has no fallback.
	// +required
	Algorithm Algorithm `json:"algorithm"`

	// ChoiceCount is how many endpoints LeastRequest compares (LeastRequest
	// only; unset: 2).
	// +optional
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=10
	ChoiceCount *int32 `json:"choiceCount,omitempty"`

	// HashHeader is the request header whose value RingHash hashes, so that
	// requests with the same value go to the same endpoint (RingHash only;
	// grpc- headers are reserved). Unset: proxyless gRPC hashes the client's
	// channel, keeping each client on one endpoint; Envoy hashes nothing and
	// picks an endpoint at random.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!self.lowerAscii().startsWith('grpc-')",message="grpc- headers are reserved"
	HashHeader gwv1.HeaderName `json:"hashHeader,omitempty"`
}

// LocalityLabel is a label Nave knows of every endpoint and client: its
// cluster, network, region or zone.
// +kubebuilder:validation:Enum=nave.io/cluster;nave.io/network;topology.kubernetes.io/region;topology.kubernetes.io/zone
type LocalityLabel string

// The locality labels.
const (
	LabelCluster LocalityLabel = "nave.io/cluster"
	LabelNetwork LocalityLabel = "nave.io/network"
	LabelRegion  LocalityLabel = "topology.kubernetes.io/region"
	LabelZone    LocalityLabel = "topology.kubernetes.io/zone"
)

// Locality says how clients prefer endpoints by where they are. At most one
// of off, failoverPriority, failover and distribute is set.
//
// +kubebuilder:validation:XValidation:rule="[has(self.off) && self.off, has(self.failoverPriority), has(self.failover), has(self.distribute)].filter(x, x).size() <= 1",message="set at most one of off, failoverPriority, failover and distribute"
type Locality struct {
	// Off puts every endpoint at one priority, wherever it is.
	// +optional
	Off bool `json:"off,omitempty"`

	// FailoverPriority orders endpoints by how many of these labels, from the
	// first, they share with the client: those that share all come first,
	// then those that share all but the last, and so on. Labels: nave.io/cluster,
	// nave.io/network, topology.kubernetes.io/region,
	// topology.kubernetes.io/zone.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	FailoverPriority []LocalityLabel `json:"failoverPriority,omitempty"`

	// Failover names, per client region, the region its clients fail over to
	// when their own has no healthy endpoint (one entry per from region).
	// +optional
	// +listType=map
	// +listMapKey=from
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	Failover []RegionFailover `json:"failover,omitempty"`

	// Distribute sets, per client locality, the share of its requests each
	// endpoint locality gets (one entry per from locality).
	// +optional
	// +listType=map
	// +listMapKey=from
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	Distribute []Distribution `json:"distribute,omitempty"`
}

// RegionFailover sends the requests of clients in one region, when it has no
// healthy endpoint, to another region.
//
// +kubebuilder:validation:XValidation:rule="self.from != self.to",message="from and to must be different regions"
type RegionFailover struct {
	// From is the clients' region (topology.kubernetes.io/region).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[^/* [:cntrl:]]+$`
	From string `json:"from"`

	// To is the region they fail over to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[^/* [:cntrl:]]+$`
	To string `json:"to"`
}

// Distribution shares the requests of clients in one locality among
// endpoint localities by weight.
type Distribution struct {
	// From is the clients' locality: region, region/zone or
	// region/zone/subzone, where * matches any (us-east1/*).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^([*]|[^/* [:cntrl:]]+)(/([*]|[^/* [:cntrl:]]+)){0,2}$`
	From string `json:"from"`

	// To maps endpoint localities (written like from) to the percentage of
	// the requests each gets; the weights sum to 100.
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=16
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 200 && k.matches('^([*]|[^/* [:cntrl:]]+)(/([*]|[^/* [:cntrl:]]+)){0,2}$'))",message="each locality of to is region, region/zone or region/zone/subzone (each part a name or *, at most 200 characters)"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k] >= 0) && self.map(k, self[k]).sum() == 100",message="the weights of to must be 0 or more and sum to 100"
	To map[string]int32 `json:"to"`
}

// OutlierDetection ejects endpoints that fail, for a while, from the
// endpoints a client picks among. It names at least one detector:
// consecutiveErrors, failurePercentage or successRate.
// Proxyless gRPC clients apply only failurePercentage and successRate (gRFC A50); consecutiveErrors is applied by Envoy only.
//
// +kubebuilder:validation:XValidation:rule="has(self.consecutiveErrors) || has(self.failurePercentage) || has(self.successRate)",message="outlierDetection needs at least one detector: consecutiveErrors, failurePercentage or successRate"
type OutlierDetection struct {
	// Interval is how often endpoints are checked (unset: 10s). At most 24h.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="interval must be at most 24h"
	Interval *gwv1.Duration `json:"interval,omitempty"`

	// BaseEjectionTime is how long an endpoint is first ejected for; each
	// ejection in a row lasts that much longer (unset: 30s). At most 24h.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="baseEjectionTime must be at most 24h"
	BaseEjectionTime *gwv1.Duration `json:"baseEjectionTime,omitempty"`

	// MaxEjectionTime caps how long an endpoint stays ejected (unset: 300s
	// or baseEjectionTime, whichever is longer). At most 24h.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="maxEjectionTime must be at most 24h"
	MaxEjectionTime *gwv1.Duration `json:"maxEjectionTime,omitempty"`

	// MaxEjectionPercent is the most endpoints, in percent, ejected at once
	// (unset: 10; at least 1, as 0 would eject nothing).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxEjectionPercent *int32 `json:"maxEjectionPercent,omitempty"`

	// ConsecutiveErrors ejects an endpoint after this many failed requests
	// in a row. Envoy only: proxyless gRPC clients ignore it.
	// +optional
	// +kubebuilder:validation:Minimum=1
	ConsecutiveErrors *int32 `json:"consecutiveErrors,omitempty"`

	// FailurePercentage ejects an endpoint whose share of failed requests in
	// an interval reaches a threshold.
	// +optional
	FailurePercentage *FailurePercentage `json:"failurePercentage,omitempty"`

	// SuccessRate ejects an endpoint whose success rate in an interval is
	// well below its peers'.
	// +optional
	SuccessRate *SuccessRate `json:"successRate,omitempty"`
}

// FailurePercentage ejects an endpoint whose share of failed requests in an
// interval reaches threshold percent.
type FailurePercentage struct {
	// Threshold is the percentage of failed requests, 0-100, at which an
	// endpoint is ejected.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Threshold int32 `json:"threshold"`

	// MinimumHosts is how many endpoints must have had requestVolume
	// requests in the interval for the detector to run (unset: 5).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinimumHosts *int32 `json:"minimumHosts,omitempty"`

	// RequestVolume is how many requests an endpoint must have had in the
	// interval to be judged (unset: 50).
	// +optional
	// +kubebuilder:validation:Minimum=1
	RequestVolume *int32 `json:"requestVolume,omitempty"`
}

// SuccessRate ejects an endpoint whose success rate is more than
// stdevFactor/1000 standard deviations below the mean of its peers'.
type SuccessRate struct {
	// StdevFactor is the number of standard deviations, in thousandths
	// (1900 is 1.9), below the mean success rate at which an endpoint is
	// ejected (unset: 1900).
	// +optional
	// +kubebuilder:validation:Minimum=1
	StdevFactor *int32 `json:"stdevFactor,omitempty"`

	// MinimumHosts is how many endpoints must have had requestVolume
	// requests in the interval for the detector to run (unset: 5).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MinimumHosts *int32 `json:"minimumHosts,omitempty"`

	// RequestVolume is how many requests an endpoint must have had in the
	// interval to be judged (unset: 100).
	// +optional
	// +kubebuilder:validation:Minimum=1
	RequestVolume *int32 `json:"requestVolume,omitempty"`
}

// RetryCode is a gRPC status a request may be retried on (gRFC A44), as xDS
// names it.
// +kubebuilder:validation:Enum=cancelled;deadline-exceeded;internal;resource-exhausted;unavailable
type RetryCode string

// The retryable gRPC statuses.
const (
	RetryCancelled         RetryCode = "cancelled"
	RetryDeadlineExceeded  RetryCode = "deadline-exceeded"
	RetryInternal          RetryCode = "internal"
	RetryResourceExhausted RetryCode = "resource-exhausted"
	RetryUnavailable       RetryCode = "unavailable"
)

// Retry retries requests that fail with one of the given gRPC statuses.
type Retry struct {
	// Attempts is how many times a failed request is retried after the
	// first try, 1-10.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Attempts int32 `json:"attempts"`

	// Backoff is the base interval between tries; each wait is random, up
	// to a bound that doubles from backoff to at most ten times it (unset:
	// 25ms). At most 24h.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('24h')",message="backoff must be at most 24h"
	Backoff *gwv1.Duration `json:"backoff,omitempty"`

	// Codes are the gRPC statuses retried: cancelled, deadline-exceeded,
	// internal, resource-exhausted, unavailable.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=5
	Codes []RetryCode `json:"codes"`
}
