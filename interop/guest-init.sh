#!/bin/busybox sh
# /init of the interop guest: a Debian kernel with its own NVMe/TCP host (nvme-tcp) and
# target (nvmet-tcp), driven by nvme-cli. linux-kernel.sh builds the initramfs around this
# file and reads the console: every check prints one "INTEROP PASS name" or
# "INTEROP FAIL name: why" line; "INTEROP DATA key value" lines carry checksums the host
# compares with the drive server's backing file.
#
# Phase A: the Linux host against `tessera drive-server` (two ports, two ANA states).
# Phase B: the Linux target (nvmet) is set up for `tessera nvme` on the host side; the guest
# waits for the host to say it is done and powers off.

/bin/busybox --install -s /bin
export PATH=/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /run && mount -t tmpfs tmp /tmp
exec >/dev/console 2>&1
. /interop.env

pass() { echo "INTEROP PASS $1"; }
fail() { echo "INTEROP FAIL $1: $2"; }
check() { # check NAME CMD... : PASS when CMD succeeds
    name=$1
    shift
    if out=$("$@" 2>&1); then pass "$name"; else fail "$name" "$(echo "$out" | tail -3 | tr '\n' ' ')"; fi
}
wait_ns() { # up to 5 s for the namespace's block device after a connect
    i=0
    while [ ! -b /dev/nvme0n1 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
}
finish() {
    echo "== kernel log (nvme)"
    dmesg | grep -i -E "nvme|nvmet" | tail -60
    echo "INTEROP END"
    poweroff -f
}

for m in $(cat /modules.list); do
    case $m in
    */brd.ko) insmod "/modules/$m" rd_nr=1 rd_size="$BRD_KIB" ;;
    *) insmod "/modules/$m" ;;
    esac
done
ip link set lo up
ip link set eth0 up
ip addr add "$GUEST_IP/24" dev eth0
echo "$GUEST_NQN" >/tmp/hostnqn
echo "guest up: $(uname -r), $(nproc) cpus"

# --- phase A: Linux nvme-tcp host -> tessera drive-server -----------------------------
NVME="nvme"
# A fixed host identifier, as /etc/nvme/hostid gives a real host: reservations belong to
# it, and the one registered below must still be this host's after reconnects.
GUEST_HOSTID=7e55e2a0-1c2b-4d3e-8f40-5a6b7c8d9e01
HQ="-q $GUEST_NQN -I $GUEST_HOSTID"

out=$($NVME discover -t tcp -a "$HOST_IP" -s "$PORT1" $HQ 2>&1)
echo "$out"
if echo "$out" | grep -q "subnqn: *$SUBNQN" && echo "$out" | grep -q "trsvcid: *$PORT2"; then
    pass discover
else
    fail discover "subsystem or second port missing from the discovery log"
fi

# The first discovery-log entry for the allowed subsystem must connect with connect-all.
check connect-port1 $NVME connect -t tcp -a "$HOST_IP" -s "$PORT1" -n "$SUBNQN" $HQ -i 2
check connect-port2 $NVME connect -t tcp -a "$HOST_IP" -s "$PORT2" -n "$SUBNQN" $HQ -i 2
wait_ns
$NVME list
$NVME list-subsys

# ANA: through port 1 the namespace is optimized, through port 2 non-optimized.
for c in /sys/class/nvme/nvme*; do
    addr=$(cat "$c/address")
    st=$(cat "$c"/nvme*c*n1/ana_state 2>/dev/null)
    echo "path $(basename "$c") $addr ana_state=$st"
    case "$addr" in
    *trsvcid=$PORT1*) [ "$st" = optimized ] && pass ana-port1 || fail ana-port1 "state $st" ;;
    *trsvcid=$PORT2*) [ "$st" = non-optimized ] && pass ana-port2 || fail ana-port2 "state $st" ;;
    esac
done

$NVME id-ctrl /dev/nvme0 | grep -E "^(vid|sn|mn|fr|mdts|cntlid|ver|oacs|oncs|anacap|anagrpmax|nanagrpid|sgls|subnqn|ioccsz|iorcsz|cmic|kas|nn|awun) "
$NVME id-ns /dev/nvme0n1 | grep -E "^(nsze|ncap|nuse|nlbaf|flbas|dlfeat|anagrpid|nguid|lbaf  0)"
bytes=$(($(cat /sys/block/nvme0n1/size) * 512))
[ "$bytes" = "$NS_BYTES" ] && pass ns-size || fail ns-size "$bytes bytes, expected $NS_BYTES"

