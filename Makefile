# Nave. `make demo` runs the whole thing on one machine; `make test` runs every test.
SHELL := bash
GO ?= go
PROTOC ?= protoc
BIN := bin

.PHONY: all build test bench fuzz demo generate generate-check lint protoc controller-gen haproxy chromium kube-apiserver coredns cert-manager-crds helm-render servicemonitor-crd grpc-js-xds python3-grpcio kind-up kind-e2e kind-down clean

# The end-to-end tests run real Kubernetes API servers, built once per machine
# from k8s.io/kubernetes (tools/kube-apiserver pins the version) and cached by version.
KUBE_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" || $$2 == "k8s.io/kubernetes" {print $$NF}' tools/kube-apiserver/go.mod | head -1)
NAVE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nave
KUBE_APISERVER := $(NAVE_CACHE)/kube-apiserver-$(KUBE_VERSION)
export NAVE_KUBE_APISERVER := $(KUBE_APISERVER)
# The DNS tests run a real CoreDNS, built the same way from github.com/coredns/coredns
# (tools/coredns pins the version and picks the plugins).
COREDNS_VERSION := $(shell awk '$$1 == "github.com/coredns/coredns" || $$2 == "github.com/coredns/coredns" {print $$NF}' tools/coredns/go.mod | head -1)
COREDNS := $(NAVE_CACHE)/coredns-$(COREDNS_VERSION)
export NAVE_COREDNS := $(COREDNS)
# The manifest test applies cert-manager's real CRDs (deploy/security holds
# Certificates): copied from the cert-manager Go module tools/cert-manager pins.
CERT_MANAGER_VERSION := $(shell awk '$$1 == "github.com/cert-manager/cert-manager" || $$2 == "github.com/cert-manager/cert-manager" {print $$NF}' tools/cert-manager/go.mod | head -1)
CERT_MANAGER_CRDS := $(NAVE_CACHE)/cert-manager-$(CERT_MANAGER_VERSION)
export NAVE_CERT_MANAGER_CRDS := $(CERT_MANAGER_CRDS)
# The chart test renders deploy/helm/nave with Helm's own library (tools/helm pins
# the version) and applies the Prometheus Operator's ServiceMonitor CRD (the
# release tools/prometheus-operator pins) before the chart's ServiceMonitors.
HELM_VERSION := $(shell awk '$$1 == "helm.sh/helm/v3" || $$2 == "helm.sh/helm/v3" {print $$NF}' tools/helm/go.mod | head -1)
HELM_RENDER := $(NAVE_CACHE)/helm-render-$(HELM_VERSION)
export NAVE_HELM_RENDER := $(HELM_RENDER)
PROMETHEUS_OPERATOR_VERSION := $(shell awk '$$1 == "github.com/prometheus-operator/prometheus-operator" || $$2 == "github.com/prometheus-operator/prometheus-operator" {print $$NF}' tools/prometheus-operator/go.mod | head -1)
SERVICEMONITOR_CRD := $(NAVE_CACHE)/prometheus-operator-$(PROMETHEUS_OPERATOR_VERSION)
export NAVE_SERVICEMONITOR_CRD := $(SERVICEMONITOR_CRD)
# The non-Go xDS client test (xds/traffic_nongo_test.go) runs gRPC Node's xDS client, installed with npm
# from tools/grpc-js-xds (its package-lock.json pins @grpc/grpc-js and @grpc/grpc-js-xds), cached by version.
GRPC_JS_XDS_VERSION := $(shell sed -n 's/.*"@grpc\/grpc-js-xds": *"\([^"]*\)".*/\1/p' tools/grpc-js-xds/package.json)-grpc-js-$(shell sed -n 's/.*"@grpc\/grpc-js": *"\([^"]*\)".*/\1/p' tools/grpc-js-xds/package.json)
GRPC_JS_XDS := $(NAVE_CACHE)/grpc-js-xds-$(GRPC_JS_XDS_VERSION)
export NAVE_GRPC_JS_XDS := $(GRPC_JS_XDS)
# `make generate` writes kubetraffic/v1alpha1's deepcopy code and the TrafficPolicy CRD with
# controller-gen, built the same way from sigs.k8s.io/controller-tools (tools/controller-gen pins it).
CONTROLLER_TOOLS_VERSION := $(shell awk '$$1 == "sigs.k8s.io/controller-tools" {print $$2} $$2 == "sigs.k8s.io/controller-tools" {print $$3}' tools/controller-gen/go.mod | head -1)
CONTROLLER_GEN := $(NAVE_CACHE)/controller-gen-$(CONTROLLER_TOOLS_VERSION)

