#!/usr/bin/env bash
# Delete rate with TRIM on against off: FILES files of FILE_BYTES each are created on a
# fresh file system over file-backed drives whose NSDs say thinDiskType=auto (freed blocks
# are punched out of the drive files once the delete is durable) or thinDiskType=no, then
# deleted by one process; the delete phase ends with a write and fsync of a marker file
# inside its timing, so the commit of the deletes and the deallocations it leads to are
# counted. The two settings alternate for ROUNDS rounds (the machine's speed drifts); the
# table gives each round, the mean rates, the ratio (goal >= 0.8), and what the drive files
# hold on the host after the deletes.
#
#   bench/trim_delete.sh [WORKDIR]     (as root; needs a C compiler and FUSE)
#   FILES=100000 FILE_BYTES=65536 ROUNDS=3 DRIVE_BYTES=8G BLOCK=4M
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-trim-delete}
FILES=${FILES:-100000}
FILE_BYTES=${FILE_BYTES:-65536}
ROUNDS=${ROUNDS:-3}
DRIVE_BYTES=${DRIVE_BYTES:-8G}
BLOCK=${BLOCK:-4M}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
export TESSERA_HOME=$WORK/home

command -v cc >/dev/null || { echo "trim_delete: cc is missing" >&2; exit 1; }
[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2
mkdir -p "$WORK"
MDBENCH=$WORK/mdbench
cc -O2 -o "$MDBENCH" bench/mdbench.c
OUT=$WORK/results.txt
: >"$OUT"

cleanup() (
    set +e
    "$TESSERA" shutdown >/dev/null 2>&1
    true
)
trap cleanup EXIT

# fresh THIN: a new cluster and file system on four sparse drive files whose NSDs say
# thinDiskType=THIN.
fresh() {
    local thin=$1
    cleanup
    rm -rf "$WORK/t" "$TESSERA_HOME"
    mkdir -p "$WORK/t/drives" "$WORK/t/mnt"
    local stanza=$WORK/t/nsd.stanza
    : >"$stanza"
    for i in 0 1 2 3; do
        truncate -s "$DRIVE_BYTES" "$WORK/t/drives/d$i"
        printf '%%nsd: device=%s nsd=trim%s usage=dataAndMetadata failureGroup=%s pool=system thinDiskType=%s\n' \
            "$WORK/t/drives/d$i" "$i" "$((i + 1))" "$thin" >>"$stanza"
    done
    "$TESSERA" cluster create --name trim >/dev/null
    "$TESSERA" startup >/dev/null
    "$TESSERA" nsd create -F "$stanza" >/dev/null
    "$TESSERA" fs create trimfs -F "$stanza" -B "$BLOCK" -T "$WORK/t/mnt" -A no >/dev/null
    "$TESSERA" mount trimfs >/dev/null
}

# Bytes the host holds for the drive files.
held() { du -B1 -c "$WORK"/t/drives/d* | awk 'END {print $1}'; }

for round in $(seq 1 "$ROUNDS"); do
    for thin in no auto; do
        fresh "$thin"
        MDBENCH_FILE_BYTES=$FILE_BYTES MDBENCH_SYNC=1 "$MDBENCH" "$WORK/t/mnt/md" "$FILES" 1 create >/dev/null
        before=$(held)
        rate=$(MDBENCH_SYNC=1 "$MDBENCH" "$WORK/t/mnt/md" "$FILES" 1 unlink | awk '{print $4}')
        after=$(held)
        echo "$round $thin $rate $before $after" | tee -a "$OUT" >&2
    done
done
cleanup
rm -rf "$WORK/t"

python3 - "$OUT" "$FILES" "$FILE_BYTES" <<'PY'
import sys
path, files, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [l.split() for l in open(path) if l.strip()]
mib = lambda b: f"{int(b) / 2**20:,.0f}"
print(f"Delete of {files:,} files of {size:,} bytes, one process, ending with an fsync:")
print()
print("| round | thinDiskType | deletes/s | drive files before (MiB) | after (MiB) |")
print("| ---: | --- | ---: | ---: | ---: |")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {float(r[2]):,.0f} | {mib(r[3])} | {mib(r[4])} |")
mean = {t: sum(float(r[2]) for r in rows if r[1] == t) / max(1, sum(1 for r in rows if r[1] == t))
        for t in ("no", "auto")}
print()
print(f"Mean: TRIM off {mean['no']:,.0f}/s, on {mean['auto']:,.0f}/s, "
      f"ratio on/off {mean['auto'] / mean['no']:.2f} (goal >= 0.8)")
PY
