#!/usr/bin/env bash
# Tessera against XFS on the same backing store, measured in one run.
#
#   bench/run.sh [WORKDIR]            (as root; needs fio, xfsprogs, a C compiler)
#   ROUNDS=N (default 3), KEEP=1 keeps WORKDIR (the drives and the XFS image) afterwards.
#   TESSERA_BIN=BINARY measures that build instead of building target/release/tessera.
#   BEFORE=BINARY: also measure another Tessera build (for example a release build of the
#   commit before a change) in the same rounds on the same drive files, and add its results
#   and the per-round this-build/BEFORE ratios to the table.
#
# Both file systems live in WORKDIR: Tessera on four drive files written in full (O_DIRECT,
# like four contiguous drives), XFS on a loop device over one image written in full, with
# direct I/O (so neither uses the guest page cache).
# Runs fio sequential 1 MiB write and read (1 and 4
# jobs), sequential small writes (4 KiB and 1 KiB pieces, one job, SMALL_BYTES and a
# quarter of it, fsync at the end: what the kernel's or the daemon's gathering of small
# writes is for), 4 KiB random read and write (libaio, iodepth 16, direct), and a metadata
# create/stat/unlink of 100,000 files from one process, then prints each result and the
# Tessera/XFS ratio as a Markdown table.
#
# The machine's disk is shared and its speed moves by 2x within minutes, so the whole set
# runs ROUNDS times (default 3), alternating which file system goes first, and the table
# shows medians: of each file system's results, and of the per-round ratios (with their
# range), each ratio taken from two runs minutes apart. Each Tessera measurement starts from
# a fresh one-node cluster and file system on the drive files.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-bench}
DRIVE_BYTES=${DRIVE_BYTES:-6G}
XFS_BYTES=${XFS_BYTES:-24G}
SEQ_BYTES=${SEQ_BYTES:-4G}
RAND_BYTES=${RAND_BYTES:-1G}
RAND_SECONDS=${RAND_SECONDS:-20}
SMALL_BYTES=${SMALL_BYTES:-256M}
MD_FILES=${MD_FILES:-100000}
BLOCK=${BLOCK:-4M}
ROUNDS=${ROUNDS:-3}
TESSERA=$(readlink -f "${TESSERA_BIN:-$ROOT/target/release/tessera}")
BEFORE=${BEFORE:+$(readlink -f "$BEFORE")}
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || { echo "bench: BEFORE=$BEFORE is not an executable" >&2; exit 1; }

for tool in fio mkfs.xfs losetup cc python3; do
    command -v $tool >/dev/null || { echo "bench: $tool is missing (apt-get install fio xfsprogs gcc)" >&2; exit 1; }
