{{/* Names and labels shared by every object. */}}

{{- define "gpuscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuscope.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of one component: include "gpuscope.selector" (list . "agent") */}}
{{- define "gpuscope.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "gpuscope.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpuscope.labels" -}}
{{ include "gpuscope.selector" . }}
app.kubernetes.io/version: {{ (index . 0).Chart.AppVersion | quote }}
app.kubernetes.io/part-of: gpuscope
app.kubernetes.io/managed-by: {{ (index . 0).Release.Service }}
helm.sh/chart: {{ printf "%s-%s" (index . 0).Chart.Name (index . 0).Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpuscope.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The name the analyzer's certificate lists and agents check. */}}
{{- define "gpuscope.analyzerServerName" -}}
{{- .Values.analyzer.serverName | default (printf "%s-analyzer.%s.svc" (include "gpuscope.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{- define "gpuscope.analyzerAddress" -}}
{{- .Values.agent.analyzerAddress | default (printf "%s:%v" (include "gpuscope.analyzerServerName" .) .Values.analyzer.port) -}}
{{- end -}}

{{/* A container's security context: nothing beyond what it uses. */}}
{{- define "gpuscope.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
seccompProfile:
  type: RuntimeDefault
{{- end -}}
