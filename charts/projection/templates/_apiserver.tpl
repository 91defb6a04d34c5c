{{/*
The apiserver as this cluster's pods see it, as JSON lists of CIDR blocks (consumers use
fromJsonArray). Looked up in the cluster at install and upgrade when apiServer.lookup is on; `helm
template` and client-side dry runs cannot look anything up and see only the configured blocks.
*/}}

{{/* An address as a block of one: /32, or /128 for IPv6. */}}
{{- define "projection.apiServer.block" -}}
{{- if contains ":" . }}{{ . }}/128{{ else }}{{ . }}/32{{ end }}
{{- end }}

{{/*
Where the apiserver's calls to the webhook come from: apiServer.cidrs, and the addresses of the
`kubernetes` Service's EndpointSlices (the apiservers' advertised addresses).
*/}}
{{- define "projection.apiServer.sources" -}}
{{- $blocks := list }}
{{- range .Values.apiServer.cidrs }}
{{- $blocks = append $blocks . }}
{{- end }}
{{- if .Values.apiServer.lookup }}
{{- $slices := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "" }}
{{- range (get $slices "items" | default list) }}
{{- if eq (get (.metadata.labels | default dict) "kubernetes.io/service-name") "kubernetes" }}
{{- range (.endpoints | default list) }}
{{- range (.addresses | default list) }}
{{- $blocks = append $blocks (include "projection.apiServer.block" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $blocks | uniq | toJson }}
{{- end }}

{{/*
Where pods reach the apiserver: its sources above, networkPolicy.apiServer.cidrs, and the
`kubernetes` Service's ClusterIPs (policy evaluated before the Service's address translation).
*/}}
{{- define "projection.apiServer.destinations" -}}
{{- $blocks := include "projection.apiServer.sources" . | fromJsonArray }}
{{- range .Values.networkPolicy.apiServer.cidrs }}
{{- $blocks = append $blocks . }}
{{- end }}
{{- if .Values.apiServer.lookup }}
{{- $service := lookup "v1" "Service" "default" "kubernetes" }}
{{- range (dig "spec" "clusterIPs" list $service) }}
{{- $blocks = append $blocks (include "projection.apiServer.block" .) }}
{{- end }}
{{- end }}
{{- $blocks | uniq | toJson }}
{{- end }}
