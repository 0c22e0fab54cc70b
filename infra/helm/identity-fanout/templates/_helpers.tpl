{{/* Names and labels. */}}
{{- define "svc.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "svc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "svc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "svc.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "svc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pin
{{- end -}}

{{- define "svc.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "svc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "svc.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The environment variable prefix of the service: IDENTITY_FANOUT_ / REWARDS_MEMBERSHIP_. */}}
{{- define "svc.envPrefix" -}}
{{- printf "%s_" (.Chart.Name | upper | replace "-" "_") -}}
{{- end -}}

{{/*
Environment of every container of the service: the ConfigMap (every non-secret setting) and
the secrets, each by reference to an existing Secret. `include "svc.env" (list . "worker")`:
the second item names the pod kind's database login, `database.<kind>` (a runtime role's
user; infra/README.md "Deploy" > "Database roles").
*/}}
{{- define "svc.env" -}}
{{- $root := index . 0 -}}
{{- $kind := index . 1 -}}
{{- $login := index $root.Values.database $kind -}}
{{- $prefix := include "svc.envPrefix" $root -}}
envFrom:
  - configMapRef:
      name: {{ include "svc.fullname" $root }}
env:
  - name: {{ $prefix }}DATABASE_DSN
    valueFrom:
      secretKeyRef:
        name: {{ required (printf "database.%s.existingSecret is required" $kind) $login.existingSecret }}
        key: {{ $login.dsnKey }}
  {{- with include "svc.kafkaSecretEnv" $root | trim }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/*
The Kafka credentials of a container (each from its Secret) and extraEnv: every container
that talks to Kafka, the lag watcher (which gets no database login) included.
*/}}
{{- define "svc.kafkaSecretEnv" -}}
{{- $root := . -}}
{{- $prefix := include "svc.envPrefix" $root -}}
{{- if $root.Values.kafka.sasl.mechanism }}
- name: {{ $prefix }}KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.sasl.existingSecret is required when kafka.sasl.mechanism is set" $root.Values.kafka.sasl.existingSecret }}
      key: {{ $root.Values.kafka.sasl.usernameKey }}
- name: {{ $prefix }}KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.kafka.sasl.existingSecret }}
      key: {{ $root.Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if $root.Values.kafka.tls.keyPasswordSecret }}
{{- if not $root.Values.kafka.tls.clientSecret }}
{{- fail "kafka.tls.keyPasswordSecret needs kafka.tls.clientSecret" }}
{{- end }}
- name: {{ $prefix }}KAFKA_SSL_KEY_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.kafka.tls.keyPasswordSecret }}
      key: {{ $root.Values.kafka.tls.keyPasswordKey }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{/* Volumes: a writable /tmp on the read-only root filesystem, the Kafka CA bundle and client certificate. */}}
{{- define "svc.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.tls.caSecret }}
    items:
      - key: {{ .Values.kafka.tls.caKey }}
        path: ca.crt
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ .Values.kafka.tls.clientSecret }}
    defaultMode: 288  # 0440: the key readable by the pod's group (fsGroup) only
    items:
      - key: {{ .Values.kafka.tls.certificateKey }}
        path: tls.crt
      - key: {{ .Values.kafka.tls.keyKey }}
        path: tls.key
{{- end }}
{{- end -}}

{{- define "svc.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/pin/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.clientSecret }}
- name: kafka-client
  mountPath: /etc/pin/kafka-client
  readOnly: true
{{- end }}
{{- end -}}

{{- define "svc.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.livenessProbe | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .Values.readinessProbe | nindent 2 }}
{{- end -}}

{{/* Pod-level settings shared by the Deployments (scheduling, identity, security). */}}
{{- define "svc.podSpecCommon" -}}
serviceAccountName: {{ include "svc.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "svc.topologySpread" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- with $ctx.Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  - {{ toYaml . | nindent 4 | trim }}
    labelSelector:
      matchLabels:
        {{- include "svc.selectorLabels" $ctx | nindent 8 }}
        app.kubernetes.io/component: {{ $component }}
  {{- end }}
{{- end }}
{{- end -}}
