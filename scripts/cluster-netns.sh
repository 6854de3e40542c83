#!/usr/bin/env bash
# An N-node Tessera cluster on one machine: every node is a network namespace with its own
# address and $TESSERA_HOME, all joined by a bridge. Users try clusters with it and the
# tests drive the same script, so what users try is what CI checks. Run as root.
#
# Namespaces are entered with `nsenter --net` (the network namespace only), never with
# `ip netns exec`: the latter makes a private mount namespace per call, so a FUSE mount
# made by a daemon would be invisible to every other command. With nsenter the mounts live
# in the host mount namespace and every later command, on the host or in any node, sees
# them. Partitions are made by moving bridge ports, so no firewall (nft, iptables) is
# needed.
set -euo pipefail

usage() {
    cat <<EOF
usage: $(basename "$0") COMMAND [ARGS]   (as root)

  up N [--drives D --size S [--jbofs J]] [--quorum Q] [--config NAME=VALUE[,...]]
     [--no-cluster]
                         N nodes node1..nodeN in namespaces ${PREFIX}node1.., addresses
                         $SUBNET.K/24; with --drives, D sparse drives of S bytes (1G, 512M)
                         per node under $BASE/drives, reachable by every node (SAN
                         mode); with --jbofs as well, the drives are in J drive servers
                         instead (JBOFs jbof1..jbofJ, namespaces ${PREFIX}jbofJ, addresses
                         $SUBNET.(200+J), D drives each as NVMe/TCP namespaces 1..D of
                         subsystem $JBOF_NQN:jbofJ, reservations persisted), and every
                         node connects to them in order, so jbofJ's drive I is
                         nvme:nvme(J-1)nI on every node; then the cluster is created (nodes 1..Q quorum-manager,
                         default Q = 3 or N if fewer, the rest clients; --config as
                         'tessera cluster create --config', e.g. failureDetectionTime=3 for
                         quick failover), started and awaited unless --no-cluster is given
                         (namespaces, homes and drives only)
  run K -- CMD...        run CMD in node K's namespace with its TESSERA_HOME and
                         TESSERA_NODE=nodeK; 'tessera' is the binary 'up' chose
  rsh NODE CMD...        the remote shell the cluster uses (ssh shape): NODE is nodeK or
                         its address, CMD is run by bash in that node (-n: stdin from
                         /dev/null)
  mountpoint K DEVICE    print where node K has file system DEVICE mounted
  kill K                 kill -9 node K's daemon
  start K                start node K's daemon (tessera startup in its namespace)
  jbof kill|start J      kill -9 drive server jbofJ (an enclosure lost), or start it again
  partition K [K...]     cut exactly those nodes off from the rest (they still reach each
                         other); a new partition replaces the last
  heal                   undo every partition
  stanza nsd|pdisk       print %nsd (failureGroup = node number) or %pdisk
                         (enclosure = nodeK, or jbofJ for drives in drive servers)
                         stanzas for the drives
  status                 namespaces, addresses, daemon pids, bridge membership
  logs [K] [--lines L]   the last L lines (default 40) of node K's daemon log, or of every
                         node's
  down                   unmount, stop, delete namespaces, bridges and $BASE

environment: TSR_PREFIX (names, default tsr-), TSR_BASE (state, default /tmp/tessera-netns),
TSR_SUBNET (first three octets, default 10.77.0), TSR_MTU (link MTU, default 9000: storage
networks run jumbo frames), TSR_TCP_CC (TCP congestion control inside the namespaces,
default cubic, the kernel's own default, whatever the host uses: a host set to bbr paces
every burst, which costs a 1 MiB NSD transfer over veth a quarter of its rate;
'host' keeps the host's), TSR_UP_TIMEOUT (seconds 'up' waits for
every node to be active, default 60), TESSERA_BIN (the tessera binary; default
the newer of target/release/tessera and target/debug/tessera, else tessera on PATH)
EOF
}

die() {
    echo "cluster-netns: $*" >&2
    exit 1
}

SCRIPT=$(readlink -f "$0")
REPO=$(dirname "$(dirname "$SCRIPT")")
PREFIX=${TSR_PREFIX:-tsr-}
MTU=${TSR_MTU:-9000}
TCP_CC=${TSR_TCP_CC:-cubic}
BASE=${TSR_BASE:-/tmp/tessera-netns}
SUBNET=${TSR_SUBNET:-10.77.0}
SUBNET=${SUBNET%.0/24}
# Interface names are at most 15 bytes; the longest we make is ${PREFIX}h254.
[[ $PREFIX =~ ^[a-z0-9][a-z0-9-]{0,9}$ ]] ||
    die "TSR_PREFIX '$PREFIX' must be 1-10 characters of a-z, 0-9 and '-'"
