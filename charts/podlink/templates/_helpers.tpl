{{/* Labels and small pieces every template shares. */}}

{{/* helm.sh/chart: name-version, as Helm's own scaffold spells it ("+" is not allowed in a label value). */}}
{{- define "podlink.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The DaemonSet's selector. A DaemonSet's selector cannot change after it is
created, so it holds only labels that never change between releases; the
kubectl-podlink plugin finds podlinkd pods by the component label.
*/}}
{{- define "podlink.selectorLabels" -}}
app.kubernetes.io/name: podlink
app.kubernetes.io/component: podlinkd
{{- end -}}

{{/* The recommended app.kubernetes.io labels, on every object. */}}
{{- define "podlink.labels" -}}
app.kubernetes.io/name: podlink
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: podlink
helm.sh/chart: {{ include "podlink.chart" . }}
{{- end -}}

{{/* The image of both the init container and podlinkd. */}}
{{- define "podlink.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* podlinkd's --metrics-addr, also what the exec probes ask. */}}
{{- define "podlink.metricsAddr" -}}
{{- printf "%s:%v" .Values.metrics.address .Values.metrics.port -}}
{{- end -}}
