{{- define "compass-agent.name" -}}compass-agent{{- end -}}

{{- define "compass-agent.labels" -}}
app.kubernetes.io/name: {{ include "compass-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "compass-agent.selector" -}}
app.kubernetes.io/name: {{ include "compass-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