[[ $SUBNET =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
    die "TSR_SUBNET '$SUBNET' must be three octets such as 10.77.0 (the /24 the nodes use)"
[[ $BASE == /* && $BASE != *[[:space:]]* && $(readlink -m "$BASE") != / ]] ||
    die "TSR_BASE '$BASE' must be an absolute path without spaces, other than /"
BASE=$(readlink -m "$BASE")
BRIDGE=${PREFIX}br0     # every node's port, except partitioned ones
ISLAND=${PREFIX}br1     # the ports of partitioned nodes
MARKER=$BASE/.tessera-netns
MAX_NODES=250
# With drive servers, nodes are .1-.199 and JBOFs .201-.240.
MAX_NODES_WITH_JBOFS=199
MAX_JBOFS=40
JBOF_NQN=nqn.2024-01.io.tessera.netns
JBOF_PORT=4420
UP_TIMEOUT=${TSR_UP_TIMEOUT:-60}
[[ $UP_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "TSR_UP_TIMEOUT '$UP_TIMEOUT' must be whole seconds"

ns_name() { echo "${PREFIX}node$1"; }
veth_name() { echo "${PREFIX}h$1"; }
home_of() { echo "$BASE/node$1/home"; }
jbof_ns() { echo "${PREFIX}jbof$1"; }
jbof_veth() { echo "${PREFIX}j$1"; }
jbof_addr() { echo "$SUBNET.$((200 + $1))"; }

need_root() {
    [[ $(id -u) -eq 0 ]] || die "run as root (namespaces, bridges and FUSE mounts need it)"
    ip netns list >/dev/null 2>&1 || die "'ip netns' does not work here; install iproute2"
}

# A node number that exists in the running cluster, or a clear error.
node_arg() {
    [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || die "'${1:-}' is not a node number (1, 2, ...)"
    [[ -e /run/netns/$(ns_name "$1") ]] ||
        die "node $1 has no namespace $(ns_name "$1"); is the cluster up ('status')?"
    echo "$1"
}

# Node numbers of our namespaces, found from the system rather than from $BASE so that
# `down` also cleans up after an `up` that failed before it wrote anything.
our_nodes() { our_numbered node; }
# JBOF numbers of our drive-server namespaces.
our_jbofs() { our_numbered jbof; }

# The numbers K of our namespaces ${PREFIX}KINDK, in order.
our_numbered() {
    local kind=$1 ns
    for ns in /run/netns/"${PREFIX}$kind"*; do
        [[ -e $ns ]] || continue
        ns=${ns##*/}
        if [[ ${ns#"${PREFIX}$kind"} =~ ^[0-9]+$ ]]; then echo "${ns#"${PREFIX}$kind"}"; fi
    done | sort -n
}

jbof_arg() {
    [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || die "'${1:-}' is not a JBOF number (1, 2, ...)"
    [[ -e /run/netns/$(jbof_ns "$1") ]] ||
        die "JBOF $1 has no namespace $(jbof_ns "$1"); was the cluster made with --jbofs?"
    echo "$1"
}

# The binary `up` recorded, so every later command runs the same one; before `up`, the
# one the user asked for or the freshest build of this checkout.
choose_binary() {
    if [[ -n ${TESSERA_BIN:-} ]]; then
        [[ -x $TESSERA_BIN ]] || die "TESSERA_BIN=$TESSERA_BIN is not an executable file"
        readlink -f "$TESSERA_BIN"
    elif [[ -x $REPO/target/release/tessera && ( ! -x $REPO/target/debug/tessera ||
        $REPO/target/release/tessera -nt $REPO/target/debug/tessera ) ]]; then
        echo "$REPO/target/release/tessera"
    elif [[ -x $REPO/target/debug/tessera ]]; then
        echo "$REPO/target/debug/tessera"
    elif command -v tessera >/dev/null 2>&1; then
        readlink -f "$(command -v tessera)"
    else
        die "no tessera binary: build one (cargo build --release -p tessera) or set TESSERA_BIN"
    fi
}

# Sets NODE_CMD to the command prefix that runs a program in node K: its network namespace
# and environment, including our own settings so that a nested call of this script (the
# remote shell, run by a daemon) finds the same cluster.
node_cmd() {
    local k=$1
    NODE_CMD=(nsenter "--net=/run/netns/$(ns_name "$k")" env "PATH=$BASE/bin:$PATH"
        "TESSERA_HOME=$(home_of "$k")" "TESSERA_NODE=node$k" "TESSERA_MOUNT_ROOT=$BASE/node$k/mnt"
        "TSR_PREFIX=$PREFIX" "TSR_BASE=$BASE" "TSR_SUBNET=$SUBNET")
}

in_node() {
    local k=$1
    shift
    node_cmd "$k"
    "${NODE_CMD[@]}" "$@"
}

# The pid of node K's daemon if one runs, else nothing. The pid file can be stale after a
# kill -9 and the pid reused, so the process must be `tessera daemon`, in node K's network
# namespace, with node K's home.
daemon_pid() {
    local k=$1 pid argv home
    pid=$(cat "$(home_of "$k")/daemon.pid" 2>/dev/null) || return 0
    [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] || return 0
    argv=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 0
    [[ $argv =~ ^[^\ ]*tessera[^\ ]*\ daemon\  ]] || return 0
    [[ $(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) == \
        $(stat -L -c %i "/run/netns/$(ns_name "$k")") ]] || return 0
    home=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^TESSERA_HOME=//p')
    [[ $(readlink -m "$home") == $(readlink -m "$(home_of "$k")") ]] || return 0
    echo "$pid"
}

# Waits up to 10 s for a killed process to be gone. A zombie counts as gone: it holds no
# socket, namespace or lease any more.
wait_gone() {
    local pid=$1 tries=200
    while [[ -d /proc/$pid && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; do
        ((--tries > 0)) || return 1
        sleep 0.05
    done
}

cmd_up() {
    local n=${1:-} drives=0 size="" cluster=1 quorum="" config="" jbofs=0
    [[ $n =~ ^[1-9][0-9]*$ && $n -le $MAX_NODES ]] || die "up: N must be 1..$MAX_NODES"
    shift
    while [[ $# -gt 0 ]]; do
        case $1 in
        --drives) drives=${2:-}; shift 2 || die "up: --drives needs a count" ;;
        --size) size=${2:-}; shift 2 || die "up: --size needs a size such as 1G" ;;
        --jbofs) jbofs=${2:-}; shift 2 || die "up: --jbofs needs a count" ;;
        --quorum) quorum=${2:-}; shift 2 || die "up: --quorum needs a count" ;;
        --config) config=${2:-}; shift 2 || die "up: --config needs NAME=VALUE[,...]" ;;
        --no-cluster) cluster=0; shift ;;
        *) die "up: unknown option '$1' (see --help)" ;;
        esac
    done
    [[ $drives =~ ^[0-9]+$ && $drives -le 64 ]] || die "up: --drives must be 0..64"
    [[ $jbofs =~ ^[0-9]+$ && $jbofs -le $MAX_JBOFS ]] || die "up: --jbofs must be 0..$MAX_JBOFS"
    if [[ $jbofs -gt 0 ]]; then
        [[ $drives -gt 0 ]] || die "up: --jbofs needs --drives D --size S (drives per JBOF)"
        [[ $n -le $MAX_NODES_WITH_JBOFS ]] || die "up: at most $MAX_NODES_WITH_JBOFS nodes with --jbofs"
    fi
    [[ -z $quorum ]] && quorum=$((n < 3 ? n : 3))
    [[ $quorum =~ ^[1-9][0-9]*$ && $quorum -le $n ]] || die "up: --quorum must be 1..$n"
    [[ $config =~ ^[A-Za-z0-9_.,=:-]*$ ]] || die "up: --config '$config' is not NAME=VALUE[,...]"
    if [[ $drives -gt 0 ]]; then
        [[ $size =~ ^[1-9][0-9]*[KMGT]?$ ]] ||
            die "up: --drives needs --size S (bytes, or with K, M, G, T such as 2G)"
    elif [[ -n $size ]]; then
        die "up: --size without --drives"
    fi
    [[ -z $(our_nodes) && -z $(our_jbofs) ]] && ! ip link show "$BRIDGE" >/dev/null 2>&1 ||
        die "a cluster with prefix '$PREFIX' is already up; run '$0 down' first"
    [[ ! -e $BASE ]] || die "$BASE exists (an earlier cluster?); run '$0 down' first"
    local bin
    bin=$(choose_binary)
    echo "cluster-netns: tessera binary $bin"
    # Checked before anything is built, so an unsupported binary changes nothing.
    local help
    help=$("$bin" cluster create --help 2>&1 || true)
    if [[ $cluster -eq 1 ]] && ! grep -Eq '(^|[^A-Za-z-])-N([ ,=<]|$)' <<<"$help"; then
        die "this tessera binary does not support multi-node clusters yet ($bin);" \
            "use --no-cluster for the namespaces only"
    fi

    # A failure from here on leaves parts behind; `down` removes whatever exists.
    trap 'up_failed $?' EXIT
    mkdir -p "$BASE/bin"
    echo "$PREFIX" >"$MARKER"
    ln -s "$bin" "$BASE/bin/tessera"
    # No address on the bridges: the host needs none (commands reach nodes through `run`),
    # and without host routes two clusters with the same subnet cannot disturb each other.
    ip link add "$BRIDGE" type bridge
    ip link add "$ISLAND" type bridge
    ip link set "$BRIDGE" up
    ip link set "$ISLAND" up
    local k ns j
    for ((k = 1; k <= n; k++)); do
        ns=$(ns_name "$k")
        add_namespace "$ns" "$(veth_name "$k")" "$SUBNET.$k"
        mkdir -p "$(home_of "$k")" "$BASE/node$k/mnt"
    done
    if [[ $jbofs -gt 0 ]]; then
        for ((j = 1; j <= jbofs; j++)); do make_jbof "$j" "$drives" "$size"; done
    elif [[ $drives -gt 0 ]]; then
        mkdir -p "$BASE/drives"
        for ((k = 1; k <= n; k++)); do
            for ((j = 1; j <= drives; j++)); do
                truncate -s "$size" "$BASE/drives/node$k-d$j.img"
            done
        done
    fi
    echo "$n" >"$BASE/size"
    echo "cluster-netns: $n nodes up ($SUBNET.1-$SUBNET.$n), state under $BASE"
    [[ $cluster -eq 0 ]] || create_cluster "$n" "$quorum" "$config"
    if [[ $cluster -eq 1 && $jbofs -gt 0 ]]; then
        for ((k = 1; k <= n; k++)); do
            for ((j = 1; j <= jbofs; j++)); do
                # I/O fails fast (-f 2) so a declustered array, not the host, rides out a
                # lost enclosure; the paths keep reconnecting and come back with it.
                in_node "$k" tessera nvme connect -t tcp -n "$JBOF_NQN:jbof$j" \
                    -a "$(jbof_addr "$j")" -s "$JBOF_PORT" -f 2 -c 1 >/dev/null ||
                    die "node$k cannot connect to jbof$j"
            done
        done
        echo "cluster-netns: every node connected to $jbofs JBOFs"
    fi
    trap - EXIT
}

# Drive server J: a namespace of its own on the bridge and D sparse drive files served as
# NVMe/TCP namespaces 1..D of one subsystem, to any host, reservations persisted in
# $BASE/jbofJ/state.
make_jbof() {
    local j=$1 drives=$2 size=$3 ns dir i namespaces=""
    ns=$(jbof_ns "$j")
    dir=$BASE/jbof$j
    add_namespace "$ns" "$(jbof_veth "$j")" "$(jbof_addr "$j")"
    mkdir -p "$dir/state" "$BASE/drives"
    for ((i = 1; i <= drives; i++)); do
        truncate -s "$size" "$BASE/drives/jbof$j-d$i.img"
        [[ -z $namespaces ]] || namespaces+=","
        namespaces+="{\"nsid\":$i,\"enable\":1,\"device\":{\"path\":\"$BASE/drives/jbof$j-d$i.img\"},\"ana_grpid\":1}"
    done
    cat >"$dir/config.json" <<JSON
{"hosts":[],
 "ports":[{"portid":1,"addr":{"trtype":"tcp","adrfam":"ipv4","traddr":"$(jbof_addr "$j")","trsvcid":"$JBOF_PORT"},
           "subsystems":["$JBOF_NQN:jbof$j"],"ana_groups":[{"grpid":1,"ana":{"state":"optimized"}}],"referrals":[]}],
 "subsystems":[{"nqn":"$JBOF_NQN:jbof$j","attr":{"allow_any_host":"1","serial":"JBOF$j"},
                "allowed_hosts":[],"namespaces":[$namespaces]}],
 "tessera":{"state_dir":"$dir/state"}}
JSON
    start_jbof "$j"
}

start_jbof() {
    local j=$1 dir=$BASE/jbof$j tries=100
    [[ -z $(jbof_pid "$j") ]] || die "jbof$j's drive server already runs"
    nsenter "--net=/run/netns/$(jbof_ns "$j")" "$BASE/bin/tessera" drive-server \
        -c "$dir/config.json" >>"$dir/drive-server.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
    # Serving once its port accepts connections.
    until nsenter "--net=/run/netns/$(jbof_ns "$j")" \
        bash -c "exec 3<>/dev/tcp/$(jbof_addr "$j")/$JBOF_PORT" 2>/dev/null; do
        ((--tries > 0)) || die "jbof$j's drive server did not start; see $dir/drive-server.log"
        [[ -n $(jbof_pid "$j") ]] || die "jbof$j's drive server exited; see $dir/drive-server.log"
        sleep 0.1
    done
}

# The pid of drive server J if it runs (the pid file can be stale after kill -9).
jbof_pid() {
    local pid argv
    pid=$(cat "$BASE/jbof$1/pid" 2>/dev/null) || return 0
    [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] || return 0
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] || return 0
    argv=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 0
    [[ $argv == *" drive-server -c $BASE/jbof$1/config.json"* ]] || return 0
    echo "$pid"
}

cmd_jbof() {
    local action=${1:-} j pid
    j=$(jbof_arg "${2:-}")
    case $action in
    kill)
        pid=$(jbof_pid "$j")
        [[ -n $pid ]] || die "jbof$j's drive server is not running"
        kill -9 "$pid"
        wait_gone "$pid" || die "jbof$j's drive server (pid $pid) survived kill -9 for 10 s"
        echo "cluster-netns: killed jbof$j's drive server (pid $pid)"
        ;;
    start)
        start_jbof "$j"
        echo "cluster-netns: jbof$j's drive server runs (pid $(jbof_pid "$j"))"
        ;;
    *) die "usage: jbof kill|start J" ;;
    esac
}

