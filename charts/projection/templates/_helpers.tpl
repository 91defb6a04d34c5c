{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "projection.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Base name of every object: the release name when it already says "projection", else
"<release>-projection". Component names append "-controller" / "-webhook", so the base leaves room.
*/}}
{{- define "projection.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else if contains (include "projection.name" .) .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "projection.name" .) | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "projection.controller.fullname" -}}
{{- printf "%s-controller" (include "projection.fullname" .) }}
{{- end }}

{{- define "projection.webhook.fullname" -}}
{{- printf "%s-webhook" (include "projection.fullname" .) }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "projection.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "projection.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: projection
{{- end }}

{{/* Selector labels of a component; call with (dict "root" $ "component" "controller"). */}}
{{- define "projection.selectorLabels" -}}
app.kubernetes.io/name: {{ include "projection.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "projection.componentLabels" -}}
{{ include "projection.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* ServiceAccount names. */}}
{{- define "projection.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "projection.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "projection.webhook.serviceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create }}
{{- default (include "projection.webhook.fullname" .) .Values.webhook.serviceAccount.name }}
{{- else }}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference of a component: call with (dict "root" $ "image" .Values.controller.image). */}}
{{- define "projection.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* Name of the Secret holding the webhook's serving certificate, in every certificate mode. */}}
{{- define "projection.webhook.tlsSecretName" -}}
{{- if eq .Values.webhook.certificate.mode "provided" }}
{{- required "webhook.certificate.provided.secretName is required in the provided mode" .Values.webhook.certificate.provided.secretName }}
{{- else }}
{{- printf "%s-tls" (include "projection.webhook.fullname" .) }}
{{- end }}
{{- end }}

{{/* Name of the cert-manager Issuer: the user's, or the self-signed one the chart creates. */}}
{{- define "projection.webhook.issuerName" -}}
{{- default (printf "%s-selfsigned" (include "projection.webhook.fullname" .)) .Values.webhook.certificate.certManager.issuerRef.name }}
{{- end }}

{{/*
Who creates and updates copies: "author" (impersonated) or "controller", from
controller.writeCopiesAs, authorAccess and the cluster's version (constrained impersonation is beta
and on by default from v1.36).
*/}}
{{- define "projection.copyWriter" -}}
{{- $asked := .Values.controller.writeCopiesAs | default "auto" -}}
{{- if not (has $asked (list "auto" "author" "controller")) -}}
{{- fail (printf "controller.writeCopiesAs must be auto, author or controller, not %q" $asked) -}}
{{- end -}}
{{- if eq .Values.authorAccess "trusted" -}}
controller
{{- else if ne $asked "auto" -}}
{{ $asked }}
{{- else if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}
author
{{- else -}}
controller
{{- end -}}
{{- end }}

{{/*
Rules for the kinds the operator may project, from supportedKinds. "*" in apiGroup or resources is
kept as the wildcard; everything else is listed as given.
*/}}
{{- define "projection.supportedKindRules" -}}
{{- range $i, $kind := .kinds }}
- apiGroups: [{{ $kind.apiGroup | quote }}]
  resources: {{ toJson $kind.resources }}
  verbs: {{ toJson $.verbs }}
{{- end }}
{{- end }}

{{/* Pod-level knobs shared by both Deployments; call with the component's values. */}}
{{- define "projection.podPlacement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The Secret both components serve /metrics over HTTPS with (metrics.tls.enabled): the one named, or
the one the chart's Certificate fills in the cert-manager mode.
*/}}
{{- define "projection.metrics.tlsSecretName" -}}
{{- if .Values.metrics.tls.secretName }}
{{- .Values.metrics.tls.secretName }}
{{- else if eq .Values.webhook.certificate.mode "cert-manager" }}
{{- printf "%s-metrics-tls" (include "projection.fullname" .) }}
{{- else }}
{{- fail "metrics.tls.enabled needs metrics.tls.secretName (a kubernetes.io/tls Secret with ca.crt, valid for both metrics Services) unless webhook.certificate.mode is cert-manager, which issues one" }}
{{- end }}
{{- end }}

{{/*
The arguments, mount and volume that serve a component's /metrics over HTTPS.
*/}}
{{- define "projection.metrics.tlsArgs" -}}
{{- if .Values.metrics.tls.enabled }}
- --metrics-cert-file=/metrics-tls/tls.crt
- --metrics-key-file=/metrics-tls/tls.key
{{- end }}
{{- end }}
{{- define "projection.metrics.tlsMount" -}}
- name: metrics-tls
  mountPath: /metrics-tls
  readOnly: true
{{- end }}
{{- define "projection.metrics.tlsVolume" -}}
- name: metrics-tls
  secret:
    secretName: {{ include "projection.metrics.tlsSecretName" . }}
{{- end }}
