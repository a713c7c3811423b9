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

{{/*
The variables the chart sets from its values; extraEnv may not set them again (see the broker
chart's compass-broker.chartEnv). Read from this list, so it cannot drift.
*/}}
{{- define "compass-agent.chartEnv" -}}
{{- if .Values.broker.url }}
- {name: AGENT_BROKER_URL, value: {{ .Values.broker.url | quote }}}
{{- end }}
{{- if .Values.broker.urlTemplate }}
- {name: AGENT_BROKER_URL_TEMPLATE, value: {{ .Values.broker.urlTemplate | quote }}}
{{- end }}
- {name: AGENT_BROKER_TIMEOUT, value: {{ .Values.broker.timeoutSeconds | quote }}}
{{- if .Values.broker.caConfigMap }}
- {name: AGENT_BROKER_CA_BUNDLE, value: /etc/compass-agent/broker-ca/ca.crt}
{{- end }}
- {name: AGENT_IDENTITY_MODE, value: {{ .Values.identity.mode | quote }}}
- {name: AGENT_AUDIENCE, value: {{ .Values.identity.audience | quote }}}
- {name: AGENT_SA_TOKEN_FILE, value: /var/run/secrets/compass-agent/token}
{{- if eq .Values.identity.mode "mtls" }}
- {name: AGENT_CLIENT_CERT_FILE, value: /etc/compass-agent/client/tls.crt}
- {name: AGENT_CLIENT_KEY_FILE, value: /etc/compass-agent/client/tls.key}
{{- end }}
- {name: AGENT_NAMESPACE, value: {{ .Release.Namespace | quote }}}
{{- if .Values.runtimeID }}
- {name: AGENT_RUNTIME_ID, value: {{ .Values.runtimeID | quote }}}
{{- end }}
- {name: AGENT_MODULE_SIGNALS, value: {{ join "," .Values.moduleSignals | quote }}}
- {name: AGENT_DELETE_SECRET_ON_DISABLE, value: {{ .Values.deleteSecretOnDisable | quote }}}
- {name: AGENT_HANDOVER_GRACE, value: {{ .Values.gracePeriods.handoverSeconds | quote }}}
- {name: AGENT_CONNECTION_GRACE, value: {{ .Values.gracePeriods.connectionSeconds | quote }}}
- {name: AGENT_REFUSAL_CADENCE, value: {{ .Values.refusalCadenceSeconds | quote }}}
- {name: AGENT_BACKOFF_CAP, value: {{ .Values.backoffCapSeconds | quote }}}
- {name: AGENT_HEALTH_ADDRESS, value: "0.0.0.0:8080"}
- name: AGENT_IDENTITY
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- {name: AGENT_LOG_LEVEL, value: {{ .Values.logLevel | quote }}}
{{- end -}}

{{/*
compass-runtime-agent reads its configuration Secret in kyma-system only, and an agent that does
not know where the broker is cannot do anything: both are refused when rendering.
*/}}
{{- define "compass-agent.guards" -}}
{{- if and (ne .Release.Namespace "kyma-system") (not .Values.testing.anyNamespace) -}}
{{- fail (printf "compass-agent must be installed into kyma-system (not %s): compass-runtime-agent reads compass-agent-configuration there only" .Release.Namespace) -}}
{{- end -}}
{{- if not (or .Values.broker.url .Values.broker.urlTemplate) -}}
{{- fail "broker.url or broker.urlTemplate is required: the broker's URL, or how to make it from lifecycle-manager's KCP_ADDR (docs/module.md)" -}}
{{- end -}}
{{- $set := list -}}
{{- range (include "compass-agent.chartEnv" . | fromYamlArray) -}}
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