# Namespace NS joined to the bridge by veth VETH (host end), eth0 at ADDR/24 inside.
add_namespace() {
    local ns=$1 veth=$2 addr=$3
    ip netns add "$ns"
    ip link add "$veth" mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "$ns"
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    set_tcp_cc "$ns"
}

# Gives namespace NS the congestion control $TCP_CC. Outside the host's own namespace the
# kernel lets a namespace default to an algorithm only if the host allows it to everyone
# (net.ipv4.tcp_allowed_congestion_control), so it is added there when missing.
set_tcp_cc() {
    local ns=$1 allowed
    [[ $TCP_CC == host ]] && return 0
    if [[ " $(sysctl -n net.ipv4.tcp_available_congestion_control 2>/dev/null) " != *" $TCP_CC "* ]]; then
        modprobe -q "tcp_$TCP_CC" 2>/dev/null || true
    fi
    if [[ " $(sysctl -n net.ipv4.tcp_available_congestion_control 2>/dev/null) " != *" $TCP_CC "* ]]; then
        echo "cluster-netns: TCP congestion control '$TCP_CC' is not available on this host; $ns keeps the host's" >&2
        return 0
    fi
    allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
    if [[ " $allowed " != *" $TCP_CC "* ]] &&
        ! sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$allowed $TCP_CC"; then
        echo "cluster-netns: the host does not let namespaces use '$TCP_CC'; $ns keeps the host's" >&2
        return 0
    fi
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$TCP_CC" ||
        die "TSR_TCP_CC '$TCP_CC' cannot be set in namespace $ns; TSR_TCP_CC=host keeps the host's"
}

