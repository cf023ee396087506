{{/*
The release name names the namespaced objects, as --name does for `dra-driver manifests`; the
longest suffix (-simulated-node) must still leave a DNS label.
*/}}
{{- define "dra-driver.fullname" -}}
{{- if gt (len .Release.Name) 48 -}}
{{- fail (printf "release name %q is longer than 48 characters: the object names made from it would not be valid" .Release.Name) -}}
{{- end -}}
{{- .Release.Name -}}
{{- end -}}

{{- define "dra-driver.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: dra-driver
app.kubernetes.io/instance: {{ include "dra-driver.fullname" . }}
{{- end -}}

{{- define "dra-driver.labels" -}}
{{ include "dra-driver.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The DeviceClass of one device type: gpu.dra-driver.dev, mig.dra-driver.dev, ... */}}
{{- define "dra-driver.className" -}}
{{- $type := index . 0 -}}
{{- $root := index . 1 -}}
{{- printf "%s.%s" $type (trimPrefix "gpu." $root.Values.driverName) -}}
{{- end -}}

{{- define "dra-driver.clusterRoleName" -}}
{{- printf "%s-node-agent" .Values.driverName -}}
{{- end -}}

{{- define "dra-driver.policyName" -}}
{{- printf "%s-node-slices" .Values.driverName -}}
{{- end -}}

{{/*
Refuses a driverName whose DeviceClass another installation owns: two installations under one
driver name would share sockets and ResourceSlices on every node. Needs the cluster (lookup),
so `helm template` does not check it.
*/}}
{{- define "dra-driver.checkDriverName" -}}
{{- $class := include "dra-driver.className" (list "gpu" .) -}}
{{- $existing := lookup "resource.k8s.io/v1" "DeviceClass" "" $class -}}
{{- if $existing -}}
{{- $annotations := $existing.metadata.annotations | default dict -}}
{{- $release := index $annotations "meta.helm.sh/release-name" | default "" -}}
{{- $namespace := index $annotations "meta.helm.sh/release-namespace" | default "" -}}
{{- if or (ne $release .Release.Name) (ne $namespace .Release.Namespace) -}}
{{- $owner := ternary "an installation not made by Helm (dra-driver manifests?)" (printf "release %s in namespace %s" $release $namespace) (eq $release "") -}}
{{- fail (printf "driverName: %s is already installed by %s; give release %s its own driverName (e.g. gpu.%s.example.com)" .Values.driverName $owner .Release.Name .Release.Name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
