#!/usr/bin/env bash
# IO500's four patterns, small, on one file system mounted on three nodes in network
# namespaces (bench/io500ish.c): IOR easy (a file per process, 1 MiB transfers), IOR hard
# (one shared file, 47008-byte transfers interleaved by process), mdtest easy (empty files,
# a directory per process) and hard (3901-byte files, one shared directory). RANKS
# processes in all, spread round-robin over 1, 2 and 3 nodes (node1 owns the metadata);
# each figure is the work of all processes over the slowest one's time, and the ratio to
# the 1-node run of the same command is the figure of merit (same drive, same run).
#
#   bench/cluster_io500.sh     (RANKS=3 MB=200 SEGMENTS=2000 FILES=2000; root; ~10 min)
#   PHASES="ior-hard-write ior-hard-read" NODES="1 3" bench/cluster_io500.sh   (a subset)
#   BLOCK=1M bench/cluster_io500.sh   (metadataSlots=yes, the default: nodes 2 and 3 own
#   the directories their processes make; BLOCK sets `fs create -B`, default 4M, and must
#   leave the 4 GiB drive free allocation regions to give, which 1M does; SLOTS=no: the
#   manager owns all metadata)
#
# Prints a Markdown table. Uses scripts/cluster-netns.sh with its own prefix, base and
# subnet, so a test cluster can run beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-3}
mb=${MB:-200}
segments=${SEGMENTS:-2000}
files=${FILES:-2000}
export TSR_PREFIX=${TSR_PREFIX:-tb-} TSR_BASE=${TSR_BASE:-/var/tmp/tbnet}
export TSR_SUBNET=${TSR_SUBNET:-10.78.0}
cargo build --release -q -p tessera
export TESSERA_BIN=${TESSERA_BIN:-$PWD/target/release/tessera}
net=scripts/cluster-netns.sh
$net down >/dev/null 2>&1 || true
slots=${SLOTS:-yes}
block=${BLOCK:-4M}
# Every node serves its metrics in its own namespace, for the time clients wait for other
# nodes' metanodes (tessera_metanode_request_seconds).
$net up 3 --drives 1 --size 4G \
    --config "failureDetectionTime=3,metadataSlots=$slots,metricsAddress=0.0.0.0:9400" >/dev/null
trap '$net down >/dev/null 2>&1 || true' EXIT
io=$TSR_BASE/io500ish
cc -O2 -o "$io" bench/io500ish.c
stanza=$TSR_BASE/b1.stanza
echo "%nsd: device=$TSR_BASE/drives/node1-d1.img nsd=b1 usage=dataAndMetadata failureGroup=1 pool=system" >"$stanza"
mnt() { echo "$TSR_BASE/node$1/mnt/b1"; }
$net run 1 -- tessera nsd create -F "$stanza" >/dev/null
$net run 1 -- tessera fs create b1 -F "$stanza" -B "$block" -T "$(mnt 1)" >/dev/null
$net run 1 -- tessera mount b1 -a >/dev/null

# run NODES PHASE COUNT: every rank at once, rank r on node (r % NODES) + 1; prints the
# slowest rank's seconds.
run() {
    local nodes=$1 phase=$2 count=$3 r pids=() outs=()
    for ((r = 0; r < ranks; r++)); do
        local k=$((r % nodes + 1)) out
        out=$(mktemp)
        outs+=("$out")
        "$io" "$(mnt "$k")/n$nodes" "$r" "$ranks" "$phase" "$count" >"$out" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    cat "${outs[@]}" | sort -g | tail -1
    rm -f "${outs[@]}"
}

# metanode_requests: "kind count seconds" lines, summed over every node's mount: what the
# clients asked other nodes' metanodes and how long they waited.
metanode_requests() {
    for k in 1 2 3; do
        $net run "$k" -- curl -s http://127.0.0.1:9400/metrics || true
    done | awk '
        /^tessera_metanode_requests_total\{/ { match($0, /request="[^"]*"/); k = substr($0, RSTART + 9, RLENGTH - 10); n[k] += $NF }
        /^tessera_metanode_request_seconds_total\{/ { match($0, /request="[^"]*"/); k = substr($0, RSTART + 9, RLENGTH - 10); s[k] += $NF }
        END { for (k in n) printf "%s %d %.6f\n", k, n[k], s[k] }'
}

declare -A rate waited asked
phases=${PHASES:-ior-easy-write ior-easy-read ior-hard-write ior-hard-read md-easy-create md-easy-stat md-easy-remove md-hard-create md-hard-stat md-hard-remove}
node_counts=${NODES:-1 2 3}
for nodes in $node_counts; do
    mkdir -p "$(mnt 1)/n$nodes"
    for phase in $phases; do
        case $phase in
        ior-easy-*) count=$mb; work=$((ranks * mb)) ;;
        ior-hard-*) count=$segments; work=$((ranks * segments * 47008 / 1048576)) ;;
        *) count=$files; work=$((ranks * files)) ;;
        esac
        case $phase in *-read | *-stat) echo 3 >/proc/sys/vm/drop_caches ;; esac
        before=$(metanode_requests)
        secs=$(run "$nodes" "$phase" "$count")
        after=$(metanode_requests)
        rate[$nodes,$phase]=$(awk -v w="$work" -v s="$secs" 'BEGIN { printf "%.0f", w / s }')
        # The share of the processes' time spent waiting for other nodes' metanodes, and
        # per operation (file or MiB) what was asked, for the largest node count.
        delta=$(printf '%s\n--\n%s\n' "$before" "$after" | awk '
            $1 == "--" { past = 1; next }
            !past { n0[$1] = $2; s0[$1] = $3; next }
            { dn = $2 - n0[$1]; ds = $3 - s0[$1]; if (dn > 0) { print $1, dn, ds } }')
        waited[$nodes,$phase]=$(echo "$delta" | awk -v s="$secs" -v r="$ranks" '
            { t += $3 } END { printf "%.2f", t / (s * r) }')
        # The first ASKED_TOP kinds, taken by awk: `head -0` would exit before sort wrote,
        # and the SIGPIPE (with pipefail) would end the whole run without a word.
        asked[$nodes,$phase]=$(echo "$delta" | sort -k2 -n -r | awk -v w="$work" -v top="${ASKED_TOP:-6}" '
            NR <= top && NF == 3 { printf "%s%s %.2f/op %.2f ms", sep, $1, $2 / w, 1000 * $3 / $2; sep = ", " }')
    done
done

echo "| pattern | unit | 1 node | 2 nodes | 3 nodes | 3 nodes / 1 node |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
for phase in $phases; do
    case $phase in ior-*) unit="MiB/s" ;; *) unit="ops/s" ;; esac
    one=${rate[1,$phase]:-0} three=${rate[3,$phase]:-0}
    echo "| $phase | $unit | $one | ${rate[2,$phase]:--} | $three | $(awk -v a="$three" -v b="$one" 'BEGIN { printf "%.2f", a / b }') |"
done
echo
echo "Share of the processes' time spent waiting for other nodes' metanodes (tokens,"
echo "names, attributes, allocation, commits), and what each operation asked, per node count:"
echo
echo "| pattern | nodes | waiting | requests per operation (file or MiB), mean wait |"
echo "| --- | ---: | ---: | --- |"
for phase in $phases; do
    for nodes in $node_counts; do
        [ "$nodes" = 1 ] && continue
        echo "| $phase | $nodes | ${waited[$nodes,$phase]:-0} | ${asked[$nodes,$phase]:-} |"
    done
done
$net run 1 -- tessera umount b1 -a >/dev/null
