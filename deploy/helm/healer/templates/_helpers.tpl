{{/* The chart name (nameOverride wins). */}}
{{- define "healer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The object name prefix: fullnameOverride, else the release name (+ the chart name unless the
release name already contains it). Release "healer" gives the names in deploy/. */}}
{{- define "healer.fullname" -}}
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

{{- define "healer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "healer.labels" -}}
helm.sh/chart: {{ include "healer.chart" . }}
{{ include "healer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: healer
{{- end -}}

{{- define "healer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "healer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The controller's pod selector. */}}
{{- define "healer.controllerSelectorLabels" -}}
{{ include "healer.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* The agent's pod selector. */}}
{{- define "healer.agentSelectorLabels" -}}
{{ include "healer.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "healer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "healer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "healer.agentName" -}}
{{- printf "%s-agent" (include "healer.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "healer.agentServiceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "healer.agentName" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "healer.policiesConfigMap" -}}
{{- printf "%s-policies" (include "healer.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "healer.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "healer.agentImage" -}}
{{- $repo := default .Values.image.repository .Values.agent.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.agent.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* The slurmrestd token Secret's namespace (default: the Slurm namespace). */}}
{{- define "healer.tokenSecretNamespace" -}}
{{- default .Values.slurm.namespace .Values.slurm.slurmrestd.tokenSecret.namespace -}}
{{- end -}}

{{/* NAMESPACE/NAME:KEY for --slurmrestd-token-secret; fails when the driver's settings are
missing (values.schema.json says the same). */}}
{{- define "healer.tokenSecretRef" -}}
{{- $s := .Values.slurm.slurmrestd.tokenSecret -}}
{{- $name := required "slurm.slurmrestd.tokenSecret.name is required when slurm.driver is slurmrestd" $s.name -}}
{{- printf "%s/%s:%s" (include "healer.tokenSecretNamespace" .) $name (default "SLURM_JWT" $s.key) -}}
{{- end -}}

{{/* The Lease name. */}}
{{- define "healer.leaseName" -}}
{{- default (printf "%s-leader" (include "healer.fullname" .)) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/* Arguments of `healer run`, built from the values. */}}
{{- define "healer.args" -}}
- run
- --policies=/etc/healer/policies
- {{ printf "--slurm-driver=%s" .Values.slurm.driver | quote }}
- {{ printf "--slurm-namespace=%s" .Values.slurm.namespace | quote }}
{{- with .Values.slurm.nodeset }}
- {{ printf "--nodeset=%s" . | quote }}
{{- end }}
{{- if eq .Values.slurm.driver "slurmrestd" }}
- {{ printf "--slurmrestd-url=%s" (required "slurm.slurmrestd.url is required when slurm.driver is slurmrestd" .Values.slurm.slurmrestd.url) | quote }}
- {{ printf "--slurmrestd-token-secret=%s" (include "healer.tokenSecretRef" .) | quote }}
{{- end }}
{{- with .Values.slurm.slurmConf }}
- {{ printf "--slurm-conf=%s" . | quote }}
{{- end }}
{{- with .Values.prometheus.url }}
- {{ printf "--prometheus-url=%s" . | quote }}
{{- end }}
- {{ printf "--poll-interval=%v" .Values.prometheus.pollInterval | quote }}
- {{ printf "--lease-name=%s" (include "healer.leaseName" .) | quote }}
- {{ printf "--http-port=%v" (int .Values.httpPort) | quote }}
- {{ printf "--log-level=%s" .Values.log.level | quote }}
- {{ printf "--log-format=%s" .Values.log.format | quote }}
{{- if .Values.dryRun }}
- --dry-run
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