sum() { md5sum | cut -d' ' -f1; }
got=$(dd if=/dev/nvme0n1 bs=1M count=8 iflag=direct 2>/dev/null | sum)
[ "$got" = "$PRELOAD_MD5" ] && pass read-preloaded || fail read-preloaded "md5 $got, expected $PRELOAD_MD5"

# write_check WRITE READ AT N: N MiB of random data written at AT MiB with O_DIRECT, its
# checksum announced for the host to find in the backing file, and read back; sets $w.
write_check() {
    dd if=/dev/urandom of="/tmp/w$3" bs=1M count="$4" 2>/dev/null
    w=$(sum <"/tmp/w$3")
    check "$1" dd if="/tmp/w$3" of=/dev/nvme0n1 bs=1M seek="$3" oflag=direct conv=fsync
    echo "INTEROP DATA at$3M $w"
    got=$(dd if=/dev/nvme0n1 bs=1M skip="$3" count="$4" iflag=direct 2>/dev/null | sum)
    [ "$got" = "$w" ] && pass "$2" || fail "$2" "md5 $got, expected $w"
}
write_check write-direct read-back 16 8
w16=$w

# Small writes, 4 KiB each, at scattered LBAs through the page cache and fsync.
dd if=/dev/urandom of=/tmp/w4k bs=4k count=64 2>/dev/null
check write-4k sh -c 'i=0; while [ $i -lt 64 ]; do dd if=/tmp/w4k of=/dev/nvme0n1 bs=4k skip=$i seek=$((10240 + i * 3)) count=1 oflag=direct 2>/dev/null || exit 1; i=$((i + 1)); done'
check flush $NVME flush /dev/nvme0n1 -n 1
ok=1
i=0
while [ $i -lt 64 ]; do
    a=$(dd if=/tmp/w4k bs=4k skip=$i count=1 2>/dev/null | sum)
    b=$(dd if=/dev/nvme0n1 bs=4k skip=$((10240 + i * 3)) count=1 iflag=direct 2>/dev/null | sum)
    [ "$a" = "$b" ] || ok=0
    i=$((i + 1))
done
[ $ok = 1 ] && pass read-4k || fail read-4k "a 4 KiB block read back different"

zero1m=$(dd if=/dev/zero bs=1M count=1 2>/dev/null | sum)
# Write Zeroes over 1 MiB at 24 MiB (LBA 6144, 256 blocks, count zero-based).
dd if=/dev/urandom of=/dev/nvme0n1 bs=1M seek=24 count=1 oflag=direct 2>/dev/null
check write-zeroes $NVME write-zeroes /dev/nvme0n1 -n 1 -s 6144 -c 255
got=$(dd if=/dev/nvme0n1 bs=1M skip=24 count=1 iflag=direct 2>/dev/null | sum)
[ "$got" = "$zero1m" ] && pass write-zeroes-reads-zero || fail write-zeroes-reads-zero "md5 $got"

# Deallocate 1 MiB at 32 MiB through the block layer (discard -> DSM AD).
dd if=/dev/urandom of=/dev/nvme0n1 bs=1M seek=32 count=1 oflag=direct 2>/dev/null
check blkdiscard blkdiscard -o $((32 << 20)) -l $((1 << 20)) /dev/nvme0n1
got=$(dd if=/dev/nvme0n1 bs=1M skip=32 count=1 iflag=direct 2>/dev/null | sum)
[ "$got" = "$zero1m" ] && pass discard-reads-zero || fail discard-reads-zero "md5 $got (DLFEAT promises zeroes on a file)"
check dsm-deallocate $NVME dsm /dev/nvme0n1 -n 1 --ad -s 8192 -b 16

# Reservations through nvme-cli: register (asking for Persist Through Power Loss: the
# drive server has a state directory), acquire Write Exclusive, report, release,
# unregister.
check resv-register $NVME resv-register /dev/nvme0n1 -n 1 -k 0xab12 -r 0 -p 3
check resv-acquire $NVME resv-acquire /dev/nvme0n1 -n 1 -c 0xab12 -t 1 -a 0
# Fabrics host identifiers are 128 bits, so only the extended report (EDS) may be served;
# the regular one is refused with Host Identifier Inconsistent Format.
out=$($NVME resv-report /dev/nvme0n1 -n 1 -d 256 2>&1)
echo "$out"
echo "$out" | grep -qi "Host Identifier Inconsistent" && pass resv-report-regular-refused ||
    fail resv-report-regular-refused "$(echo "$out" | tail -2 | tr '\n' ' ')"
