{{/* Chart name, truncated to a DNS label. */}}
{{- define "railguard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name; the release name alone when it already contains the chart name. */}}
{{- define "railguard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Common labels; call with (dict "root" $ "component" "webhook"). */}}
{{- define "railguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "railguard.selectorLabels" . }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "railguard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "railguard.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Name of a component's objects: (dict "root" $ "component" "webhook"). */}}
{{- define "railguard.componentName" -}}
{{- printf "%s-%s" (include "railguard.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Image reference: (dict "root" $ "image" .Values.webhook.image). */}}
{{- define "railguard.image" -}}
{{- $tag := default .root.Chart.AppVersion (default .root.Values.image.tag .image.tag) -}}
{{- $repo := .image.repository -}}
{{- if and .root.Values.image.registry (not (contains "/" $repo)) -}}
{{- $repo = printf "%s/%s" .root.Values.image.registry $repo -}}
{{- end -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* PodDisruptionBudget API: policy/v1 where served (1.21+), policy/v1beta1 before. The
     version counts too: `helm template` and `helm lint` without --api-versions list group
     versions only (no kinds), and would otherwise render v1beta1 for any cluster. */}}
{{- define "railguard.pdbApiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget") (ge (include "railguard.kubeMinor" . | int) 21) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{/* CronJob API: batch/v1 where it serves CronJob (1.21+), batch/v1beta1 before (the
     version counts too, as for the PodDisruptionBudget). */}}
{{- define "railguard.cronJobApiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "batch/v1/CronJob") (ge (include "railguard.kubeMinor" . | int) 21) -}}
batch/v1
{{- else -}}
batch/v1beta1
{{- end -}}
{{- end -}}

{{/* kube-scheduler's image tag: scheduler.image.tag, else the upstream release of the
     cluster's version without a distribution's suffix: v1.30.4-eks-a737599,
     v1.31.1-gke.1146000 and v1.30.4+k3s1 run registry.k8s.io/kube-scheduler:v1.30.4, v1.31.1,
     v1.30.4; no registry has the raw strings. */}}
{{- define "railguard.schedulerImageTag" -}}
{{- if .Values.scheduler.image.tag -}}
{{- .Values.scheduler.image.tag -}}
{{- else -}}
{{- $release := index (splitList "+" .Capabilities.KubeVersion.Version) 0 -}}
{{- printf "v%s" (trimPrefix "v" (index (splitList "-" $release) 0)) -}}
{{- end -}}
{{- end -}}

{{/* The node guard's matchConditions (admissionregistration.k8s.io/v1, GA in 1.30): the
     API server calls the guard only for a Node write that changes one of railguard's
     protected outputs (webhook/src/node_guard/decision.rs PROTECTED: four labels, the
     certificate annotation, two conditions by status, reason and message), so every other
     Node write (cordon, taints, a kubelet registering or reporting) never waits on
     railguard and keeps working while it is down. A CREATE (oldObject null) is sent when it
     carries any of them. Over-matching only costs a call; the guard decides. */}}
{{- define "railguard.nodeGuardMatchExpression" -}}
{{- $terms := list -}}
{{- range $field := list (dict "path" "labels" "keys" (list "railguard.io/fabric" "railguard.io/profile" "railguard.io/signature" "railguard.io/simulated")) (dict "path" "annotations" "keys" (list "railguard.io/certificate")) -}}
{{- range $key := $field.keys -}}
{{- $new := printf "(has(object.metadata.%s) && '%s' in object.metadata.%s)" $field.path $key $field.path -}}
{{- $old := printf "(oldObject != null && has(oldObject.metadata.%s) && '%s' in oldObject.metadata.%s)" $field.path $key $field.path -}}
{{- $terms = append $terms (printf "%s != %s || (%s && object.metadata.%s['%s'] != oldObject.metadata.%s['%s'])" $new $old $new $field.path $key $field.path $key) -}}
{{- end -}}
{{- end -}}
{{- range $type := list "RailguardFabricReady" "RailguardFleetOutlier" -}}
{{- $entries := printf ".status.conditions.filter(c, c.type == '%s').map(c, c.status + '/' + (has(c.reason) ? 'r:' + c.reason : '-') + '/' + (has(c.message) ? 'm:' + c.message : '-'))" $type -}}
{{- $new := "(has(object.status) && has(object.status.conditions))" -}}
{{- $old := "(oldObject != null && has(oldObject.status) && has(oldObject.status.conditions))" -}}
{{- $terms = append $terms (printf "%s != %s || (%s && object%s != oldObject%s)" $new $old $new $entries $entries) -}}
{{- end -}}
{{- join " || " $terms -}}
{{- end -}}

{{/* Non-empty when the cluster serves webhook matchConditions (1.30+). */}}
{{- define "railguard.serverHasMatchConditions" -}}
{{- if ge (include "railguard.kubeMinor" . | int) 30 -}}
true
{{- end -}}
{{- end -}}

{{/* kube-scheduler's minor version as an int ("20+" on some distributions is 20). */}}
{{- define "railguard.kubeMinor" -}}
{{- trimSuffix "+" .Capabilities.KubeVersion.Minor | int -}}
{{- end -}}

{{/* Non-empty when the extender should report unresolvable nodes in FailedNodes too:
     asked for, or auto on a cluster whose kube-scheduler predates FailedAndUnresolvableNodes
     (1.21). */}}
{{- define "railguard.reportUnresolvableAsFailed" -}}
{{- $v := toString .Values.extender.reportUnresolvableAsFailed -}}
{{- if or (eq $v "true") (and (eq $v "auto") (lt (include "railguard.kubeMinor" . | int) 21)) -}}
true
{{- end -}}
{{- end -}}

{{/* KubeSchedulerConfiguration API version for the cluster's kube-scheduler. */}}
{{- define "railguard.schedulerConfigApiVersion" -}}
{{- if .Values.scheduler.configApiVersion -}}
{{- .Values.scheduler.configApiVersion -}}
{{- else -}}
{{- $minor := include "railguard.kubeMinor" . | int -}}
{{- if ge $minor 25 -}}
kubescheduler.config.k8s.io/v1
{{- else if ge $minor 23 -}}
kubescheduler.config.k8s.io/v1beta3
{{- else if ge $minor 22 -}}
kubescheduler.config.k8s.io/v1beta2
{{- else -}}
kubescheduler.config.k8s.io/v1beta1
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Where the extender runs: "sidecar" (a container of the secondary scheduler's pods,
reached on localhost) or "deployment" (its own Deployment behind a Service). */}}
{{- define "railguard.extenderPlacement" -}}
{{- $p := .Values.extender.placement | default "auto" -}}
{{- if eq $p "auto" -}}
{{- if eq .Values.scheduler.mode "secondary" -}}sidecar{{- else -}}deployment{{- end -}}
{{- else if and (eq $p "sidecar") (ne .Values.scheduler.mode "secondary") -}}
{{- fail "extender.placement=sidecar needs scheduler.mode=secondary" -}}
{{- else -}}
{{- $p -}}
{{- end -}}
{{- end -}}

{{/* The extender container, for its Deployment or as the scheduler's sidecar. */}}
{{- define "railguard.extenderContainer" -}}
{{- $sidecar := eq (include "railguard.extenderPlacement" .) "sidecar" -}}
- name: extender
  image: {{ include "railguard.image" (dict "root" . "image" .Values.extender.image) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    {{- if $sidecar }}
    # Only the scheduler in the same pod calls it.
    - --listen=127.0.0.1:{{ int .Values.extender.port }}
    {{- else }}
    - --listen=0.0.0.0:{{ int .Values.extender.port }}
    {{- end }}
    - --metrics-listen=0.0.0.0:{{ int .Values.extender.metricsPort }}
    - --gpu-resources={{ join "," .Values.extender.gpuResources }}
    - --log-format={{ .Values.logFormat }}
    - --shutdown-delay-seconds={{ int .Values.extender.shutdown.delaySeconds }}
    - --shutdown-grace-seconds={{ int .Values.extender.shutdown.graceSeconds }}
    {{- with .Values.extender.jobLabelKeys }}
    - --job-label-keys={{ join "," . }}
    {{- end }}
    {{- with .Values.extender.topologyKeys }}
    - --topology-keys={{ join "," . }}
    {{- end }}
    {{- if include "railguard.reportUnresolvableAsFailed" . }}
    - --report-unresolvable-as-failed
    {{- end }}
    {{- if include "railguard.extenderTls" . }}
    # Only the scheduler, with its client certificate from the chart's CA, is served.
    - --tls-cert=/etc/railguard/extender-tls/tls.crt
    - --tls-key=/etc/railguard/extender-tls/tls.key
    - --tls-client-ca=/etc/railguard/extender-tls/ca.crt
    {{- end }}
  {{- if include "railguard.extenderTls" . }}
  volumeMounts:
    - name: extender-tls
      mountPath: /etc/railguard/extender-tls
      readOnly: true
  {{- end }}
  ports:
    {{- if not $sidecar }}
    - name: http
      containerPort: {{ int .Values.extender.port }}
      protocol: TCP
    {{- end }}
    - name: metrics
      containerPort: {{ int .Values.extender.metricsPort }}
      protocol: TCP
  livenessProbe:
    httpGet: {path: /healthz, port: metrics}
    periodSeconds: 10
  # Ready only once the node, pod and namespace caches are synced.
  readinessProbe:
    httpGet: {path: /readyz, port: metrics}
    periodSeconds: 5
  resources:
    {{- toYaml .Values.extender.resources | nindent 4 }}
  securityContext:
    {{- include "railguard.restrictedContainer" . | nindent 4 }}
{{- end -}}

{{/* terminationGracePeriodSeconds of a pod running the extender: its drain delay and grace,
and 5 s to exit. */}}
{{- define "railguard.extenderTerminationGrace" -}}
{{- add (int .Values.extender.shutdown.delaySeconds) (int .Values.extender.shutdown.graceSeconds) 5 -}}
{{- end -}}

{{/* Where kube-scheduler reaches the extender. */}}
{{- define "railguard.extenderURL" -}}
{{- if .Values.scheduler.extenderURL -}}
{{- .Values.scheduler.extenderURL -}}
{{- else if eq (include "railguard.extenderPlacement" .) "sidecar" -}}
{{- printf "%s://127.0.0.1:%d" (include "railguard.extenderScheme" .) (int .Values.extender.port) -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%d" (include "railguard.extenderScheme" .) (include "railguard.componentName" (dict "root" . "component" "extender")) .Release.Namespace (int .Values.extender.port) -}}
{{- end -}}
{{- end -}}

{{/* Non-empty when the extender serves TLS with the chart's CA (and the scheduler uses it). */}}
{{- define "railguard.extenderTls" -}}
{{- if and .Values.extender.enabled .Values.extender.tls.enabled -}}true{{- end -}}
{{- end -}}

{{- define "railguard.extenderScheme" -}}
{{- if include "railguard.extenderTls" . -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* The Secret of the extender's CA, serving pair and the scheduler's client pair. */}}
{{- define "railguard.extenderTlsSecret" -}}
{{- printf "%s-tls" (include "railguard.componentName" (dict "root" . "component" "extender")) -}}
{{- end -}}

{{/* The pod volume the set is written to by the extender-tls init container (extender
pods, scheduler pods): in memory, never on the node's disk. */}}
{{- define "railguard.extenderTlsVolume" -}}
- name: extender-tls
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}

{{/* The init container that fills the Secret once (a CA, the extender's serving pair, the
scheduler's client pair; never rendered by the chart) or reads the set already there, and
writes it to the extender-tls volume. Every pod that mounts the set runs it with the same
names, so whichever pod starts first issues the set and the others use it. */}}
{{- define "railguard.extenderTlsInit" -}}
{{- $name := include "railguard.componentName" (dict "root" . "component" "extender") -}}
{{- $svc := printf "%s.%s.svc" $name .Release.Namespace -}}
- name: extender-tls
  image: {{ include "railguard.image" (dict "root" . "image" .Values.extender.image) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - tls-bootstrap
    - --secret={{ include "railguard.extenderTlsSecret" . }}
    - --namespace={{ .Release.Namespace }}
    - --out=/etc/railguard/extender-tls
    # The names kube-scheduler dials: the sidecar's loopback, the Service's names.
    - --server-ip=127.0.0.1
    - --server-dns=localhost,{{ $svc }},{{ $svc }}.cluster.local
    - --server-cn={{ $name }}
    - --client-cn={{ include "railguard.componentName" (dict "root" . "component" "scheduler") }}
    - --ca-cn={{ $name }}-ca
    - --validity-days={{ int .Values.extender.tls.validityDays }}
    - --log-format={{ .Values.logFormat }}
  volumeMounts:
    - name: extender-tls
      mountPath: /etc/railguard/extender-tls
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {memory: 64Mi}
  securityContext:
    {{- include "railguard.restrictedContainer" . | nindent 4 }}
{{- end -}}

{{/* Service accounts that fill the extender's TLS Secret: of the pods that run the
extender-tls init container. */}}
{{- define "railguard.extenderTlsWriters" -}}
{{- if ne (include "railguard.extenderPlacement" .) "sidecar" }}
- kind: ServiceAccount
  name: {{ include "railguard.componentName" (dict "root" . "component" "extender") }}
  namespace: {{ .Release.Namespace }}
{{- end }}
{{- if eq .Values.scheduler.mode "secondary" }}
- kind: ServiceAccount
  name: {{ include "railguard.componentName" (dict "root" . "component" "scheduler") }}
  namespace: {{ .Release.Namespace }}
{{- end }}
{{- end -}}

{{/* The init container that fills the campaign's token Secret once (or reads the token
there: a prober.peerToken value is rendered into it) and writes it to the peer-token
volume, for the peer endpoints and the campaign. Takes (dict "root" $ "apiToken" BOOL):
apiToken mounts the prober pods' api-token volume (they mount no default token). */}}
{{- define "railguard.peerTokenInit" -}}
{{- $root := .root -}}
{{- $ns := include "railguard.proberNamespace" $root -}}
- name: peer-token
  image: {{ include "railguard.image" (dict "root" $root "image" $root.Values.prober.image) }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args:
    - peer-token
    - --secret={{ include "railguard.peerTokenSecret" $root }}
    - --namespace={{ $ns }}
    - --out=/etc/railguard/peer/token
    - --log-format={{ $root.Values.logFormat }}
  volumeMounts:
    - name: peer-token
      mountPath: /etc/railguard/peer
    {{- if .apiToken }}
    - name: api-token
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- end }}
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {memory: 64Mi}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
{{- end -}}

{{/* The pod volume the peer token is written to: in memory. */}}
{{- define "railguard.peerTokenVolume" -}}
- name: peer-token
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}

{{/* The extenders list of a KubeSchedulerConfiguration. */}}
{{- define "railguard.schedulerExtenders" -}}
- urlPrefix: {{ include "railguard.extenderURL" . | quote }}
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: {{ int .Values.scheduler.weight }}
  {{- if include "railguard.extenderTls" . }}
  enableHTTPS: true
  # The extender's CA and the scheduler's client certificate (Secret
  # {{ include "railguard.extenderTlsSecret" . }}, filled by the extender-tls init container
  # of the chart's pods; a main scheduler mounts that Secret here).
  tlsConfig:
    caFile: /etc/railguard/extender-tls/ca.crt
    certFile: /etc/railguard/extender-tls/client.crt
    keyFile: /etc/railguard/extender-tls/client.key
  {{- else }}
  enableHTTPS: false
  {{- end }}
  nodeCacheCapable: {{ .Values.scheduler.nodeCacheCapable }}
  httpTimeout: {{ .Values.scheduler.httpTimeout }}
  # Fail closed: a pod is not placed on a node railguard could not check.
  ignorable: false
  managedResources:
  {{- range .Values.scheduler.managedResources }}
    - name: {{ . | quote }}
      ignoredByScheduler: false
  {{- end }}
{{- end -}}

{{/* The namespace of everything that runs privileged (the prober DaemonSets, their metrics
Service and RBAC, the campaign CronJobs and the peer-token Secret they share):
prober.namespace.name, else the release namespace. Split out, the release namespace can
enforce the `restricted` Pod Security level and this one `privileged`. */}}
{{- define "railguard.proberNamespace" -}}
{{- $ns := .Values.prober.namespace | default dict -}}
{{- if .Values.prober.enabled -}}
{{- default .Release.Namespace $ns.name -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Names of the webhook's objects. */}}
{{- define "railguard.webhookConfigName" -}}
{{- include "railguard.componentName" (dict "root" . "component" "webhook") -}}
{{- end -}}
{{- define "railguard.nodeGuardConfigName" -}}
{{- printf "%s-node-guard" (include "railguard.webhookConfigName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "railguard.webhookTlsSecret" -}}
{{- printf "%s-tls" (include "railguard.componentName" (dict "root" . "component" "webhook")) -}}
{{- end -}}
{{- define "railguard.peerTokenSecret" -}}
{{- printf "%s-peer-token" (include "railguard.fullname" .) -}}
{{- end -}}

{{/* Pod security context shared by the non-root components. */}}
{{- define "railguard.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
{{- end -}}
{{- define "railguard.restrictedPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Soft anti-affinity over nodes for a component's replicas. */}}
{{- define "railguard.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "railguard.selectorLabels" . | nindent 12 }}
{{- end -}}
