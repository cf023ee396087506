{{/*
The release name (or fullnameOverride) names the namespaced objects, as --name does for
`dra-driver manifests`; the longest suffix (-simulated-node) must still leave a DNS label.
*/}}
{{- define "dra-driver.fullname" -}}
{{- $name := .Values.fullnameOverride | default .Release.Name -}}
{{- if gt (len $name) 48 -}}
{{- fail (printf "%s %q is longer than 48 characters: the object names made from it would not be valid" (ternary "fullnameOverride" "release name" (ne .Values.fullnameOverride "")) $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The service account the agent runs as: the chart's, or one the operator made. */}}
{{- define "dra-driver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "dra-driver.fullname" .) -}}
{{- else -}}
{{- required "serviceAccount.name: needed when serviceAccount.create is false (the account the agent runs as)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, behind global.imageRegistry when a parent chart or operator sets one. */}}
{{- define "dra-driver.image" -}}
{{- $repository := .Values.image.repository -}}
{{- with .Values.global.imageRegistry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "dra-driver.namespace" -}}
{{- .Values.namespaceOverride | default .Release.Namespace -}}
{{- end -}}

{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ .Values.nameOverride | default "dra-driver" }}
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

{{/*
extendedResources needs the DRAExtendedResource gate, on by default from Kubernetes 1.36: an
older API server drops extendedResourceName without a word and pods asking for nvidia.com/gpu
would wait forever, so the chart refuses (as `dra-driver manifests` does below
--kubernetes-version 1.36). `helm template` checks the version given with --kube-version.
*/}}
{{- define "dra-driver.checkExtendedResources" -}}
{{- if semverCompare "<1.36.0-0" .Capabilities.KubeVersion.Version -}}
{{- fail (printf "extendedResources.enabled: needs Kubernetes 1.36 or later, where the DRAExtendedResource feature gate is on by default (this cluster is %s; older API servers drop extendedResourceName)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/*
Every vGPU partition size of every node config, as YAML: zero-padded bytes (which sort as
numbers) -> the quantity in the API server's spelling (10Gi, 1536Mi), as devices/model.py's
quantity() writes it for whole MiB. Helm hands whole numbers over as floats, hence the int64.
*/}}
{{- define "dra-driver.vgpuPartitionSizes" -}}
{{- $factors := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $sizes := dict -}}
{{- range $name, $config := .Values.nodeConfigs -}}
{{- $entries := list (dig "default" dict ($config | default dict)) -}}
{{- $entries = concat $entries (dig "gpus" list ($config | default dict)) -}}
{{- range $entries -}}
{{- range (dig "vgpu" "partitions" list .) -}}
{{- $memory := .memory -}}
{{- $text := kindIs "string" $memory | ternary $memory (printf "%d" (int64 $memory)) -}}
{{- if not (regexMatch "^(0|[1-9][0-9]*)(Ki|Mi|Gi|Ti|k|M|G|T)?$" $text) -}}
{{- fail (printf "nodeConfigs.%s: vgpu partition memory %q is not a whole number of bytes such as 10Gi, 512Mi or 1073741824" $name $text) -}}
{{- end -}}
{{- $digits := regexFind "^[0-9]+" $text -}}
{{- $bytes := mul (int64 $digits) (get $factors (trimPrefix $digits $text)) -}}
{{- if or (eq (int64 $bytes) 0) (ne (mod $bytes 1048576) 0) -}}
{{- fail (printf "nodeConfigs.%s: vgpu partition memory %q must be a positive whole number of MiB" $name $text) -}}
{{- end -}}
{{- $quantity := printf "%dMi" (div $bytes 1048576) -}}
{{- if eq (mod $bytes 1099511627776) 0 -}}
{{- $quantity = printf "%dTi" (div $bytes 1099511627776) -}}
{{- else if eq (mod $bytes 1073741824) 0 -}}
{{- $quantity = printf "%dGi" (div $bytes 1073741824) -}}
{{- end -}}
{{- $_ := set $sizes (printf "%020d" (int64 $bytes)) $quantity -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $sizes -}}
{{- end -}}

{{/*
Two gpus[] entries with the same selector (index 0 twice, one model twice) configure the same
GPUs twice: the agent would leave those GPUs out, so the install fails instead. Index and UUID
entries that name one GPU are left to the node, which alone knows the UUIDs.
*/}}
{{- define "dra-driver.checkNodeConfigs" -}}
{{- range $name, $config := .Values.nodeConfigs -}}
{{- $seen := dict -}}
{{- range $number, $entry := (dig "gpus" list ($config | default dict)) -}}
{{- range $selector := list "index" "uuid" "model" "productName" -}}
{{- if hasKey $entry $selector -}}
{{- $key := printf "%s %v" $selector (get $entry $selector) -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "nodeConfigs.%s.gpus[%d]: %s is already configured by gpus[%d]" $name $number $key (get $seen $key)) -}}
{{- end -}}
{{- $_ := set $seen $key $number -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The DaemonSet selects its pods by the selector labels: a podLabels entry that changed one would
leave the pods unselected (the API server refuses such a DaemonSet), so it is refused here with
its name.
*/}}
{{- define "dra-driver.checkPodLabels" -}}
{{- $selector := include "dra-driver.selectorLabels" . | fromYaml -}}
{{- range $key, $_ := .Values.podLabels -}}
{{- if hasKey $selector $key -}}
{{- fail (printf "podLabels.%s: set by the chart itself (the DaemonSet's selector)" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
