//! Layer 1 of Tessera: drives.
//!
//! Everything above this crate (vdisks, NSDs, the file system) reaches storage through the
//! [`BlockDevice`] trait, so a local file, a local NVMe namespace, a remote NVMe/TCP namespace
//! or an erasure-coded vdisk are interchangeable. The contract is deliberately small and
//! strict: I/O is positional, sector aligned, and `flush` means "on stable storage".

mod aligned;
mod file;
pub mod stats;
mod volatile;

pub use aligned::AlignedBuf;
pub use file::{device_holders, FileDrive};
pub use volatile::{VolatileCache, VolatileCacheConfig};

use std::io;

/// The alignment every buffer, offset and length handed to a [`BlockDevice`] must have.
///
/// 4 KiB is the logical block size of NVMe drives formatted for performance and the page
/// size, so O_DIRECT accepts it everywhere.
pub const SECTOR_BYTES: u64 = 4096;

/// A drive seen as an array of sectors.
///
/// Implementations must be usable from many threads at once: the file system issues
/// independent reads and writes concurrently.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// A human-readable name for error messages (a path, or an NQN and namespace id).
    fn name(&self) -> &str;

    /// Capacity in bytes, a multiple of [`SECTOR_BYTES`].
    fn size_bytes(&self) -> u64;

    /// Reads `buf.len()` bytes at `offset`. Both must be multiples of [`SECTOR_BYTES`] and
    /// `buf` must be sector aligned in memory (use [`AlignedBuf`]).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes `buf` at `offset`, with the same alignment rules as [`BlockDevice::read_at`].
    /// The data may sit in a volatile cache until [`BlockDevice::flush`] returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;

    /// Returns when every write that completed before the call is on stable storage.
    fn flush(&self) -> io::Result<()>;

    /// Writes `buf` at `offset` as [`BlockDevice::write_at`] does and returns once these
    /// bytes are on stable storage (Force Unit Access): a synchronous write then costs one
    /// round trip to the drive instead of a write and a flush. Says nothing of other writes:
    /// those still need a flush. Devices without a cheaper way write and flush.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }

    /// Gives `len` bytes at `offset` back to a thin-provisioned device (TRIM: a hole punched
    /// in a file, a discard on a block device, an NVMe Deallocate). What was there must never
    /// be read again: afterwards the range reads as zeros or as anything. Both must be
    /// multiples of [`SECTOR_BYTES`]. Devices that cannot deallocate answer `Unsupported`.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{}: cannot deallocate space", self.name()),
        ))
    }

    /// The descriptor this device does its I/O on, for a caller that drives I/O itself
    /// (a drive server's io_uring): positional reads and writes on it are this device's
    /// reads and writes, sector aligned as here. Only a device with nothing between its
    /// caller and the descriptor offers one (a vdisk, a cache or a wrapper that counts,
    /// fences or injects faults must see every I/O, and offers none). A caller that
    /// writes through it must sync the descriptor itself before it relies on
    /// [`BlockDevice::flush`], which may not know of those writes.
    fn direct_file(&self) -> Option<&std::fs::File> {
        None
    }

    /// Whether [`BlockDevice::discard`] deallocates on this device.
    fn can_discard(&self) -> bool {
        false
    }

    /// Whether a range that [`BlockDevice::discard`] accepted reads back as zeros (a hole
    /// in a file; an NVMe namespace whose DLFEAT says so), not merely as anything. A
    /// declustered array deallocates the strips of its pdisks only when this holds, since
    /// its checksums must keep describing what the strips read back.
    fn discard_zeroes(&self) -> bool {
        false
    }
}

/// Checks the range of a discard: sector multiples, inside the device.
pub fn check_discard(dev: &dyn BlockDevice, offset: u64, len: u64) -> io::Result<()> {
    if !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: discard of {len} bytes at {offset} is not in whole {SECTOR_BYTES}-byte sectors",
                dev.name()
            ),
        ));
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > dev.size_bytes())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: discard of {len} bytes at {offset} runs past the end ({} bytes)",
                dev.name(),
                dev.size_bytes()
            ),
        ));
    }
    Ok(())
}

/// True for the errors of a drive that cannot be reached right now (a remote namespace
/// with no usable path, a connection that broke), as opposed to a drive that answered
/// with a failure: the drive may well come back with its data intact.
pub fn is_unreachable(e: &io::Error) -> bool {
    use io::ErrorKind as K;
    matches!(
        e.kind(),
        K::TimedOut
            | K::NotConnected
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
    )
}

/// Checks the alignment contract of [`BlockDevice`] and turns a violation into an error
/// that names the device, so a bug above never becomes a misplaced write.
pub fn check_io(dev: &dyn BlockDevice, buf: &[u8], offset: u64) -> io::Result<()> {
    let len = buf.len() as u64;
    let aligned = offset.is_multiple_of(SECTOR_BYTES)
        && len.is_multiple_of(SECTOR_BYTES)
        && (buf.as_ptr() as usize).is_multiple_of(SECTOR_BYTES as usize);
    if !aligned {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: unaligned I/O (offset {offset}, length {len}); \
                 offsets, lengths and buffers must be multiples of {SECTOR_BYTES}",
                dev.name()
            ),
        ));
    }
    let end = offset.checked_add(len);
    if end.is_none_or(|end| end > dev.size_bytes()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: I/O at offset {offset} length {len} runs past the end of the drive ({} bytes)",
                dev.name(),
                dev.size_bytes()
            ),
        ));
    }
    Ok(())
}
