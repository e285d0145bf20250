{{/*
Labels of every object: deploy/'s three (name, component, part-of) and Helm's.
Call with (dict "ctx" $ "name" "nave-hub" "component" "hub").
*/}}
{{- define "nave.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: nave
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of a pod template: exactly deploy/'s, so that a chart upgrade alone rolls no pod.
*/}}
{{- define "nave.podLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: nave
{{- end }}

{{/* The Nave image. */}}
{{- define "nave.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* imagePullSecrets of a pod spec; empty when there are none. */}}
{{- define "nave.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
- name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The pod and container securityContext of every Nave container: Pod Security "restricted". */}}
{{- define "nave.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* A preferred anti-affinity over nodes and a zone spread, for the pods named .name. */}}
{{- define "nave.spread" -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/name: {{ .name }}
topologySpreadConstraints:
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      app.kubernetes.io/name: {{ .name }}
  {{- if .podTemplateHash }}
  matchLabelKeys: [pod-template-hash]
  {{- end }}
{{- end }}

{{/* Whether hub replicas gossip and share an etcd: "true" or "". */}}
{{- define "nave.hubReplicated" -}}
{{- if ne .Values.etcd.mode "embedded" }}true{{ end }}
{{- end }}

{{/* The hub's federation address for this cluster's spokes. */}}
{{- define "nave.hubAddr" -}}
{{- if .Values.cluster.hubAddr }}{{ .Values.cluster.hubAddr }}
{{- else if .Values.hub.enabled }}nave-hub.{{ .Release.Namespace }}.svc:15010
{{- else }}{{ required "cluster.hubAddr is required without hub.enabled: the hub's federation address (host:port)" .Values.cluster.hubAddr }}
{{- end }}
{{- end }}

{{/* The hub's xDS address for this cluster's node agents. */}}
{{- define "nave.hubXDSAddr" -}}
{{- if .Values.cluster.hubXDSAddr }}{{ .Values.cluster.hubXDSAddr }}
{{- else if .Values.hub.enabled }}nave-hub.{{ .Release.Namespace }}.svc:15011
{{- else }}{{ required "cluster.hubXDSAddr is required without hub.enabled: the hub's xDS address (host:port)" .Values.cluster.hubXDSAddr }}
{{- end }}
{{- end }}

{{/* The bundled etcd's member DNS name, for (dict "ctx" $ "i" N). */}}
{{- define "nave.etcdMember" -}}
nave-etcd-{{ .i }}.nave-etcd.{{ .ctx.Release.Namespace }}.svc.{{ .ctx.Values.clusterDomain }}
{{- end }}

{{/* The hub's --etcd-endpoints: the bundled members or the external endpoints. */}}
{{- define "nave.etcdEndpoints" -}}
{{- if eq .Values.etcd.mode "bundled" -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.etcd.bundled.replicas) -}}
{{- $urls = append $urls (printf "http://%s:2379" (include "nave.etcdMember" (dict "ctx" $ "i" $i))) -}}
{{- end -}}
{{ join "," $urls }}
{{- else -}}
{{ required "etcd.external.endpoints is required with etcd.mode external" (join "," .Values.etcd.external.endpoints) }}
{{- end -}}
{{- end }}

{{/* Checks of values that would render a hub that refuses to start. */}}
{{- define "nave.validate" -}}
{{- if not (has .Values.etcd.mode (list "bundled" "external" "embedded")) }}
{{- fail (printf "etcd.mode must be bundled, external or embedded, not %q" .Values.etcd.mode) }}
{{- end }}
{{- if and .Values.hub.enabled (eq .Values.etcd.mode "embedded") (ne (int .Values.hub.replicas) 1) }}
{{- fail "etcd.mode embedded runs one hub replica: set hub.replicas to 1, or use etcd.mode bundled or external" }}
{{- end }}
{{- if and .Values.hub.tls.xds.policy.configMapName (not .Values.hub.tls.xds.clientAuth) }}
{{- fail "hub.tls.xds.policy needs hub.tls.xds.clientAuth: the policy is about client identities" }}
{{- end }}
{{- if and .Values.hub.tls.xds.clientAuth (not .Values.hub.tls.xds.secretName) }}
{{- fail "hub.tls.xds.clientAuth needs hub.tls.xds.secretName: client certificates travel over TLS" }}
{{- end }}
{{- $fed := .Values.hub.tls.federation }}
{{- if and $fed.clientAuth (not (or $fed.secretName $fed.perReplica)) }}
{{- fail "hub.tls.federation.clientAuth needs hub.tls.federation.secretName or perReplica: client certificates travel over TLS" }}
{{- end }}
{{- if and $fed.clientAuth (include "nave.hubReplicated" .) (not .Values.hub.peerToken.secretName) (not $fed.perReplica) }}
{{- fail "hub.tls.federation.clientAuth without hub.peerToken needs perReplica: replicas then know each other by their own certificates" }}
{{- end }}
{{- if and .Values.spoke.tls.clientCert (not .Values.spoke.tls.secretName) }}
{{- fail "spoke.tls.clientCert needs spoke.tls.secretName" }}
{{- end }}
{{- if and .Values.node.tls.clientCert (not .Values.node.tls.secretName) }}
{{- fail "node.tls.clientCert needs node.tls.secretName" }}
{{- end }}
{{- end }}
