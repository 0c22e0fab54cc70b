#!/usr/bin/env bash
# A one-node Kubernetes cluster on this machine, for `make e2e-kube`: the components of
# infra/kube/build.sh (Kubernetes, etcd, containerd, runc, the CNI plugins, CoreDNS), all
# inside a network namespace of its own, so nothing listens on the machine's interfaces and
# nothing from the cluster reaches out.
#
#   infra/kube/cluster.sh up        # idempotent: build what is missing, start, wait for the node
#   infra/kube/cluster.sh down      # stop everything it started, unmount, remove the state
#   infra/kube/cluster.sh images    # load the project's images (docker save | ctr import)
#   infra/kube/cluster.sh run CMD…  # CMD inside the namespace with KUBECONFIG and the tools on PATH
#   infra/kube/cluster.sh status
#
# The namespace (`pin-kube`) has only its loopback, carrying 127.0.0.1 and the node address
# 198.18.0.1/32 (the benchmarking range, RFC 2544: the kubelet refuses a 127/8 node IP), and
# the pods' bridge. Pods get addresses of 10.244.0.0/24 from the reference bridge plugin and
# reach the node address through it; the platform's PostgreSQL and Kafka (infra/kube/platform.yaml)
# run as host-network pods on that address. No kube-proxy: nothing here uses a Service's
# cluster IP (the charts' test asks each pod at its own address, found through CoreDNS).
# Processes enter it with `nsenter --net`, which keeps the mount namespace, so the volumes the
# kubelet mounts are the ones runc sees.
#
# Needs root, cgroup v1 or v2, Go and gcc (build.sh), and the Docker engine for the images.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/build.sh"

NETNS="pin-kube"
NODE_IP="198.18.0.1"
NODE_NAME="pin-node"
POD_SUBNET="10.244.0.0/24"
SERVICE_RANGE="10.96.0.0/16"
STATE="${PIN_KUBE_STATE:-/var/lib/pin-kube}"
# The deadline of each wait of `up` (etcd, the API, the node Ready, CoreDNS).
UP_TIMEOUT="${PIN_KUBE_TIMEOUT:-120}"
PAUSE_IMAGE="docker.io/pin-kube/pause:3.10"

KUBE_BIN="" DEB="" COREDNS_BIN=""
_dirs() {
    KUBE_BIN="$(kube_dir kubernetes)"
    DEB="$(kube_dir debian)"
    COREDNS_BIN="$(kube_dir coredns)"
}

in_ns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

kube_env() {
    _dirs
    export KUBECONFIG="$STATE/pki/admin.kubeconfig"
    export PATH="$KUBE_BIN:$DEB/usr/bin:$DEB/usr/sbin:$PATH"
    export CONTAINERD_ADDRESS="$STATE/run/containerd.sock" CONTAINERD_NAMESPACE=k8s.io
}

# Waits for a command to succeed, for at most $UP_TIMEOUT seconds.
await() {
    local what="$1" deadline=$((SECONDS + UP_TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            log "cluster: $what not ready after ${UP_TIMEOUT}s; logs in $STATE/log"
            return 1
        fi
        sleep 0.5
    done
}

# A process that runs (a zombie does not: its parent, once the shell that started it has
# exited, may never reap it).
alive() {
    local state
    state="$(ps -o stat= -p "$1" 2>/dev/null)" && [[ "$state" != Z* ]]
}

running() {
    local pid
    [[ -f "$STATE/pids/$1" ]] && pid="$(cat "$STATE/pids/$1")" && alive "$pid"
}

# A component as a daemon of the namespace: its own session (so a signal to `make` does not
# reach it), its log, its pid file.
start() {
    local name="$1"
    shift
    running "$name" && return 0
    # setsid and nsenter exec (neither forks here): $! is the daemon's own pid.
    setsid nsenter --net="/run/netns/$NETNS" -- "$@" >>"$STATE/log/$name.log" 2>&1 </dev/null &
    echo $! >"$STATE/pids/$name"
}

stop() {
    local name="$1" pid deadline
    [[ -f "$STATE/pids/$name" ]] || return 0
    pid="$(cat "$STATE/pids/$name")"
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + 20))
        while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        # containerd must be gone before another starts on the same root.
        while alive "$pid"; do sleep 0.2; done
    fi
    rm -f "$STATE/pids/$name"
}

