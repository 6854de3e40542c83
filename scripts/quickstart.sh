#!/usr/bin/env bash
# Tessera quick start: on a fresh Debian/Ubuntu machine, as root, from the repository root:
#
#     scripts/quickstart.sh
#
# installs FUSE if it is missing, builds the release binary, creates a one-node cluster
# with four file-backed drives under ./quickstart, creates file system fs1 striped over
# them, mounts it and says what to try next. Running it again starts over from scratch.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
QS=$ROOT/quickstart
export TESSERA_HOME=${TESSERA_HOME:-$QS/home}
TESSERA=$ROOT/target/release/tessera
MNT=$QS/mnt/fs1
DRIVE_BYTES=2G

if [ "$(id -u)" -ne 0 ]; then
    echo "quickstart: run as root (FUSE mounts for every user and package installs need it)" >&2
    exit 1
fi
if ! command -v fusermount3 >/dev/null 2>&1; then
    echo "== installing fuse3"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y fuse3
fi
if [ ! -e /dev/fuse ]; then
    echo "quickstart: /dev/fuse is missing; load the module with 'modprobe fuse' (in a container, pass --device /dev/fuse)" >&2
    exit 1
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "quickstart: cargo is missing; install Rust from https://rustup.rs and rerun" >&2
    exit 1
fi

echo "== building tessera (release)"
cargo build --release -p tessera

# Start over: stop a daemon left by an earlier run and forget its cluster.
if [ -e "$TESSERA_HOME/daemon.sock" ]; then
    "$TESSERA" shutdown || true
fi
if grep -q " $MNT " /proc/mounts 2>/dev/null; then
    fusermount3 -uz "$MNT" || umount -l "$MNT" || true
fi
rm -rf "$QS"
mkdir -p "$QS/drives" "$MNT" "$TESSERA_HOME"

echo "== creating four $DRIVE_BYTES sparse drives in $QS/drives"
for i in 0 1 2 3; do
    truncate -s "$DRIVE_BYTES" "$QS/drives/drive$i"
done

STANZA=$QS/nsd.stanza
{
    echo "# One %nsd stanza per drive, as for mmcrnsd."
    for i in 0 1 2 3; do
        echo "%nsd: device=$QS/drives/drive$i nsd=qs$i usage=dataAndMetadata"
        echo "  failureGroup=$((i + 1)) pool=system thinDiskType=no"
    done
} >"$STANZA"

"$TESSERA" cluster create --name quickstart
"$TESSERA" startup
"$TESSERA" state
"$TESSERA" nsd create -F "$STANZA"
"$TESSERA" nsd ls
"$TESSERA" fs create fs1 -F "$STANZA" -B 1M -T "$MNT" -A yes
"$TESSERA" mount fs1
"$TESSERA" fs ls fs1
"$TESSERA" df fs1

cat <<EOT

Tessera file system fs1 is mounted at $MNT; try:
    export TESSERA_HOME=$TESSERA_HOME PATH=$ROOT/target/release:\$PATH
    cp -r /etc $MNT/ && ls -l $MNT/etc | head
    tessera df fs1          # free space per disk and pool
    tessera pmon            # I/O counters and latency histograms
    tessera disk ls fs1     # the four NSDs
    tessera umount fs1      # unmount
    tessera shutdown        # stop the daemon (tessera startup brings fs1 back)
EOT
