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
{{- else if and (eq .Values.slurm.driver "slinky") .Values.slurm.slurmrestd.url .Values.slurm.slurmrestd.tokenSecret.name }}
{{- /* Slinky drains through Kubernetes; jobs are listed and signalled through slurmrestd */}}
- {{ printf "--slurmrestd-url=%s" .Values.slurm.slurmrestd.url | quote }}
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
- {{ printf "--kube-api-qps=%v" .Values.kubeApi.qps | quote }}
- {{ printf "--kube-api-burst=%v" (int .Values.kubeApi.burst) | quote }}
- {{ printf "--http-host=%s" .Values.http.host | quote }}
- {{ printf "--http-port=%v" (int .Values.httpPort) | quote }}
{{- if .Values.http.debugState }}
- --debug-state
{{- end }}
{{- if (include "healer.policyNeeds" . | fromJson).webhooks }}
- {{ printf "--callback-url=%s" (include "healer.callbackUrl" .) | quote }}
{{- end }}
- {{ printf "--log-level=%s" .Values.log.level | quote }}
- {{ printf "--log-format=%s" .Values.log.format | quote }}
{{- if .Values.dryRun }}
- --dry-run
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* What the policies in .Values.policies ask of the installation, as JSON:
  secrets:     {namespace: [name, ...]}  the webhook hooks' HMAC Secrets (secretRef; the
                                         dead-node fencing webhook's too)
  configMaps:  {namespace: [name, ...]}  the Job hooks' templates (jobTemplate)
  webhooks:    true when any policy has a webhook hook (the ack callback is then passed)
  slurmSignal: ["file: policy", ...]     enabled slurm-signal checkpoints of policies that are
                                         not `mode: observe` (they will signal Slurm jobs)
  slurmNamespaces: [namespace, ...]      the Slinky NodeSets' namespaces of the SlurmNodeSet
                                         documents (slurmd pods, NodeSets read there)
