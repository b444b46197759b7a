{{/* Chart name, truncated to 63 chars. */}}
{{- define "mirrorq.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release name unless it already contains the chart name. It names the
MirrorqCluster, so the operator's pods are <fullname>-N. */}}
{{- define "mirrorq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The default user's Secret (username, password, admin-token). */}}
{{- define "mirrorq.secretName" -}}
{{- default (include "mirrorq.fullname" .) .Values.auth.existingSecret -}}
{{- end -}}

{{/* raftTls.secretName, "" when Raft TLS is off (also when raftTls is unset). */}}
{{- define "mirrorq.raftTlsSecret" -}}
{{- with .Values.raftTls -}}{{- .secretName | default "" -}}{{- end -}}
{{- end -}}

{{/* tls.secretName (AMQP over TLS), "" when off. */}}
{{- define "mirrorq.tlsSecret" -}}
{{- with .Values.tls -}}{{- .secretName | default "" -}}{{- end -}}
{{- end -}}

{{- define "mirrorq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mirrorq
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The labels the operator puts on everything it builds for the cluster
(operator/mirrorq_operator/builders.py labels()). */}}
{{- define "mirrorq.clusterLabels" -}}
app.kubernetes.io/name: mirrorq
app.kubernetes.io/instance: {{ include "mirrorq.fullname" . }}
app.kubernetes.io/managed-by: mirrorq-operator
{{- end -}}

{{- define "mirrorq.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorq.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "mirrorq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The operator's image: its own values where set, else the broker's (one image
with both entry points, what `make image` builds). */}}
{{- define "mirrorq.operatorImage" -}}
{{- $op := .Values.operator.image | default dict -}}
{{- if $op.repository -}}
{{- printf "%s:%s" $op.repository (default .Chart.AppVersion $op.tag) -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (default .Values.image.tag $op.tag)) -}}
{{- end -}}
{{- end -}}

{{- define "mirrorq.operatorPullPolicy" -}}
{{- default (default "IfNotPresent" .Values.image.pullPolicy) (.Values.operator.image | default dict).pullPolicy -}}
{{- end -}}

{{/* node.toml keys read as fractional seconds (node/app/config_file.py): a whole number is
written "1.0" there. Any other whole number is written as an integer ("60", never
"60.0" nor Go's "4.194304e+08" for values.yaml's float64 419430400), which the node
refuses for none of its number keys. tests/k8s/test_chart.py checks this list. */}}
{{- define "mirrorq.floatKeys" -}}
login_failure_window login_failure_delay login_failure_max_delay handshake_timeout raft.election_min raft.election_max raft.leader_fallback raft.tick_interval raft.out_of_sync_after raft.block_after raft.nack_after raft.compaction_min_time raft.compaction_min_gap
{{- end -}}

{{/* One spec.config value as a string. Call with (list KEY VALUE ROOT). */}}
{{- define "mirrorq.configValue" -}}
{{- $key := index . 0 -}}{{- $v := index . 1 -}}{{- $root := index . 2 -}}
{{- $whole := or (kindIs "int" $v) (kindIs "int64" $v) (and (kindIs "float64" $v) (eq (float64 (int64 $v)) $v)) -}}
{{- if kindIs "bool" $v -}}{{ ternary "true" "false" $v }}
{{- else if $whole -}}
{{- if has $key (splitList " " (include "mirrorq.floatKeys" $root)) -}}{{ printf "%d.0" (int64 $v) }}{{- else -}}{{ int64 $v }}{{- end -}}
{{- else -}}{{ toString $v }}
{{- end -}}
{{- end -}}

{{/* spec.config: .Values.config then .Values.extraConfig, tables flattened to dotted
keys (raft: {election_min: 1.0} -> raft.election_min: "1.0"), every value a string. */}}
{{- define "mirrorq.config" -}}
{{- $out := dict -}}
{{- range $src := list .Values.config .Values.extraConfig -}}
{{- range $k, $v := $src -}}
{{- if kindIs "map" $v -}}
{{- range $k2, $v2 := $v -}}
{{- $key := printf "%s.%s" $k $k2 -}}
{{- $_ := set $out $key (include "mirrorq.configValue" (list $key $v2 $)) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $out $k (include "mirrorq.configValue" (list $k $v $)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $lines := list -}}
{{- range $k, $v := $out -}}
{{- $lines = append $lines (printf "%s: %s" ($k | quote) ($v | quote)) -}}
{{- end -}}
{{- join "\n" $lines -}}
{{- end -}}
