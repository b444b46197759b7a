{{/* Chart name, truncated to 63 chars. */}}
{{- define "mirrorq.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release name unless it already contains the chart name. Pods are <fullname>-N. */}}
{{- define "mirrorq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mirrorq.headless" -}}
{{- printf "%s-headless" (include "mirrorq.fullname" .) -}}
{{- end -}}

{{- define "mirrorq.secretName" -}}
{{- default (include "mirrorq.fullname" .) .Values.auth.existingSecret -}}
{{- end -}}

{{/* raftTls.secretName, "" when Raft TLS is off (also when raftTls is unset). */}}
{{- define "mirrorq.raftTlsSecret" -}}
{{- with .Values.raftTls -}}{{- .secretName | default "" -}}{{- end -}}
{{- end -}}

{{/* Where the Raft TLS Secret is mounted (not under /etc/mirrorq: that is the read-only ConfigMap). */}}
{{- define "mirrorq.raftTlsDir" -}}
/etc/mirrorq-raft-tls
{{- end -}}

{{- define "mirrorq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mirrorq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "mirrorq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mirrorq
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Selector labels of the broker pods. */}}
{{- define "mirrorq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "mirrorq.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorq.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "mirrorq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "mirrorq.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{/* --peers for pod ordinal-free rendering: every member; the start script drops itself. */}}
{{- define "mirrorq.allPeers" -}}
{{- $full := include "mirrorq.fullname" . -}}
{{- $svc := include "mirrorq.headless" . -}}
{{- $ns := .Release.Namespace -}}
{{- $port := int .Values.ports.raft -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.replicas) -}}
{{- $peers = append $peers (printf "%s-%d=%s-%d.%s.%s.svc.cluster.local:%d" $full $i $full $i $svc $ns $port) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{/* A TOML value: strings quoted, whole numbers as integers (values.yaml numbers are
float64, and Go prints 419430400.0 as 4.194304e+08), everything else as is. */}}
{{- define "mirrorq.tomlValue" -}}
{{- if kindIs "string" . -}}{{ . | quote }}{{- else if kindIs "bool" . -}}{{ ternary "true" "false" . }}
{{- else if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- end -}}