done
[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2
mkdir -p "$(dirname "$WORK")"
MDBENCH=$WORK.mdbench
cc -O2 -o "$MDBENCH" bench/mdbench.c

# Each build's daemon has its own home; tessera_down stops whichever runs.
home_of() { echo "$WORK/home-$(echo "$1" | cksum | cut -d' ' -f1)"; }
tessera_down() {
    local bin
    for bin in "$TESSERA" ${BEFORE:+"$BEFORE"}; do
        TESSERA_HOME=$(home_of "$bin") "$bin" shutdown >/dev/null 2>&1 || true
    done
}
cleanup() (
    set +e
    tessera_down
    umount "$WORK/xfs" 2>/dev/null
    [ -n "${LOOP:-}" ] && losetup -d "$LOOP"
    true
)
# At the end the drives and the XFS image (tens of GiB) go too, unless KEEP=1.
finish() {
    cleanup
    if [ "${KEEP:-0}" != 1 ] && [ -d "$WORK/drives" ]; then
        rm -rf "$WORK"
    fi
}
trap finish EXIT
cleanup
rm -rf "$WORK"
mkdir -p "$WORK/drives" "$WORK/xfs" "$WORK/tessera"

# XFS on a loop device over an image file, direct I/O to the backing file. The image is
# written in full first, as Tessera's drive files are below: on a sparse image XFS paid for
# the host file system's allocation at each region's first write, which Tessera did not.
truncate -s "$XFS_BYTES" "$WORK/xfs.img"
dd if=/dev/zero of="$WORK/xfs.img" bs=16M count="$(( $(numfmt --from=iec "$XFS_BYTES") / 16777216 ))" \
    oflag=direct conv=notrunc status=none
LOOP=$(losetup --find --show --direct-io=on "$WORK/xfs.img")
mkfs.xfs -q -f "$LOOP"
mount "$LOOP" "$WORK/xfs"

# Tessera on four drive files.
STANZA=$WORK/nsd.stanza
: >"$STANZA"
# Written once in full before round 1: a preallocated but never written range of an ext4
# file costs an unwritten-extent conversion on its first write, which would slow whichever
# build runs first (600 against 930 MB/s sequential, 9.9k against 18k random IOPS).
for i in 0 1 2 3; do
    fallocate -l "$DRIVE_BYTES" "$WORK/drives/d$i"
    dd if=/dev/zero of="$WORK/drives/d$i" bs=16M count="$(( $(numfmt --from=iec "$DRIVE_BYTES") / 16777216 ))" \
        oflag=direct conv=notrunc status=none
    printf '%%nsd: device=%s nsd=bench%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
        "$WORK/drives/d$i" "$i" "$((i + 1))" >>"$STANZA"
done

# tessera_up BINARY: a fresh one-node cluster of that build with the file system mounted
# on $WORK/tessera (the drives are formatted again).
tessera_up() {
    local bin=$1
    tessera_down
    export TESSERA_HOME
    TESSERA_HOME=$(home_of "$bin")
    rm -rf "$TESSERA_HOME"
    "$bin" cluster create --name bench >/dev/null
    "$bin" startup >/dev/null
    "$bin" nsd create -F "$STANZA" -v no >/dev/null
    "$bin" fs create bench -F "$STANZA" -B "$BLOCK" -T "$WORK/tessera" -A no -v no >/dev/null
    "$bin" mount bench >/dev/null
}

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# fio NAME DIR ARGS... -> prints "MB/s IOPS"
run_fio() {
    local name=$1 dir=$2
    shift 2
    fio --name="$name" --directory="$dir" --output-format=json "$@" >"$WORK/$name.json"
    python3 - "$WORK/$name.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
bw = iops = 0.0
for job in j["jobs"]:
    for d in ("read", "write"):
        bw += job[d]["bw_bytes"]; iops += job[d]["iops"]
print(f"{bw/1e6:.1f} {iops:.0f}")
PY
}

declare -A RESULT
# measure FS DIR ROUND: one run of every test, results kept as RESULT[FS,TEST,ROUND].
measure() {
    local fs=$1 dir=$2 r=$3
    local per1=$SEQ_BYTES
    local per4=$(( $(numfmt --from=iec "$SEQ_BYTES") / 4 ))
    RESULT[$fs,seqwrite1,$r]=$(run_fio "$fs-sw1" "$dir" --rw=write --bs=1M --size="$per1" --numjobs=1 --end_fsync=1 --ioengine=psync)
    drop_caches
    RESULT[$fs,seqread1,$r]=$(run_fio "$fs-sr1" "$dir" --rw=read --bs=1M --size="$per1" --numjobs=1 --ioengine=psync)
    rm -f "$dir"/"$fs-sw1"* "$dir"/"$fs-sr1"*
    RESULT[$fs,seqwrite4,$r]=$(run_fio "$fs-sw4" "$dir" --rw=write --bs=1M --size="$per4" --numjobs=4 --end_fsync=1 --ioengine=psync --group_reporting)
    drop_caches
    RESULT[$fs,seqread4,$r]=$(run_fio "$fs-sr4" "$dir" --rw=read --bs=1M --size="$per4" --numjobs=4 --ioengine=psync --group_reporting)
    rm -f "$dir"/"$fs-sw4"* "$dir"/"$fs-sr4"*
    local small=$SMALL_BYTES
    local tiny=$(( $(numfmt --from=iec "$SMALL_BYTES") / 4 ))
    RESULT[$fs,write4k,$r]=$(run_fio "$fs-s4k" "$dir" --rw=write --bs=4k --size="$small" --numjobs=1 --end_fsync=1 --ioengine=psync)
    RESULT[$fs,write1k,$r]=$(run_fio "$fs-s1k" "$dir" --rw=write --bs=1k --size="$tiny" --numjobs=1 --end_fsync=1 --ioengine=psync)
    rm -f "$dir"/"$fs-s4k"* "$dir"/"$fs-s1k"*
    local rand=(--bs=4k --size="$RAND_BYTES" --ioengine=libaio --iodepth=16 --direct=1 --time_based --runtime="$RAND_SECONDS" --filename=rand.dat)
    RESULT[$fs,randwrite,$r]=$(run_fio "$fs-rw" "$dir" --rw=randwrite "${rand[@]}" | awk '{print $2}')
    RESULT[$fs,randread,$r]=$(run_fio "$fs-rr" "$dir" --rw=randread "${rand[@]}" | awk '{print $2}')
    rm -f "$dir/rand.dat"
    local md
    md=$("$MDBENCH" "$dir/md" "$MD_FILES")
    RESULT[$fs,create,$r]=$(echo "$md" | awk '$1 == "create" {print $4}')
    RESULT[$fs,stat,$r]=$(echo "$md" | awk '$1 == "stat" {print $4}')
    RESULT[$fs,unlink,$r]=$(echo "$md" | awk '$1 == "unlink" {print $4}')
    for key in seqwrite1 seqread1 seqwrite4 seqread4 write4k write1k; do
        RESULT[$fs,$key,$r]=$(echo "${RESULT[$fs,$key,$r]}" | awk '{print $1}')
    done
    echo "round $r $fs: seq w1 ${RESULT[$fs,seqwrite1,$r]} r1 ${RESULT[$fs,seqread1,$r]} w4 ${RESULT[$fs,seqwrite4,$r]} r4 ${RESULT[$fs,seqread4,$r]} 4k ${RESULT[$fs,write4k,$r]} 1k ${RESULT[$fs,write1k,$r]} MB/s; rand w ${RESULT[$fs,randwrite,$r]} r ${RESULT[$fs,randread,$r]} IOPS; create ${RESULT[$fs,create,$r]} stat ${RESULT[$fs,stat,$r]} unlink ${RESULT[$fs,unlink,$r]} /s" >&2
}

# Each round starts with a different system (xfs, tessera, before, xfs, ...).
SYSTEMS=(xfs tessera ${BEFORE:+before})
for r in $(seq 1 "$ROUNDS"); do
    for i in $(seq 0 $((${#SYSTEMS[@]} - 1))); do
        fs=${SYSTEMS[$(( (r - 1 + i) % ${#SYSTEMS[@]} ))]}
        case $fs in
            xfs) measure xfs "$WORK/xfs" "$r" ;;
            tessera) tessera_up "$TESSERA"; measure tessera "$WORK/tessera" "$r"; tessera_down ;;
            before) tessera_up "$BEFORE"; measure before "$WORK/tessera" "$r"; tessera_down ;;
        esac
    done
done

# row KEY LABEL UNIT: medians over rounds and the median (min-max) of per-round ratios.
row() {
    local key=$1 label=$2 unit=$3
    local t=() x=() b=()
    for r in $(seq 1 "$ROUNDS"); do
        t+=("${RESULT[tessera,$key,$r]}")
        x+=("${RESULT[xfs,$key,$r]}")
        [ -z "$BEFORE" ] || b+=("${RESULT[before,$key,$r]}")
    done
    python3 - "$label" "$unit" "${t[*]}" "${x[*]}" "${b[*]:-}" <<'PY'
import statistics, sys
label, unit = sys.argv[1], sys.argv[2]
t, x = list(map(float, sys.argv[3].split())), list(map(float, sys.argv[4].split()))
b = list(map(float, sys.argv[5].split()))
fmt = (lambda v: f"{v:.0f}") if unit != "MB/s" else (lambda v: f"{v:.1f}")
def ratio(num, den):
    rs = [p / q for p, q in zip(num, den) if q]
    spread = f" ({min(rs):.2f}–{max(rs):.2f})" if len(rs) > 1 else ""
    return f"{statistics.median(rs):.2f}{spread}"
cells = [label, f"{fmt(statistics.median(t))} {unit}", f"{fmt(statistics.median(x))} {unit}", ratio(t, x)]
if b:
    cells += [f"{fmt(statistics.median(b))} {unit}", ratio(b, x), ratio(t, b)]
print("| " + " | ".join(cells) + " |")
PY
}
if [ -n "$BEFORE" ]; then
    echo "| test | Tessera | XFS | Tessera/XFS, median (range) of $ROUNDS rounds | BEFORE | BEFORE/XFS | Tessera/BEFORE |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
else
    echo "| test | Tessera | XFS | Tessera/XFS, median (range) of $ROUNDS rounds |"
    echo "| --- | ---: | ---: | ---: |"
fi
row seqwrite1 "seq write 1 MiB, 1 job" MB/s
row seqread1 "seq read 1 MiB, 1 job" MB/s
row seqwrite4 "seq write 1 MiB, 4 jobs" MB/s
row seqread4 "seq read 1 MiB, 4 jobs" MB/s
row write4k "seq write 4 KiB, 1 job" MB/s
row write1k "seq write 1 KiB, 1 job" MB/s
row randwrite "rand write 4 KiB, QD16 direct" IOPS
row randread "rand read 4 KiB, QD16 direct" IOPS
row create "create (1 process)" files/s
row stat "stat (1 process)" files/s
row unlink "unlink (1 process)" files/s
