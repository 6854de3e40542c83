//! Where things live on an NSD.
//!
//! ```text
//! offset      size     what
//! 0           4 KiB    NSD descriptor (this crate, see `descriptor`)
//! 4 KiB       252 KiB  reserved for the NSD layer (zero today)
//! 256 KiB     256 KiB  file-system descriptor, slot A (written by the file-system crate)
//! 512 KiB     256 KiB  file-system descriptor, slot B
//! 768 KiB     256 KiB  reserved (zero today)
//! data_start  ...      file-system blocks; data_start = max(1 MiB, block size)
//! ```
//!
//! Every offset is a multiple of [`SECTOR_BYTES`], so each record can be read and written
//! with one aligned I/O and never shares a sector with another record: a torn write of one
//! record cannot damage its neighbour.

// `u64::is_multiple_of` needs Rust 1.87; the workspace supports 1.80.
#![allow(clippy::manual_is_multiple_of)]

use tessera_drive::SECTOR_BYTES;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Offset of the NSD descriptor. The first sector is where every tool (`blkid`, `wipefs`,
/// a human with `hexdump | head`) looks first, and where the descriptor is found without
/// knowing anything else about the device.
pub const NSD_DESCRIPTOR_OFFSET: u64 = 0;

/// Size of the NSD descriptor: exactly one sector, so that writing it is a single sector
/// write, which drives perform atomically.
pub const NSD_DESCRIPTOR_BYTES: u64 = SECTOR_BYTES;

/// Offsets of the two file-system descriptor slots. Two slots let the file system update
/// its descriptor by writing the older slot while the newer one stays intact (ping-pong),
/// so a crash in the middle of an update always leaves one good copy. The gap after the
/// NSD descriptor leaves room for more NSD-layer records without moving the slots.
pub const FS_DESCRIPTOR_SLOT_OFFSETS: [u64; 2] = [256 * KIB, 512 * KIB];

/// Size of each file-system descriptor slot. 256 KiB holds the descriptor of a file system
/// with many thousands of disks, and keeps each slot on its own 256 KiB boundary, which is
/// a common RAID strip size, so a slot write never straddles two strips of an array volume.
pub const FS_DESCRIPTOR_SLOT_BYTES: u64 = 256 * KIB;

/// The first 8 bytes of a file-system descriptor slot that holds a descriptor. This crate
/// only reads it, to refuse turning a disk that belongs to a file system into a new NSD.
pub const FS_DESCRIPTOR_MAGIC: [u8; 8] = *b"TSRFSD01";

/// The least offset of the data region. 1 MiB matches the partition alignment Linux tools
/// use, so data blocks stay aligned to the strips of arrays underneath, and leaves room
/// for the records above.
pub const DATA_START_MIN_BYTES: u64 = MIB;

/// The smallest device accepted as an NSD. 16 MiB holds the 1 MiB reserved head plus 15
/// blocks of 1 MiB: anything smaller is almost certainly a mistyped device (a partition
/// table stub, a loop device of the wrong file) rather than storage someone wants to use.
pub const MIN_NSD_BYTES: u64 = 16 * MIB;

// The records must not overlap and must all fit before the data region.
const _: () =
    assert!(NSD_DESCRIPTOR_OFFSET + NSD_DESCRIPTOR_BYTES <= FS_DESCRIPTOR_SLOT_OFFSETS[0]);
const _: () = assert!(
    FS_DESCRIPTOR_SLOT_OFFSETS[0] + FS_DESCRIPTOR_SLOT_BYTES <= FS_DESCRIPTOR_SLOT_OFFSETS[1]
);
const _: () =
    assert!(FS_DESCRIPTOR_SLOT_OFFSETS[1] + FS_DESCRIPTOR_SLOT_BYTES <= DATA_START_MIN_BYTES);
const _: () = assert!(FS_DESCRIPTOR_SLOT_OFFSETS[0] % SECTOR_BYTES == 0);
const _: () = assert!(FS_DESCRIPTOR_SLOT_OFFSETS[1] % SECTOR_BYTES == 0);
const _: () = assert!(FS_DESCRIPTOR_SLOT_BYTES % SECTOR_BYTES == 0);
const _: () = assert!(DATA_START_MIN_BYTES < MIN_NSD_BYTES);

/// Where the data region starts for a file system of `block_size` bytes: the first block
/// boundary at or after [`DATA_START_MIN_BYTES`], so every data block is block aligned on
/// the device (block sizes are powers of two, hence max() is that boundary).
pub fn data_start_bytes(block_size: u64) -> u64 {
    assert!(
        block_size.is_power_of_two(),
        "block size {block_size} is not a power of two"
    );
    assert!(
        block_size >= SECTOR_BYTES,
        "block size {block_size} is below one sector"
    );
    let start = DATA_START_MIN_BYTES.max(block_size);
    assert!(start % block_size == 0);
    start
}

/// How many whole blocks of `block_size` bytes fit in the data region of a device of
/// `device_bytes` bytes (zero when the device is smaller than the reserved head).
pub fn data_blocks(device_bytes: u64, block_size: u64) -> u64 {
    device_bytes.saturating_sub(data_start_bytes(block_size)) / block_size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_start_is_block_aligned_and_past_the_head() {
        assert_eq!(data_start_bytes(4 * KIB), MIB);
        assert_eq!(data_start_bytes(256 * KIB), MIB);
        assert_eq!(data_start_bytes(MIB), MIB);
        assert_eq!(data_start_bytes(16 * MIB), 16 * MIB);
    }

    #[test]
    fn data_blocks_counts_whole_blocks() {
        assert_eq!(data_blocks(MIN_NSD_BYTES, MIB), 15);
        assert_eq!(data_blocks(MIN_NSD_BYTES, 16 * MIB), 0);
        assert_eq!(data_blocks(4 * KIB, MIB), 0);
    }

    #[test]
    #[should_panic(expected = "not a power of two")]
    fn data_start_rejects_odd_block_size() {
        data_start_bytes(3 * MIB);
    }
}
