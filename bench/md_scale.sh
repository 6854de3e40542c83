#!/usr/bin/env bash
# Metadata at scale: mdtest-style create, stat and unlink of SMALL and BIG numbers of empty
# files, in one directory and spread over DIRS directories, on Tessera and on XFS over the
# same backing store, measured in one run; plus the Tessera daemon's memory and its
# startup and mount times with BIG files against MOUNT_SMALL files.
#
#   bench/md_scale.sh [WORKDIR]        (as root; needs xfsprogs and a C compiler)
#   BIG=10000000 SMALL=100000 MOUNT_SMALL=10000 DIRS=1000 XFS=1 (0 skips XFS)
#   LAYOUTS="one many" (one directory, DIRS directories)
#   DRIVE_BYTES=8G (four Tessera drive files), XFS_BYTES=64G (sparse image)
#   PAGEPOOL=1G (Tessera's metadata page cache; unset keeps the default)
#   METRICS=127.0.0.1:9710 (the daemon's metricsAddress, for watching a long run; its first
#     start in each run has it off, so the create phase is served without it)
#   MAX_INODES (the file system's inode limit, --inode-limit; default BIG plus a fifth)
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera
#   MOUNT_ONLY=1 measures only startup and mount, with MOUNT_SMALL and with BIG files
#   SETTLE=10 seconds between the daemon's stop and its timed start (see restart_timed)
#   COLD_UNLINK=1 drops the kernel's dentries and inodes between stat and unlink, on both
#     file systems: the kernel cannot keep ten million dentries from the stat, so at BIG
#     most unlinks need a lookup first (a FUSE round trip for Tessera) while at SMALL none
#     does; cold, both sizes pay it and the ratio compares the file system alone
#
# Between create and stat each file system is unmounted and mounted again (Tessera: the
# daemon is shut down and started, so stat runs from cold caches and mount reads what the
# create left on disk). SMALL runs before and after BIG and the table shows their mean. The
# table gives each rate, Tessera's rate at BIG over its rate at
# SMALL (the issue's "no cliff" figure), the Tessera/XFS ratios, the daemon's peak resident
# memory, and the startup and mount times.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-md-scale}
BIG=${BIG:-10000000}
SMALL=${SMALL:-100000}
MOUNT_SMALL=${MOUNT_SMALL:-10000}
DIRS=${DIRS:-1000}
XFS=${XFS:-1}
LAYOUTS=${LAYOUTS:-one many}
DRIVE_BYTES=${DRIVE_BYTES:-8G}
XFS_BYTES=${XFS_BYTES:-64G}
BLOCK=${BLOCK:-4M}
PAGEPOOL=${PAGEPOOL:-}
METRICS=${METRICS:-}
MAX_INODES=${MAX_INODES:-$((BIG + BIG / 5 + 10000))}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
COLD_UNLINK=${COLD_UNLINK:-0}
export TESSERA_HOME=$WORK/home

# stat_unlink DIR FILES DIRS: mdbench's stat and unlink lines (with COLD_UNLINK=1, the
# kernel's dentry and inode caches are dropped in between).
stat_unlink() {
    if [ "$COLD_UNLINK" = 1 ]; then
        "$MDBENCH" "$1" "$2" "$3" stat
        sync
        echo 2 >/proc/sys/vm/drop_caches
        "$MDBENCH" "$1" "$2" "$3" unlink
    else
        "$MDBENCH" "$1" "$2" "$3" stat,unlink
    fi
}

for tool in cc python3 fallocate; do
    command -v $tool >/dev/null || { echo "md_scale: $tool is missing" >&2; exit 1; }
