#!/usr/bin/env bash
# A file system reached through an NSD server against the same file system on the server's
# own access to the drive, in one run (issue: NSD servers). Two nodes in network
# namespaces; node1 holds a drive file and serves NSD n1 (`servers=node1`); node2 reaches it
# only through node1 (`useNSDserver=always`). Each round mounts the file system on one node
# at a time (that node then owns the metadata, so only the data path differs) and runs fio
# on it: sequential 1 MiB writes and reads by one process (each write waits for the one
# before) and by four at once, and 4 KiB random reads at queue depth 32, all O_DIRECT so
# no page cache answers for the drive.
#
#   bench/nsd_server.sh          (ROUNDS=2 SIZE=1G SIZE4=256M SECONDS_EACH=15; root; ~7 min)
#
# Then the same node pair without the file system: `tessera perf nsd` streams to a free
# NSD p1 (node1's second drive) from node1 (its device) and from node2 (through node1).
# Prints a Markdown table: MiB/s (or IOPS) per round for each side and the ratio
# server path / local, the figure of merit (goals: >= 0.8 sequential, >= 0.5 random).
#
# The namespaces are joined by a Linux bridge. Where `br_netfilter` is loaded (Docker
# loads it) with `net.bridge.bridge-nf-call-iptables=1`, every packet between the two nodes
# also goes through iptables, a cost no NSD client pays on a real network.
# BRIDGE_NETFILTER=off turns that host-wide sysctl off for the run and puts it back at the
# end (it also bypasses iptables for other bridges of the host meanwhile: containers'
# firewall rules, so it is opt-in); the script prints which it measured with, and the
# namespaces' link MTU and TCP congestion control (TSR_MTU, TSR_TCP_CC of the netns script).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2}
size=${SIZE:-1G}
# Per process when four run at once.
size4=${SIZE4:-256M}
secs=${SECONDS_EACH:-15}
export TSR_PREFIX=${TSR_PREFIX:-tq-} TSR_BASE=${TSR_BASE:-/var/tmp/tqnet}
export TSR_SUBNET=${TSR_SUBNET:-10.76.0}
if [[ -z ${TESSERA_BIN:-} ]]; then
    cargo build --release -q -p tessera
    export TESSERA_BIN=$PWD/target/release/tessera
fi
net=scripts/cluster-netns.sh
$net down >/dev/null 2>&1 || true
$net up 2 --drives 2 --size 4G --config failureDetectionTime=10 >/dev/null
# The drive files start sparse, so the first write into each region makes the host's file
# system allocate it, which cost a writer up to half its rate (four local writers:
# 735-1064 MiB/s on sparse files, 1724-1790 on written ones). Whichever side wrote a region
# first paid for it, and the write ratios swung both ways with the order of the runs. A
# real drive has every block allocated: both drives are written in full once, first.
for drive in node1-d1 node1-d2; do
    img=$TSR_BASE/drives/$drive.img
    echo "writing $img in full, so that no measurement pays for its allocation"
    dd if=/dev/zero of="$img" bs=4M count=$(($(stat -c %s "$img") / 4194304)) \
        oflag=direct conv=notrunc,fsync status=none
done
nf=/proc/sys/net/bridge/bridge-nf-call-iptables
nf_was=$(cat "$nf" 2>/dev/null || echo absent)
restore_nf() { [[ $nf_was == absent || $(cat "$nf") == "$nf_was" ]] || echo "$nf_was" >"$nf"; }
trap '$net down >/dev/null 2>&1 || true; restore_nf' EXIT
if [[ ${BRIDGE_NETFILTER:-} == off && $nf_was == 1 ]]; then
    echo 0 >"$nf"
fi
echo "net.bridge.bridge-nf-call-iptables during the run: $(cat "$nf" 2>/dev/null || echo 'absent (br_netfilter not loaded)')"
# The simulated network: its MTU (TSR_MTU) and congestion control (TSR_TCP_CC) move the
# through-server figures more than anything in the file system (bench/RESULTS.md).
echo "link MTU $(ip netns exec "${TSR_PREFIX}node1" cat /sys/class/net/eth0/mtu), TCP congestion control $(ip netns exec "${TSR_PREFIX}node1" sysctl -n net.ipv4.tcp_congestion_control)"
echo
stanza=$TSR_BASE/n1.stanza
echo "%nsd: device=$TSR_BASE/drives/node1-d1.img nsd=n1 usage=dataAndMetadata failureGroup=1 pool=system servers=node1" >"$stanza"
# A free NSD for `perf nsd`: the NSD path alone, without the file system.
raw=$TSR_BASE/p1.stanza
echo "%nsd: device=$TSR_BASE/drives/node1-d2.img nsd=p1 servers=node1" >"$raw"
$net run 1 -- tessera config set useNSDserver=always -N node2 >/dev/null
$net run 1 -- tessera nsd create -F "$stanza" >/dev/null
$net run 1 -- tessera nsd create -F "$raw" >/dev/null
$net run 1 -- tessera fs create q1 -F "$stanza" >/dev/null
mnt() { echo "$TSR_BASE/node$1/mnt/q1"; }

