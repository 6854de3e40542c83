#!/usr/bin/env bash
# Write throughput with two data copies (-r 2) against one (-r 1), and the rate at which
# `restripe -r` restores the second copy against a plain copy of the same bytes, in one
# run on the same drives.
#
#   bench/replication.sh [WORKDIR]     (as root; needs fio and FUSE)
#   DATA_BYTES=2G FILE_BYTES=256M ROUNDS=3 DRIVE_BYTES=6G BLOCK=4M
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera
#
# Each round makes two fresh file systems on file-backed drives (metadata on rp0; data on
# rp2, rp4 in failure group 1 and rp1, rp3 in group 2), one with -r 1 and one with -r 2,
# and writes
# DATA_BYTES with fio (sequential 1 MiB writes, one job, fsync at the end). The ratio of
# the -r 2 rate to the -r 1 rate is the figure (goal >= 0.45: the second copy costs only
# its bytes). Then on the -r 2 file system group 1 is stopped, the same bytes are written
# again (one copy each), group 1 is started and `restripe -r` gives every block its second
# copy: its rate (bytes copied / time) against dd copying that many bytes between two
# drive files with O_DIRECT.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-replication}
DATA_BYTES=${DATA_BYTES:-2G}
FILE_BYTES=${FILE_BYTES:-256M}
ROUNDS=${ROUNDS:-3}
DRIVE_BYTES=${DRIVE_BYTES:-6G}
BLOCK=${BLOCK:-4M}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
export TESSERA_HOME=$WORK/home

command -v fio >/dev/null || { echo "replication bench: fio is missing (apt-get install fio)" >&2; exit 1; }
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
NRFILES=$(($(bytes "$DATA_BYTES") / $(bytes "$FILE_BYTES")))

# fresh COPIES: a new cluster and file system with -r COPIES.
fresh() {
    cleanup
    rm -rf "$WORK/t" "$TESSERA_HOME"
    mkdir -p "$WORK/t/drives" "$MNT"
    local stanza=$WORK/t/nsd.stanza
    : >"$stanza"
    # Metadata on rp0 (failure group 3): a disk that holds metadata cannot be stopped
    # while metadata has one copy.
    fallocate -l "$DRIVE_BYTES" "$WORK/t/drives/d0"
    printf '%%nsd: device=%s nsd=rp0 usage=metadataOnly failureGroup=3 pool=system\n' \
        "$WORK/t/drives/d0" >>"$stanza"
    for i in 1 2 3 4; do
        fallocate -l "$DRIVE_BYTES" "$WORK/t/drives/d$i"
        printf '%%nsd: device=%s nsd=rp%s usage=dataOnly failureGroup=%s pool=system\n' \
            "$WORK/t/drives/d$i" "$i" "$((i % 2 + 1))" >>"$stanza"
    done
    "$TESSERA" cluster create --name replication >/dev/null
    "$TESSERA" startup >/dev/null
    "$TESSERA" nsd create -F "$stanza" >/dev/null
    "$TESSERA" fs create rpfs -F "$stanza" -B "$BLOCK" -T "$MNT" -A no -r "$1" >/dev/null
    "$TESSERA" mount rpfs >/dev/null
}

# write_mib_s NAME: fio writes DATA_BYTES into files NAME.*; prints MiB/s.
write_mib_s() {
    mkdir -p "$MNT/data"
    fio --name="$1" --directory="$MNT/data" --rw=write --bs=1M --ioengine=psync \
        --filesize="$FILE_BYTES" --nrfiles="$NRFILES" --file_service_type=sequential \
        --end_fsync=1 --output-format=json --output="$WORK/$1.json" >/dev/null
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw"] / 1024)' "$WORK/$1.json"
}

for round in $(seq 1 "$ROUNDS"); do
    fresh 1
    one=$(write_mib_s one)
    fresh 2
    two=$(write_mib_s two)

    # Group 1 stopped: the same bytes written with one copy, then restored by restripe -r.
    "$TESSERA" disk change rpfs stop -d "rp2;rp4" >/dev/null
    write_mib_s again >/dev/null
    "$TESSERA" disk change rpfs start -d "rp2;rp4" >/dev/null
    t0=$(date +%s%N)
    out=$("$TESSERA" restripe rpfs -r)
    ns=$(($(date +%s%N) - t0))
    mib=$(echo "$out" | sed -n 's/.*(\([0-9.]*\) MiB).*/\1/p')
    secs=$(python3 -c "print($ns / 1e9)")

    # The reference: as many bytes read from one drive file and written to another.
    count=$(python3 -c "print(max(1, int($mib / 4)))")
    sync
    t0=$(date +%s%N)
    dd if="$WORK/t/drives/d1" of="$WORK/t/copy" bs=4M count="$count" iflag=direct oflag=direct conv=fsync status=none
    copy_secs=$(python3 -c "print(($(date +%s%N) - $t0) / 1e9)")
    rm -f "$WORK/t/copy"
    echo "$round $one $two $mib $secs $count $copy_secs" | tee -a "$OUT" >&2
done
cleanup
rm -rf "$WORK/t"

python3 - "$OUT" "$DATA_BYTES" <<'PY'
import sys
rows = [[float(x) for x in l.split()] for l in open(sys.argv[1]) if l.strip()]
print(f"Sequential 1 MiB writes of {sys.argv[2]} (fio, one job, fsync at the end), and restripe -r:")
print()
print("| round | -r 1 (MiB/s) | -r 2 (MiB/s) | -r 2 / -r 1 | restripe -r (MiB/s) | copy (MiB/s) | restripe -r / copy |")
print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
w, r = [], []
for rnd, one, two, mib, secs, count, cs in rows:
    rate, copy = mib / secs, count * 4 / cs
    w.append(two / one)
    r.append(rate / copy)
    print(f"| {int(rnd)} | {one:,.0f} | {two:,.0f} | {two / one:.2f} | {rate:,.0f} | {copy:,.0f} | {rate / copy:.2f} |")
print()
print(f"Mean: -r 2 / -r 1 = {sum(w) / len(w):.2f} (goal >= 0.45); restripe -r / copy = {sum(r) / len(r):.2f}")
PY
