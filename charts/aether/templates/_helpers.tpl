{{/* Chart name. */}}
{{- define "aether.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource name prefix. */}}
{{- define "aether.fullname" -}}
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

{{- define "aether.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "aether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aether
{{- end -}}

{{- define "aether.controller.selector" -}}
app.kubernetes.io/name: {{ include "aether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "aether.node.selector" -}}
app.kubernetes.io/name: {{ include "aether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{- define "aether.proxy.selector" -}}
app.kubernetes.io/name: {{ include "aether.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end -}}

{{/*
The namespace of the node side (both DaemonSets, their ServiceAccount and Roles, the Envoy
bootstrap ConfigMap, the PodMonitor and the priority quota): daemonset.namespace, default the
release namespace.
*/}}
{{- define "aether.node.namespace" -}}
{{- .Values.daemonset.namespace | default .Release.Namespace -}}
{{- end -}}

{{- define "aether.controller.fullname" -}}{{ include "aether.fullname" . }}-controller{{- end -}}
{{- define "aether.node.fullname" -}}{{ include "aether.fullname" . }}-node{{- end -}}
{{- define "aether.proxy.fullname" -}}{{ include "aether.fullname" . }}-proxy{{- end -}}
{{- define "aether.certs.fullname" -}}{{ include "aether.fullname" . }}-webhook-certs{{- end -}}
{{- define "aether.webhook.configName" -}}{{ include "aether.fullname" . }}-endpointpolicy{{- end -}}

{{/* Secret holding the webhook's tls.crt / tls.key. */}}
{{- define "aether.webhook.secretName" -}}
{{- if eq .Values.webhook.certs.mode "provided" -}}
{{- required "webhook.certs.provided.secretName is required when webhook.certs.mode=provided" .Values.webhook.certs.provided.secretName -}}
{{- else -}}
{{- default (printf "%s-webhook-tls" (include "aether.fullname" .)) .Values.webhook.certs.secretName -}}
{{- end -}}
{{- end -}}

{{- define "aether.image" -}}
{{- $img := index . 0 -}}{{- $root := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/*
The kubelet pods dir as the proxy and the agent see it: the one value both binaries'
--kubelet-pods-dir take, so webhook and agent compute one socket budget.
*/}}
{{- define "aether.podsDir" -}}
{{- .Values.proxy.udsWorkloads.mountPath | default .Values.proxy.udsWorkloads.hostPodsDir | trimSuffix "/" | default "/" -}}
{{- end -}}

{{/*
The heap Envoy's overload manager measures against, in bytes (proxy.overload.maxHeapBytes): the
value, or when it is 0, 85 % of proxy.resources.limits.memory (a whole number with a unit of k,
M, G, Ki, Mi, Gi or Ti, or none: bytes); 0 with no memory limit (no heap monitor). The rest of the
limit is Envoy's code, thread stacks and the allocator's free pages, which the heap does not count.
*/}}
{{- define "aether.proxy.maxHeapBytes" -}}
{{- $set := .Values.proxy.overload.maxHeapBytes | int64 -}}
{{- if $set -}}
{{- $set -}}
{{- else -}}
{{- $limit := toString (dig "limits" "memory" "" .Values.proxy.resources) -}}
{{- $number := regexFind "^[0-9]+" $limit -}}
{{- if $number -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $unit := trimPrefix $number $limit -}}
{{- if not (hasKey $units $unit) -}}
{{- fail (printf "proxy.resources.limits.memory %q: the chart derives Envoy's heap limit from it and reads only a whole number with a unit of k, M, G, Ki, Mi, Gi or Ti; write it so, or set proxy.overload.maxHeapBytes" $limit) -}}
{{- end -}}
{{- div (mul ($number | int64) (get $units $unit | int64) 85) 100 -}}
{{- else -}}
0
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Metadata of one object of an aether-webhook-certs hook (selfSigned mode): name, namespace (unless
cluster-scoped), labels and the hook annotations. Arguments (dict): root, name, hook, weight,
clusterScoped.
*/}}
{{- define "aether.certs.hookMetadata" -}}
name: {{ .name }}
{{- if not .clusterScoped }}
namespace: {{ .root.Release.Namespace }}
{{- end }}
labels:
  {{- include "aether.labels" .root | nindent 2 }}
  app.kubernetes.io/component: webhook-certs
annotations:
  helm.sh/hook: {{ .hook }}
  helm.sh/hook-weight: {{ .weight | quote }}
  helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/*
The Job spec of an aether-webhook-certs hook: the controller image's second binary, as UID
65532, no capabilities, read-only root. Arguments (dict): root, name (also its ServiceAccount),
args (list).
*/}}
{{- /*
A pod's nodeSelector: kubernetes.io/os=linux (every aether image is a Linux one: a Windows node
pool must never get these pods) under the given map of values, whose keys win.
Usage: {{- include "aether.nodeSelector" .Values.controller.nodeSelector | nindent 6 }}
*/}}
{{- define "aether.nodeSelector" -}}
nodeSelector:
  {{- toYaml (mergeOverwrite (dict "kubernetes.io/os" "linux") (deepCopy (. | default dict))) | nindent 2 }}
{{- end -}}

{{- define "aether.certs.jobSpec" -}}
{{- $v := .root.Values -}}
backoffLimit: {{ $v.webhook.certs.job.backoffLimit }}
activeDeadlineSeconds: {{ $v.webhook.certs.job.activeDeadlineSeconds }}
template:
  metadata:
    labels:
      {{- include "aether.labels" .root | nindent 6 }}
      app.kubernetes.io/component: webhook-certs
  spec:
    serviceAccountName: {{ .name }}
    restartPolicy: OnFailure
    {{- include "aether.nodeSelector" dict | nindent 4 }}
    {{- with $v.imagePullSecrets }}
    imagePullSecrets:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    securityContext:
      runAsNonRoot: true
      seccompProfile:
        type: RuntimeDefault
    containers:
      - name: aether-webhook-certs
        image: {{ include "aether.image" (list $v.images.webhookCerts .root) }}
        imagePullPolicy: {{ $v.images.webhookCerts.pullPolicy }}
        command: ["aether-webhook-certs"]
        args:
          {{- toYaml .args | nindent 10 }}
          - --log-format={{ $v.logFormat }}
          - --log-level={{ $v.logLevel }}
        securityContext:
          runAsNonRoot: true
          runAsUser: 65532
          runAsGroup: 65532
          readOnlyRootFilesystem: true
          allowPrivilegeEscalation: false
          capabilities:
            drop: [ALL]
        resources:
          {{- toYaml $v.webhook.certs.job.resources | nindent 10 }}
{{- end -}}

{{/*
Pod-spec fields both node DaemonSets (the agent's and the proxy's) share, so that both run on the
same nodes with the same network, labelling and priority: hostNetwork, SELinux options, DNS policy,
image pull secrets, priority class, node selector and tolerations (daemonset.*).
*/}}
{{- define "aether.nodePodPlacement" -}}
hostNetwork: true
{{- if .Values.daemonset.seLinux.enabled }}
securityContext:
  seLinuxOptions:
    {{- toYaml .Values.daemonset.seLinux.options | nindent 4 }}
{{- end }}
dnsPolicy: ClusterFirstWithHostNet
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.daemonset.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{ include "aether.nodeSelector" .Values.daemonset.nodeSelector }}
{{- with .Values.daemonset.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /*
The project's documentation at this chart's release: "<home>/blob/v<appVersion>", so a link in
NOTES or an annotation (a runbook URL) works from a packaged chart, where no repository file is
next to it. Usage: {{ include "aether.docsURL" . }}/docs/install.md
*/}}
{{- define "aether.docsURL" -}}
https://github.com/aether-mesh/aether/blob/v{{ .Chart.AppVersion }}
{{- end -}}
