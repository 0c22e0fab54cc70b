{{/*
The library chart pin-common: every template here is defined for the charts that depend on it
(identity-fanout, rewards-membership) and called by them with their own context, so .Chart,
.Release and .Values are the calling chart's.
Names and labels.
*/}}
{{- define "svc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* fullnameOverride, else <release>-<name> (the release's name alone when it holds the
name). The environment variable prefix stays the chart's own (svc.envPrefix). */}}
{{- define "svc.fullname" -}}
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

{{- define "svc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The chart's own labels, without commonLabels. */}}
{{- define "svc.ownLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "svc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pin
{{- end -}}

{{/*
The labels of every object: the chart's own and commonLabels (the chart's own win; the
schema refuses commonLabels that name them). `include "svc.labels" .`, or
`(list . "<component>")` to add app.kubernetes.io/component.
*/}}
{{- define "svc.labels" -}}
{{- $root := . -}}
{{- $own := dict -}}
{{- if kindIs "slice" . -}}
{{- $root = index . 0 -}}
{{- $own = dict "app.kubernetes.io/component" (index . 1) -}}
{{- end -}}
{{- $labels := merge $own (include "svc.ownLabels" $root | fromYaml) ($root.Values.commonLabels | default dict) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* A pod template's labels: the object's (svc.labels, with its component), podLabels,
commonLabels; the chart's own win, so the selectors hold. `(list . "<component>")`. */}}
{{- define "svc.podLabels" -}}
{{- $root := index . 0 -}}
{{- $own := dict "app.kubernetes.io/component" (index . 1) -}}
{{- /* The pods that serve the metrics port (/readyz), for the Service `helm test` reads
(svc.readyzPodsService): not the ops pod, not the migration Job's. */ -}}
{{- if not (has (index . 1) (list "ops" "migrate")) -}}
{{- $_ := set $own "pin-platform/serves-metrics" "true" -}}
{{- end -}}
{{- $labels := merge $own (include "svc.ownLabels" $root | fromYaml) ($root.Values.podLabels | default dict) ($root.Values.commonLabels | default dict) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/*
A value a component may set for itself: `include "svc.own" (list . <component values> "key")`
is the component's `key` when it sets one (even empty: {} or []), else the release's
top-level `key`; as YAML (fromYaml / fromYamlArray). The keys are absent from values.yaml
for that reason: present, they would always win.
*/}}
{{- define "svc.own" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 | default dict -}}
{{- $key := index . 2 -}}
{{- $value := index $root.Values $key -}}
{{- if hasKey $component $key -}}
{{- $value = index $component $key -}}
{{- end -}}
{{- if kindIs "invalid" $value -}}{{- $value = dict -}}{{- end -}}
{{- toYaml $value -}}
{{- end -}}

{{/*
A pod template's annotations, as YAML, empty when there are none: `extra` (the config
checksum) and podAnnotations (the component's own when it sets them, svc.own).
`(list . <component values> <extra dict>)`.
*/}}
{{- define "svc.podAnnotations" -}}
{{- $root := index . 0 -}}
{{- $annotations := merge (index . 2) (include "svc.own" (list $root (index . 1) "podAnnotations") | fromYaml) -}}
{{- with $annotations }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* A Deployment's own annotations, as YAML, empty when there are none:
deploymentAnnotations (the component's own when it sets them). `(list . <component values>)`. */}}
{{- define "svc.deploymentAnnotations" -}}
{{- with include "svc.own" (list (index . 0) (index . 1) "deploymentAnnotations") | fromYaml }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/*
A number for a string (the ConfigMap's values): values files read every number as a float,
which prints as 1.6777216e+07; a whole one prints as the integer it is. A list is joined
with commas.
*/}}
{{- define "svc.scalar" -}}
{{- if kindIs "slice" . -}}
{{- $items := list -}}
{{- range . -}}{{- $items = append $items (include "svc.scalar" .) -}}{{- end -}}
{{- join "," $items -}}
{{- else if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget's count: a number as an integer, a percentage ("50%") as a string. */}}
{{- define "svc.intOrPercent" -}}
{{- if kindIs "string" . -}}{{- . | quote -}}{{- else -}}{{- int64 . -}}{{- end -}}
{{- end -}}

{{/* [registry/]repository, then @digest when set, else :tag (the appVersion when empty). */}}
{{- define "svc.image" -}}
{{- $repository := .Values.image.repository -}}
{{- with .Values.image.registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
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
  {{- with $root.Values.extraEnvFrom }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
env:
  - name: {{ $prefix }}DATABASE_DSN
    valueFrom:
      secretKeyRef:
        name: {{ required (printf "database.%s.existingSecret is required" $kind) $login.existingSecret }}
        key: {{ $login.dsnKey }}
  {{- if $login.passwordKey }}
  {{- /* The login's Secret mounted as a volume ("svc.volumes"): read at every connect. */}}
  - name: {{ $prefix }}DATABASE_PASSWORD_FILE
    value: /etc/pin/database/password
  {{- end }}
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
{{- if $root.Values.kafka.sasl.passwordFile }}
{{- /* The Secret mounted as a volume ("svc.volumes"): read again at a refused login. */}}
- name: {{ $prefix }}KAFKA_SASL_PASSWORD_FILE
  value: /etc/pin/kafka-sasl/password
{{- else }}
- name: {{ $prefix }}KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.kafka.sasl.existingSecret }}
      key: {{ $root.Values.kafka.sasl.passwordKey }}
{{- end }}
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
{{- include "svc.otelEnv" $root }}
{{- with $root.Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{/*
OpenTelemetry (`otel`), read by pin_runtime.tracing: an OTLP endpoint turns the exporter on,
over otel.protocol (grpc, or http/protobuf where the traces path is appended); every span
names the environment, the namespace and the pod. extraEnv comes after it, so an OTEL_*
variable there still wins.
*/}}
{{- define "svc.otelEnv" -}}
{{- $otel := .Values.otel }}
{{- if $otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $otel.protocol | quote }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
{{- end }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $otel.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $otel.samplerArg | quote }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- $attributes := list (printf "k8s.namespace.name=%s" .Release.Namespace) "k8s.pod.name=$(K8S_POD_NAME)" }}
{{- with $otel.environment }}
{{- $attributes = append $attributes (printf "deployment.environment.name=%s" .) }}
{{- end }}
{{- range $name, $value := $otel.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%s" $name $value) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- end -}}

{{/*
The ports the NetworkPolicy opens to the OTLP collector, as a YAML list (empty: no rule):
networkPolicy.egress.otlp.ports when set, which must then hold otel.endpoint's port; else the
port otel.endpoint names (the schema wants one), whichever protocol it speaks (4317 is gRPC's
by convention, 4318 HTTP's); none without an endpoint.
*/}}
{{- define "svc.otlpPorts" -}}
{{- $ports := .Values.networkPolicy.egress.otlp.ports | default list -}}
{{- $endpoint := .Values.otel.endpoint -}}
{{- if $endpoint -}}
{{- $port := regexFind ":[0-9]+$" (urlParse $endpoint).host | trimPrefix ":" -}}
{{- if not $port -}}
{{- fail (printf "otel.endpoint %q names no port: the NetworkPolicy opens the collector's port" $endpoint) -}}
{{- end -}}
{{- if not $ports -}}
{{- $ports = list (atoi $port) -}}
{{- end -}}
{{- $open := list -}}
{{- range $ports }}{{ $open = append $open (toString (int64 .)) }}{{ end -}}
{{- if not (has $port $open) -}}
{{- fail (printf "networkPolicy.egress.otlp.ports %v do not open otel.endpoint's port %s (%s over %s)" $ports $port $endpoint .Values.otel.protocol) -}}
{{- end -}}
{{- end -}}
{{- include "svc.int64s" $ports -}}
{{- end -}}

{{/* A list of numbers as a YAML list of integers (values files read numbers as floats). */}}
{{- define "svc.int64s" -}}
{{- $ints := list -}}
{{- range . }}{{ $ints = append $ints (int64 .) }}{{ end -}}
{{- toYaml $ints -}}
{{- end -}}

{{/*
Volumes: a writable /tmp on the read-only root filesystem, the Kafka CA bundle and client
certificate, and the password files. `include "svc.volumes" (list . "worker")` adds the
database password of that pod kind's login (`database.<kind>.passwordKey`); `.` alone (the
lag watcher) none. A Secret volume mounted whole (never by subPath) is rewritten by the
kubelet when the Secret changes, which is how a rotated password reaches the process.
*/}}
{{- define "svc.volumes" -}}
{{- $root := . -}}
{{- $login := dict -}}
{{- if kindIs "slice" . -}}
{{- $root = index . 0 -}}
{{- $login = index $root.Values.database (index . 1) -}}
{{- end -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if $login.passwordKey }}
- name: database-password
  secret:
    secretName: {{ $login.existingSecret }}
    defaultMode: 288  # 0440: readable by the pod's group (fsGroup) only
    items:
      - key: {{ $login.passwordKey }}
        path: password
{{- end }}
{{- if and $root.Values.kafka.sasl.mechanism $root.Values.kafka.sasl.passwordFile }}
- name: kafka-sasl
  secret:
    secretName: {{ $root.Values.kafka.sasl.existingSecret }}
    defaultMode: 288  # 0440: readable by the pod's group (fsGroup) only
    items:
      - key: {{ $root.Values.kafka.sasl.passwordKey }}
        path: password
{{- end }}
{{- if $root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $root.Values.kafka.tls.caSecret }}
    items:
      - key: {{ $root.Values.kafka.tls.caKey }}
        path: ca.crt
{{- end }}
{{- if $root.Values.kafka.tls.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ $root.Values.kafka.tls.clientSecret }}
    defaultMode: 288  # 0440: the key readable by the pod's group (fsGroup) only
    items:
      - key: {{ $root.Values.kafka.tls.certificateKey }}
        path: tls.crt
      - key: {{ $root.Values.kafka.tls.keyKey }}
        path: tls.key
{{- end }}
{{- with $root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "svc.volumeMounts" -}}
{{- $root := . -}}
{{- $login := dict -}}
{{- if kindIs "slice" . -}}
{{- $root = index . 0 -}}
{{- $login = index $root.Values.database (index . 1) -}}
{{- end -}}
- name: tmp
  mountPath: /tmp
{{- if $login.passwordKey }}
- name: database-password
  mountPath: /etc/pin/database
  readOnly: true
{{- end }}
{{- if and $root.Values.kafka.sasl.mechanism $root.Values.kafka.sasl.passwordFile }}
- name: kafka-sasl
  mountPath: /etc/pin/kafka-sasl
  readOnly: true
{{- end }}
{{- if $root.Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: /etc/pin/kafka-ca
  readOnly: true
{{- end }}
{{- if $root.Values.kafka.tls.clientSecret }}
- name: kafka-client
  mountPath: /etc/pin/kafka-client
  readOnly: true
{{- end }}
{{- with $root.Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* startupProbe (when enabled) holds the other two back until /healthz answers: a slow
first start is not killed by the liveness probe. */}}
{{- define "svc.probes" -}}
{{- with .Values.startupProbe }}
{{- if .enabled }}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml (omit . "enabled") | nindent 2 }}
{{- end }}
{{- end }}
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

{{/*
Where a pod may run: nodeSelector, tolerations, affinity (each the component's own when it
sets one, svc.own) and priorityClassName. `(list . <component values>)`; the migration Job
takes the release's (`(list . dict)`).
*/}}
{{- define "svc.scheduling" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with include "svc.own" (list $root $component "nodeSelector") | fromYaml }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "svc.own" (list $root $component "tolerations") | fromYamlArray }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "svc.own" (list $root $component "affinity") | fromYaml }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by the Deployments (scheduling, identity, security).
`(list . <component values>)`: the component's own scheduling (svc.scheduling). */}}
{{- define "svc.podSpecCommon" -}}
{{- $root := index . 0 -}}
serviceAccountName: {{ include "svc.serviceAccountName" $root }}
automountServiceAccountToken: false
{{- /* No service links: a Service named <release>-metrics would put
<RELEASE>_METRICS_PORT=tcp://... into every pod of the namespace, which is the service's own
setting's name (config error at start where the chart does not set it: the migration Job on
any upgrade). The services find nothing through these variables. */}}
enableServiceLinks: false
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ int64 $root.Values.terminationGracePeriodSeconds }}
{{- include "svc.scheduling" . }}
{{- with $root.Values.initContainers }}
initContainers:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The sidecars of every Deployment (extraContainers), after its own container. */}}
{{- define "svc.extraContainers" -}}
{{- with .Values.extraContainers }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{- define "svc.topologySpread" -}}
{{- $ctx := index . 0 -}}
{{- $component := index . 1 -}}
{{- with $ctx.Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- /* A constraint that brings its own labelSelector keeps it; the others count the
  component's own pods. */ -}}
  {{- $constraint := . }}
  {{- if not (hasKey . "labelSelector") }}
  {{- $labels := merge (dict "app.kubernetes.io/component" $component) (include "svc.selectorLabels" $ctx | fromYaml) }}
  {{- $constraint = merge (dict "labelSelector" (dict "matchLabels" $labels)) . }}
  {{- end }}
  - {{ toYaml $constraint | nindent 4 | trim }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The labels of `helm test`'s objects: the chart's own but app.kubernetes.io/name, and
commonLabels. */}}
{{- define "svc.helmTestLabels" -}}
{{- $own := omit (include "svc.ownLabels" . | fromYaml) "app.kubernetes.io/name" -}}
{{- $labels := merge (dict "app.kubernetes.io/component" "helm-test") $own (.Values.commonLabels | default dict) -}}
{{- toYaml $labels -}}
{{- end -}}

{{/*
The Service `helm test` reads: headless (DNS answers with the pods' own addresses, not one
virtual IP) and, like the metrics Service, with the pods that are not ready, so none can hide
behind a ready one. It selects the pods that serve the metrics port by their label
(svc.podLabels): by the release's labels alone, the ops pod would be listed too, in an
EndpointSlice of its own without ports, and DNS answers with every address of every slice. Its labels leave out app.kubernetes.io/name: the ServiceMonitor selects by name and
instance, and a second Service selected by it would scrape every pod twice.
*/}}
{{- define "svc.readyzPodsService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "svc.fullname" . }}-pods
  labels:
    {{- include "svc.helmTestLabels" . | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "svc.selectorLabels" . | nindent 4 }}
    pin-platform/serves-metrics: "true"
  ports:
    - name: metrics
      port: {{ int64 .Values.config.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- end -}}

{{/*
`helm test <release>`: a pod of the service's image resolves the headless `-pods` Service to
the address of every pod that serves the metrics port, ready or not, and asks each one for
/readyz; it passes when at least the pods the release asks for (`include "svc.readyzTest"
(list . <pods>)`: the replicas of every Deployment with a metrics port) are listed and every
one answers 200, within two minutes. Asking the metrics Service instead would reach one pod
per request, so a ready pod could answer for an unready one. It carries none of the service's
selector labels (the NetworkPolicy lets it in by its own label), and the pods' security
context.
*/}}
{{- define "svc.readyzTest" -}}
{{- $root := index . 0 -}}
{{- $pods := index . 1 -}}
{{- $service := printf "%s-pods" (include "svc.fullname" $root) -}}
apiVersion: v1
kind: Pod
metadata:
  name: {{ include "svc.fullname" $root }}-test-readyz
  labels:
    {{- include "svc.helmTestLabels" $root | nindent 4 }}
  annotations:
    helm.sh/hook: test
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- /* The service's image, from the same registry: the same pull secrets. */}}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  containers:
    - name: readyz
      image: {{ include "svc.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command:
        - python
        - -c
        - |
          import socket, sys, time, urllib.request
          service, port, pods = {{ $service | quote }}, {{ int $root.Values.config.metricsPort }}, {{ int $pods }}
          deadline = time.monotonic() + 120
          while True:
              try:
                  found = socket.getaddrinfo(service, port, type=socket.SOCK_STREAM)
                  addresses = sorted({info[4][0] for info in found})
              except socket.gaierror:
                  addresses = []
              failed = []
              for address in addresses:
                  host = f"[{address}]" if ":" in address else address
                  try:
                      urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=5).close()
                  except Exception as exc:
                      failed.append(f"{address}: {exc}")
              if len(addresses) >= pods and not failed:
                  break
              if time.monotonic() > deadline:
                  sys.exit(f"{service}: {len(addresses)} of {pods} pods listed; not ready: {failed}")
              time.sleep(2)
          print(f"{service}: all {len(addresses)} pods ready")
      resources:
        requests: {cpu: 10m, memory: 32Mi}
        limits: {cpu: 100m, memory: 64Mi}
      securityContext:
        {{- toYaml $root.Values.securityContext | nindent 8 }}
{{- end -}}