out=$($NVME resv-report /dev/nvme0n1 -n 1 -d 256 --eds 2>&1)
echo "$out"
if echo "$out" | grep -qi "rtype *: *1" && echo "$out" | grep -qi "rkey *: *ab12" &&
    echo "$out" | grep -qi "rcsts *: *1"; then
    pass resv-report-eds
else
    fail resv-report-eds "holder, type or key missing from the report"
fi
echo "$out" | grep -qi "ptpls *: *1" && pass resv-report-ptpl || fail resv-report-ptpl "PTPLS not 1"
out=$($NVME get-feature /dev/nvme0n1 -n 1 -f 0x83 2>&1)
echo "$out"
echo "$out" | grep -qiE "value: *0x0*1( |$)" && pass get-feature-ptpl ||
    fail get-feature-ptpl "$(echo "$out" | tail -1)"
check resv-release $NVME resv-release /dev/nvme0n1 -n 1 -c 0xab12 -t 1 -a 0
check resv-unregister $NVME resv-register /dev/nvme0n1 -n 1 -c 0xab12 -r 1
# A registration that must outlive the drive server's kill -9 and restart further down.
check resv-register-keep $NVME resv-register /dev/nvme0n1 -n 1 -k 0xcd34 -r 0

# Keep-alive: the controllers stay live past the 5 s default KATO.
sleep 12
for c in /sys/class/nvme/nvme*; do
    st=$(cat "$c/state")
    [ "$st" = live ] && pass "keep-alive-$(basename "$c")" || fail "keep-alive-$(basename "$c")" "state $st"
done

# ANA change: the drive server swaps the two ports' states (SIGHUP after its file changed)
# and tells this host with an asynchronous event; the kernel rereads the ANA log.
ana_of() { # ana_of PORT: the ANA state of the path through PORT
    for c in /sys/class/nvme/nvme*; do
        case "$(cat "$c/address")" in *trsvcid=$1*) cat "$c"/nvme*c*n1/ana_state ;; esac
    done
}
wait_ana() { # wait_ana STATE1 STATE2: up to 10 s for port 1 and port 2 to show them
    i=0
    while [ $i -lt 100 ]; do
        [ "$(ana_of "$PORT1")" = "$1" ] && [ "$(ana_of "$PORT2")" = "$2" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    echo "port $PORT1: $(ana_of "$PORT1"), port $PORT2: $(ana_of "$PORT2")"
    return 1
}
echo "INTEROP ANA-SWAP"
check ana-change-event wait_ana non-optimized optimized
echo "INTEROP ANA-BACK"
check ana-change-back wait_ana optimized non-optimized

# Failover: drop the optimized path; the namespace stays readable via the other one.
for c in /sys/class/nvme/nvme*; do
    case "$(cat "$c/address")" in *trsvcid=$PORT1*) opt=$(basename "$c") ;; esac
done
check disconnect-optimized $NVME disconnect -d "/dev/$opt"
got=$(dd if=/dev/nvme0n1 bs=1M skip=16 count=8 iflag=direct 2>/dev/null | sum)
[ "$got" = "$w16" ] && pass read-non-optimized || fail read-non-optimized "md5 $got, expected $w16"
check disconnect-all $NVME disconnect-all
sleep 0.5

# Header and data digests (CRC32C) and a host that disables SQ flow control.
check connect-digests $NVME connect -t tcp -a "$HOST_IP" -s "$PORT2" -n "$SUBNQN" $HQ -i 1 -g -G -d
wait_ns
write_check write-digests read-digests 40 4
check disconnect-digests $NVME disconnect -n "$SUBNQN"

# Several writers at once over both I/O queues, 256 KiB each (one R2T each).
check connect-again $NVME connect -t tcp -a "$HOST_IP" -s "$PORT1" -n "$SUBNQN" $HQ -i 2 -c 1 -l 60
wait_ns
for off in 48 52 56 60; do
    dd if=/dev/urandom of=/tmp/p$off bs=1M count=4 2>/dev/null
    echo "INTEROP DATA at${off}M $(sum </tmp/p$off)"