netns_up() {
    if [[ ! -e "/run/netns/$NETNS" ]]; then
        ip netns add "$NETNS"
    fi
    in_ns ip link set lo up
    in_ns ip addr replace "$NODE_IP/32" dev lo
}

# A CA, the API server's serving certificate, its client certificate towards the kubelets,
# the service-account key; every other client logs in with a static token (one per identity,
# the groups RBAC and the Node authorizer expect).
pki() {
    local p="$STATE/pki"
    [[ -f "$p/.done" ]] && return 0
    mkdir -p "$p" && cd "$p"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pin-kube-ca" \
        -keyout ca.key -out ca.crt 2>/dev/null
    cat >apiserver.ext <<EOF
subjectAltName=IP:$NODE_IP,IP:127.0.0.1,IP:${SERVICE_RANGE%.0/16}.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth
EOF
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key \
        -out apiserver.csr 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
        -keyout kubelet-client.key -out kubelet-client.csr 2>/dev/null
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
        -days 3650 -extfile client.ext -out kubelet-client.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    local name user groups token
    : >tokens.csv
    for name in admin controller-manager scheduler kubelet coredns; do
        case "$name" in
            admin) user="pin-admin" groups="system:masters" ;;
            controller-manager) user="system:kube-controller-manager" groups="" ;;
            scheduler) user="system:kube-scheduler" groups="" ;;
            kubelet) user="system:node:$NODE_NAME" groups="system:nodes" ;;
            coredns) user="pin-coredns" groups="" ;;
        esac
        token="$(openssl rand -hex 24)"
        printf '%s,%s,%s,"%s"\n' "$token" "$user" "$user" "$groups" >>tokens.csv
        cat >"$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: pin-kube
  cluster: {server: "https://$NODE_IP:6443", certificate-authority: "$p/ca.crt"}
users:
- name: $name
  user: {token: "$token"}
contexts:
- name: pin-kube
  context: {cluster: pin-kube, user: $name}
current-context: pin-kube
EOF
    done
    touch .done
    cd - >/dev/null
}

configs() {
    local c="$STATE/config"
    mkdir -p "$c" "$STATE/cni/net.d" "$STATE/run"
    cat >"$c/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$STATE/run/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This machine's processes lack CAP_SYS_RESOURCE: runc cannot lower a container's
  # oom_score_adj below its own, which the kubelet asks for; keep it at least the shim's.
  restrict_oom_score_adj = true
  disable_apparmor = true
  # The pods' network namespaces under the state (not /run/netns), so cluster.sh down removes them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$DEB/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$DEB/usr/sbin/runc"
        SystemdCgroup = false
EOF
    # No masquerade and no port mappings: nothing leaves the namespace, so no iptables rules.
    cat >"$STATE/cni/net.d/10-pin-pods.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "pin-pods", "plugins": [
  {"type": "bridge", "bridge": "pin0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}}]}
EOF
    # The cluster's DNS answers cluster.local only: the namespace has no route out.
    printf 'nameserver %s\n' "$NODE_IP" >"$c/resolv.conf"
    cat >"$c/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$STATE/pki/ca.crt"}
authorization: {mode: Webhook}
# This machine mounts cgroup v1; Kubernetes 1.35 refuses it unless told.
cgroupDriver: cgroupfs
failCgroupV1: false
containerRuntimeEndpoint: "unix://$STATE/run/containerd.sock"
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: "$c/resolv.conf"
failSwapOn: false
# The disk is shared with other work: evict nothing and collect no image for its fill level
# (the images are loaded, never pulled back).
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
podLogsDir: "$STATE/pod-logs"
EOF
    cat >"$c/Corefile" <<EOF
.:53 {
    # Every address of the namespace (its loopback and the pods' bridge): nothing else
    # listens there.
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/pki/coredns.kubeconfig pin-kube
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    loadbalance
}
EOF
}

