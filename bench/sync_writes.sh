#!/usr/bin/env bash
# Synchronous writes through an NSD server, two builds in one run (issue: NSD servers):
# 1 MiB O_DIRECT writes (each durable before the next: data, log record) and 4 KiB random
# reads at QD32, on node1 (the server's own access to the drive) and on node2 (through
# node1, `useNSDserver=always`), each build in turn, ROUNDS times. Then, per build, the
# last requests of a 200 MiB O_DIRECT dd on node2 as `tessera diag --iohist` shows them:
# W = write (2048 sectors: the data; 8: the log page), F = flush, latency in ms.
#
#   BEFORE=<tessera binary> AFTER=<tessera binary> bench/sync_writes.sh   (root; ~6 min)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2}
export TSR_PREFIX=${TSR_PREFIX:-tq-} TSR_BASE=${TSR_BASE:-/var/tmp/tqnet}
export TSR_SUBNET=${TSR_SUBNET:-10.76.0}
net=scripts/cluster-netns.sh
trap '$net down >/dev/null 2>&1 || true' EXIT

# up BINARY: two nodes, NSD n1 on node1's drive served by node1, file system q1 on it.
up() {
    export TESSERA_BIN=$1
    $net down >/dev/null 2>&1 || true
    $net up 2 --drives 2 --size 4G --config failureDetectionTime=10 >/dev/null
    local stanza=$TSR_BASE/n1.stanza
    echo "%nsd: device=$TSR_BASE/drives/node1-d1.img nsd=n1 usage=dataAndMetadata failureGroup=1 pool=system servers=node1" >"$stanza"
    $net run 1 -- tessera config set useNSDserver=always -N node2 >/dev/null
    $net run 1 -- tessera nsd create -F "$stanza" >/dev/null
    $net run 1 -- tessera fs create q1 -F "$stanza" >/dev/null
}

fio_json() {
    fio --output-format=json --direct=1 "$@" | python3 -c \
        'import json, sys; j = json.load(sys.stdin)["jobs"][0]; s = j["write"] if j["write"]["io_bytes"] else j["read"]; print(round(s["bw_bytes"] / 2**20), round(s["iops"]))'
}

# measure NODE: "write_MiB/s randread_IOPS" on NODE's mount (mounted there alone).
measure() {
    local node=$1 m=$TSR_BASE/node$1/mnt/q1 w q
    $net run "$node" -- tessera mount q1 -T "$m" >/dev/null
    w=$(fio_json --name=w --directory="$m" --filename=b.dat --size=1G --rw=write --bs=1M \
        --ioengine=psync --end_fsync=1 | cut -d' ' -f1)
    q=$(fio_json --name=q --directory="$m" --filename=b.dat --size=1G --rw=randread --bs=4k \
        --ioengine=libaio --iodepth=32 --time_based --runtime=10 | cut -d' ' -f2)
    rm -f "$m/b.dat"
    $net run "$node" -- tessera umount q1 >/dev/null
    echo "$w $q"
}

echo "| round | build | write 1 MiB O_DIRECT local | through server | ratio | rand read 4 KiB QD32 local | through server | ratio |"
echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for round in $(seq 1 "$rounds"); do
    for build in before after; do
        bin=$BEFORE
        [[ $build == after ]] && bin=$AFTER
        up "$bin"
        read -r lw lq < <(measure 1)
        read -r sw sq < <(measure 2)
        python3 -c "print(f'| $round | $build | $lw | $sw | {$sw / $lw:.2f} | $lq | $sq | {$sq / $lq:.2f} |')"
    done
done
for build in before after; do
    bin=$BEFORE
    [[ $build == after ]] && bin=$AFTER
    up "$bin"
    m=$TSR_BASE/node2/mnt/q1
    $net run 2 -- tessera mount q1 -T "$m" >/dev/null
    dd if=/dev/zero of="$m/f" bs=1M count=200 oflag=direct 2>/dev/null
    echo
    echo "$build: the last requests of node2 (through the server)"
    $net run 2 -- tessera diag --iohist | tail -8
done