all: build

# grpcnotrace: as deploy/Dockerfile builds (grpc's request tracing, unused, kept a third of each binary).
build:
	$(GO) build -tags grpcnotrace -o $(BIN)/ ./cmd/...

## test: everything CI runs: generated code current, vet, gofmt, and every test with -race. client-go's cache
## mutation detector is on: a cached object written to (the spoke's caches share label maps) panics the process.
test: generate-check lint kube-apiserver coredns haproxy chromium cert-manager-crds helm-render servicemonitor-crd grpc-js-xds python3-grpcio
	NAVE_E2E_REQUIRE=1 KUBE_CACHE_MUTATION_DETECTOR=true $(GO) test -race -count=1 -timeout 30m ./...

## bench: benchmarks print numbers; nothing is asserted. The scale benchmark drives a real hub
## with simulated spokes and ADS clients (small by default; SCALE=large for the target scale).
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...
	$(GO) run ./bench -scale $(or $(SCALE),small) -out bench-results.json

## fuzz: every fuzz target (func FuzzXxx in the module's tests), one after another, for FUZZTIME each
## (default 10m). A failure stops here; Go prints the failing input's path under the package's testdata/fuzz.
## New inputs are minimized for at most 10s: slow targets (manifests) would otherwise spend their time minimizing.
FUZZTIME ?= 10m
fuzz:
	@set -e; for file in $$(grep -l '^func Fuzz' $$($(GO) list -f '{{range .TestGoFiles}}{{$$.Dir}}/{{.}} {{end}}{{range .XTestGoFiles}}{{$$.Dir}}/{{.}} {{end}}' ./...)); do \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "== $$name ($$(dirname $$file))"; \
			$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=10s $$(dirname $$file); \
		done; \
	done

## demo: a hub, three clusters' spokes, real gRPC backends and an xDS client; watch it fail over.
demo: build
	$(BIN)/nave demo

## generate: regenerate the federation protobuf code, the MCS CRDs in deploy/crds, the Gateway API
## CRDs in deploy/crds/gateway-api (committed; the CRDs copied from the modules go.mod names), and with controller-gen
## kubetraffic/v1alpha1's deepcopy code and its CRD, deploy/crds/trafficpolicies.yaml (no leading ---, like the others).
generate: protoc controller-gen
	$(PROTOC) --plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--go_out=paths=source_relative:. --go-grpc_out=paths=source_relative:. \
		federation/v1/federation.proto
	$(GO) run ./internal/mcscrds deploy/crds
	$(GO) run ./internal/gatewaycrds deploy/crds/gateway-api
	$(CONTROLLER_GEN) object paths=./kubetraffic/v1alpha1
	$(CONTROLLER_GEN) crd paths=./kubetraffic/v1alpha1 output:crd:stdout > deploy/crds/trafficpolicies.yaml.tmp && \
		sed -i '1{/^---$$/d}' deploy/crds/trafficpolicies.yaml.tmp && mv deploy/crds/trafficpolicies.yaml.tmp deploy/crds/trafficpolicies.yaml

## generate-check: fail when the committed generated code is not what `make generate` produces.
generate-check: generate
	@git diff --exit-code -- federation/v1 kubetraffic/v1alpha1 deploy/crds || { echo "generated code is stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- federation/v1 kubetraffic/v1alpha1 deploy/crds)" || { git status --short -- federation/v1 kubetraffic/v1alpha1 deploy/crds; echo "generated files are not committed: run 'make generate' and commit"; exit 1; }

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet ./...

## protoc: install protoc from Debian's packages when it is missing (a fresh machine).
protoc:
	@command -v $(PROTOC) >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler; }

