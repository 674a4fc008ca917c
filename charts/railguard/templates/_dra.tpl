{{/* DRA (resource.k8s.io/v1, Kubernetes 1.37+): rail health as device taints.
     The names are api::dra's (claim_template_name, device_class_name); tests/tests/chart_dra.rs
     renders the chart and compares them with the Rust functions. */}}

{{/* Non-empty when the server serves DRA with DeviceTaintRule: resource.k8s.io/v1 has
     DeviceTaintRule from 1.37 on (DeviceClass and ResourceClaimTemplate from 1.34, but the
     taints that keep claims off a failed rail are what makes railguard's classes safe to
     use). `helm template` without --api-versions lists group/versions only, never a kind, so
     it renders nothing DRA; neither does a 1.20 server. */}}
{{- define "railguard.draServed" -}}
{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceTaintRule" -}}
true
{{- end -}}
{{- end -}}

{{/* Non-empty when the fleet controller keeps DeviceTaintRules: DRA is served and
     dra.deviceTaints (opt-in). Its RBAC for them is rendered only then. */}}
{{- define "railguard.draTaints" -}}
{{- if and .Values.dra.deviceTaints (include "railguard.draServed" .) -}}
true
{{- end -}}
{{- end -}}

{{/* Non-empty when the chart ships its DeviceClasses and ResourceClaimTemplates: DRA is
     served and dra.enabled. */}}
{{- define "railguard.draObjects" -}}
{{- if and .Values.dra.enabled (include "railguard.draServed" .) -}}
true
{{- end -}}
{{- end -}}

{{/* A profile's DRA drivers, with the CRD's defaults (api::dra::DraSpec): a key absent from
     spec.dra is the default, an empty string switches that kind off. Takes the profile's
     values ($p); returns YAML {nic: ..., gpu: ...}. */}}
{{- define "railguard.draDrivers" -}}
{{- $dra := .spec.dra | default dict -}}
nic: {{ ternary $dra.nicDriver "dra.net" (hasKey $dra "nicDriver") | quote }}
gpu: {{ ternary $dra.gpuDriver "gpu.nvidia.com" (hasKey $dra "gpuDriver") | quote }}
{{- end -}}

{{/* The standard labels of a DRA object of profile `profile`:
     (dict "root" $ "profile" NAME). */}}
{{- define "railguard.draLabels" -}}
{{ include "railguard.labels" (dict "root" .root "component" "dra") }}
railguard.io/profile: {{ .profile | quote }}
{{- end -}}
