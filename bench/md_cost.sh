#!/usr/bin/env bash
# Where a create's time goes as the file count grows: one mdbench process creates FILES
# empty files over DIRS directories on a fresh Tessera file system, and at EARLY and at
# LATE files this script measures, over WINDOW seconds, the CPU time per create of the
# daemon and of the application (user and system, from /proc/PID/stat), the context
# switches per create, and (PERF=1) records a system-wide profile with call graphs
# (perf record -a -g) for `perf report --comm`/`perf diff`.
#
#   bench/md_cost.sh [WORKDIR]                       (as root; needs a C compiler)
#   FILES=3000000 DIRS=1000 EARLY=150000 LATE=2500000 WINDOW=20 PERF=1
#   DRIVE_BYTES=8G (four Tessera drive files), TESSERA_BIN=PATH (default: release build)
#   TESSERA_FUSE_URING=1 serves FUSE over io_uring instead of /dev/fuse threads.
#
# The daemon's and the application's CPU per create, early against late, is the "no cliff"
# question of bench/md_scale.sh asked of each side separately, in a quarter of the time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-md-cost}
FILES=${FILES:-3000000}
DIRS=${DIRS:-1000}
EARLY=${EARLY:-150000}
LATE=${LATE:-2500000}
WINDOW=${WINDOW:-20}
PERF=${PERF:-1}
DRIVE_BYTES=${DRIVE_BYTES:-8G}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
export TESSERA_HOME=$WORK/home
[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2
[ "$PERF" = 0 ] || command -v perf >/dev/null || { echo "md_cost: perf is missing (PERF=0 skips profiles)" >&2; exit 1; }

cleanup() (
    set +e
    [ -n "${BENCH:-}" ] && kill "$BENCH" 2>/dev/null
    "$TESSERA" shutdown >/dev/null 2>&1
    # The drive files are fallocated: leaving them would fill the disk for the next run.
    rm -rf "$WORK/drives"
    true
)
trap cleanup EXIT

"$TESSERA" shutdown >/dev/null 2>&1 || true
rm -rf "$WORK"
mkdir -p "$WORK/drives" "$WORK/mnt"
: >"$WORK/nsd.stanza"
for i in 0 1 2 3; do
    fallocate -l "$DRIVE_BYTES" "$WORK/drives/d$i"
    printf '%%nsd: device=%s nsd=cost%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
        "$WORK/drives/d$i" "$i" "$((i + 1))" >>"$WORK/nsd.stanza"
done
"$TESSERA" cluster create --name cost >/dev/null
"$TESSERA" startup >/dev/null
"$TESSERA" nsd create -F "$WORK/nsd.stanza" >/dev/null
"$TESSERA" fs create cost -F "$WORK/nsd.stanza" -B 4M --inode-limit $((FILES + FILES / 5 + 10000)) \
    -T "$WORK/mnt" -A no >/dev/null
"$TESSERA" mount cost >/dev/null
cc -O2 -o "$WORK/mdbench" bench/mdbench.c
"$WORK/mdbench" "$WORK/mnt/md" "$FILES" "$DIRS" create >"$WORK/create.out" &
BENCH=$!
sleep 1
DAEMON=$(pgrep -n -f "^$TESSERA daemon")

inodes() { df -i "$WORK/mnt" | awk 'NR == 2 {print $3}'; }
ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
switches() { awk '$1 == "ctxt" {print $2}' /proc/stat; }

# sample TAG: CPU per create of the daemon and of mdbench over WINDOW seconds.
sample() {
    local tag=$1 d0 m0 i0 c0 d1 m1 i1 c1 n hz
    hz=$(getconf CLK_TCK)
    read -r -a d0 <<<"$(ticks "$DAEMON")"
    read -r -a m0 <<<"$(ticks "$BENCH")"
    i0=$(inodes)
    c0=$(switches)
    if [ "$PERF" = 0 ]; then
        sleep "$WINDOW"
    else
        perf record -a -g -F 499 -o "$WORK/$tag.perf.data" sleep "$WINDOW" >/dev/null 2>&1
    fi
    read -r -a d1 <<<"$(ticks "$DAEMON")"
    read -r -a m1 <<<"$(ticks "$BENCH")"
    i1=$(inodes)
    c1=$(switches)
    n=$((i1 - i0))
    us() { echo $(( ($1) * 1000000 / hz / n )); }
    echo "$tag at $i0 files: $((n / WINDOW)) creates/s; per create: daemon user $(us "${d1[0]} - ${d0[0]}") us, system $(us "${d1[1]} - ${d0[1]}") us; mdbench user $(us "${m1[0]} - ${m0[0]}") us, system $(us "${m1[1]} - ${m0[1]}") us; $(( (c1 - c0) / n )) context switches" |
        tee -a "$WORK/summary"
}

while [ "$(inodes)" -lt "$EARLY" ]; do sleep 1; done
sample early
while [ "$(inodes)" -lt "$LATE" ]; do sleep 5; done
sample late
wait "$BENCH"
BENCH=
echo "whole run: $(cat "$WORK/create.out")" | tee -a "$WORK/summary"