done
pids=
for off in 48 52 56 60; do
    dd if=/tmp/p$off of=/dev/nvme0n1 bs=256k seek=$((off * 4)) oflag=direct 2>/dev/null &
    pids="$pids $!"
done
ok=1
for p in $pids; do wait "$p" || ok=0; done
[ $ok = 1 ] && pass parallel-writes || fail parallel-writes "a writer failed"

# The drive server is killed (-9) and restarted while this host writes: the kernel
# reconnects by itself and the writes complete without an error.
echo "INTEROP RESTART-TARGET"
dd if=/dev/urandom of=/tmp/rs bs=1M count=8 2>/dev/null
echo "INTEROP DATA at2M $(sum </tmp/rs)"
ok=1
i=0
while [ $i -lt 8 ]; do
    dd if=/tmp/rs of=/dev/nvme0n1 bs=1M skip=$i seek=$((2 + i)) count=1 oflag=direct 2>/dev/null || ok=0
    sleep 1
    i=$((i + 1))
done
[ $ok = 1 ] && pass writes-across-target-restart || fail writes-across-target-restart "a write failed"
st=$(cat /sys/class/nvme/nvme0/state)
[ "$st" = live ] && pass reconnected || fail reconnected "state $st"
# PTPL: the registration made before the kill is still there, with its key.
out=$($NVME resv-report /dev/nvme0n1 -n 1 -d 256 --eds 2>&1)
echo "$out"
if echo "$out" | grep -qi "rkey *: *cd34" && echo "$out" | grep -qi "ptpls *: *1"; then
    pass resv-survives-target-restart
else
    fail resv-survives-target-restart "registration or PTPLS missing after the restart"
fi
check resv-unregister-after-restart $NVME resv-register /dev/nvme0n1 -n 1 -c 0xcd34 -r 1 -p 2
check disconnect-again $NVME disconnect-all

# A host the drive server does not allow is refused.
if $NVME connect -t tcp -a "$HOST_IP" -s "$PORT1" -n "$SUBNQN" -q "$GUEST_NQN.not-allowed" >/tmp/out 2>&1; then
    fail refuse-unknown-host "connected"
    $NVME disconnect-all
else
    pass refuse-unknown-host
fi
echo "INTEROP PHASE-A-DONE"

# --- phase B: Linux nvmet target for tessera nvme on the host -------------------------
mount -t configfs none /sys/kernel/config
T=/sys/kernel/config/nvmet
S=$T/subsystems/$LINUX_SUBNQN
mkdir "$S" "$T/hosts/$TESSERA_NQN"
echo 0 >"$S/attr_allow_any_host"
ln -s "$T/hosts/$TESSERA_NQN" "$S/allowed_hosts/$TESSERA_NQN"
mkdir "$S/namespaces/1"
echo -n /dev/ram0 >"$S/namespaces/1/device_path"
echo 1 >"$S/namespaces/1/enable"
for p in 1 2; do
    mkdir "$T/ports/$p"
    echo tcp >"$T/ports/$p/addr_trtype"
    echo ipv4 >"$T/ports/$p/addr_adrfam"
    echo "$GUEST_IP" >"$T/ports/$p/addr_traddr"
    eval echo "\$LPORT$p" >"$T/ports/$p/addr_trsvcid"
    ln -s "$S" "$T/ports/$p/subsystems/$LINUX_SUBNQN"
done
echo non-optimized >"$T/ports/2/ana_groups/1/ana_state"
echo "INTEROP READY-B"
# The host steers the target through port 7777, one word per connection: drop1 takes the
# subsystem off port 1 (nvmet deletes its controllers there and refuses new ones, a path
# lost), restore1 puts it back, done ends the run.
while true; do
    cmd=$(nc -l -p 7777 </dev/null | tr -d '\r\n')
    case $cmd in
    drop1) rm "$T/ports/1/subsystems/$LINUX_SUBNQN" ;;
    restore1) ln -s "$S" "$T/ports/1/subsystems/$LINUX_SUBNQN" ;;
    *) break ;;
    esac
    echo "INTEROP ACK $cmd"
done
echo "host done with phase B"
finish