# Kills every process left in namespace NS (a daemon, a drive server, a command started
# with `run`: any would keep it and its veth alive after `ip netns del`), then deletes it.
remove_namespace() {
    local ns=$1 pids pid
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
    for pid in $pids; do
        wait_gone "$pid" || echo "cluster-netns: pid $pid survives kill -9; going on" >&2
    done
    ip netns del "$ns" 2>/dev/null || true
}

up_failed() {
    [[ $1 -eq 0 ]] || echo "cluster-netns: up failed; '$SCRIPT down' removes what it made" >&2
}

# Nodes 1..Q are quorum managers, the rest non-quorum clients.
write_node_file() {
    local n=$1 quorum=$2 k
    for ((k = 1; k <= n; k++)); do
        if [[ $k -le $quorum ]]; then
            echo "node$k:quorum-manager:$SUBNET.$k"
        else
            echo "node$k::$SUBNET.$k"
        fi
    done >"$BASE/nodes"
}

create_cluster() {
    local n=$1 quorum=$2 config=$3
    write_node_file "$n" "$quorum"
    # The remote shell carries our settings, so it works from any shell or daemon later.
    local rsh="env TSR_PREFIX=$PREFIX TSR_BASE=$BASE TSR_SUBNET=$SUBNET $SCRIPT rsh"
    local extra=()
    [[ -z $config ]] || extra=(--config "$config")
    in_node 1 tessera cluster create --name tsr -N "$BASE/nodes" -r "$rsh" "${extra[@]}"
    in_node 1 tessera startup -a
    wait_active "$n" "$UP_TIMEOUT"
}

