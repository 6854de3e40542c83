#!/usr/bin/env bash
# Metadata rates of two Tessera builds on the same backing store, measured in one run.
#
#   bench/md_compare.sh BEFORE_BINARY AFTER_BINARY [WORKDIR]     (as root; needs a C compiler)
#   ROUNDS=N (default 3), MD_FILES=N (default 100000), MD_DIRS=N (default 1: one directory;
#   more spreads the files over that many, as mdtest does), BLOCK=4M
#
# Each build gets a one-node cluster on four preallocated drive files, one file system,
# mounted, and bench/mdbench.c creates, stats and unlinks MD_FILES empty files in one
# directory. Rounds alternate which build goes first; the table shows each build's median
# and the median (min-max) of the per-round after/before ratios. Use it to check that a
# change of the metadata path costs no more than it should (for example a release build of
# the commit before a change against one of the change).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=$(readlink -f "$1")
AFTER=$(readlink -f "$2")
WORK=${3:-/var/tmp/tessera-md-compare}
ROUNDS=${ROUNDS:-3}
MD_FILES=${MD_FILES:-100000}
MD_DIRS=${MD_DIRS:-1}
BLOCK=${BLOCK:-4M}
DRIVE_BYTES=${DRIVE_BYTES:-2G}

for tool in cc python3 fallocate; do
    command -v $tool >/dev/null || { echo "md_compare: $tool is missing" >&2; exit 1; }
done
mkdir -p "$WORK"
MDBENCH=$WORK/mdbench
cc -O2 -o "$MDBENCH" bench/mdbench.c

# run BINARY TAG -> prints "create stat unlink" (operations per second)
run() {
    local bin=$1 tag=$2
    local dir=$WORK/$tag
    export TESSERA_HOME=$dir/home
    "$bin" shutdown >/dev/null 2>&1 || true
    rm -rf "$dir"
    mkdir -p "$dir/drives" "$dir/mnt"
    local stanza=$dir/nsd.stanza
    : >"$stanza"
    for i in 0 1 2 3; do
        fallocate -l "$DRIVE_BYTES" "$dir/drives/d$i"
        printf '%%nsd: device=%s nsd=%s%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
            "$dir/drives/d$i" "$tag" "$i" "$((i + 1))" >>"$stanza"
    done
    "$bin" cluster create --name "md$tag" >/dev/null
    "$bin" startup >/dev/null
    "$bin" nsd create -F "$stanza" >/dev/null
    "$bin" fs create "md$tag" -F "$stanza" -B "$BLOCK" -T "$dir/mnt" -A no >/dev/null
    "$bin" mount "md$tag" >/dev/null
    local out
    out=$("$MDBENCH" "$dir/mnt/md" "$MD_FILES" "$MD_DIRS")
    "$bin" shutdown >/dev/null 2>&1 || true
    rm -rf "$dir"
    echo "$out" | awk '$1 == "create" {c=$4} $1 == "stat" {s=$4} $1 == "unlink" {u=$4} END {print c, s, u}'
}

declare -a B A
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then
        B[$r]=$(run "$BEFORE" before); A[$r]=$(run "$AFTER" after)
    else
        A[$r]=$(run "$AFTER" after); B[$r]=$(run "$BEFORE" before)
    fi
    echo "round $r: before ${B[$r]}  after ${A[$r]} (create stat unlink /s)" >&2
done

python3 - "$MD_FILES" "$MD_DIRS" "${B[@]}" -- "${A[@]}" <<'PY'
import statistics, sys
files, dirs = sys.argv[1], int(sys.argv[2])
args = " ".join(sys.argv[3:]).split()
cut = args.index("--")
b = [list(map(float, args[i:i+3])) for i in range(0, cut, 3)]
a = [list(map(float, args[cut+1+i:cut+4+i])) for i in range(0, len(args) - cut - 1, 3)]
where = "one directory" if dirs == 1 else f"{dirs} directories"
print(f"| {files} files, {where} | before /s | after /s | after/before (min-max) |")
print("| --- | ---: | ---: | ---: |")
for j, name in enumerate(["create", "stat", "unlink"]):
    rb = [x[j] for x in b]; ra = [x[j] for x in a]
    ratios = [y / x for x, y in zip(rb, ra)]
    print(f"| {name} | {statistics.median(rb):.0f} | {statistics.median(ra):.0f} | "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
PY