done
[ "$XFS" = 0 ] || command -v mkfs.xfs >/dev/null || { echo "md_scale: mkfs.xfs is missing (apt-get install xfsprogs)" >&2; exit 1; }
[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2
mkdir -p "$WORK"
MDBENCH=$WORK/mdbench
cc -O2 -o "$MDBENCH" bench/mdbench.c
OUT=$WORK/results.txt
: >"$OUT"

cleanup() (
    set +e
    "$TESSERA" shutdown >/dev/null 2>&1
    umount "$WORK/xfs" 2>/dev/null
    [ -n "${LOOP:-}" ] && losetup -d "$LOOP"
    true
)
trap cleanup EXIT

ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
daemon_pid() { pgrep -n -f "^$TESSERA daemon" || true; }
# kib FIELD: a field of the daemon's /proc status (VmRSS, VmHWM) in KiB.
kib() { awk -v f="$1:" '$1 == f {print $2}' "/proc/$(daemon_pid)/status"; }

tessera_fresh() {
    cleanup
    rm -rf "$WORK/t"
    mkdir -p "$WORK/t/drives" "$WORK/t/mnt"
    local stanza=$WORK/t/nsd.stanza
    : >"$stanza"
    for i in 0 1 2 3; do
        fallocate -l "$DRIVE_BYTES" "$WORK/t/drives/d$i"
        printf '%%nsd: device=%s nsd=scale%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
            "$WORK/t/drives/d$i" "$i" "$((i + 1))" >>"$stanza"
    done
    rm -rf "$TESSERA_HOME"
    "$TESSERA" cluster create --name scale >/dev/null
    "$TESSERA" startup >/dev/null
    [ -z "$PAGEPOOL" ] || "$TESSERA" config set "pagepool=$PAGEPOOL" >/dev/null
    [ -z "$METRICS" ] || "$TESSERA" config set "metricsAddress=$METRICS" >/dev/null
    "$TESSERA" nsd create -F "$stanza" >/dev/null
    "$TESSERA" fs create scale -F "$stanza" -B "$BLOCK" --inode-limit "$MAX_INODES" -T "$WORK/t/mnt" -A no >/dev/null
    "$TESSERA" mount scale >/dev/null
}

# restart_timed: unmount, stop the daemon, start it and mount again, setting startup_ms and
# mount_ms (the caller's variables) to how long starting and mounting took. Between stop
# and start it waits SETTLE seconds (default 10): after an unmount the kernel goes on
# evicting the mount's FUSE inodes (millions of them after a big create), which is not part
# of starting or mounting (the likely reason both took three times as long at ten million
# files in the run of 2026-11-27; to be confirmed by the next run).
restart_timed() {
    local t0
    "$TESSERA" umount scale >/dev/null
    "$TESSERA" shutdown >/dev/null
    sync
    sleep "${SETTLE:-10}"
    t0=$(date +%s%N)
    "$TESSERA" startup >/dev/null
    startup_ms=$(ms_since "$t0")
    t0=$(date +%s%N)
    "$TESSERA" mount scale >/dev/null
    mount_ms=$(ms_since "$t0")
}

# tessera_run FILES DIRS LABEL: one create, restart, stat, unlink; appends result lines.
tessera_run() {
    local files=$1 dirs=$2 label=$3
    tessera_fresh
    local c s u rss startup_ms mount_ms
    c=$("$MDBENCH" "$WORK/t/mnt/md" "$files" "$dirs" create | awk '{print $4}')
    rss=$(kib VmHWM)
    restart_timed
    local rest
    rest=$(stat_unlink "$WORK/t/mnt/md" "$files" "$dirs")
    s=$(echo "$rest" | awk '$1 == "stat" {print $4}')
    u=$(echo "$rest" | awk '$1 == "unlink" {print $4}')
    local hwm
    hwm=$(kib VmHWM)
    echo "tessera $label $files $c $s $u $rss $hwm $startup_ms $mount_ms" | tee -a "$OUT" >&2
}

# tessera_mount_only FILES [DIRS]: startup and mount times with FILES files in one
# directory (or spread over DIRS).
tessera_mount_only() {
    local files=$1 dirs=${2:-1}
    tessera_fresh
    "$MDBENCH" "$WORK/t/mnt/md" "$files" "$dirs" create >/dev/null
    local startup_ms mount_ms label=one
    [ "$dirs" = 1 ] || label=many
    restart_timed
    echo "tessera-mount $label $files - - - - - $startup_ms $mount_ms" | tee -a "$OUT" >&2
}

# MOUNT_ONLY=1: only the startup and mount times, with MOUNT_SMALL files and with BIG files,
# both in DIRS directories (each restarted twice), no rates and no XFS. Both in one layout:
# what a mount reads depends on the layout as well as on the file count (on 2026-12-05,
# 100,000 files in 1,000 directories mounted in 79 ms, 10,000 in one directory in 25-33).
if [ "${MOUNT_ONLY:-0}" = 1 ]; then
    tessera_mount_only "$MOUNT_SMALL" "$DIRS"
    restart_timed
    echo "tessera-mount again $MOUNT_SMALL - - - - - $startup_ms $mount_ms" | tee -a "$OUT" >&2
    tessera_mount_only "$BIG" "$DIRS"
    restart_timed
    echo "tessera-mount again $BIG - - - - - $startup_ms $mount_ms" | tee -a "$OUT" >&2
    cleanup
    rm -rf "$WORK/t"
    exit 0
fi

xfs_run() {
    local files=$1 dirs=$2 label=$3
    cleanup
    LOOP=
    rm -f "$WORK/xfs.img"
    mkdir -p "$WORK/xfs"
    truncate -s "$XFS_BYTES" "$WORK/xfs.img"
    LOOP=$(losetup --find --show --direct-io=on "$WORK/xfs.img")
    mkfs.xfs -q -f "$LOOP"
    mount "$LOOP" "$WORK/xfs"
    local c s u rest t0 mount_ms
    c=$("$MDBENCH" "$WORK/xfs/md" "$files" "$dirs" create | awk '{print $4}')
    umount "$WORK/xfs"
    t0=$(date +%s%N)
    mount "$LOOP" "$WORK/xfs"
    mount_ms=$(ms_since "$t0")
    rest=$(stat_unlink "$WORK/xfs/md" "$files" "$dirs")
    s=$(echo "$rest" | awk '$1 == "stat" {print $4}')
    u=$(echo "$rest" | awk '$1 == "unlink" {print $4}')
    umount "$WORK/xfs"
    losetup -d "$LOOP"
    LOOP=
    rm -f "$WORK/xfs.img"
    echo "xfs $label $files $c $s $u - - - $mount_ms" | tee -a "$OUT" >&2
}

for layout in $LAYOUTS; do
    dirs=1
    [ $layout = many ] && dirs=$DIRS
    # The mount reference in the same layout as the rates (see MOUNT_ONLY).
    tessera_mount_only "$MOUNT_SMALL" "$dirs"
    # SMALL again after BIG: the machine's speed drifts over an hour-long BIG run, so the
    # SMALL rates (the "no cliff" reference) are the mean of one run before and one after.
    for files in "$SMALL" "$BIG" "$SMALL"; do
        tessera_run "$files" "$dirs" "$layout"
        [ "$XFS" = 0 ] || xfs_run "$files" "$dirs" "$layout"
    done
done
cleanup
rm -rf "$WORK/t"

python3 - "$OUT" "$SMALL" "$BIG" "$MOUNT_SMALL" "$DIRS" <<'PY'
import sys
path, small, big, mount_small, dirs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = [l.split() for l in open(path) if l.strip()]
# Several runs of one size (SMALL before and after BIG): the mean of each figure.
runs = {}
for r in rows:
    runs.setdefault((r[0], r[1], int(r[2])), []).append(r[3:])
def mean(values):
    nums = [float(v) for v in values if v != "-"]
    return f"{sum(nums) / len(nums):.0f}" if nums else "-"
res = {k: [mean(col) for col in zip(*v)] for k, v in runs.items()}
def num(x):
    return None if x == "-" else float(x)
print(f"| files | directories | op | Tessera /s | XFS /s | Tessera/XFS | Tessera {big:,} / {small:,} |")
print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
for layout, label in (("one", "1"), ("many", dirs)):
    for files in (small, big):
        t = res.get(("tessera", layout, files))
        x = res.get(("xfs", layout, files))
        ts = res.get(("tessera", layout, small))
        if not t and not x:
            continue
        for i, op in enumerate(("create", "stat", "unlink")):
            tv = num(t[i]) if t else None
            xv = num(x[i]) if x else None
            ratio = f"{tv / xv:.2f}" if tv and xv else "-"
            scale = f"{tv / num(ts[i]):.2f}" if files == big and tv and ts else ""
            print(f"| {files:,} | {label} | {op} | {tv or 0:.0f} | {xv or 0:.0f} | {ratio} | {scale} |")
print()
print("| files | directories | daemon peak RSS during create (MiB) | peak RSS after restart, stat and unlink (MiB) | startup (ms) | mount (ms) | XFS mount (ms) |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for layout, label in (("one", "1"), ("many", dirs)):
    m = res.get(("tessera-mount", layout, mount_small))
    if m:
        print(f"| {mount_small:,} | {label} | - | - | {m[5]} | {m[6]} | - |")
    for files in (small, big):
        t = res.get(("tessera", layout, files))
        x = res.get(("xfs", layout, files))
        if not t:
            continue
        print(f"| {files:,} | {label} | {int(t[3]) // 1024} | {int(t[4]) // 1024} | {t[5]} | {t[6]} | {x[6] if x else '-'} |")
PY
