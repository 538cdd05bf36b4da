{{/* HCS's image: every console script of the hcsd package is in it. HCS publishes no
image: the operator builds it (make image) and pushes it to a registry of their own, so there
is no default to pull from a name someone else may own. A digest, when given, pins it. */}}
{{- define "hcs.image" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is required: HCS publishes no image. Build it with `make image`, push it to your registry and set image.repository (and image.digest to pin it): docs/images.md" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .Values.image.digest) -}}
{{- fail (printf "image.digest must be sha256:<64 hex digits>, not %q" .Values.image.digest) -}}
{{- end -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The upstream kube-scheduler at the cluster's release (managed clusters report versions
such as v1.33.5-eks-3025e55: only major.minor.patch names an upstream image). */}}
{{- define "hcs.schedulerImage" -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{ .Values.scheduler.image.repository }}:{{ .Values.scheduler.image.tag | default (printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch) }}
{{- end }}

{{/* The extender's Service name in this namespace: its serving certificate names it. */}}
{{- define "hcs.extenderHost" -}}
hcs-scheduler-extender.{{ .Release.Namespace }}.svc
{{- end }}

{{/* Fails the render for values that cannot work, before anything is installed. */}}
{{- define "hcs.validate" -}}
{{- if not (has .Values.mode (list "extender" "dra")) -}}
{{- fail (printf "mode: %q is not a mode (extender or dra)" .Values.mode) -}}
{{- end -}}
{{- if and (eq .Values.mode "dra") (not (has .Values.dra.deviceTaintEffect (list "NoSchedule" "NoExecute"))) -}}
{{- fail (printf "dra.deviceTaintEffect must be NoSchedule or NoExecute, not %q" .Values.dra.deviceTaintEffect) -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not .Values.scheduler.enabled) (eq .Values.mode "extender") -}}
{{- fail "webhook.enabled sends pods to scheduler.name, which scheduler.enabled=false does not run" -}}
{{- end -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.tls.generate) (not .Values.webhook.tls.caBundle) -}}
{{- fail "webhook.tls.generate=false needs webhook.tls.caBundle (the base64 PEM of the CA that signed its certificate)" -}}
{{- end -}}
{{- if and (eq (toString .Values.runtimeProfiles.enabled) "true") (not .Values.requeue.enabled) (eq .Values.mode "extender") -}}
{{- fail "runtimeProfiles.enabled needs requeue.enabled: the extender sets a profile's image with the `patch pods` and the policy hcs-extender-requeue that requeue.enabled=false drops (set runtimeProfiles.enabled=false too, or keep requeue on)" -}}
{{- end -}}
{{- if not (has .Values.webhook.failurePolicy (list "Fail" "Ignore")) -}}
{{- fail (printf "webhook.failurePolicy must be Fail or Ignore, not %q" .Values.webhook.failurePolicy) -}}
{{- end -}}
{{- end }}

{{/* "true" when RuntimeProfiles are on, "" when off. runtimeProfiles.enabled unset (null, the
default) follows requeue in mode extender, whose `patch pods` and policy the extender sets a
profile's image with: an install that turned requeue off keeps working on upgrade, with
profiles off. In mode dra, unset means on. An explicit true or false is taken as it is. */}}
{{- define "hcs.runtimeProfiles" -}}
{{- $v := .Values.runtimeProfiles.enabled -}}
{{- if kindIs "invalid" $v -}}
{{- if or .Values.requeue.enabled (ne .Values.mode "extender") }}true{{ end -}}
{{- else if $v }}true{{ end -}}
{{- end }}

{{/* hcs-scheduler's KubeSchedulerConfiguration (scheduler.yaml). */}}
{{- define "hcs.schedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceName: {{ .Values.scheduler.name }}
  resourceNamespace: {{ .Release.Namespace }}
profiles:
  - schedulerName: {{ .Values.scheduler.name }}
extenders:
  - urlPrefix: {{ include "hcs.extenderURL" (list . "extender" 8888) }}/
    filterVerb: filter
    prioritizeVerb: prioritize
    bindVerb: bind
    weight: {{ .Values.scheduler.extenderWeight }}
    enableHTTPS: true
    tlsConfig:
      certFile: /etc/hcs-scheduler-tls/tls.crt
      keyFile: /etc/hcs-scheduler-tls/tls.key
      caFile: /etc/hcs-scheduler-tls/ca.crt
    nodeCacheCapable: true
    httpTimeout: {{ .Values.scheduler.extenderTimeout }}
    ignorable: false
    managedResources:
      - {name: ai.compute/vram, ignoredByScheduler: true}
      - {name: ai.compute/tflops-fp16, ignoredByScheduler: true}
      - {name: ai.compute/devices, ignoredByScheduler: true}
{{- end }}

{{/* The extender's URL for a port: its Service name and the Service's port, or (for clusters
without kube-proxy/cluster DNS) extenderAddress and the port the pod listens on. Called with
(list $ "<ports key>" <Service port>). */}}
{{- define "hcs.extenderURL" -}}
{{- $ := index . 0 -}}
{{- if $.Values.extenderAddress -}}
https://{{ $.Values.extenderAddress }}:{{ index $.Values.ports (index . 1) }}
{{- else -}}
https://{{ include "hcs.extenderHost" $ }}:{{ index . 2 }}
{{- end -}}
{{- end }}

{{/* The API server's address in a pod's environment, for clusters without kube-proxy
(kubernetesAPI); nothing otherwise. */}}
{{- define "hcs.apiEnv" -}}
{{- with .Values.kubernetesAPI.host -}}
- {name: KUBERNETES_SERVICE_HOST, value: {{ . | quote }}}
{{ end -}}
{{- with .Values.kubernetesAPI.port -}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ . | toString | quote }}}
{{ end -}}
{{- end }}
