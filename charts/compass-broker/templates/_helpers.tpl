{{- define "compass-broker.name" -}}compass-broker{{- end -}}

{{- define "compass-broker.labels" -}}
app.kubernetes.io/name: {{ include "compass-broker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "compass-broker.selector" -}}
app.kubernetes.io/name: {{ include "compass-broker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "compass-broker.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
xfcc mode trusts X-Forwarded-Client-Cert, which any client can send: it is only a proof when
the ingress gateway that verified the client certificate is the only way to the broker. So
rendering fails unless the NetworkPolicy is on and names the gateway's pods.
*/}}
{{- define "compass-broker.xfccGuard" -}}
{{- range .Values.extraEnv -}}
{{- if has .name (list "BROKER_IDENTITY_MODE" "BROKER_XFCC_TRUSTED") -}}
{{- fail (printf "extraEnv cannot set %s: use identity.mode, whose xfcc mode comes with its NetworkPolicy" .name) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.identity.mode "xfcc" -}}
{{- if not .Values.networkPolicy.enabled -}}
{{- fail "identity.mode=xfcc needs networkPolicy.enabled=true: X-Forwarded-Client-Cert is trusted only when the ingress gateway is the only way to the broker" -}}
{{- end -}}
{{- if not .Values.istio.ingressGateway.namespace -}}
{{- fail "identity.mode=xfcc needs istio.ingressGateway.namespace: the NetworkPolicy admits the ingress gateway's pods alone" -}}
{{- end -}}
{{- if empty .Values.istio.ingressGateway.podLabels -}}
{{- fail "identity.mode=xfcc needs istio.ingressGateway.podLabels: the NetworkPolicy admits the ingress gateway's pods alone" -}}
{{- end -}}
{{- end -}}
{{- end -}}
