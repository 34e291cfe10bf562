{{/* Fails the render on combinations podlinkd would refuse or that cannot work. */}}
{{- define "podlink.validate" -}}
{{- if not (has .Values.podSource (list "standalone" "cri")) -}}
{{- fail (printf "podSource must be standalone or cri, not %q" .Values.podSource) -}}
{{- end -}}
{{- if and (eq .Values.podSource "cri") (not .Values.criSocket) -}}
{{- fail "podSource=cri needs criSocket (containerd: /run/containerd/containerd.sock, CRI-O: /var/run/crio/crio.sock)" -}}
{{- end -}}
{{- if and (eq .Values.podSource "cri") (or (not (isAbs .Values.criSocket)) (eq (dir .Values.criSocket) "/")) -}}
{{- fail (printf "criSocket must be an absolute path in a directory other than / (its directory is mounted), not %q" .Values.criSocket) -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled (or (lt (int .Values.devicePlugin.devices) 1) (gt (int .Values.devicePlugin.devices) 100000)) -}}
{{- fail "devicePlugin.devices must be in 1..100000" -}}
{{- end -}}
{{- if or (lt (int .Values.metrics.port) 1) (gt (int .Values.metrics.port) 65535) -}}
{{- fail "metrics.port must be in 1..65535 (the probes use it)" -}}
{{- end -}}
{{- if and .Values.devicePlugin.enabled (eq .Values.podSource "standalone") -}}
{{- fail "devicePlugin.enabled with podSource=standalone: pods would get no annotations; use podSource=cri" -}}
{{- end -}}
{{- if or (lt (int .Values.relay.workers) 0) (gt (int .Values.relay.workers) 64) -}}
{{- fail "relay.workers must be in 0..64 (0: one per GPU)" -}}
{{- end -}}
{{- if or (lt (int .Values.relay.streams) 1) (gt (int .Values.relay.streams) 64) -}}
{{- fail "relay.streams must be in 1..64" -}}
{{- end -}}
{{- if not (has .Values.logLevel (list "trace" "debug" "info" "warn" "error")) -}}
{{- fail (printf "logLevel must be trace, debug, info, warn or error, not %q" .Values.logLevel) -}}
{{- end -}}
{{- if not (has .Values.updateStrategy.type (list "OnDelete" "RollingUpdate")) -}}
{{- fail (printf "updateStrategy.type must be OnDelete or RollingUpdate, not %q" .Values.updateStrategy.type) -}}
{{- end -}}
{{- range $k, $v := .Values.podLabels -}}
{{- if or (hasPrefix "app.kubernetes.io/" $k) (eq $k "helm.sh/chart") -}}
{{- fail (printf "podLabels must not set %s: the chart sets the app.kubernetes.io labels and helm.sh/chart (the DaemonSet's selector uses some)" $k) -}}
{{- end -}}
{{- end -}}
{{- if .Values.mesh.enabled -}}
{{- $mp := int .Values.mesh.port -}}{{- $dp := int .Values.mesh.dataPort -}}
{{- if or (lt $mp 1) (gt $mp 65535) (lt $dp 1) (gt $dp 65535) -}}
{{- fail "mesh.port and mesh.dataPort must be in 1..65535" -}}
{{- end -}}
{{- if or (eq $mp $dp) (eq $mp (int .Values.metrics.port)) (eq $dp (int .Values.metrics.port)) -}}
{{- fail "mesh.port, mesh.dataPort and metrics.port must differ (the mesh puts podlinkd on the host network)" -}}
{{- end -}}
{{- if not (has .Values.mesh.remotePods (list "apiserver" "forwarded" "auto")) -}}
{{- fail "mesh.remotePods must be apiserver, forwarded or auto" -}}
{{- end -}}
{{- $rs := int .Values.mesh.relayStagingMib -}}
{{- if or (lt $rs 16) (gt $rs 65536) -}}
{{- fail "mesh.relayStagingMib must be in 16..65536" -}}
{{- end -}}
{{- $sw := int .Values.mesh.sealedWindowMib -}}
{{- if or (lt $sw 16) (gt $sw 65536) -}}
{{- fail "mesh.sealedWindowMib must be in 16..65536" -}}
{{- end -}}
{{- $gi := int .Values.mesh.grantIdleSeconds -}}
{{- $ka := int .Values.mesh.keepaliveSeconds -}}
{{- if or (lt $gi 1) (gt $gi 604800) (lt $ka 1) (gt $ka 3600) (lt (int .Values.mesh.certRefreshSeconds) 1) (gt (int .Values.mesh.certRefreshSeconds) 3600) -}}
{{- fail "mesh.grantIdleSeconds must be in 1..604800, mesh.keepaliveSeconds and mesh.certRefreshSeconds in 1..3600" -}}
{{- end -}}
{{- $as := int .Values.mesh.advertSeconds -}}
{{- if or (lt $as 1) (gt $as 3600) -}}
{{- fail "mesh.advertSeconds must be in 1..3600" -}}
{{- end -}}
{{- if lt $gi (mul 2 $ka) -}}
{{- fail "mesh.grantIdleSeconds must be at least twice mesh.keepaliveSeconds (live importers would lose their grants)" -}}
{{- end -}}
{{- if not (isAbs (toString .Values.mesh.certHostPath)) -}}
{{- fail "mesh.certHostPath must be an absolute path on the node (it holds ca.crt, tls.crt, tls.key)" -}}
{{- end -}}
{{- if or (lt (int .Values.mesh.connectionsPerPath) 1) (gt (int .Values.mesh.connectionsPerPath) 16) -}}
{{- fail "mesh.connectionsPerPath must be in 1..16" -}}
{{- end -}}
{{- if not (has (toString .Values.mesh.transport) (list "tcp" "verbs")) -}}
{{- fail "mesh.transport must be tcp or verbs" -}}
{{- end -}}
{{- range $k := list "fallback" "verbsTcpFallback" "verbsStagedOnly" "tcpZeroCopy" "twoHopStripe" -}}
{{- if not (kindIs "bool" (get $.Values.mesh $k)) -}}
{{- fail (printf "mesh.%s must be true or false" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "bool" .Values.ncclNative.enabled) -}}
{{- fail "ncclNative.enabled must be true or false" -}}
{{- end -}}
{{- if or (lt (int .Values.ncclNative.shmSizeMib) 16) (gt (int .Values.ncclNative.shmSizeMib) 1048576) -}}
{{- fail "ncclNative.shmSizeMib must be in 16..1048576" -}}
{{- end -}}
{{- range $k, $v := .Values.limits -}}
{{- if lt (int $v) 1 -}}
{{- fail (printf "limits.%s must be a positive integer" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
