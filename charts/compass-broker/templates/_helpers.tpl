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

{{/*
The variables the chart sets from its values. extraEnv may not set them again: a repeated name
is refused by the API server only on a later upgrade (server-side apply), and a second value
would silently lose against the first. The names are read from this very list, so it cannot
drift from what the Deployment sets.
*/}}
{{- define "compass-broker.chartEnv" -}}
- {name: BROKER_PORT, value: "8080"}
- {name: BROKER_KCP_NAMESPACE, value: {{ .Values.kcpNamespace | quote }}}
- {name: BROKER_LEASE_NAMESPACE, value: {{ .Values.kcpNamespace | quote }}}
- {name: BROKER_DIRECTOR_URL, value: {{ required "director.url is required" .Values.director.url | quote }}}
- {name: BROKER_DIRECTOR_CREDENTIALS_FILE, value: /etc/compass-broker/director/{{ .Values.director.credentialsKey }}}
- {name: BROKER_DIRECTOR_MAX_CONCURRENCY, value: {{ .Values.director.maxConcurrency | quote }}}
- {name: BROKER_DIRECTOR_TIMEOUT_SECONDS, value: {{ .Values.director.timeoutSeconds | quote }}}
- {name: BROKER_IDENTITY_MODE, value: {{ .Values.identity.mode | quote }}}
- {name: BROKER_AUDIENCE, value: {{ .Values.identity.audience | quote }}}
- {name: BROKER_ALLOWED_SERVICE_ACCOUNTS, value: {{ join "," .Values.identity.allowedServiceAccounts | quote }}}
- {name: BROKER_JWKS_ISSUER_URL, value: {{ .Values.identity.jwksIssuerURL | quote }}}
- {name: BROKER_BYOC_ENROLMENT, value: {{ .Values.identity.byocEnrolment | quote }}}
{{- if .Values.identity.issuerCAConfigMap }}
- {name: BROKER_ISSUER_CA_FILE, value: /etc/compass-broker/issuer-ca/ca.crt}
{{- end }}
- {name: BROKER_XFCC_TRUSTED, value: {{ eq .Values.identity.mode "xfcc" | quote }}}
{{- if .Values.identity.xfccDenyListConfigMap }}
{{- if ne .Values.identity.mode "xfcc" }}
{{- fail "identity.xfccDenyListConfigMap is for identity.mode=xfcc only" }}
{{- end }}
- {name: BROKER_XFCC_DENY_LIST_FILE, value: /etc/compass-broker/deny-list/deny-list}
{{- end }}
- {name: BROKER_MODULE_POLICY, value: {{ .Values.policy.module | quote }}}
- {name: BROKER_MODULE_DISABLED_POLICY, value: {{ .Values.policy.onModuleDisabled | quote }}}
- {name: BROKER_RATE_LIMIT_PER_MINUTE, value: {{ .Values.policy.rateLimitPerMinute | quote }}}
- {name: BROKER_RATE_LIMIT_BURST, value: {{ .Values.policy.rateLimitBurst | quote }}}
- {name: BROKER_BREAKER_FAILURE_THRESHOLD, value: {{ .Values.breaker.failureThreshold | quote }}}
- {name: BROKER_BREAKER_OPEN_SECONDS, value: {{ .Values.breaker.openSeconds | quote }}}
- {name: BROKER_LEADER_ELECTION, value: {{ .Values.leaderElection.enabled | quote }}}
- {name: BROKER_LOG_LEVEL, value: {{ .Values.logLevel | quote }}}
{{- end -}}

{{- define "compass-broker.extraEnvGuard" -}}
{{- $set := list -}}
{{- range (include "compass-broker.chartEnv" . | fromYamlArray) -}}
{{- $set = append $set .name -}}
{{- end -}}
{{- $seen := list -}}
{{- range .Values.extraEnv -}}
{{- if has .name $set -}}
{{- fail (printf "extraEnv cannot set %s: the chart sets it from its values (see values.yaml)" .name) -}}
{{- end -}}
{{- if has .name $seen -}}
{{- fail (printf "extraEnv sets %s twice" .name) -}}
{{- end -}}
{{- $seen = append $seen .name -}}
{{- end -}}
{{- end -}}