## controller-gen: build the controller-gen `make generate` runs (about a minute, once per machine and version).
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	@mkdir -p $(dir $@)
	cd tools/controller-gen && $(GO) build -trimpath -o $@.tmp sigs.k8s.io/controller-tools/cmd/controller-gen && mv $@.tmp $@

## haproxy: install HAProxy from Debian's packages when it is missing: the multi-network test's
## east-west gateway (there is no Envoy binary to be had here).
haproxy:
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy; }

## chromium: install Chromium from Debian's packages when it is missing: the dashboard test (e2e/ui_test.go)
## drives it headless.
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

## kube-apiserver: build the real API server the e2e tests run (about 9 minutes, once per machine and version).
kube-apiserver: $(KUBE_APISERVER)
$(KUBE_APISERVER):
	@mkdir -p $(dir $@)
	cd tools/kube-apiserver && $(GO) build -trimpath -o $@.tmp . && mv $@.tmp $@

## coredns: build the real CoreDNS the DNS tests run (about 4 minutes, once per machine and version).
coredns: $(COREDNS)
$(COREDNS):
	@mkdir -p $(dir $@)
	cd tools/coredns && $(GO) build -trimpath -o $@.tmp . && mv $@.tmp $@

## cert-manager-crds: copy cert-manager's CRDs out of its Go module (once per machine and version).
cert-manager-crds: $(CERT_MANAGER_CRDS)
$(CERT_MANAGER_CRDS):
	@mkdir -p $@.tmp
	dir=$$(cd tools/cert-manager && $(GO) mod download -json github.com/cert-manager/cert-manager@$(CERT_MANAGER_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p') && \
		cp "$$dir"/deploy/crds/cert-manager.io_*.yaml $@.tmp/ && chmod u+w $@.tmp/* && mv $@.tmp $@

## helm-render: build the chart test's renderer, `helm template` from Helm's own library (about 2 minutes,
## once per machine and version).
helm-render: $(HELM_RENDER)
$(HELM_RENDER):
	@mkdir -p $(dir $@)
	cd tools/helm && $(GO) build -trimpath -o $@.tmp . && mv $@.tmp $@

## servicemonitor-crd: copy the Prometheus Operator's ServiceMonitor CRD out of its Go module (once per machine and version).
servicemonitor-crd: $(SERVICEMONITOR_CRD)
$(SERVICEMONITOR_CRD):
	@mkdir -p $@.tmp
	dir=$$(cd tools/prometheus-operator && $(GO) mod download -json github.com/prometheus-operator/prometheus-operator@$(PROMETHEUS_OPERATOR_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p') && \
		cp "$$dir"/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml $@.tmp/ && chmod u+w $@.tmp/* && mv $@.tmp $@

## grpc-js-xds: install gRPC Node's xDS client with the machine's npm, exactly as tools/grpc-js-xds/package-lock.json
## pins it (a few seconds, once per machine and version); xds/traffic_nongo_test.go runs tools/grpc-js-xds/client.js with it.
grpc-js-xds: $(GRPC_JS_XDS)
$(GRPC_JS_XDS):
	@rm -rf $@.tmp && mkdir -p $@.tmp
	cp tools/grpc-js-xds/package.json tools/grpc-js-xds/package-lock.json $@.tmp/ && \
		(cd $@.tmp && npm ci --ignore-scripts --no-audit --no-fund) && rm -rf $@ && mv $@.tmp $@

## python3-grpcio: install Debian's gRPC Python (its C-core has xDS) when it is missing: the C-core client
## (tools/grpc-js-xds/ccore_client.py) of xds/traffic_nongo_test.go.
python3-grpcio:
	@/usr/bin/python3 -c 'import grpc' 2>/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-grpcio; }

## kind-up, kind-e2e, kind-down: three kind clusters with the hub and spokes deployed, and the e2e suite
## run against them (needs Docker, kind and kubectl; see deploy/README.md).
kind-up:
	deploy/kind/kind.sh up
kind-e2e:
	deploy/kind/kind.sh e2e
kind-down:
	deploy/kind/kind.sh down

clean:
	rm -rf $(BIN)