RemediationPolicy documents count for the hooks; SlurmNodeSet documents for their NodeSet's
namespace and their slurmrestd token Secret (into secrets). A document that does not parse is
left to healer's own validation (the controller refuses it with file:line). */}}
{{- define "healer.policyNeeds" -}}
{{- $secrets := dict -}}
{{- $cms := dict -}}
{{- $signal := list -}}
{{- $webhooks := false -}}
{{- $slurmNs := list -}}
{{- range $file, $text := .Values.policies -}}
{{- range $doc := regexSplit "(?m)^---[ \\t]*$" (toString $text) -1 -}}
{{- $p := fromYaml $doc -}}
{{- if and $p (eq (toString (get $p "kind")) "SlurmNodeSet") -}}
{{- $spec := get $p "spec" | default dict -}}
{{- $ref := get $spec "nodeSet" | default dict -}}
{{- if get $ref "namespace" -}}
{{- $slurmNs = append $slurmNs (toString (get $ref "namespace")) | uniq | sortAlpha -}}
{{- end -}}
{{- $token := toString (get (get $spec "slurm" | default dict) "tokenSecret" | default "") -}}
{{- $parts := splitList "/" ((splitList ":" $token) | first) -}}
{{- if eq (len $parts) 2 -}}
{{- $_ := set $secrets (index $parts 0) (append (get $secrets (index $parts 0) | default list) (index $parts 1) | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- if and $p (eq (toString (get $p "kind")) "RemediationPolicy") -}}
{{- $spec := get $p "spec" | default dict -}}
{{- $steps := get $spec "steps" | default dict -}}
{{- $cp := get $steps "checkpoint" | default dict -}}
{{- $rp := get $steps "repair" | default dict -}}
{{- $hooks := list -}}
{{- if get $cp "enabled" -}}{{- $hooks = append $hooks $cp -}}{{- end -}}
{{- $hooks = append $hooks $rp -}}
{{- $dead := get $spec "deadNode" | default dict -}}
{{- $fence := get $dead "fencing" | default dict -}}
{{- if and (ne (toString (get $dead "enabled")) "false") (has "webhook" (get $fence "providers" | default list)) -}}
{{- $hooks = append $hooks (dict "hook" "webhook" "secretRef" (get $fence "secretRef")) -}}
{{- end -}}
{{- range $h := $hooks -}}
{{- $kind := toString (get $h "hook") -}}
{{- if and (eq $kind "webhook") (get $h "secretRef") -}}
{{- $webhooks = true -}}
{{- $ref := (splitList ":" (toString (get $h "secretRef"))) | first -}}
{{- $parts := splitList "/" $ref -}}
{{- if eq (len $parts) 2 -}}
{{- $_ := set $secrets (index $parts 0) (append (get $secrets (index $parts 0) | default list) (index $parts 1) | uniq | sortAlpha) -}}
{{- end -}}
{{- else if eq $kind "webhook" -}}
{{- $webhooks = true -}}
{{- else if and (eq $kind "job") (get $h "jobTemplate") -}}
{{- $parts := splitList "/" (toString (get $h "jobTemplate")) -}}
{{- if eq (len $parts) 2 -}}
{{- $_ := set $cms (index $parts 0) (append (get $cms (index $parts 0) | default list) (index $parts 1) | uniq | sortAlpha) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $mode := toString (get $spec "mode" | default "observe") -}}
{{- $cpHook := toString (get $cp "hook" | default "slurm-signal") -}}
{{- if and (get $cp "enabled") (eq $cpHook "slurm-signal") (ne $mode "observe") -}}
{{- $meta := get $p "metadata" | default dict -}}
{{- $signal = append $signal (printf "%s: %s" $file (toString (get $meta "name"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- dict "secrets" $secrets "configMaps" $cms "webhooks" $webhooks "slurmSignal" $signal "slurmNamespaces" $slurmNs | toJson -}}
{{- end -}}

{{/* Does the controller reach Slurm's job API (to list and signal jobs)? slurmrestd: always;
slinky: with slurm.slurmrestd.url and its token Secret (or scontrol in a custom image);
scontrol: only in an image that carries the Slurm client. */}}
{{- define "healer.slurmJobsReachable" -}}
{{- $s := .Values.slurm -}}
{{- if eq $s.driver "slurmrestd" -}}true
{{- else if and (eq $s.driver "slinky") $s.slurmrestd.url $s.slurmrestd.tokenSecret.name -}}true
{{- else if and $s.clientInImage $s.slurmConf -}}true
{{- end -}}
{{- end -}}

{{/* Refuse what cannot work as installed, with the reason and the fix. */}}
{{- define "healer.checks" -}}
{{- $needs := include "healer.policyNeeds" . | fromJson -}}
{{- $s := .Values.slurm -}}
{{- if and (eq $s.driver "scontrol") (not $s.clientInImage) -}}
{{- fail "slurm.driver=scontrol runs scontrol inside the controller, and healer's image has no Slurm client: build an image with scontrol and munge, set slurm.clientInImage=true and slurm.slurmConf (mounted with extraVolumes), or use slurm.driver=slurmrestd or slinky" -}}
{{- end -}}
{{- if and $needs.slurmSignal (not (include "healer.slurmJobsReachable" .)) -}}
{{- fail (printf "the slurm-signal checkpoint of %s signals Slurm jobs, which slurm.driver=%s cannot reach as configured: set slurm.slurmrestd.url (Slinky: http://<restapi>-restapi.%s.svc:6820) and slurm.slurmrestd.tokenSecret.name (a Secret with a slurmrestd JWT, e.g. from a Slinky Token), or use a webhook or job checkpoint hook, or keep that policy at mode: observe" (join ", " $needs.slurmSignal) $s.driver $s.namespace) -}}
{{- end -}}
{{- end -}}

{{/* Where webhook receivers POST acks: hooks.callbackUrl, else the metrics Service. */}}
{{- define "healer.callbackUrl" -}}
{{- default (printf "http://%s-metrics.%s.svc:%v/v1/hooks/ack" (include "healer.fullname" .) .Release.Namespace (int .Values.service.port)) .Values.hooks.callbackUrl -}}
{{- end -}}
