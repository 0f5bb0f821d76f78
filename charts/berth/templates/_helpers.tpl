{{/* The chart's name, or nameOverride. */}}
{{- define "berth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects' name: fullnameOverride, or RELEASE-berth (RELEASE when it holds the name). */}}
{{- define "berth.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "berth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "berth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "berth.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "berth.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "berth.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "berth.claimName" -}}
{{- default (include "berth.fullname" .) .Values.persistence.existingClaim }}
{{- end }}

{{/*
berth.yaml: what the chart must set (the data directory on the volume, the socket and TCP
listener, TLS, the LXD endpoint and client certificate) over the user's `config`. The server
fingerprint is a placeholder the init container fills in from the LXD Secret.
*/}}
{{- define "berth.config" -}}
{{- $fixed := dict
  "dataDir" "/var/lib/berth"
  "listen" (dict
    "socket" "/run/berth/berth.sock"
    "http" (printf "0.0.0.0:%d" (int .Values.service.port))
    "tls" (dict "cert" "/etc/berth/tls/tls.crt" "key" "/etc/berth/tls/tls.key")
    "preview" .Values.preview.listen)
  "lxd" (dict
    "endpoint" (required "lxd.endpoint is required (https://HOST:8443)" .Values.lxd.endpoint)
    "project" .Values.lxd.project
    "storagePool" .Values.lxd.storagePool
    "target" .Values.lxd.target
    "clientCert" "/etc/berth/lxd/client.crt"
    "clientKey" "/etc/berth/lxd/client.key"
    "serverFingerprint" "@SERVER_FINGERPRINT@") }}
{{- toYaml (mergeOverwrite (deepCopy (default dict .Values.config)) $fixed) }}
{{- end }}
