#!/usr/bin/env bash
# Raw drives against an 8+2p vdisk built on them, in one run on the same backing store:
# sequential whole-block write and read, then the rebuild of one failed pdisk.
#   bench/vdisk.sh [DIR] [SIZE] [BLOCK]     (default /var/tmp/tessera-vdisk-bench 4G 1M)
# Twelve sparse drive files of 3 GiB in six "enclosures" are created under DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/var/tmp/tessera-vdisk-bench}
size=${2:-4G}
block=${3:-1M}
cargo build --release -q -p tessera
mkdir -p "$dir"
rm -f "$dir"/e*s* "$dir/pdisks.stanza"
for e in 1 2 3 4 5 6; do
    for s in 1 2; do
        truncate -s 3G "$dir/e${e}s${s}"
        echo "%pdisk: device=$dir/e${e}s${s} enclosure=jbof$e slot=$s" >>"$dir/pdisks.stanza"
    done
done
target/release/tessera bench vdisk -F "$dir/pdisks.stanza" --code 8+2p \
    --block-size "$block" --size "$size" --threads 4 --rounds 3 --rebuild
rm -f "$dir"/e*s*
