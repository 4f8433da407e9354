{{/* The image reference of a component: repository:tag, tag defaulting to appVersion. */}}
{{- define "consul-cni-repair.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/* Fails on values the controller would refuse, naming the key. */}}
{{- define "consul-cni-repair.validate" -}}
{{- if not (has .Values.controller.action (list "evict" "delete" "label")) }}
{{- fail (printf "controller.action: %q is not one of evict, delete, label" .Values.controller.action) }}
{{- end }}
{{- if not (has .Values.controller.cniReadyGate (list "" "node-label" "cni-pod" "none")) }}
{{- fail (printf "controller.cniReadyGate: %q is not one of node-label, cni-pod, none" .Values.controller.cniReadyGate) }}
{{- end }}
{{- if and .Values.nodeStartupTaint.enabled (not .Values.controller.nodeReadiness) }}
{{- fail "nodeStartupTaint.enabled=true with controller.nodeReadiness=false: node readiness is what lifts the startup taint, so every new node would stay tainted; set controller.nodeReadiness=true" }}
{{- end }}
{{- if and .Values.nodeStartupTaint.enabled (not .Values.installer.enabled) (not .Values.nodeStartupTaint.cniToleratesTaint) }}
{{- fail "nodeStartupTaint.enabled=true with installer.enabled=false (repair-only): the startup taint is lifted only once the CNI pod on the node is Ready, and consul-k8s's CNI DaemonSet tolerates only CriticalAddonsOnly and NoExecute taints, so it would never run on a new node and the node would stay tainted. Give consul-k8s's CNI DaemonSet the toleration {key: consul.hashicorp.com/cni-not-ready, operator: Exists} (docs/install.md, \"Repair only\"), then set nodeStartupTaint.cniToleratesTaint=true" }}
{{- end }}
{{- if and .Values.nodeStartupTaint.enabled .Values.controller.dryRun }}
{{- fail "nodeStartupTaint.enabled=true with controller.dryRun=true: audit mode lifts no startup taint, so every new node would stay tainted; set controller.dryRun=false (profiles/evict.yaml)" }}
{{- end }}
{{- $level := include "consul-cni-repair.podSecurityLevel" . }}
{{- if and .Values.installer.enabled $level (ne $level "privileged") }}
{{- fail (printf "namespace %s enforces Pod Security level %q; the installer's hostPath volumes need \"privileged\": kubectl label namespace %s pod-security.kubernetes.io/enforce=privileged --overwrite (or installer.enabled=false)" .Release.Namespace $level .Release.Namespace) }}
{{- end }}
{{- if and (not .Values.controller.nodeReadiness) (has .Values.controller.cniReadyGate (list "" "node-label")) }}
{{- fail "controller.nodeReadiness=false: nothing would label nodes cni=ready; set controller.cniReadyGate to cni-pod or none" }}
{{- end }}
{{- end }}

{{/* A file of manifests/base as it is (symbolic link under files/), each
object labelled app.kubernetes.io/part-of like the kustomize build, and
with Helm's standard labels (helmLabels). For
cluster-scoped objects without labels of their own (the admission policies). */}}
{{- define "consul-cni-repair.baseFile" -}}
{{- $text := .root.Files.Get .path }}
{{- if not $text }}
{{- fail (printf "%s: missing or empty" .path) }}
{{- end }}
{{- $labels := printf "app.kubernetes.io/part-of: consul-cni-repair\n%s" (include "consul-cni-repair.helmLabels" .root) }}
{{- $text | replace "\nmetadata:\n" (printf "\nmetadata:\n  labels:\n%s\n" ($labels | indent 4)) }}
{{- end }}

{{/* The labels Helm's conventions add to every object and pod template,
beside app.kubernetes.io/{name,component,part-of}, which the kustomize
build has too. Selectors keep app.kubernetes.io/name alone: they are
immutable, and the objects' names are fixed (one release per cluster). */}}
{{- define "consul-cni-repair.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- end }}

{{/* "true" when the cluster's API serves the Prometheus Operator kind
(monitoring.coreos.com/v1), else empty: the monitoring objects are rendered
only then, so a cluster without the operator's CRDs installs cleanly and
NOTES.txt says what was left out. `helm template` knows no cluster: pass
--api-versions monitoring.coreos.com/v1/<Kind> to render them. */}}
{{- define "consul-cni-repair.hasKind" -}}
{{- $root := index . 0 }}
{{- if $root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" (index . 1)) }}true{{ end }}
{{- end }}

{{/* Prometheus Operator kinds enabled in the values but missing from the
cluster's API, for NOTES.txt. */}}
{{- define "consul-cni-repair.missingMonitoringKinds" -}}
{{- $m := .Values.monitoring }}
{{- $missing := list }}
{{- range $kind, $on := dict "ServiceMonitor" $m.serviceMonitor.enabled "PodMonitor" (and $m.podMonitor.enabled $.Values.installer.enabled) "PrometheusRule" $m.prometheusRule.enabled }}
{{- if and $on (not (include "consul-cni-repair.hasKind" (list $ $kind))) }}
{{- $missing = append $missing $kind }}
{{- end }}
{{- end }}
{{- join ", " $missing }}
{{- end }}

{{/* The namespace's Pod Security enforce level when the cluster has the
namespace and it enforces one (empty in helm template and dry runs). */}}
{{- define "consul-cni-repair.podSecurityLevel" -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace }}
{{- if $ns }}{{ index ($ns.metadata.labels | default dict) "pod-security.kubernetes.io/enforce" | default "" }}{{ end }}
{{- end }}