# fio_run NODE NAME ARGS...: prints MiB/s (bw) or IOPS of one fio job on node NODE's mount.
fio_run() {
    local node=$1 name=$2
    shift 2
    fio --name="$name" --directory="$(mnt "$node")" --size="$size" \
        --direct=1 --group_reporting --output-format=json "$@" >"$TSR_BASE/$name.json"
    python3 - "$TSR_BASE/$name.json" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
side = job["write"] if job["write"]["io_bytes"] > 0 else job["read"]
print(f'{side["bw_bytes"] / 2**20:.0f} {side["iops"]:.0f}')
EOF
}

# perf_nsd NODE ARGS...: MB/s of `tessera perf nsd p1 ARGS` on node NODE.
perf_nsd() {
    local node=$1
    shift
    $net run "$node" -- tessera perf nsd p1 --seconds "$secs" -Y "$@" \
        | awk -F: '$3 != "HEADER" && /^perfNsd/ { print $11 }'
}

# measure NODE: mounts on NODE alone, runs the workloads, unmounts; prints
# "seqwrite seqread seqwrite4 seqread4 (MiB/s) randread_iops".
measure() {
    local node=$1 w r w4 r4 q
    $net run "$node" -- tessera mount q1 -T "$(mnt "$node")" >/dev/null
    w=$(fio_run "$node" seqwrite --filename=bench.dat --rw=write --bs=1M --ioengine=psync \
        --end_fsync=1 | cut -d' ' -f1)
    r=$(fio_run "$node" seqread --filename=bench.dat --rw=read --bs=1M --ioengine=psync \
        | cut -d' ' -f1)
    q=$(fio_run "$node" randread --filename=bench.dat --rw=randread --bs=4k --ioengine=libaio \
        --iodepth=32 --time_based --runtime="$secs" | cut -d' ' -f2)
    rm -f "$(mnt "$node")/bench.dat"
    w4=$(fio_run "$node" seqwrite4 --numjobs=4 --size="$size4" --rw=write --bs=1M --ioengine=psync \
        --end_fsync=1 | cut -d' ' -f1)
    r4=$(fio_run "$node" seqread4 --numjobs=4 --size="$size4" --rw=read --bs=1M --ioengine=psync \
        | cut -d' ' -f1)
    rm -f "$(mnt "$node")"/seq*
    $net run "$node" -- tessera umount q1 >/dev/null
    echo "$w $r $w4 $r4 $q"
}

echo "| round | workload | local (node1) | through NSD server (node2) | server / local |"
echo "| ---: | --- | ---: | ---: | ---: |"
row() { echo "| $1 | $2 | $3 | $4 | $(python3 -c "print(f'{$4 / $3:.2f}')") |"; }
for round in $(seq 1 "$rounds"); do
    read -r lw lr lw4 lr4 lq < <(measure 1)
    read -r sw sr sw4 sr4 sq < <(measure 2)
    row "$round" "seq write 1 MiB, 1 process, MiB/s" "$lw" "$sw"
    row "$round" "seq read 1 MiB, 1 process, MiB/s" "$lr" "$sr"
    row "$round" "seq write 1 MiB, 4 processes, MiB/s" "$lw4" "$sw4"
    row "$round" "seq read 1 MiB, 4 processes, MiB/s" "$lr4" "$sr4"
    row "$round" "rand read 4 KiB QD32, IOPS" "$lq" "$sq"
    # The NSD alone (perf nsd, no file system): written first, so reads find data.
    for args in "--op write --size 1M -t 1" "--op write --size 1M -t 4" \
        "--op read --size 1M -t 1" "--op read --size 1M -t 4" "--op read --size 4K -t 32"; do
        # shellcheck disable=SC2086
        row "$round" "NSD alone: $args, MB/s" "$(perf_nsd 1 $args)" "$(perf_nsd 2 $args)"
    done
    # The network alone: one TCP stream node1 -> node2 and back over the same veth pair,
    # the ceiling of any one-stream protocol here (iperf3, if installed).
    if command -v iperf3 >/dev/null 2>&1; then
        for dir in "" "-R"; do
            $net run 1 -- iperf3 -s -1 -B "$TSR_SUBNET.1" >/dev/null 2>&1 &
            sleep 0.5
            # shellcheck disable=SC2086
            mbs=$($net run 2 -- iperf3 -c "$TSR_SUBNET.1" -t "$secs" -J $dir | python3 -c \
                'import json, sys; e = json.load(sys.stdin)["end"]; print(round(e["sum_received"]["bits_per_second"] / 8e6))')
            wait
            way="node2 -> node1, as writes"
            [[ -z $dir ]] || way="node1 -> node2, as reads"
            echo "| $round | TCP alone, one stream ($way), MB/s | - | $mbs | - |"
        done
    fi
done
