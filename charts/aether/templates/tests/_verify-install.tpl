{{/*
verify-install: `aether-controller verify-install` (controller/src/verify.rs) proves an install
works: a dry-run over-budget EndpointPolicy must be denied by the webhook itself, a dry-run valid
one admitted, and every node agent must answer /readyz 200. Two runners, each with its own
ServiceAccount and Role (verify-install-rbac.yaml, the same rules): the startup check Job
(post-install,post-upgrade hooks, ../verify-install-job.yaml, verifyInstall.enabled) and the
`helm test` Pod (test hook, verify-install.yaml, verifyInstall.helmTest). Separate accounts keep
`helm template --skip-tests` (and Argo CD, which skips test hooks) from dropping the Job's account
along with the test's. Every object is a hook, so nothing stays after a run that passed.
*/}}

{{- define "aether.verify.fullname" -}}{{ include "aether.fullname" . }}-verify-install{{- end -}}

{{/* The dry-run namespace: verifyInstall.namespace, default the release namespace. */}}
{{- define "aether.verify.namespace" -}}
{{- .Values.verifyInstall.namespace | default .Release.Namespace -}}
{{- end -}}

{{/*
The runners that are enabled: a list of dicts {name, hook}, the startup check's first.
*/}}
{{- define "aether.verify.runners" -}}
{{- $runners := list -}}
{{- if .Values.verifyInstall.enabled -}}
{{- $runners = append $runners (dict "name" (include "aether.verify.fullname" .) "hook" "post-install,post-upgrade") -}}
{{- end -}}
{{- if .Values.verifyInstall.helmTest -}}
{{- $runners = append $runners (dict "name" (printf "%s-test" (include "aether.verify.fullname" .)) "hook" "test") -}}
{{- end -}}
{{- toJson $runners -}}
{{- end -}}

{{/*
Metadata of one verify-install object: name, namespace, labels and the hook annotations.
Arguments (dict): root, name, hook, weight, namespace (default: the release namespace).
*/}}
{{- define "aether.verify.metadata" -}}
name: {{ .name }}
namespace: {{ .namespace | default .root.Release.Namespace }}
labels:
  {{- include "aether.labels" .root | nindent 2 }}
  app.kubernetes.io/component: verify-install
annotations:
  helm.sh/hook: {{ .hook }}
  helm.sh/hook-weight: {{ .weight | quote }}
  helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/*
The Pod spec of a verify-install runner: the controller image's `aether-controller verify-install`
as UID 65532, no capabilities, read-only root, restartPolicy Never. Arguments (dict): root,
name (its ServiceAccount), retryForSeconds.
*/}}
{{- define "aether.verify.podSpec" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ .name }}
automountServiceAccountToken: true
restartPolicy: Never
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{ include "aether.nodeSelector" $v.verifyInstall.nodeSelector }}
{{- with $v.verifyInstall.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: verify-install
    image: {{ include "aether.image" (list $v.images.controller .root) }}
    imagePullPolicy: {{ $v.images.controller.pullPolicy }}
    command: ["aether-controller"]
    args:
      - verify-install
      - --log-format={{ $v.logFormat }}
      - --log-level={{ $v.logLevel }}
      - --namespace={{ include "aether.verify.namespace" .root }}
      - --agent-namespace={{ include "aether.node.namespace" .root }}
      - --agent-selector=app.kubernetes.io/name={{ include "aether.name" .root }},app.kubernetes.io/instance={{ .root.Release.Name }},app.kubernetes.io/component=node
      - --daemonset-selector=app.kubernetes.io/name={{ include "aether.name" .root }},app.kubernetes.io/instance={{ .root.Release.Name }}
      - --agent-admin-port={{ $v.agent.adminPort }}
      - --agent-access={{ if eq $v.verifyInstall.agentAccess "apiServerProxy" }}api-server-proxy{{ else }}pod-ip{{ end }}
      - --kubelet-pods-dir={{ include "aether.podsDir" .root }}
      - --socket-limit={{ if eq $v.socketLimit "filesystem" }}filesystem{{ else }}sun-path{{ end }}
      - --retry-for-seconds={{ .retryForSeconds }}
    securityContext:
      runAsNonRoot: true
      runAsUser: 65532
      runAsGroup: 65532
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities:
        drop: [ALL]
    resources:
      {{- toYaml $v.verifyInstall.resources | nindent 6 }}
{{- end -}}
