#!/usr/bin/env bash
# Small sequential writes on the nodes of a two-node cluster in network namespaces: each
# node writes in a directory it made (with owner slots, one its own metanode serves), one
# node after the other, then node 2 in node 1's directory (files another node serves):
# fio sequential writes of 1 KiB (SMALL/4 bytes), 4 KiB (SMALL) and 1 MiB (4*SMALL)
# pieces from one job, fsync at the end; then 1 KiB O_APPEND writes (SMALL/4 bytes, a
# log opened in append mode, from python3), fsync at the end.
#
#   bench/cluster_small_writes.sh     (root; needs fio; SMALL=64M; about 2 minutes)
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera.
#
# Prints a Markdown table, MB/s. Uses scripts/cluster-netns.sh with its own prefix, base and
# subnet, so a test cluster can run beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
small=${SMALL:-64M}
export TSR_PREFIX=${TSR_PREFIX:-tw-} TSR_BASE=${TSR_BASE:-/var/tmp/twnet}
export TSR_SUBNET=${TSR_SUBNET:-10.79.0}
if [ -z "${TESSERA_BIN:-}" ]; then
    cargo build --release -q -p tessera
    TESSERA_BIN=$PWD/target/release/tessera
fi
export TESSERA_BIN
command -v fio >/dev/null || { echo "bench: fio is missing (apt-get install fio)" >&2; exit 1; }
net=scripts/cluster-netns.sh
$net down >/dev/null 2>&1 || true
$net up 2 --drives 1 --size 2G --config failureDetectionTime=3 >/dev/null
trap '$net down >/dev/null 2>&1 || true' EXIT
stanza=$TSR_BASE/w1.stanza
echo "%nsd: device=$TSR_BASE/drives/node1-d1.img nsd=w1 usage=dataAndMetadata failureGroup=1 pool=system" >"$stanza"
mnt() { echo "$TSR_BASE/node$1/mnt/w1"; }
$net run 1 -- tessera nsd create -F "$stanza" >/dev/null
$net run 1 -- tessera fs create w1 -F "$stanza" -T "$(mnt 1)" >/dev/null
for k in 1 2; do
    $net run "$k" -- tessera mount w1 -T "$(mnt "$k")" >/dev/null
done
bytes=$(numfmt --from=iec "$small")
# rate K D BS SIZE: fio's write rate in MB/s, run in node K's namespace, in the directory
# node D made.
rate() {
    local k=$1 d=$2 bs=$3 size=$4 dir
    dir=$(mnt "$k")/w$d
    $net run "$k" -- fio --name="s$bs" --directory="$dir" --rw=write --bs="$bs" --size="$size" \
        --numjobs=1 --end_fsync=1 --ioengine=psync --output-format=json |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"] / 1e6))'
    $net run "$k" -- sh -c "rm -f $dir/s$bs*"
}
# appended K D SIZE: MB/s of 1 KiB O_APPEND writes of SIZE bytes in all, fsync at the end.
appended() {
    local k=$1 d=$2 size=$3 dir
    dir=$(mnt "$k")/w$d
    $net run "$k" -- python3 -c '
import os, sys, time
path, size = sys.argv[1], int(sys.argv[2])
piece = b"x" * 1023 + b"\n"
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
start = time.monotonic()
for _ in range(size // len(piece)):
    os.write(fd, piece)
os.fsync(fd)
print("%.1f" % (size / (time.monotonic() - start) / 1e6))
os.close(fd)
os.unlink(path)' "$dir/appended" "$size"
}
echo "| node | 1 KiB | 4 KiB | 1 MiB | 1 KiB O_APPEND |"
echo "| --- | ---: | ---: | ---: | ---: |"
for k in 1 2; do
    $net run "$k" -- mkdir "$(mnt "$k")/w$k"
done
for kd in 1:1 2:2 2:1; do
    k=${kd%:*} d=${kd#*:}
    r1=$(rate "$k" "$d" 1k $((bytes / 4)))
    r4=$(rate "$k" "$d" 4k "$bytes")
    rm1=$(rate "$k" "$d" 1M $((bytes * 4)))
    ra=$(appended "$k" "$d" $((bytes / 4)))
    case $kd in
    1:1) role="file system manager" ;;
    2:2) role="its own slot's directory" ;;
    *) role="node1's directory" ;;
    esac
    echo "| node$k ($role) | $r1 | $r4 | $rm1 | $ra |"
done
for k in 2 1; do
    $net run "$k" -- tessera umount w1 >/dev/null
done
