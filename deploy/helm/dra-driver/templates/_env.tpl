{{/*
The agent container's own environment, as YAML. An extraEnv entry of the same name would come
after it and win (Kubernetes takes the last), so dra-driver.checkExtraEnv refuses one: the list
of names it checks is this one, so it cannot go stale.
*/}}
{{- define "dra-driver.agentEnv" -}}
{{- $name := include "dra-driver.fullname" . }}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: DRA_DRIVER_NAME
  value: {{ .Values.driverName | quote }}
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: DRA_DRIVER_HARDWARE
  value: {{ ternary "simulated:/etc/dra-driver/simulated-node/simulated-node.yaml" .Values.hardware (not (empty .Values.simulatedNode)) | quote }}
- name: DRA_DRIVER_ROOT
  value: /driver-root
- name: DRA_DRIVER_HOST_ROOT
  value: {{ .Values.driverRoot | quote }}
- name: NVIDIA_VISIBLE_DEVICES
  value: void
- name: DRA_DRIVER_REGISTRAR_DIR
  value: {{ .Values.kubeletRegistrarDir | quote }}
- name: DRA_DRIVER_PLUGINS_DIR
  value: {{ .Values.kubeletPluginsDir | quote }}
- name: DRA_DRIVER_MPS_DIR
  value: {{ printf "%s/mps" (printf "/run/%s" $name) | quote }}
- name: DRA_DRIVER_METRICS_ADDRESS
  value: {{ printf ":%v" .Values.metrics.port | quote }}
- name: DRA_DRIVER_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: DRA_DRIVER_VERBOSITY
  value: {{ .Values.logVerbosity | toString | quote }}
# MPS control daemons in pods of their own, from this image, in this namespace.
- name: DRA_DRIVER_MPS_DAEMONS
  value: pod
- name: DRA_DRIVER_MPS_DAEMON_IMAGE
  value: {{ include "dra-driver.image" . | quote }}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- if .Values.nodeConfigs }}
- name: DRA_DRIVER_NODE_CONFIGS
  value: /etc/dra-driver/node-configs
{{- end }}
{{- with .Values.hamiCore.library }}
- name: DRA_DRIVER_HAMI_CORE_LIBRARY
  value: {{ . | quote }}
- name: DRA_DRIVER_HAMI_CORE_DIR
  value: {{ (printf "/var/lib/%s/vgpu" $name) | quote }}
{{- end }}
{{- if .Values.flushRecords }}
- name: DRA_DRIVER_FLUSH_RECORDS
  value: "true"
{{- end }}
- name: DRA_DRIVER_USAGE_INTERVAL
  value: {{ .Values.usage.interval | toString | quote }}
{{- if .Values.usage.interval }}
- name: DRA_DRIVER_POD_RESOURCES_SOCKET
  value: {{ printf "%s/kubelet.sock" .Values.usage.podResourcesDir | quote }}
{{- if .Values.usage.processes }}
- name: DRA_DRIVER_USAGE_PROCESSES
  value: "true"
{{- end }}
{{- end }}
{{- end -}}

{{- define "dra-driver.checkExtraEnv" -}}
{{- $taken := dict -}}
{{- range (include "dra-driver.agentEnv" . | fromYamlArray) -}}
{{- $_ := set $taken .name true -}}
{{- end -}}
{{- range $index, $entry := .Values.extraEnv -}}
{{- if hasKey $taken $entry.name -}}
{{- fail (printf "extraEnv[%d].name: %s is set by the chart itself (an entry of the same name would override it)" $index $entry.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
