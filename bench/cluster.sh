#!/usr/bin/env bash
# Cluster timings with real node processes on loopback TCP (one process per member, each
# with its own redb store): kill -9 of the cluster manager until a new manager grants
# leases, kill -9 of a node until its expel, configuration-change latency, lease traffic
# and its extrapolation to 1,000 and 10,000 nodes. 3 and 5 quorum-manager nodes, plus one
# client each, first with test timings, then with the production defaults.
#
#   bench/cluster.sh [TEST_ROUNDS] [PRODUCTION_ROUNDS] [CHANGES]   (defaults 5, 2, 200)
#
# Test timings: failureDetectionTime=$TEST_FDT (default 2), leaseRecoveryWait=1. Production
# timings: 35 and 35 (the defaults); each of their rounds takes 2-2.5 minutes, so the
# default production part takes about 9 minutes. 0 rounds skips a part. CHANGES is the number
# of `config set` samples per round, half at the manager and half at the client.
# Prints Markdown tables; the measurements are explained in bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
test_rounds=${1:-5}
production_rounds=${2:-2}
changes=${3:-200}
test_fdt=${TEST_FDT:-2}
cargo build --release -q -p tessera-cluster --example cluster_timings
timings=target/release/examples/cluster_timings
if [ "$test_rounds" -gt 0 ]; then
    "$timings" --quorum 3,5 --rounds "$test_rounds" --changes "$changes" \
        --failure-detection "$test_fdt" --lease-recovery-wait 1
fi
if [ "$production_rounds" -gt 0 ]; then
    "$timings" --quorum 3,5 --rounds "$production_rounds" --changes "$changes" \
        --failure-detection 35 --lease-recovery-wait 35
fi
