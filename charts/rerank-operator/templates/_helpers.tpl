{{/* Names, labels and the operator's command line. */}}

{{- define "rerank-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rerank-operator.fullname" -}}
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

{{- define "rerank-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rerank-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rerank-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rerank-operator.labels" -}}
helm.sh/chart: {{ include "rerank-operator.chart" . }}
{{ include "rerank-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rerank
app.kubernetes.io/component: operator
{{- end }}

{{- define "rerank-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rerank-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rerank-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The operator's RBAC rules: operator/rerank_operator/rbac_rules.yaml (a list of PolicyRules), reached through the
files/rbac_rules.yaml symlink so the chart and the operator share one file.
*/}}
{{- define "rerank-operator.rbacRules" -}}
{{- $raw := .Files.Get "files/rbac_rules.yaml" }}
{{- if not $raw }}
{{- fail "files/rbac_rules.yaml is missing or empty (a symlink to operator/rerank_operator/rbac_rules.yaml)" }}
{{- end }}
{{- $rules := fromYamlArray $raw }}
{{- if or (not $rules) (kindIs "string" (first $rules)) }}
{{- fail (printf "files/rbac_rules.yaml must be a YAML list of PolicyRules: %v" $rules) }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{/*
The leader-election Lease's rules: operator/rerank_operator/rbac_leader_election.yaml, through the
files/rbac_leader_election.yaml symlink (the cluster tests bind the same file).
*/}}
{{- define "rerank-operator.leaderElectionRules" -}}
{{- $raw := .Files.Get "files/rbac_leader_election.yaml" }}
{{- if not $raw }}
{{- fail "files/rbac_leader_election.yaml is missing or empty (a symlink to operator/rerank_operator/rbac_leader_election.yaml)" }}
{{- end }}
{{- $rules := fromYamlArray $raw }}
{{- if or (not $rules) (kindIs "string" (first $rules)) }}
{{- fail (printf "files/rbac_leader_election.yaml must be a YAML list of PolicyRules: %v" $rules) }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{/*
The rules split by scope, as YAML {"namespaced": [...], "cluster": [...]}: in namespaced mode the first go into a
Role per watched namespace, the second (kopf's CRD and namespace discovery, cluster-scoped kinds of our own CRDs)
into a ClusterRole, since a Role cannot grant cluster-scoped resources. A rule mixing both kinds is refused.
*/}}
{{- define "rerank-operator.rbacRulesByScope" -}}
{{- $clusterScoped := list "customresourcedefinitions" "namespaces" "nodes" "persistentvolumes" "storageclasses" "clusterroles" "clusterrolebindings" "priorityclasses" "ingressclasses" "gatewayclasses" "runtimeclasses" "apiservices" "mutatingwebhookconfigurations" "validatingwebhookconfigurations" "validatingadmissionpolicies" "validatingadmissionpolicybindings" "tokenreviews" "subjectaccessreviews" "selfsubjectaccessreviews" "selfsubjectrulesreviews" "certificatesigningrequests" "csidrivers" "csinodes" "volumeattachments" "componentstatuses" }}
{{- range $path, $_ := .Files.Glob "crds/*.yaml" }}
{{- $crd := $.Files.Get $path | fromYaml }}
{{- if eq (dig "spec" "scope" "" $crd) "Cluster" }}
{{- $clusterScoped = append $clusterScoped $crd.spec.names.plural }}
{{- end }}
{{- end }}
{{- $namespaced := list }}
{{- $cluster := list }}
{{- range $rule := include "rerank-operator.rbacRules" . | fromYamlArray }}
{{- $n := 0 }}
{{- range $rule.resources }}
{{- if has (first (splitList "/" .)) $clusterScoped }}{{ $n = add1 $n }}{{ end }}
{{- end }}
{{- if eq $n 0 }}
{{- $namespaced = append $namespaced $rule }}
{{- else if eq $n (len $rule.resources) }}
{{- $cluster = append $cluster $rule }}
{{- else }}
{{- fail (printf "rbac_rules.yaml: a rule mixes cluster-scoped and namespaced resources: %v" $rule.resources) }}
{{- end }}
{{- end }}
{{- toYaml (dict "namespaced" $namespaced "cluster" $cluster) }}
{{- end }}

{{/*
TEI pods, as the operator labels them (operator/rerank_operator/core/names.py: LABEL_NAME=APP_NAME on every child,
LABEL_POOL on pool pods only; tests/unit/project/test_chart.py checks these names against that module).
*/}}
{{- define "rerank-operator.teiSelector" -}}
matchLabels:
  app.kubernetes.io/name: rerankmodel
matchExpressions:
  - key: rerank.io/pool
    operator: In
    values: [cpu, gpu]
{{- end }}

{{/* TEI's container port name, and the Prometheus meta labels of the pool and model pod labels. */}}
{{- define "rerank-operator.teiPortName" -}}
http
{{- end }}

{{- define "rerank-operator.frontMetricsPortName" -}}
sampler-metrics
{{- end }}

{{- define "rerank-operator.teiPoolLabelMeta" -}}
__meta_kubernetes_pod_label_rerank_io_pool
{{- end }}

{{- define "rerank-operator.teiModelLabelMeta" -}}
__meta_kubernetes_pod_label_app_kubernetes_io_instance
{{- end }}
