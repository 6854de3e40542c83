#!/usr/bin/env bash
# Interoperability with the Linux kernel's NVMe/TCP host and target.
#
#     interop/linux-kernel.sh [WORKDIR]        (as root; default /var/tmp/tessera-interop)
#
# Boots Debian's kernel under QEMU (KVM when /dev/kvm is there), joined to this machine by
# a tap interface, with nvme-cli in its initramfs (interop/guest-init.sh is its /init):
#
#   A. the kernel's nvme-tcp host and nvme-cli against `tessera drive-server` here: discovery,
#      two paths with native multipath and ANA, I/O checked against the backing file, Flush,
#      Write Zeroes, deallocate, reservations, keep-alive, failover, digests, access control;
#   B. `tessera nvme` here against the kernel's nvmet-tcp target: discovery, two paths with
#      ANA, and a Tessera file system on the remote namespace, written, remounted and read.
#
# Prints one PASS/FAIL line per check and exits non-zero if any failed.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
W=${1:-/var/tmp/tessera-interop}
TESSERA=${TESSERA:-$ROOT/target/release/tessera}
TAP=tsrtap0
HOST_IP=192.168.231.1
GUEST_IP=192.168.231.2
PORT1=4420
PORT2=4421
LPORT1=4420
LPORT2=4421
SUBNQN=nqn.2026-11.io.tessera:interop-jbof
LINUX_SUBNQN=nqn.2026-11.org.linux:nvmet-interop
GUEST_NQN=nqn.2014-08.org.nvmexpress:uuid:5b7c1d2e-0f3a-4c6b-9d8e-112233445566
NS_BYTES=$((64 << 20))
BRD_KIB=$((1024 * 1024))
TIMEOUT=${TIMEOUT:-600}

if [ "$(id -u)" -ne 0 ]; then
    echo "linux-kernel.sh: run as root (tap interface, KVM, FUSE)" >&2
    exit 1
fi

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v modprobe >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
command -v fusermount3 >/dev/null || need+=(fuse3)
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ ! -x "$TESSERA" ]; then
    echo "== building tessera (release)"
    cargo build --release -p tessera
fi

mkdir -p "$W"
W=$(cd "$W" && pwd)
echo "== work directory $W"

