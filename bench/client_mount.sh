#!/usr/bin/env bash
# One file system mounted on two nodes in network namespaces: what the client (node2)
# pays against the owner (node1, its metanode) for metadata (bench/mdbench.c: create, stat
# and unlink of FILES empty files in one directory, one process) and for sequential data
# (dd of MB MiB with conv=fsync, then a read with the page cache dropped). One node after
# the other, each in its own directory; the ratio client/owner is the figure of merit
# (same drive, same run).
#
#   bench/client_mount.sh            (FILES=5000 MB=400; root; about 2 minutes)
#
# Prints a Markdown table. Uses scripts/cluster-netns.sh with its own prefix, base and
# subnet, so a test cluster can run beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
files=${FILES:-5000}
mb=${MB:-400}
export TSR_PREFIX=${TSR_PREFIX:-tb-} TSR_BASE=${TSR_BASE:-/var/tmp/tbnet}
export TSR_SUBNET=${TSR_SUBNET:-10.78.0}
cargo build --release -q -p tessera
export TESSERA_BIN=${TESSERA_BIN:-$PWD/target/release/tessera}
net=scripts/cluster-netns.sh
$net down >/dev/null 2>&1 || true
$net up 2 --drives 1 --size 2G --config failureDetectionTime=3 >/dev/null
trap '$net down >/dev/null 2>&1 || true' EXIT
mdbench=$TSR_BASE/mdbench
cc -O2 -o "$mdbench" bench/mdbench.c
stanza=$TSR_BASE/b1.stanza
echo "%nsd: device=$TSR_BASE/drives/node1-d1.img nsd=b1 usage=dataAndMetadata failureGroup=1 pool=system" >"$stanza"
mnt() { echo "$TSR_BASE/node$1/mnt/b1"; }
# dd's rate in MB/s, whatever unit it chose.
mbps() { awk '/copied/ { f = $NF == "GB/s" ? 1000 : ($NF == "kB/s" ? 0.001 : 1); printf "%.0f", $(NF-1) * f }'; }
$net run 1 -- tessera nsd create -F "$stanza" >/dev/null
$net run 1 -- tessera fs create b1 -F "$stanza" -T "$(mnt 1)" >/dev/null
for k in 1 2; do
    $net run "$k" -- tessera mount b1 -T "$(mnt "$k")" >/dev/null
done
echo "| node | create /s | stat /s | unlink /s | write MB/s | read MB/s |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
declare -A rate
for k in 1 2; do
    dir=$(mnt "$k")/md$k
    for phase in create stat unlink; do
        # Phase 1 creates DIR, the others reuse it.
        out=$("$mdbench" "$dir" "$files" 1 "$phase")
        rate[$k,$phase]=$(awk -v p="$phase" '$1 == p { print $4 }' <<<"$out")
    done
    file=$(mnt "$k")/data$k
    w=$(dd if=/dev/zero of="$file" bs=1M count="$mb" conv=fsync 2>&1 | mbps)
    echo 3 >/proc/sys/vm/drop_caches
    r=$(dd if="$file" of=/dev/null bs=1M 2>&1 | mbps)
    rate[$k,write]=$w
    rate[$k,read]=$r
    role=$([ "$k" = 1 ] && echo "owner, metanode" || echo "client")
    echo "| node$k ($role) | ${rate[$k,create]} | ${rate[$k,stat]} | ${rate[$k,unlink]} | $w | $r |"
done
for k in 2 1; do
    $net run "$k" -- tessera umount b1 >/dev/null
done
