#!/usr/bin/env bash
# What watching costs: fio on a Tessera mount with a scraper fetching /metrics and the
# JSON API (the dashboard's requests) every 100 ms, against the same fio without it, in
# one run.
#
#   bench/metrics_overhead.sh [WORKDIR]     (as root; needs fio, curl, python3)
#   ROUNDS=N (default 4), SEQ_BYTES=2G, RAND_BYTES=1G, RAND_SECONDS=20, PERIOD=0.1
#   TESSERA_BIN=PATH measures that binary instead of building target/release/tessera
#
# One one-node cluster on four preallocated drive files with metricsAddress set; each round
# runs a sequential 1 MiB write and a 4 KiB random read (libaio, QD16, direct) with and
# without the scraper, alternating which goes first. The table shows the medians and the
# median (min-max) of the per-round with/without ratios; the issue asks at least 0.97.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/var/tmp/tessera-metrics-overhead}
ROUNDS=${ROUNDS:-4}
SEQ_BYTES=${SEQ_BYTES:-2G}
RAND_BYTES=${RAND_BYTES:-1G}
RAND_SECONDS=${RAND_SECONDS:-20}
PERIOD=${PERIOD:-0.1}
DRIVE_BYTES=${DRIVE_BYTES:-4G}
PORT=${PORT:-9719}
TESSERA=${TESSERA_BIN:-$ROOT/target/release/tessera}
export TESSERA_HOME=$WORK/home

for tool in fio curl python3 fallocate; do
    command -v $tool >/dev/null || { echo "metrics_overhead: $tool is missing" >&2; exit 1; }
done
[ -n "${TESSERA_BIN:-}" ] || cargo build --release -p tessera >&2

SCRAPER=
cleanup() (
    set +e
    [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null
    "$TESSERA" shutdown >/dev/null 2>&1
    true
)
trap 'cleanup; rm -rf "$WORK"' EXIT
cleanup
rm -rf "$WORK"
mkdir -p "$WORK/drives" "$WORK/mnt"
STANZA=$WORK/nsd.stanza
: >"$STANZA"
for i in 0 1 2 3; do
    fallocate -l "$DRIVE_BYTES" "$WORK/drives/d$i"
    printf '%%nsd: device=%s nsd=mo%s usage=dataAndMetadata failureGroup=%s pool=system\n' \
        "$WORK/drives/d$i" "$i" "$((i + 1))" >>"$STANZA"
done
"$TESSERA" cluster create --name overhead >/dev/null
"$TESSERA" startup >/dev/null
"$TESSERA" config set "metricsAddress=127.0.0.1:$PORT" >/dev/null
"$TESSERA" shutdown >/dev/null
"$TESSERA" startup >/dev/null
"$TESSERA" nsd create -F "$STANZA" >/dev/null
"$TESSERA" fs create mo -F "$STANZA" -B 4M -T "$WORK/mnt" -A no >/dev/null
"$TESSERA" mount mo >/dev/null
curl -sf "http://127.0.0.1:$PORT/metrics" >/dev/null || { echo "metrics_overhead: no /metrics on port $PORT" >&2; exit 1; }

# Every PERIOD: a Prometheus scrape and what an open dashboard asks for.
scraper_on() {
    local base="http://127.0.0.1:$PORT"
    (while true; do
        curl -sf "$base/metrics" "$base/api/v1/filesystems" "$base/api/v1/filesystems/mo/throughput" \
            "$base/api/v1/das" "$base/api/v1/pdisks" "$base/api/v1/health" "$base/api/v1/events" >/dev/null
        sleep "$PERIOD"
    done) &
    SCRAPER=$!
}
scraper_off() {
    kill "$SCRAPER" 2>/dev/null || true
    wait "$SCRAPER" 2>/dev/null || true
    SCRAPER=
}

# fio_rate NAME ARGS... -> MB/s (sequential) or IOPS (random) of one fio run.
fio_rate() {
    local name=$1 field=$2
    shift 2
    fio --name="$name" --directory="$WORK/mnt" --output-format=json "$@" >"$WORK/$name.json"
    python3 - "$WORK/$name.json" "$field" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
v = sum(job[d][sys.argv[2]] for job in j["jobs"] for d in ("read", "write"))
print(f"{v / 1e6:.1f}" if sys.argv[2] == "bw_bytes" else f"{v:.0f}")
PY
}

rand=(--bs=4k --size="$RAND_BYTES" --ioengine=libaio --iodepth=16 --direct=1 --filename=rand.dat)
fio_rate prepare bw_bytes --rw=write --bs=1M --size="$RAND_BYTES" --filename=rand.dat --end_fsync=1 >/dev/null

declare -A R
measure() {
    local mode=$1 r=$2
    [ "$mode" = with ] && scraper_on
    R[$mode,seq,$r]=$(fio_rate seq bw_bytes --rw=write --bs=1M --size="$SEQ_BYTES" --end_fsync=1 --ioengine=psync)
    rm -f "$WORK/mnt/seq"*
    R[$mode,rand,$r]=$(fio_rate rand iops --rw=randread --time_based --runtime="$RAND_SECONDS" "${rand[@]}")
    [ "$mode" = with ] && scraper_off
    echo "round $r $mode scraper: seq write ${R[$mode,seq,$r]} MB/s, rand read ${R[$mode,rand,$r]} IOPS" >&2
}
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then measure without "$r"; measure with "$r"; else measure with "$r"; measure without "$r"; fi
done

row() {
    local key=$1 label=$2
    local w=() o=()
    for r in $(seq 1 "$ROUNDS"); do w+=("${R[with,$key,$r]}"); o+=("${R[without,$key,$r]}"); done
    python3 - "$label" "${w[*]}" "${o[*]}" <<'PY'
import statistics, sys
label, w, o = sys.argv[1], list(map(float, sys.argv[2].split())), list(map(float, sys.argv[3].split()))
ratios = [a / b for a, b in zip(w, o) if b]
print(f"| {label} | {statistics.median(w):.1f} | {statistics.median(o):.1f} | "
      f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) |")
PY
}
echo "| test | with scraper every ${PERIOD}s | without | with/without, median (range) of $ROUNDS rounds |"
echo "| --- | ---: | ---: | ---: |"
row seq "seq write 1 MiB, 1 job (MB/s)"
row rand "rand read 4 KiB, QD16 direct (IOPS)"
