{{- define "shardq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "shardq.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "shardq.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "shardq.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "shardq.secretName" -}}
{{- if .Values.dsn.existingSecret -}}
{{ .Values.dsn.existingSecret }}
{{- else -}}
{{ include "shardq.fullname" . }}-dsn
{{- end -}}
{{- end -}}

{{- define "shardq.migrateSecretName" -}}
{{- if .Values.dsn.existingSecret -}}
{{ .Values.dsn.existingSecret }}
{{- else -}}
{{ include "shardq.fullname" . }}-migrate-dsn
{{- end -}}
{{- end -}}

{{- define "shardq.dsnEnv" -}}
- name: SHARDQ_DSN
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .root.Values.dsn.secretKey }}
- name: SHARDQ_LOG_FORMAT
  value: {{ .root.Values.serve.logFormat | quote }}
- name: SHARDQ_LOG_LEVEL
  value: {{ .root.Values.serve.logLevel | quote }}
{{- end -}}

{{- define "shardq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "shardq.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{- /* The serve pods' selector: the Deployment's, the Service's and the
PodDisruptionBudget's. */ -}}
{{- define "shardq.serveSelector" -}}
{{ include "shardq.selector" . }}
app.kubernetes.io/component: serve
{{- end -}}

{{- /* An HTTP GET probe of serve's port from a probe's values (the
handler is the chart's: serve's own endpoints). */ -}}
{{- define "shardq.probe" -}}
httpGet:
  path: {{ .path }}
  port: http
{{- range $k := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "failureThreshold" "successThreshold" }}
{{- if hasKey $.values $k }}
{{ $k }}: {{ get $.values $k }}
{{- end }}
{{- end }}
{{- end -}}