api_ready() { in_ns "$KUBE_BIN/kubectl" --kubeconfig "$STATE/pki/admin.kubeconfig" get --raw /readyz; }
node_ready() {
    [[ "$(in_ns "$KUBE_BIN/kubectl" --kubeconfig "$STATE/pki/admin.kubeconfig" get node "$NODE_NAME" \
        -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# The pause image from the Kubernetes module's pause.c, statically linked, as a one-layer
# image loaded into containerd (no registry).
pause_image() {
    local ctr=("$DEB/usr/bin/ctr" --address "$STATE/run/containerd.sock" -n k8s.io)
    if "${ctr[@]}" images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q complete; then return; fi
    local tmp docker
    tmp="$(mktemp -d)"
    gcc -Os -static -DVERSION=3.10 -o "$tmp/pause" "$KUBE_BIN/pause.c"
    strip "$tmp/pause"
    printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$tmp/Dockerfile"
    docker="$("$ROOT/infra/docker/engine.sh" docker)"
    DOCKER_BUILDKIT=1 "$docker" build --quiet -t "${PAUSE_IMAGE#docker.io/}" "$tmp" >/dev/null
    "$docker" save "${PAUSE_IMAGE#docker.io/}" | "${ctr[@]}" images import - >/dev/null
    rm -rf "$tmp"
}

cmd_up() {
    local started=$SECONDS
    "$HERE/build.sh" all >/dev/null
    _dirs
    mkdir -p "$STATE/log" "$STATE/pids"
    netns_up
    pki
    configs
    start etcd "$DEB/usr/bin/etcd" --name pin-kube --data-dir "$STATE/etcd" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster pin-kube=http://127.0.0.1:2380 --quota-backend-bytes 2147483648
    start containerd env PATH="$DEB/usr/bin:$DEB/usr/sbin:$PATH" \
        "$DEB/usr/bin/containerd" --config "$STATE/config/containerd.toml"
    await etcd in_ns curl -fsS http://127.0.0.1:2379/health
    start kube-apiserver "$KUBE_BIN/kube-apiserver" \
        --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=6443 \
        --advertise-address="$NODE_IP" --service-cluster-ip-range="$SERVICE_RANGE" \
        --tls-cert-file="$STATE/pki/apiserver.crt" --tls-private-key-file="$STATE/pki/apiserver.key" \
        --client-ca-file="$STATE/pki/ca.crt" --token-auth-file="$STATE/pki/tokens.csv" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$STATE/pki/sa.pub" \
        --service-account-signing-key-file="$STATE/pki/sa.key" \
        --authorization-mode=Node,RBAC \
        --kubelet-client-certificate="$STATE/pki/kubelet-client.crt" \
        --kubelet-client-key="$STATE/pki/kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP
    await "the API server" api_ready
    # Both read the API at start: started after it answers, not before.
    start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
        --kubeconfig="$STATE/pki/controller-manager.kubeconfig" --leader-elect=false \
        --service-account-private-key-file="$STATE/pki/sa.key" --root-ca-file="$STATE/pki/ca.crt" \
        --use-service-account-credentials=true --bind-address=127.0.0.1
    start kube-scheduler "$KUBE_BIN/kube-scheduler" \
        --kubeconfig="$STATE/pki/scheduler.kubeconfig" --leader-elect=false --bind-address=127.0.0.1
    await containerd in_ns "$DEB/usr/bin/ctr" --address "$STATE/run/containerd.sock" version
    pause_image
    start kubelet "$KUBE_BIN/kubelet" --config="$STATE/config/kubelet.yaml" \
        --kubeconfig="$STATE/pki/kubelet.kubeconfig" --root-dir="$STATE/kubelet" \
        --node-ip="$NODE_IP" --hostname-override="$NODE_NAME"
    # CoreDNS reads Services and EndpointSlices cluster-wide.
    in_ns "$KUBE_BIN/kubectl" --kubeconfig "$STATE/pki/admin.kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: pin-coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: User, name: pin-coredns}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pin-coredns-discovery}
rules:
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
- {apiGroups: [""], resources: [namespaces, services, pods], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: pin-coredns-discovery}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pin-coredns-discovery}
subjects: [{kind: User, name: pin-coredns}]
EOF
    start coredns "$COREDNS_BIN/coredns" -conf "$STATE/config/Corefile"
    await "the node" node_ready
    await CoreDNS in_ns curl -fsS http://127.0.0.1:18181/ready
    log "cluster: node $NODE_NAME Ready in $((SECONDS - started)) s (KUBECONFIG=$STATE/pki/admin.kubeconfig, inside netns $NETNS)"
}

# Unmounts whatever the kubelet and containerd left mounted under the state directory
# (deepest first; a lazy unmount, as a dead container's mount may still be held), again until
# none is left: a volume can be mounted over another.
unmount_state() {
    local m round
    for round in 1 2 3 4 5 6 7 8 9 10; do
        mapfile -t mounts < <(awk -v s="$STATE/" 'index($2, s) == 1 {print $2}' /proc/self/mounts | sort -r)
        ((${#mounts[@]})) || return 0
        for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
    done
    log "cluster: $STATE still has mounts: $(awk -v s="$STATE/" 'index($2, s) == 1 {print $2}' /proc/self/mounts | head -3)"
    return 1
}

# SIGKILL to every process of the pods: the kubelet's cgroups (cgroupfs driver, cgroup v1 or
# v2), which hold each container and nothing else.
kill_pods() {
    local pids
    pids="$(find /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods -name cgroup.procs \
        -exec cat {} + 2>/dev/null | sort -u || true)"
    [[ -z "$pids" ]] || kill -KILL $pids 2>/dev/null || true
}

cmd_down() {
    _dirs
    # The kubelet first (nothing is started or restarted once it is gone), then the pods'
    # processes, then the daemons; the shims of containerd run in sessions of their own.
    local name
    for name in kubelet coredns kube-scheduler kube-controller-manager; do stop "$name"; done
    kill_pods
    stop containerd
    local pid
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $STATE/run/containerd.sock" || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    for name in kube-apiserver etcd; do stop "$name"; done
    kill_pods
    unmount_state
    # The pods' cgroups, deepest first: empty now.
    local d
    for d in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
        if [[ -d "$d" ]]; then find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
    done
    # The kubelet's links to the pods' logs (a fixed path) that point into this state.
    find /var/log/containers -maxdepth 1 -lname "$STATE/*" -delete 2>/dev/null || true
    if [[ -e "/run/netns/$NETNS" ]]; then ip netns del "$NETNS"; fi
    rm -rf "$STATE"
}

# The project's images, loaded into the cluster's containerd (the charts run them with
# pullPolicy Never): the services as infra/docker/images.sh tagged them, and the platform's
# PostgreSQL and Kafka bases.
cmd_images() {
    _dirs
    local docker
    docker="$("$ROOT/infra/docker/engine.sh" docker)"
    "$docker" save "$@" | "$DEB/usr/bin/ctr" --address "$STATE/run/containerd.sock" -n k8s.io \
        images import - >/dev/null
}

cmd_status() {
    _dirs
    local name
    for name in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet coredns; do
        if running "$name"; then printf '%-24s running (pid %s)\n' "$name" "$(cat "$STATE/pids/$name")"
        else printf '%-24s stopped\n' "$name"; fi
    done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    # Network namespaces, mounts and cgroups: root's.
    if [[ $EUID != 0 ]]; then exec sudo -n -E "$0" "$@"; fi
    case "${1:-}" in
        up) cmd_up ;;
        down) cmd_down ;;
        images) shift; cmd_images "$@" ;;
        status) cmd_status ;;
        run) shift; kube_env; exec nsenter --net="/run/netns/$NETNS" -- "$@" ;;
        *) log "usage: $0 up|down|images IMAGE…|status|run CMD…"; exit 2 ;;
    esac
fi
