#!/usr/bin/env bash
# Restripe throughput against a plain copy of the same bytes on the same drives, and
# foreground throughput while a restripe runs, measured in one run.
#
#   bench/restripe.sh [WORKDIR]        (as root; needs fio and FUSE)
#   DATA_BYTES=6G FILE_BYTES=256M DRIVE_BYTES=4G FG_SECONDS=20 ROUNDS=2 BLOCK=4M
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera
#
# Each round: a fresh file system on four preallocated drive files is filled with
# DATA_BYTES in files of FILE_BYTES. Then
#   1. foreground alone: fio reads the files sequentially (1 MiB, one job, O_DIRECT) for
#      FG_SECONDS;
#   2. one disk is suspended and `restripe -m` moves its data to the other three while the
#      same fio read runs (started a second before, stopped when the restripe ends): the
#      restripe's rate (bytes moved / its time) and the foreground's;
#   3. the disk is resumed, another suspended, and `restripe -m` runs alone;
#   4. the reference: dd copies as many bytes from one drive file to a new file beside it
#      with O_DIRECT and 4 MiB requests (the same reads and writes on the same store,
#      without checksums, logging or FUSE).
# The table gives per-round figures and the ratios: restripe (under load and alone) over
# the copy (goal >= 0.5 under load) and foreground during over alone (goal >= 0.7).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-restripe}
DATA_BYTES=${DATA_BYTES:-6G}
FILE_BYTES=${FILE_BYTES:-256M}
DRIVE_BYTES=${DRIVE_BYTES:-4G}
FG_SECONDS=${FG_SECONDS:-20}
ROUNDS=${ROUNDS:-2}
BLOCK=${BLOCK:-4M}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
export TESSERA_HOME=$WORK/home

command -v fio >/dev/null || { echo "restripe bench: fio is missing (apt-get install fio)" >&2; exit 1; }
[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2
mkdir -p "$WORK"
OUT=$WORK/results.txt
: >"$OUT"
MNT=$WORK/t/mnt

cleanup() (
    set +e
    "$TESSERA" shutdown >/dev/null 2>&1
    true
)
trap cleanup EXIT

bytes() { numfmt --from=iec "$1"; }

fresh() {
    cleanup
    rm -rf "$WORK/t" "$TESSERA_HOME"
    mkdir -p "$WORK/t/drives" "$MNT"
    local stanza=$WORK/t/nsd.stanza
    : >"$stanza"
    for i in 0 1 2 3; do
        fallocate -l "$DRIVE_BYTES" "$WORK/t/drives/d$i"
        printf '%%nsd: device=%s nsd=rs%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
            "$WORK/t/drives/d$i" "$i" "$((i + 1))" >>"$stanza"
    done
    "$TESSERA" cluster create --name restripe >/dev/null
    "$TESSERA" startup >/dev/null
    "$TESSERA" nsd create -F "$stanza" >/dev/null
    "$TESSERA" fs create rsfs -F "$stanza" -B "$BLOCK" -T "$MNT" -A no >/dev/null
    "$TESSERA" mount rsfs >/dev/null
}

# fg_read SECONDS JSON: a sequential 1 MiB direct read of the files, one job, for SECONDS
# (or until SIGTERM), its fio report written to JSON. `exec`, so that a caller running it
# in the background signals fio itself. The job is named like the fill job: fio names its
# files after the job, and under another name it would lay out (write) a second set.
fg_read() {
    exec fio --name=fill --directory="$MNT/data" --rw=read --bs=1M --ioengine=psync --direct=1 \
        --filesize="$FILE_BYTES" --nrfiles=$(($(bytes "$DATA_BYTES") / $(bytes "$FILE_BYTES"))) \
        --file_service_type=sequential --time_based --runtime="$1" --output-format=json \
        --output="$2" >/dev/null
}
# MiB/s read in a fio JSON report.
# (A stopped fio writes a line about the signal before the report.)
read_mib_s() {
    python3 -c 'import json,sys; t=open(sys.argv[1]).read(); print(json.loads(t[t.index("{"):])["jobs"][0]["read"]["bw"] / 1024)' "$1"
}

# restripe_timed: runs `restripe -m`; prints "MiB-moved seconds".
restripe_timed() {
    local t0 out
    t0=$(date +%s%N)
    out=$("$TESSERA" restripe rsfs -m)
    local ns=$(($(date +%s%N) - t0))
    local mib
    mib=$(echo "$out" | sed -n 's/.*(\([0-9.]*\) MiB).*/\1/p')
    echo "$mib $(python3 -c "print($ns / 1e9)")"
}

for round in $(seq 1 "$ROUNDS"); do
    fresh
    mkdir -p "$MNT/data"
    fio --name=fill --directory="$MNT/data" --rw=write --bs=1M --ioengine=psync \
        --filesize="$FILE_BYTES" --nrfiles=$(($(bytes "$DATA_BYTES") / $(bytes "$FILE_BYTES"))) \
        --file_service_type=sequential --end_fsync=1 >/dev/null
    (fg_read "$FG_SECONDS" "$WORK/alone.json")
    alone=$(read_mib_s "$WORK/alone.json")

    # The foreground read runs exactly as long as the restripe: stopped when it ends.
    "$TESSERA" disk change rsfs suspend -d rs0 >/dev/null
    (fg_read 3600 "$WORK/during.json") &
    fg_pid=$!
    sleep 1
    read -r moved_loaded secs_loaded < <(restripe_timed)
    kill -TERM "$fg_pid"
    wait "$fg_pid" || true
    during=$(read_mib_s "$WORK/during.json")
    "$TESSERA" disk change rsfs resume -d rs0 >/dev/null

    "$TESSERA" disk change rsfs suspend -d rs1 >/dev/null
    read -r moved_alone secs_alone < <(restripe_timed)
    "$TESSERA" disk change rsfs resume -d rs1 >/dev/null

    # The reference: the same number of bytes read from one drive and written beside it.
    count=$(python3 -c "print(max(1, int($moved_alone / 4)))")
    sync
    t0=$(date +%s%N)
    dd if="$WORK/t/drives/d2" of="$WORK/t/copy" bs=4M count="$count" iflag=direct oflag=direct conv=fsync status=none
    copy_secs=$(python3 -c "print(($(date +%s%N) - $t0) / 1e9)")
    rm -f "$WORK/t/copy"
    echo "$round $moved_loaded $secs_loaded $moved_alone $secs_alone $count $copy_secs $alone $during" \
        | tee -a "$OUT" >&2
done
cleanup
rm -rf "$WORK/t"

python3 - "$OUT" <<'PY'
import statistics, sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
print("| round | restripe under load (MiB/s) | restripe alone (MiB/s) | copy (MiB/s) | under load / copy | alone / copy | foreground alone (MiB/s) | during restripe (MiB/s) | during / alone |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
ratios = []
for r in rows:
    rnd, ml, sl, ma, sa, count, cs, alone, during = r
    loaded, solo, copy = ml / sl, ma / sa, count * 4 / cs
    ratios.append((loaded / copy, solo / copy, during / alone))
    print(f"| {int(rnd)} | {loaded:.0f} | {solo:.0f} | {copy:.0f} | {loaded / copy:.2f} | {solo / copy:.2f} | {alone:.0f} | {during:.0f} | {during / alone:.2f} |")
med = [statistics.median(c) for c in zip(*ratios)]
print()
print(f"Medians: restripe under load / copy {med[0]:.2f} (goal >= 0.5), alone / copy {med[1]:.2f}, "
      f"foreground during / alone {med[2]:.2f} (goal >= 0.7)")
PY
