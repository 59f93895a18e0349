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

{{- /* serve.env as SHARDQ_<KEY> variables (.root, and .args: serve's
command line). A key that names a variable the chart sets itself is
refused: after the Secret's SHARDQ_DSN a second SHARDQ_DSN would replace
it with plaintext (the last variable of a name wins), and the variable of
a flag the chart passes on serve's command line would be ignored unsaid
(the command line wins). values.schema.json refuses those keys by name
(so helm lint does too, which runs no fail); this refuses any variable
the chart sets that the schema's list lacks, and two keys naming one
variable ("rate", "RATE"). Values are strings (the schema): a YAML number
would be quoted in float form ("8.388608e+06"), which serve refuses. */ -}}
{{- define "shardq.serveEnv" -}}
{{- $chart := dict }}
{{- range (include "shardq.dsnEnv" (dict "root" .root "secret" "x") | fromYamlArray) }}
{{- $_ := set $chart .name true }}
{{- end }}
{{- range .args }}
{{- if hasPrefix "--" . }}
{{- $_ := set $chart (printf "SHARDQ_%s" (trimPrefix "--" . | upper | replace "-" "_")) true }}
{{- end }}
{{- end }}
{{- $seen := dict }}
{{- range $k, $v := .root.Values.serve.env }}
{{- $name := printf "SHARDQ_%s" ($k | upper | replace "-" "_") }}
{{- if hasKey $chart $name }}
{{- fail (printf "serve.env.%s: the chart sets %s itself" $k $name) }}
{{- end }}
{{- if hasKey $seen $name }}
{{- fail (printf "serve.env.%s and serve.env.%s are both %s: keep one" (get $seen $name) $k $name) }}
{{- end }}
{{- $_ := set $seen $name $k }}
- name: {{ $name }}
  value: {{ $v | quote }}
{{- end }}
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
