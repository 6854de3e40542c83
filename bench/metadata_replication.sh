#!/usr/bin/env bash
# What the second copy of the metadata costs: mdtest-style create, stat and unlink of FILES
# small files (mdbench, one process, over DIRS directories, each phase ending with an
# fsync that commits it) and the remount that follows, on a file system with -m 1 -r 2
# against the same with -m 2 -r 2, on the same drives, in one run.
#
#   bench/metadata_replication.sh [WORKDIR]     (as root; needs FUSE and a C compiler)
#   FILES=200000 DIRS=100 FILE_BYTES=4096 ROUNDS=3 DRIVE_BYTES=4G
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera
#
# Layout: mr0, mr1 in failure group 1 and mr2, mr3 in group 2 (data and metadata), and
# mr4 a descOnly NSD in group 3 (the descriptor quorum's third copy). The figures are the
# -m 2 rate over the -m 1 rate per phase, and the mount times of both.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-metadata-replication}
FILES=${FILES:-200000}
DIRS=${DIRS:-100}
FILE_BYTES=${FILE_BYTES:-4096}
ROUNDS=${ROUNDS:-3}
DRIVE_BYTES=${DRIVE_BYTES:-4G}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
export TESSERA_HOME=$WORK/home

[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2
[ -x "$TESSERA" ] || { echo "metadata_replication bench: no tessera binary at $TESSERA" >&2; exit 1; }
mkdir -p "$WORK"
cc -O2 -o "$WORK/mdbench" bench/mdbench.c
OUT=$WORK/results.txt
: >"$OUT"
MNT=$WORK/t/mnt

cleanup() (
    set +e
    "$TESSERA" shutdown >/dev/null 2>&1
    rm -rf "$WORK/t/drives"
    true
)
trap cleanup EXIT

# fresh COPIES: a new cluster and file system with -m COPIES -r 2.
fresh() {
    cleanup
    rm -rf "$WORK/t" "$TESSERA_HOME"
    mkdir -p "$WORK/t/drives" "$MNT"
    local stanza=$WORK/t/nsd.stanza
    : >"$stanza"
    for i in 0 1 2 3; do
        fallocate -l "$DRIVE_BYTES" "$WORK/t/drives/d$i"
        printf '%%nsd: device=%s nsd=mr%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
            "$WORK/t/drives/d$i" "$i" "$((i / 2 + 1))" >>"$stanza"
    done
    fallocate -l 64M "$WORK/t/drives/d4"
    printf '%%nsd: device=%s nsd=mr4 usage=descOnly failureGroup=3 pool=system\n' \
        "$WORK/t/drives/d4" >>"$stanza"
    "$TESSERA" cluster create --name mrep >/dev/null
    "$TESSERA" startup >/dev/null
    "$TESSERA" nsd create -F "$stanza" >/dev/null
    "$TESSERA" fs create mrfs -F "$stanza" -B 1M -T "$MNT" -A no -m "$1" -r 2 \
        --inode-limit $((FILES * 2 + 10000)) >/dev/null
    "$TESSERA" mount mrfs >/dev/null
}

# run COPIES: prints "create stat unlink mount_seconds" (files/s, files/s, files/s, s).
run() {
    fresh "$1"
    local c s u
    c=$(MDBENCH_FILE_BYTES=$FILE_BYTES MDBENCH_SYNC=1 "$WORK/mdbench" "$MNT/md" "$FILES" "$DIRS" create | awk '{print $4}')
    "$TESSERA" umount mrfs >/dev/null
    local t0
    t0=$(date +%s%N)
    "$TESSERA" mount mrfs >/dev/null
    local mount_s
    mount_s=$(python3 -c "print(($(date +%s%N) - $t0) / 1e9)")
    s=$("$WORK/mdbench" "$MNT/md" "$FILES" "$DIRS" stat | awk '{print $4}')
    u=$(MDBENCH_SYNC=1 "$WORK/mdbench" "$MNT/md" "$FILES" "$DIRS" unlink | awk '{print $4}')
    echo "$c $s $u $mount_s"
}

for round in $(seq 1 "$ROUNDS"); do
    one=$(run 1)
    two=$(run 2)
    echo "$round $one $two" | tee -a "$OUT" >&2
done

python3 - "$OUT" "$FILES" "$DIRS" "$FILE_BYTES" <<'PY'
import sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
print(f"mdtest-style phases of {int(sys.argv[2]):,} files of {sys.argv[4]} bytes over {sys.argv[3]} "
      "directories (mdbench, one process, each phase ending with an fsync), -r 2 both:")
print()
print("| round | create -m 1 | create -m 2 | ratio | stat -m 1 | stat -m 2 | ratio | unlink -m 1 | unlink -m 2 | ratio | mount -m 1 (s) | mount -m 2 (s) |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
ratios = [[], [], []]
for r in rows:
    rnd, c1, s1, u1, m1, c2, s2, u2, m2 = r
    for k, (a, b) in enumerate([(c1, c2), (s1, s2), (u1, u2)]):
        ratios[k].append(b / a)
    print(f"| {int(rnd)} | {c1:,.0f} | {c2:,.0f} | {c2 / c1:.2f} | {s1:,.0f} | {s2:,.0f} | {s2 / s1:.2f} "
          f"| {u1:,.0f} | {u2:,.0f} | {u2 / u1:.2f} | {m1:.2f} | {m2:.2f} |")
mean = lambda x: sum(x) / len(x)
print()
print(f"Mean -m 2 / -m 1: create {mean(ratios[0]):.2f}, stat {mean(ratios[1]):.2f}, unlink {mean(ratios[2]):.2f}")
PY