# Polls `tessera state -a -Y` on node 1 until all N nodes are active; reads columns by
# their header names, so added columns do not break it.
wait_active() {
    local n=$1 timeout=$2 deadline out active k
    deadline=$((SECONDS + timeout))
    while [[ $SECONDS -lt $deadline ]]; do
        out=$(in_node 1 tessera state -a -Y 2>/dev/null) || out=""
        active=$(awk -F: '
            $3 == "HEADER" { for (i = 1; i <= NF; i++) if ($i == "state") col = i; next }
            col && $col == "active" { count++ }
            END { print count + 0 }' <<<"$out")
        if [[ $active -eq $n ]]; then
            echo "cluster-netns: all $n nodes active"
            return 0
        fi
        sleep 0.5
    done
    echo "cluster-netns: after ${timeout}s only $active of $n nodes are active:" >&2
    echo "$out" >&2
    for ((k = 1; k <= n; k++)); do
        echo "--- node$k: $(home_of "$k")/log/daemon.log (last lines)" >&2
        tail -n 15 "$(home_of "$k")/log/daemon.log" >&2 2>/dev/null || echo "(no log)" >&2
    done
    die "the cluster did not become active; '$0 down' removes it"
}

cmd_run() {
    local k
    k=$(node_arg "${1:-}")
    shift
    [[ ${1:-} == -- ]] || die "usage: run K -- CMD..."
    shift
    [[ $# -gt 0 ]] || die "run: no command given"
    # exec: the caller's pid is the command's, so signals and exit status are its own.
    node_cmd "$k"
    exec "${NODE_CMD[@]}" "$@"
}

# The remote shell contract of `tessera cluster create -r` (that of ssh): the words after
# the node name are one command line for the node's shell.
cmd_rsh() {
    local node=${1:-} k no_stdin=0
    if [[ $node == -n ]]; then no_stdin=1; shift; node=${1:-}; fi
    [[ -n $node ]] || die "usage: rsh [-n] NODE CMD..."
    shift
    if [[ ${1:-} == -n ]]; then no_stdin=1; shift; fi
    [[ ${1:-} != -* ]] || die "rsh: option '$1' is not supported (only -n)"
    if [[ $node =~ ^node([0-9]+)$ ]]; then
        k=${BASH_REMATCH[1]}
    elif [[ $node == "$SUBNET".* && ${node##*.} =~ ^[0-9]+$ ]]; then
        k=${node##*.}
    else
        die "rsh: '$node' is no node of this cluster (nodeK or $SUBNET.K)"
    fi
    k=$(node_arg "$k")
    [[ $# -gt 0 ]] || die "rsh: no command given (an interactive shell is not offered)"
    node_cmd "$k"
    if [[ $no_stdin -eq 1 ]]; then
        exec "${NODE_CMD[@]}" bash -c "$*" </dev/null
    fi
    exec "${NODE_CMD[@]}" bash -c "$*"
}

cmd_mountpoint() {
    local k dev
    k=$(node_arg "${1:-}")
    dev=${2:-}
    [[ $dev =~ ^[A-Za-z0-9_.-]+$ ]] || die "usage: mountpoint K DEVICE"
    local want=$BASE/node$k/mnt/$dev
    awk -v want="$want" '$2 == want { found = 1 } END { exit !found }' /proc/mounts ||
        die "node $k has no file system $dev mounted (expected at $want)"
    echo "$want"
}

cmd_kill() {
    local k pid
    k=$(node_arg "${1:-}")
    pid=$(daemon_pid "$k")
    [[ -n $pid ]] || die "node $k has no running daemon"
    kill -9 "$pid"
    wait_gone "$pid" || die "node $k's daemon (pid $pid) survived kill -9 for 10 s (stuck in I/O?)"
    echo "cluster-netns: killed node $k's daemon (pid $pid)"
}

cmd_start() {
    local k
    k=$(node_arg "${1:-}")
    in_node "$k" tessera startup
}

# The island is exactly the nodes named: a second partition replaces the first.
cmd_partition() {
    [[ $# -gt 0 ]] || die "usage: partition K [K...]"
    local k island=" "
    for k in "$@"; do island+="$(node_arg "$k") "; done
    for k in $(our_nodes); do
        if [[ $island == *" $k "* ]]; then
            ip link set "$(veth_name "$k")" master "$ISLAND"
        else
            ip link set "$(veth_name "$k")" master "$BRIDGE"
        fi
    done
    echo "cluster-netns: nodes $* cut off from the rest"
}

cmd_heal() {
    local k
    for k in $(our_nodes); do ip link set "$(veth_name "$k")" master "$BRIDGE"; done
    # Neighbour entries that failed during the partition would delay the first packets
    # after it by seconds; forget them so nodes find each other at once, as after a
    # switch port comes back.
    for k in $(our_nodes); do
        nsenter "--net=/run/netns/$(ns_name "$k")" ip neigh flush all 2>/dev/null || true
    done
    echo "cluster-netns: every node back on $BRIDGE"
}

# Drives sorted by node, then by drive number (node10 after node9).
drive_files() {
    local f
    for f in "$BASE"/drives/node*-d*.img; do
        [[ -e $f ]] || continue
        if [[ ${f##*/} =~ ^node([0-9]+)-d([0-9]+)\.img$ ]]; then
            echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]} $f"
        fi
    done | sort -n -k1,1 -k2,2
}

# Drives of the drive servers sorted by JBOF, then by drive number.
jbof_drive_files() {
    local f
    for f in "$BASE"/drives/jbof*-d*.img; do
        [[ -e $f ]] || continue
        if [[ ${f##*/} =~ ^jbof([0-9]+)-d([0-9]+)\.img$ ]]; then
            echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]} $f"
        fi
    done | sort -n -k1,1 -k2,2
}

cmd_stanza() {
    local kind=${1:-} k j f found=0
    [[ $kind == nsd || $kind == pdisk ]] || die "usage: stanza nsd|pdisk"
    if [[ -n $(jbof_drive_files) ]]; then
        [[ $kind == pdisk ]] ||
            die "stanza nsd: the drives are in drive servers; make a declustered array of them (stanza pdisk)"
        while read -r k j f; do
            echo "%pdisk: pdisk=jbof${k}d$j device=nvme:nvme$((k - 1))n$j enclosure=jbof$k slot=$j"
        done < <(jbof_drive_files)
        return 0
    fi
    while read -r k j f; do
        found=1
        if [[ $kind == nsd ]]; then
            echo "%nsd: device=$f nsd=node${k}d$j usage=dataAndMetadata failureGroup=$k pool=system"
        else
            echo "%pdisk: pdisk=node${k}d$j device=$f enclosure=node$k slot=$j"
        fi
    done < <(drive_files)
    [[ $found -eq 1 ]] ||
        die "no drives under $BASE/drives; create them with 'up N --drives D --size S'"
}

cmd_logs() {
    local only="" lines=40 k
    while [[ $# -gt 0 ]]; do
        case $1 in
        --lines) lines=${2:-}; shift 2 || die "logs: --lines needs a count" ;;
        *) only=$(node_arg "$1"); shift ;;
        esac
    done
    [[ $lines =~ ^[0-9]+$ ]] || die "logs: --lines needs a count, not '$lines'"
    for home in "$BASE"/node*/home; do
        [[ -d $home ]] || continue
        k=${home%/home}
        k=${k##*/node}
        [[ -n $only && $only != "$k" ]] && continue
        echo "--- node$k: $home/log/daemon.log (last $lines lines)"
        tail -n "$lines" "$home/log/daemon.log" 2>/dev/null || echo "(no log)"
    done
}

cmd_status() {
    local k ns addr pid port bridge any=0
    printf '%-6s %-16s %-15s %-8s %s\n' node namespace address daemon bridge
    for k in $(our_nodes); do
        any=1
        ns=$(ns_name "$k")
        addr=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
        pid=$(daemon_pid "$k")
        port=$(veth_name "$k")
        bridge=$(ip -o link show "$port" 2>/dev/null | sed -n 's/.* master \([^ ]*\).*/\1/p')
        printf '%-6s %-16s %-15s %-8s %s\n' "node$k" "$ns" "${addr:--}" "${pid:-down}" \
            "${bridge:-none}$([[ $bridge == "$ISLAND" ]] && echo ' (partitioned)')"
    done
    for k in $(our_jbofs); do
        any=1
        pid=$(jbof_pid "$k")
        addr=$(ip -n "$(jbof_ns "$k")" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
        printf '%-6s %-16s %-15s %-8s %s\n' "jbof$k" "$(jbof_ns "$k")" "${addr:--}" \
            "${pid:-down}" "$BRIDGE (drive server)"
    done
    if [[ $any -eq 1 ]]; then
        # What the simulated network is, from the first node or drive server's namespace.
        ns=$(ip netns list | awk -v p="$PREFIX" 'index($1, p) == 1 { print $1; exit }')
        [[ -z $ns ]] ||
            echo "links: MTU $(ip netns exec "$ns" cat /sys/class/net/eth0/mtu 2>/dev/null || echo '?'), TCP congestion control $(ip netns exec "$ns" cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo '?')"
    else
        echo "(no namespaces with prefix '$PREFIX'; state under $BASE)"
    fi
}

# Unmounts everything under $BASE, deepest first; lazily when a mount is busy or its daemon
# hangs, so `down` always finishes.
unmount_all() {
    local m
    [[ -r /proc/mounts ]] || return 0
    awk -v base="$BASE/" 'index($2, base) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r m; do
            m=$(printf '%b' "$m")   # /proc/mounts writes a space as \040
            timeout 10 fusermount3 -u "$m" 2>/dev/null ||
                timeout 10 fusermount3 -uz "$m" 2>/dev/null ||
                umount -l "$m" 2>/dev/null ||
                echo "cluster-netns: cannot unmount $m" >&2
        done
}

cmd_down() {
    local k link
    unmount_all
    # A clean shutdown first, all nodes at once (one by one, the last ones could wait for
    # a quorum already gone); whatever does not stop in time is killed below.
    for k in $(our_nodes); do
        if [[ -n $(daemon_pid "$k") && -x $BASE/bin/tessera ]]; then
            node_cmd "$k"
            timeout 20 "${NODE_CMD[@]}" tessera shutdown >/dev/null 2>&1 &
        fi
    done
    wait || true
    for k in $(our_nodes); do remove_namespace "$(ns_name "$k")"; done
    for k in $(our_jbofs); do remove_namespace "$(jbof_ns "$k")"; done
    # Deleting a namespace deletes its veth end and so the pair; this catches any host end
    # left by a failed `up`, then the bridges.
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
        [[ $link =~ ^${PREFIX}[hj][0-9]+$ || $link == "$BRIDGE" || $link == "$ISLAND" ]] &&
            ip link del "$link" 2>/dev/null || true
    done
    unmount_all
    if [[ -e $BASE ]]; then
        # Only a directory this script made is removed, never what TSR_BASE happens to name.
        [[ -f $MARKER && $(cat "$MARKER") == "$PREFIX" ]] ||
            die "$BASE was not made by this script for prefix '$PREFIX'; not removing it"
        rm -rf --one-file-system "$BASE"
    fi
    echo "cluster-netns: down (prefix '$PREFIX'; nothing left under $BASE)"
}

main() {
    local cmd=${1:-}
    [[ $# -gt 0 ]] && shift
    case $cmd in
    -h | --help | help) usage; return 0 ;;
    "") usage >&2; exit 2 ;;
    esac
    need_root
    case $cmd in
    up) cmd_up "$@" ;;
    run) cmd_run "$@" ;;
    rsh) cmd_rsh "$@" ;;
    mountpoint) cmd_mountpoint "$@" ;;
    kill) cmd_kill "$@" ;;
    start) cmd_start "$@" ;;
    jbof) cmd_jbof "$@" ;;
    partition) cmd_partition "$@" ;;
    heal) cmd_heal "$@" ;;
    stanza) cmd_stanza "$@" ;;
    status) cmd_status "$@" ;;
    logs) cmd_logs "$@" ;;
    down) cmd_down "$@" ;;
    *) echo "cluster-netns: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
