#!/usr/bin/env bash
# Tessera's erasure-coding kernels against ISA-L and klauspost/reedsolomon, on one core,
# measured in one run.
#
#   bench/ec.sh [SECONDS_PER_RUN] [ROUNDS]      (defaults 2 and 3; needs libisal-dev, Go, cc)
#
# For 8+2p at 128 KiB and 1 MiB strips it runs each engine ROUNDS times, interleaved
# (ISA-L, klauspost, Tessera, ISA-L, ...), all pinned to the same core, and keeps each
# engine's best encode and decode: the host is shared, so a run can lose a third of its
# speed to a neighbour, and the best of interleaved runs is the fairest comparison.
# GB/s = data bytes (k x strip) per second, 1e9 bytes, one thread; decode = rebuild the
# first m data strips. Prints a Markdown table with Tessera's ratio to the faster reference.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-2}
ROUNDS=${2:-3}
CORE=${EC_BENCH_CORE:-1}
WORK=${TMPDIR:-/tmp}/tessera-ec-bench
GO=$(command -v go || echo /usr/local/go/bin/go)
mkdir -p "$WORK"

[ -f /usr/include/isa-l/erasure_code.h ] || {
    echo "bench/ec.sh: ISA-L headers missing (apt-get install -y libisal-dev)" >&2
    exit 1
}
[ -x "$GO" ] || { echo "bench/ec.sh: Go toolchain not found (PATH or /usr/local/go/bin)" >&2; exit 1; }
for tool in cc taskset python3; do
    command -v $tool >/dev/null || { echo "bench/ec.sh: $tool is missing" >&2; exit 1; }
done

cc -O2 -Wall -o "$WORK/isal_bench" bench/ec/isal_bench.c -lisal
(cd bench/ec/klauspost && "$GO" build -o "$WORK/klauspost_bench" .)
cargo build --release -p tessera >&2
cargo build --release -p tessera-ec --example ec_bench >&2

# Prefer the CLI; the example prints the same -Y lines if the CLI lacks `bench ec`. Only
# the last fields (kernel, encode, decode) are read, so either record prefix works.
TESSERA=(target/release/tessera bench ec)
if ! "${TESSERA[@]}" --code 8+2p --strip 4K --seconds 0.1 -Y 2>/dev/null | grep -q 'ec:0:1:'; then
    TESSERA=(target/release/examples/ec_bench)
fi
echo "bench/ec.sh: Tessera measured with ${TESSERA[*]}" >&2

RESULTS=$WORK/results.txt
: >"$RESULTS"
for strip in 128K 1M; do
    case $strip in 128K) bytes=131072 ;; 1M) bytes=1048576 ;; esac
    for round in $(seq "$ROUNDS"); do
        echo "bench/ec.sh: $strip round $round/$ROUNDS" >&2
        echo "$strip isa-l $(taskset -c "$CORE" "$WORK/isal_bench" 8 2 $bytes "$DURATION" | tail -1)" >>"$RESULTS"
        echo "$strip klauspost $(taskset -c "$CORE" "$WORK/klauspost_bench" 8 2 $bytes "$DURATION" | tail -1)" >>"$RESULTS"
        echo "$strip tessera $(taskset -c "$CORE" "${TESSERA[@]}" --code 8+2p --strip $strip \
            --seconds "$DURATION" -Y | grep -v HEADER | tail -1)" >>"$RESULTS"
    done
done

python3 - "$RESULTS" <<'PY'
import sys
best, kernel = {}, "?"
for line in open(sys.argv[1]):
    strip, engine, rec = line.split()
    f = rec.split(":")
    enc, dec = float(f[-3]), float(f[-2])
    if engine == "tessera":
        kernel = f[-4]
    e, d = best.get((strip, engine), (0.0, 0.0))
    best[(strip, engine)] = (max(e, enc), max(d, dec))
head = ["code", "strip", "ISA-L enc", "ISA-L dec", "klauspost enc", "klauspost dec",
        "Tessera enc", "Tessera dec", "enc vs best ref", "dec vs best ref"]
rows = []
for strip in ("128K", "1M"):
    i, k, t = (best[(strip, e)] for e in ("isa-l", "klauspost", "tessera"))
    re, rd = max(i[0], k[0]), max(i[1], k[1])
    rows.append(["8+2p", strip] + [f"{x:.2f}" for x in (*i, *k, *t)]
                + [f"{t[0] / re:.0%}", f"{t[1] / rd:.0%}"])
w = [max(len(r[c]) for r in [head] + rows) for c in range(len(head))]
fmt = lambda r: "| " + " | ".join(x.rjust(w[c]) if c > 1 else x.ljust(w[c]) for c, x in enumerate(r)) + " |"
print(f"GB/s of data, one thread on one core, best of each engine's runs; Tessera kernel {kernel}")
print()
print(fmt(head))
print("| " + " | ".join("-" * (x - 1) + (":" if c > 1 else "-") for c, x in enumerate(w)) + " |")
for r in rows:
    print(fmt(r))
PY