# --- the guest: Debian's kernel, its modules, busybox and nvme-cli -------------------
if [ ! -e "$W/x/.done" ]; then
    echo "== downloading Debian's kernel, nvme-cli and busybox"
    rm -rf "$W/debs" "$W/x"
    mkdir -p "$W/debs" "$W/x"
    kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
    (cd "$W/debs" && apt-get download "$kpkg" nvme-cli libnvme1 busybox-static >/dev/null 2>&1) || {
        apt-get update -qq
        (cd "$W/debs" && apt-get download "$kpkg" nvme-cli libnvme1 busybox-static)
    }
    for d in "$W"/debs/*.deb; do dpkg-deb -x "$d" "$W/x"; done
    touch "$W/x/.done"
fi
KVER=$(basename "$(ls -d "$W"/x/lib/modules/*)")
depmod -b "$W/x" "$KVER"

echo "== building the initramfs (kernel $KVER)"
R=$W/root
rm -rf "$R"
mkdir -p "$R"/{bin,usr/sbin,lib64,lib/x86_64-linux-gnu,modules,proc,sys,dev,etc,tmp}
cp "$W/x/bin/busybox" "$R/bin/busybox"
cp "$W/x/usr/sbin/nvme" "$R/usr/sbin/nvme"
LD_LIBRARY_PATH=$W/x/usr/lib/x86_64-linux-gnu ldd "$W/x/usr/sbin/nvme" |
    awk '/=> \// {print $3} /^\t\/lib64/ {print $1}' | while read -r lib; do
    case $lib in
    /lib64/*) cp -L "$lib" "$R/lib64/" ;;
    *) cp -L "$lib" "$R/lib/x86_64-linux-gnu/" ;;
    esac
done
# Modules in load order, each once.
: >"$R/modules.list"
for m in virtio_pci virtio_net configfs crc32c_generic crc32c-intel nvme-tcp nvmet-tcp brd; do
    modprobe -d "$W/x" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
    rel=${ko#"$W/x/lib/modules/$KVER/"}
    mkdir -p "$R/modules/$(dirname "$rel")"
    cp "$ko" "$R/modules/$rel"
    echo "$rel" >>"$R/modules.list"
done
cp "$ROOT/interop/guest-init.sh" "$R/init"
chmod +x "$R/init"

# --- this side: tap link, drive server, tessera daemon -------------------------------
QEMU_PID=
DS_PID=
cleanup() {
    set +e
    [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null
    if [ -e "$W/home/daemon.sock" ]; then
        grep -q " $W/mnt " /proc/mounts && "$TESSERA" umount ifs >/dev/null 2>&1
        "$TESSERA" shutdown >/dev/null 2>&1
    fi
    grep -q " $W/mnt " /proc/mounts && fusermount3 -uz "$W/mnt"
    [ -n "$DS_PID" ] && kill "$DS_PID" 2>/dev/null && wait "$DS_PID" 2>/dev/null
    ip link del "$TAP" 2>/dev/null
}
trap cleanup EXIT

ip link del "$TAP" 2>/dev/null || true
ip tuntap add dev "$TAP" mode tap
ip addr add "$HOST_IP/24" dev "$TAP"
ip link set "$TAP" up

export TESSERA_HOME=$W/home
rm -rf "$W/home" "$W/mnt" "$W/ns1.img" "$W/cmp"
mkdir -p "$W/home" "$W/mnt" "$W/cmp"
"$TESSERA" cluster create --name interop >/dev/null
"$TESSERA" startup >/dev/null
TESSERA_NQN=$("$TESSERA" nvme show-hostnqn)

head -c "$NS_BYTES" /dev/urandom >"$W/ns1.img"
PRELOAD_MD5=$(head -c $((8 << 20)) "$W/ns1.img" | md5sum | cut -d' ' -f1)
drive_server_config() { # drive_server_config STATE1 STATE2: ANA states of ports 1 and 2
    cat >"$W/drive-server.json" <<EOF
{
  "hosts": [{"nqn": "$GUEST_NQN"}],
  "ports": [
    {"portid": 1, "addr": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "$HOST_IP", "trsvcid": "$PORT1"},
     "subsystems": ["$SUBNQN"], "ana_groups": [{"grpid": 1, "ana": {"state": "$1"}}]},
    {"portid": 2, "addr": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "$HOST_IP", "trsvcid": "$PORT2"},
     "subsystems": ["$SUBNQN"], "ana_groups": [{"grpid": 1, "ana": {"state": "$2"}}]}
  ],
  "subsystems": [
    {"nqn": "$SUBNQN", "attr": {"allow_any_host": "0", "serial": "INTEROP1"},
     "allowed_hosts": ["$GUEST_NQN"],
     "namespaces": [{"nsid": 1, "enable": 1, "ana_grpid": 1, "device": {"path": "$W/ns1.img"}}]}
  ],
  "tessera": {"state_dir": "$W/resv-state"}
}
EOF
}
# Reservations with PTPL from an earlier run must not leak into this one.
rm -rf "$W/resv-state"
drive_server_config optimized non-optimized
"$TESSERA" drive-server -c "$W/drive-server.json" >"$W/drive-server.log" 2>&1 &
DS_PID=$!

cat >"$R/interop.env" <<EOF
HOST_IP=$HOST_IP
GUEST_IP=$GUEST_IP
PORT1=$PORT1
PORT2=$PORT2
LPORT1=$LPORT1
LPORT2=$LPORT2
SUBNQN=$SUBNQN
LINUX_SUBNQN=$LINUX_SUBNQN
GUEST_NQN=$GUEST_NQN
TESSERA_NQN=$TESSERA_NQN
NS_BYTES=$NS_BYTES
BRD_KIB=$BRD_KIB
PRELOAD_MD5=$PRELOAD_MD5
EOF
(cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) >"$W/initramfs.gz"

# Software emulation by default: nested KVM inside a cloud VM often hangs the guest kernel
# at boot. ACCEL=kvm uses KVM where it works.
accel=(-accel tcg -cpu max)
if [ "${ACCEL:-tcg}" = kvm ]; then accel=(-enable-kvm -cpu host); fi
echo "== booting the guest (${accel[*]})"
: >"$W/console.log"
qemu-system-x86_64 "${accel[@]}" -smp 2 -m 2048 -nographic -no-reboot \
    -kernel "$W/x/boot/vmlinuz-$KVER" -initrd "$W/initramfs.gz" \
    -append "console=ttyS0 panic=-1 quiet rdinit=/init" \
    -netdev tap,id=n0,ifname=$TAP,script=no,downscript=no \
    -device virtio-net-pci,netdev=n0 >"$W/console.log" 2>&1 </dev/null &
QEMU_PID=$!

wait_for() { # wait_for PATTERN: until the console shows it, the guest dies or time runs out
    local t=0
    while ! grep -q "$1" "$W/console.log"; do
        if ! kill -0 "$QEMU_PID" 2>/dev/null; then return 1; fi
        if [ $t -ge "$TIMEOUT" ]; then return 1; fi
        sleep 1
        t=$((t + 1))
    done
}

steer() { # steer WORD: tell the guest's target what to do; wait for its acknowledgement
    local t=0
    until echo "$1" 2>/dev/null >"/dev/tcp/$GUEST_IP/7777"; do
        sleep 0.2
        t=$((t + 1))
        [ $t -lt 50 ] || return 1
    done
    [ "$1" = done ] || wait_for "INTEROP ACK $1"
}

FAILED=0
hpass() { echo "INTEROP PASS $1" | tee -a "$W/host.log"; }
hfail() {
    echo "INTEROP FAIL $1: $2" | tee -a "$W/host.log"
    FAILED=1
}
: >"$W/host.log"

# Fail the namespace over between the ports and back, as an array's controllers would.
if wait_for "INTEROP ANA-SWAP"; then
    drive_server_config non-optimized optimized
    kill -HUP "$DS_PID"
fi
if wait_for "INTEROP ANA-BACK"; then
    drive_server_config optimized non-optimized
    kill -HUP "$DS_PID"
fi
if wait_for "INTEROP RESTART-TARGET"; then
    sleep 2
    kill -9 "$DS_PID"
    wait "$DS_PID" 2>/dev/null || true
    sleep 3
    "$TESSERA" drive-server -c "$W/drive-server.json" >>"$W/drive-server.log" 2>&1 &
    DS_PID=$!
fi
if ! wait_for "INTEROP PHASE-A-DONE"; then
    hfail phase-a "the guest did not finish phase A; see $W/console.log"
else
    # The guest's writes must be in the drive server's backing file.
    for key_off in "at16M 16 8" "at40M 40 4" "at48M 48 4" "at52M 52 4" "at56M 56 4" "at60M 60 4" "at2M 2 8"; do
        set -- $key_off
        want=$(awk -v k="$1" '$1 == "INTEROP" && $2 == "DATA" && $3 == k {print $4}' "$W/console.log" | tr -d '\r')
        got=$(dd if="$W/ns1.img" bs=1M skip="$2" count="$3" 2>/dev/null | md5sum | cut -d' ' -f1)
        if [ -n "$want" ] && [ "$want" = "$got" ]; then
            hpass "backing-file-$1"
        else
            hfail "backing-file-$1" "md5 $got in the file, guest wrote $want"
        fi
    done
fi

if wait_for "INTEROP READY-B"; then
    # --- phase B: tessera nvme against the kernel's nvmet ----------------------------
    run() { # run NAME CMD...: one check on this side
        local name=$1
        shift
        if "$@" >>"$W/host.log" 2>&1; then hpass "$name"; else hfail "$name" "see $W/host.log"; fi
    }
    # Linux lists in its discovery log only the port the host asked through.
    for p in "$LPORT1" "$LPORT2"; do
        out=$("$TESSERA" nvme discover -t tcp -a "$GUEST_IP" -s "$p" 2>&1) || true
        echo "$out" >>"$W/host.log"
        if echo "$out" | grep -A3 "$LINUX_SUBNQN" | grep -q "trsvcid: *$p" ||
            echo "$out" | grep -B6 "subnqn: *$LINUX_SUBNQN" | grep -q "trsvcid: *$p"; then
            hpass "tessera-discover-nvmet-$p"
        else
            hfail "tessera-discover-nvmet-$p" "subsystem missing from the discovery log"
        fi
    done
    # Port 1 through its discovery log entry, port 2 by hand.
    run tessera-connect-all-port1 "$TESSERA" nvme connect-all -t tcp -a "$GUEST_IP" -s "$LPORT1" -l 30
    run tessera-connect-port2 "$TESSERA" nvme connect -t tcp -n "$LINUX_SUBNQN" -a "$GUEST_IP" -s "$LPORT2" -l 30
    sleep 2
    out=$("$TESSERA" nvme list 2>&1) || true
    echo "$out" | tee -a "$W/host.log"
    if echo "$out" | grep -q "non-optimized" && echo "$out" | grep -E -q "(^|[^-])optimized"; then
        hpass tessera-list-ana
    else
        hfail tessera-list-ana "expected one optimized and one non-optimized path"
    fi
    dev=$(echo "$out" | grep -o -m1 "nvme[0-9]*n1" || true)
    cat >"$W/nsd.stanza" <<EOF
%nsd: device=nvme:${dev:-nvme0n1} nsd=linuxns1 usage=dataAndMetadata failureGroup=1 pool=system
EOF
    run tessera-nsd-create "$TESSERA" nsd create -F "$W/nsd.stanza"
    run tessera-fs-create "$TESSERA" fs create ifs -F "$W/nsd.stanza" -B 256K -T "$W/mnt"
    run tessera-mount "$TESSERA" mount ifs
    head -c $((48 << 20)) /dev/urandom >"$W/cmp/big"
    cp -r /usr/share/doc/bash "$W/cmp/doc"
    run tessera-write sh -c "cp -r '$W/cmp/big' '$W/cmp/doc' '$W/mnt/' && sync"
    run tessera-umount "$TESSERA" umount ifs
    run tessera-remount "$TESSERA" mount ifs
    run tessera-read-back sh -c "cmp '$W/cmp/big' '$W/mnt/big' && diff -r '$W/cmp/doc' '$W/mnt/doc'"
    # Keep-alive: both paths stay live past the 5 s KATO (nvmet would drop them).
    sleep 12
    out=$("$TESSERA" nvme list 2>&1) || true
    echo "$out" >>"$W/host.log"
    if [ "$(echo "$out" | grep -c " live ")" = 2 ]; then
        hpass tessera-keep-alive
    else
        hfail tessera-keep-alive "both paths should be live: $out"
    fi
    # The target takes the subsystem off the optimized port while files are written and
    # synced: writes go on through the non-optimized path, without an error, and the
    # optimized path is used again once the port is back.
    head -c $((2 << 20)) /dev/urandom >"$W/cmp/small"
    (for i in $(seq 1 24); do cp "$W/cmp/small" "$W/mnt/during$i" && sync || exit 1; sleep 0.25; done) &
    writer=$!
    sleep 1
    steer drop1
    sleep 3
    steer restore1
    if wait "$writer"; then hpass tessera-writes-across-path-loss; else hfail tessera-writes-across-path-loss "a write failed; see $W/host.log"; fi
    ok=1
    for i in $(seq 1 24); do cmp -s "$W/cmp/small" "$W/mnt/during$i" || ok=0; done
    [ $ok = 1 ] && hpass tessera-data-across-path-loss || hfail tessera-data-across-path-loss "a file differs"
    t=0
    while [ $t -lt 30 ]; do
        [ "$("$TESSERA" nvme list 2>/dev/null | grep -c " live ")" = 2 ] && break
        sleep 1
        t=$((t + 1))
    done
    "$TESSERA" nvme list >>"$W/host.log" 2>&1 || true
    [ $t -lt 30 ] && hpass tessera-path-restored || hfail tessera-path-restored "port 1 path not live again after 30 s"
    # Lose the optimized path: reads go on through the non-optimized one.
    run tessera-disconnect-optimized "$TESSERA" nvme disconnect -n "$LINUX_SUBNQN" -a "$GUEST_IP" -s "$LPORT1"
    run tessera-umount-2 "$TESSERA" umount ifs
    run tessera-mount-2 "$TESSERA" mount ifs
    run tessera-read-non-optimized cmp "$W/cmp/big" "$W/mnt/big"
    run tessera-umount-3 "$TESSERA" umount ifs
    run tessera-disconnect-all "$TESSERA" nvme disconnect-all
else
    hfail phase-b "the guest did not set up its target; see $W/console.log"
fi
# Let the guest go.
steer done || true
wait_for "INTEROP END" || true
if grep -a -q "keep-alive timer" "$W/console.log"; then
    hfail nvmet-keep-alive "nvmet saw a keep-alive timeout; see $W/console.log"
fi

echo
echo "== results (guest console: $W/console.log, this side: $W/host.log)"
grep -a -h -E "^INTEROP (PASS|FAIL)" "$W/console.log" | tr -d '\r' || true
grep -q -E "^INTEROP FAIL" "$W/host.log" && FAILED=1
grep -a -q -E "^INTEROP FAIL" "$W/console.log" && FAILED=1
passes=$(cat "$W/console.log" "$W/host.log" | grep -a -c "^INTEROP PASS" || true)
fails=$(cat "$W/console.log" "$W/host.log" | grep -a -c "^INTEROP FAIL" || true)
echo "== $passes passed, $fails failed"
exit $FAILED
