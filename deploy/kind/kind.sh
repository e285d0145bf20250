#!/usr/bin/env bash
# kind.sh: a three-cluster Nave lab on kind (Kubernetes in Docker).
#
#   deploy/kind/kind.sh up     create nave-east, nave-north, nave-west; build and load the
#                              image (and Envoy's); deploy etcd and the hub's three replicas
#                              (east), and in every cluster a spoke, an east-west gateway
#                              (real Envoy run by `nave gateway`) and an exported echo service
#   deploy/kind/kind.sh e2e    run the TestKube and TestKindEastWest end-to-end tests against
#                              the lab (extra arguments go to `go test`, e.g. -v)
#   deploy/kind/kind.sh down   delete the three clusters and everything under deploy/kind/.kube
#
# Needs kind, kubectl and a running Docker engine (and Go for e2e). `up` is idempotent:
# run it again after a code change and it rebuilds, reloads and rolls out what changed.
#
# Wiring: the hub's replicas and their etcd (deploy/hub/etcd.yaml) run in nave-east; the
# replicas find each other through the headless Service nave-hub-peers and serve behind
# the NodePort Service hub-nodeport.yaml (31010 federation, 31011 xDS, 31012 admin),
# which reaches any of them. east.yaml publishes those ports on
# 127.0.0.1 of this machine (for the tests and navectl). The east spoke dials the hub's
# ClusterIP Service; the north and west spokes dial the nave-east control-plane
# container's address on the docker network "kind", port 31010.
#
# Networks: pods of two kind clusters cannot reach each other, so each cluster is a
# network of its own (net-east, ...), entered through its east-west gateway: Envoy
# (deploy/gateway) behind a Service whose external IP is the cluster's node address on
# the docker network "kind" (kind has no load balancer), announced by the spoke.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
deploy=$root/deploy
state=$here/.kube # kubeconfigs and tokens; gitignored

clusters=(east north west)
ns=nave-system
# The image the manifests name; `up` replaces it with the freshly built one.
manifest_image=ghcr.io/navemesh/nave:latest
hub_cluster=east
hub_federation_nodeport=31010
# Host ports of east.yaml's extraPortMappings.
host_federation=127.0.0.1:31010
host_xds=127.0.0.1:31011
host_admin=127.0.0.1:31012
rollout_timeout=${NAVE_KIND_TIMEOUT:-5m}
# Envoy's image for the east-west gateways (the one deploy/gateway/eastwest.yaml names).
envoy_image=$(awk '/image: envoyproxy\/envoy:/ {print $2; exit}' "$deploy/gateway/eastwest.yaml")
hub_xds_nodeport=31011

die() {
	echo "kind.sh: $*" >&2
	exit 1
}
log() { echo "==> $*" >&2; }

need() {
	local tool
	for tool in "$@"; do
		command -v "$tool" >/dev/null 2>&1 || die "'$tool' is required but is not on PATH (see deploy/README.md)"
	done
}

need_docker_engine() {
	docker info >/dev/null 2>&1 || die "no Docker engine answers 'docker info': kind needs a running Docker engine"
}

kind_name() { echo "nave-$1"; }
kubeconfig() { echo "$state/$1.yaml"; }
kc() {
	local cluster=$1
	shift
	kubectl --kubeconfig "$(kubeconfig "$cluster")" "$@"
}

# render prints a manifest with the image replaced by the one just built, and fails if
# the manifest does not name the expected image (a silent mismatch would deploy the
# wrong image).
render() {
	local file=$1
	grep -q "image: $manifest_image\$" "$file" || die "$file does not use image $manifest_image"
	sed "s|image: $manifest_image\$|image: $image|" "$file"
}

# apply_reports_changed applies stdin to a cluster; it fails the script if kubectl
# fails, and returns 0 only if an existing object changed (kubectl prints "created",
# "configured" or "unchanged" per object). Pods read their settings at start, so a
# changed ConfigMap or Secret means a restart; a created one is read by the pods
# that follow it.
apply_reports_changed() {
	local cluster=$1 out
	out=$(kc "$cluster" apply -f -) || die "kubectl apply failed in cluster $(kind_name "$cluster")"
	echo "$out" >&2
	grep -Eq ' configured$' <<<"$out"
}

cluster_exists() {
	local existing
	existing=$(kind get clusters 2>/dev/null) || die "'kind get clusters' failed"
	grep -qx "$(kind_name "$1")" <<<"$existing"
}

