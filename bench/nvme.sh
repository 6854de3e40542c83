#!/usr/bin/env bash
# One file through NVMe/TCP over loopback against the same file with local O_DIRECT, in
# one run on the same backing store: 1 MiB sequential write/read at QD1 and QD4, 4 KiB
# random read/write at QD32; throughput, IOPS, p50/p99 latency and ratios (medians of
# interleaved rounds).
#   bench/nvme.sh [DIR] [SIZE] [SECONDS] [ROUNDS] [OPTIONS...]
# bench/nvme_fio.py runs the same with fio as a second local reference.
#                                 (default /var/tmp/tessera-nvme-bench 1G 5 3)
# OPTIONS go to `tessera bench nvme`, e.g. --huge-buffers to give the benchmark's own
# buffers (local and remote) huge pages instead of base pages like fio's.
# A `tessera drive-server` child process exports the file on 127.0.0.1; the benchmark
# process is the host.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/tessera-nvme-bench}
size=${2:-1G}
seconds=${3:-5}
rounds=${4:-3}
shift $(( $# < 4 ? $# : 4 ))
cargo build --release -q -p tessera
target/release/tessera bench nvme --dir "$dir" --size "$size" --seconds "$seconds" \
    --rounds "$rounds" --qd 32 "$@"