create_clusters() {
	local c args
	for c in "${clusters[@]}"; do
		if cluster_exists "$c"; then
			log "cluster $(kind_name "$c") exists"
			kind get kubeconfig --name "$(kind_name "$c")" >"$(kubeconfig "$c")"
			continue
		fi
		log "creating cluster $(kind_name "$c")"
		args=(--name "$(kind_name "$c")" --config "$here/$c.yaml" --kubeconfig "$(kubeconfig "$c")" --wait 3m)
		if [[ -n ${KIND_NODE_IMAGE:-} ]]; then
			args+=(--image "$KIND_NODE_IMAGE")
		fi
		rm -f "$(kubeconfig "$c")"
		kind create cluster "${args[@]}"
	done
	chmod 600 "$state"/*.yaml
}

# build_image builds nave:dev and tags it by content (nave:dev-<id>), so that applying
# the manifests rolls the pods exactly when the image changed.
build_image() {
	log "building nave:dev"
	(cd "$root" && docker build -f deploy/Dockerfile -t nave:dev .)
	local id
	id=$(docker image inspect -f '{{.Id}}' nave:dev)
	id=${id#sha256:}
	image=nave:dev-${id:0:12}
	docker tag nave:dev "$image"
}

load_image() {
	local c img archive platform
	[[ -n $envoy_image ]] || die "no envoyproxy/envoy image in $deploy/gateway/eastwest.yaml"
	docker image inspect "$envoy_image" >/dev/null 2>&1 || docker pull "$envoy_image"
	for img in "$image" "$envoy_image"; do
		for c in "${clusters[@]}"; do
			log "loading $img into $(kind_name "$c")"
			if kind load docker-image "$img" --name "$(kind_name "$c")"; then
				continue
			fi
			# Docker's containerd image store can save content the node's ctr cannot import
			# (kubernetes-sigs/kind#3795); a single-platform archive always imports.
			log "kind load docker-image failed: retrying with a single-platform image archive"
			platform=$(docker version -f '{{.Server.Os}}/{{.Server.Arch}}')
			archive="$state/image.tar"
			docker image save --platform "$platform" -o "$archive" "$img"
			kind load image-archive "$archive" --name "$(kind_name "$c")"
			rm -f "$archive"
		done
	done
}

# ensure_tokens makes one random token per cluster and the hub replicas' peer token,
# once; later runs reuse them.
ensure_tokens() {
	local c f
	mkdir -p "$state/tokens"
	chmod 700 "$state/tokens"
	for f in "${clusters[@]}" peer; do
		f=$state/tokens/$f
		if [[ ! -s $f ]]; then
			(umask 077 && od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$f")
		fi
	done
	# The hub refuses a peer token that is also a cluster's token.
	for c in "${clusters[@]}"; do
		if cmp -s "$state/tokens/$c" "$state/tokens/peer"; then
			die "the peer token equals the token of cluster $c: delete $state/tokens/peer and run again"
		fi
	done
	(
		umask 077
		for c in "${clusters[@]}"; do
			printf '%s: %s\n' "$c" "$(cat "$state/tokens/$c")"
		done >"$state/tokens/hub-tokens.yaml"
	)
}

install_base() {
	local c=$1
	log "$c: MCS CRDs, CoreDNS's RBAC for ServiceImports, and the namespace"
	kc "$c" apply -f "$deploy/crds/"
	kc "$c" wait --for=condition=Established --timeout=60s crd/serviceexports.multicluster.x-k8s.io crd/serviceimports.multicluster.x-k8s.io
	kc "$c" apply -f "$deploy/coredns/rbac.yaml"
	kc "$c" apply -f "$deploy/base/namespace.yaml"
}

# deploy_etcd runs the hub replicas' shared etcd (three members) and waits until it is
# rolled out: the hub needs it to admit spokes.
deploy_etcd() {
	local c=$hub_cluster
	log "$c: etcd"
	kc "$c" apply -f "$deploy/hub/etcd.yaml"
	kc "$c" -n "$ns" rollout status statefulset/nave-etcd --timeout="$rollout_timeout"
}

# replace_single_replica_hub deletes (orphaning its pods) a hub StatefulSet from before hub
# replicas: it claimed a volume per pod for the embedded etcd, and volumeClaimTemplates
# cannot be changed in place. The StatefulSet applied next adopts the pods and rolls them.
# Returns 0 if it deleted one.
replace_single_replica_hub() {
	local c=$hub_cluster claims
	claims=$(kc "$c" -n "$ns" get statefulset nave-hub --ignore-not-found \
		-o jsonpath='{.spec.volumeClaimTemplates[*].metadata.name}')
	if [[ -n $claims ]]; then
		log "$c: replacing the single-replica hub StatefulSet (embedded etcd) with the replicated one"
		kc "$c" -n "$ns" delete statefulset nave-hub --cascade=orphan
		return 0
	fi
	return 1
}

deploy_hub() {
	local c=$hub_cluster restart=false manifest old_hub_claims=false
	log "$c: hub"
	manifest=$(kc "$c" -n "$ns" create secret generic nave-hub-tokens \
		--from-file=tokens.yaml="$state/tokens/hub-tokens.yaml" --dry-run=client -o yaml)
	if apply_reports_changed "$c" <<<"$manifest"; then
		restart=true
	fi
	manifest=$(kc "$c" -n "$ns" create secret generic nave-hub-peer-token \
		--from-file=token="$state/tokens/peer" --dry-run=client -o yaml)
	if apply_reports_changed "$c" <<<"$manifest"; then
		restart=true
	fi
	deploy_etcd
	if replace_single_replica_hub; then
		old_hub_claims=true
	fi
	render "$deploy/hub/hub.yaml" | kc "$c" apply -f -
	kc "$c" apply -f "$here/hub-nodeport.yaml"
	# The hub reads its tokens at start.
	if $restart; then
		kc "$c" -n "$ns" rollout restart statefulset/nave-hub
	fi
	kc "$c" -n "$ns" rollout status statefulset/nave-hub --timeout="$rollout_timeout"
	# The embedded etcd's volumes are unused now (their pods are gone after the rollout).
	if $old_hub_claims; then
		kc "$c" -n "$ns" delete pvc -l app.kubernetes.io/name=nave-hub --ignore-not-found
	fi
}

# node_ip prints a cluster's control-plane node address on the docker network "kind".
node_ip() {
	local ip
	ip=$(docker inspect -f '{{with index .NetworkSettings.Networks "kind"}}{{.IPAddress}}{{end}}' \
		"$(kind_name "$1")-control-plane")
	[[ -n $ip ]] || die "no address of $(kind_name "$1")-control-plane on the docker network \"kind\""
	echo "$ip"
}

# hub_port_for prints where a cluster's pods reach one of the hub's ports: the nave-hub
# Service in the hub's cluster, the hub's NodePort on its node elsewhere.
hub_port_for() {
	local c=$1 port=$2 nodeport=$3
	if [[ $c == "$hub_cluster" ]]; then
		echo "nave-hub.$ns.svc.cluster.local:$port"
		return
	fi
	echo "$(node_ip "$hub_cluster"):$nodeport"
}

hub_addr_for() { hub_port_for "$1" 15010 "$hub_federation_nodeport"; }

# hub_xds_addr_for is where a cluster's gateways reach the hub's xDS port.
hub_xds_addr_for() { hub_port_for "$1" 15011 "$hub_xds_nodeport"; }

# deploy_gateway runs the cluster's east-west gateway: Envoy under `nave gateway`, its
# Service labelled with the cluster's network and given the node's address as external IP
# (kind has no load balancer), which the spoke announces to the hub.
deploy_gateway() {
	local c=$1 manifest
	log "$c: east-west gateway (network net-$c)"
	manifest=$(kc "$c" -n "$ns" create configmap nave-eastwest-gateway --from-literal=network="net-$c" \
		--from-literal=cluster-id="$c" --from-literal=hub-xds-addr="$(hub_xds_addr_for "$c")" --dry-run=client -o yaml)
	if apply_reports_changed "$c" <<<"$manifest"; then
		kc "$c" -n "$ns" rollout restart deployment/nave-eastwest-gateway 2>/dev/null || true
	fi
	render "$deploy/gateway/eastwest.yaml" | sed "s|REPLACE_NETWORK|net-$c|" | kc "$c" apply -f -
	kc "$c" -n "$ns" patch service nave-eastwest-gateway --type merge \
		-p "{\"spec\":{\"externalIPs\":[\"$(node_ip "$c")\"]}}"
}

# deploy_echo runs the east-west scenario's echo service, exported from the cluster.
deploy_echo() {
	local c=$1
	log "$c: echo service (default/echo)"
	render "$here/eastwest/echo.yaml" | sed "s|REPLACE_CLUSTER|$c|" | kc "$c" apply -f -
}

deploy_spoke() {
	local c=$1 restart=false hub_addr manifest
	log "$c: spoke"
	kc "$c" apply -f "$deploy/spoke/rbac.yaml" -f "$deploy/node/rbac.yaml"
	hub_addr=$(hub_addr_for "$c")
	manifest=$(kc "$c" -n "$ns" create configmap nave-spoke --from-literal=cluster-id="$c" \
		--from-literal=hub-addr="$hub_addr" --from-literal=hub-xds-addr="$(hub_xds_addr_for "$c")" \
		--from-literal=network="net-$c" --dry-run=client -o yaml)
	if apply_reports_changed "$c" <<<"$manifest"; then
		restart=true
	fi
	manifest=$(kc "$c" -n "$ns" create secret generic nave-spoke-token \
		--from-file=token="$state/tokens/$c" --dry-run=client -o yaml)
	if apply_reports_changed "$c" <<<"$manifest"; then
		restart=true
	fi
	render "$deploy/spoke/deployment.yaml" | kc "$c" apply -f -
	# A lab made before the candidates' Deployment ran the spoke as a DaemonSet.
	kc "$c" -n "$ns" delete daemonset nave-spoke --ignore-not-found
	render "$deploy/node/daemonset.yaml" | kc "$c" apply -f -
	kc "$c" apply -f "$deploy/node/service.yaml"
	# Settings reach the spoke and the node agents through their environment and the token file, read at start.
	if $restart; then
		kc "$c" -n "$ns" rollout restart deployment/nave-spoke
		kc "$c" -n "$ns" rollout restart daemonset/nave-node
	fi
}

up() {
	need kind kubectl docker
	need_docker_engine
	mkdir -p "$state"
	chmod 700 "$state"
	create_clusters
	build_image
	load_image
	ensure_tokens
	local c
	for c in "${clusters[@]}"; do
		install_base "$c"
	done
	deploy_hub
	for c in "${clusters[@]}"; do
		deploy_spoke "$c"
	done
	for c in "${clusters[@]}"; do
		deploy_gateway "$c"
		deploy_echo "$c"
	done
	for c in "${clusters[@]}"; do
		kc "$c" -n "$ns" rollout status deployment/nave-spoke --timeout="$rollout_timeout"
		kc "$c" -n "$ns" rollout status daemonset/nave-node --timeout="$rollout_timeout"
		kc "$c" -n "$ns" rollout status deployment/nave-eastwest-gateway --timeout="$rollout_timeout"
		kc "$c" -n default rollout status deployment/echo --timeout="$rollout_timeout"
	done
	log "up: hub admin http://$host_admin (navectl --hub http://$host_admin clusters), xDS $host_xds"
	log "kubeconfigs: $state/<cluster>.yaml (clusters: ${clusters[*]})"
}

e2e() {
	need go
	local c kubeconfigs=()
	for c in "${clusters[@]}"; do
		[[ -s $(kubeconfig "$c") ]] || die "no kubeconfig $(kubeconfig "$c"): run '$0 up' first"
		kubeconfigs+=("$c=$(kubeconfig "$c")")
	done
	NAVE_E2E_KUBECONFIGS=$(
		IFS=,
		echo "${kubeconfigs[*]}"
	)
	export NAVE_E2E_KUBECONFIGS
	export NAVE_E2E_HUB_ADMIN=http://$host_admin
	export NAVE_E2E_HUB_XDS=$host_xds
	export NAVE_E2E_HUB_FEDERATION=$host_federation
	cd "$root"
	go test -race -count=1 -run 'TestKube|TestKindEastWest' "$@" ./e2e/
}

down() {
	need kind
	local c
	for c in "${clusters[@]}"; do
		log "deleting cluster $(kind_name "$c")"
		kind delete cluster --name "$(kind_name "$c")"
	done
	rm -rf "$state"
}

main() {
	local cmd=${1:-}
	if [[ $# -gt 0 ]]; then
		shift
	fi
	case $cmd in
	up) up ;;
	e2e) e2e "$@" ;;
	down) down ;;
	*)
		echo "usage: $0 up|e2e|down" >&2
		exit 2
		;;
	esac
}

main "$@"
