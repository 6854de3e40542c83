//! The NSD descriptor: the first sector of every NSD, which says "this device is NSD `name`
//! with id `id`". Nodes find their NSDs by reading it, never by device path, because paths
//! change between boots and differ between nodes.
//!
//! Byte layout (format version 1, all integers little-endian, 4096 bytes in all):
//!
//! ```text
//! offset  size  field           meaning
//! ------  ----  --------------  ---------------------------------------------------------
//!      0     8  magic           b"TSRNSD01"; absent = not an NSD
//!      8     4  format_version  1; bumped on any incompatible change
//!     12     4  crc32c          CRC-32C of all 4096 bytes with this field zeroed
//!     16    16  nsd_id          random, permanent identity of the NSD
//!     32     8  device_bytes    device size in bytes when the NSD was created
//!     40     8  created_unix    creation time, seconds since 1970-01-01 UTC
//!     48    16  cluster_id      cluster the NSD was created in; all zero = none yet
//!     64     2  name_len        length of the name in bytes, 1..=255
//!     66     6  reserved0       zero
//!     72   256  name            NSD name (ASCII, see `check_name`), zero padded
//!    328  3768  reserved        zero; room for later versions
//! ------  ----
//!   4096
//! ```
//!
//! The header fields (magic, version, checksum) come first so that any later version can
//! be recognised and checked before its body is interpreted. The descriptor is one sector
//! so that its write is atomic on the drive: a crash leaves the old or the new descriptor,
//! never a mix (and the checksum catches a drive that breaks that promise).

use std::io;

use tessera_drive::{AlignedBuf, BlockDevice};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::layout::{
    FS_DESCRIPTOR_MAGIC, FS_DESCRIPTOR_SLOT_OFFSETS, MIN_NSD_BYTES, NSD_DESCRIPTOR_BYTES,
    NSD_DESCRIPTOR_OFFSET,
};
use crate::types::{check_name, NAME_MAX_BYTES};
use crate::NsdId;

/// The first 8 bytes of every NSD.
pub const NSD_DESCRIPTOR_MAGIC: [u8; 8] = *b"TSRNSD01";

/// The descriptor format this build writes and reads.
pub const NSD_DESCRIPTOR_VERSION: u32 = 1;

/// Offset of the checksum field, which the checksum covers as zero.
const CRC_OFFSET: usize = 12;

/// The descriptor exactly as stored; see the module documentation for the byte layout.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct RawDescriptor {
    magic: [u8; 8],
    format_version: U32,
    crc32c: U32,
    nsd_id: [u8; 16],
    device_bytes: U64,
    created_unix: U64,
    cluster_id: [u8; 16],
    name_len: U16,
    reserved0: [u8; 6],
    name: [u8; 256],
    reserved: [u8; 3768],
}

// The documented layout, checked by the compiler.
const _: () = assert!(std::mem::size_of::<RawDescriptor>() as u64 == NSD_DESCRIPTOR_BYTES);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, crc32c) == CRC_OFFSET);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, nsd_id) == 16);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, device_bytes) == 32);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, created_unix) == 40);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, cluster_id) == 48);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, name_len) == 64);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, name) == 72);
const _: () = assert!(std::mem::offset_of!(RawDescriptor, reserved) == 328);
const _: () = assert!(NAME_MAX_BYTES < 256);

/// What an NSD descriptor says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsdDescriptor {
    pub id: NsdId,
    pub name: String,
    /// Device size in bytes when the NSD was created.
    pub device_bytes: u64,
    /// Creation time in seconds since the Unix epoch.
    pub created_unix: u64,
    /// The cluster the NSD was created in; all zero when it was created outside one.
    pub cluster_id: [u8; 16],
}

/// What is on a device, as far as the NSD layer can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InUse {
    /// Neither an NSD descriptor nor a file-system descriptor.
    Free,
    /// Already an NSD.
    Nsd(NsdDescriptor),
    /// Holds a file-system descriptor, so it belongs (or belonged) to a file system.
    FileSystem,
}

/// Errors of the NSD layer on a device.
#[derive(Debug, thiserror::Error)]
pub enum NsdError {
    // The I/O error is in the message and deliberately not a `source()`, so that printing
    // the chain (`{:#}`) does not repeat it.
    #[error("{device}: {action}: {error}")]
    Io {
        device: String,
        action: &'static str,
        error: io::Error,
    },
    #[error(
        "{device}: the NSD descriptor is corrupt: {reason}; the device cannot be used as \
         this NSD. If the data on it is not needed, recreate the NSD with \
         `tessera nsd create -v no`"
    )]
    CorruptDescriptor { device: String, reason: String },
    #[error(
        "{device}: {size_bytes} bytes is too small for an NSD; the minimum is {min_bytes} \
         bytes ({} MiB); use a larger device or volume", min_bytes >> 20
    )]
    TooSmall {
        device: String,
        size_bytes: u64,
        min_bytes: u64,
    },
    #[error("`{name}`: invalid NSD name: {problem}; {}", crate::types::NAME_RULE)]
    InvalidName { name: String, problem: &'static str },
}

/// CRC-32C of a descriptor sector with the checksum field taken as zero.
fn sector_crc(sector: &[u8]) -> u32 {
    assert_eq!(sector.len() as u64, NSD_DESCRIPTOR_BYTES);
    let crc = crc32c::crc32c(&sector[..CRC_OFFSET]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &sector[CRC_OFFSET + 4..])
}

fn encode(d: &NsdDescriptor) -> AlignedBuf {
    assert!(
        check_name(&d.name).is_ok(),
        "descriptor name checked by the caller"
    );
    let mut raw = RawDescriptor::new_zeroed();
    raw.magic = NSD_DESCRIPTOR_MAGIC;
    raw.format_version = U32::new(NSD_DESCRIPTOR_VERSION);
    raw.nsd_id = d.id.0;
    raw.device_bytes = U64::new(d.device_bytes);
    raw.created_unix = U64::new(d.created_unix);
    raw.cluster_id = d.cluster_id;
    raw.name_len = U16::new(d.name.len() as u16);
    raw.name[..d.name.len()].copy_from_slice(d.name.as_bytes());
    raw.crc32c = U32::new(sector_crc(raw.as_bytes()));
    AlignedBuf::from_slice(raw.as_bytes())
}

/// Decodes a descriptor sector: `None` when it does not start with the magic.
fn decode(sector: &[u8], device: &str) -> Result<Option<NsdDescriptor>, NsdError> {
    let raw = RawDescriptor::ref_from_bytes(sector).expect("sector is one descriptor long");
    if raw.magic != NSD_DESCRIPTOR_MAGIC {
        return Ok(None);
    }
    let corrupt = |reason: String| NsdError::CorruptDescriptor {
        device: device.into(),
        reason,
    };
    let version = raw.format_version.get();
    if version != NSD_DESCRIPTOR_VERSION {
        return Err(corrupt(format!(
            "format version {version}, but this Tessera reads version \
             {NSD_DESCRIPTOR_VERSION} (if a newer Tessera created it, upgrade this node)"
        )));
    }
    let (stored, computed) = (raw.crc32c.get(), sector_crc(sector));
    if stored != computed {
        return Err(corrupt(format!(
            "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        )));
    }
    let name = decode_name(raw).map_err(corrupt)?;
    Ok(Some(NsdDescriptor {
        id: NsdId(raw.nsd_id),
        name,
        device_bytes: raw.device_bytes.get(),
        created_unix: raw.created_unix.get(),
        cluster_id: raw.cluster_id,
    }))
}

/// The name of a checksummed descriptor; a bad one means a bug wrote it, not bit rot.
fn decode_name(raw: &RawDescriptor) -> Result<String, String> {
    let len = usize::from(raw.name_len.get());
    if len > NAME_MAX_BYTES {
        return Err(format!("name length {len} exceeds {NAME_MAX_BYTES}"));
    }
    if raw.name[len..].iter().any(|&b| b != 0) {
        return Err("bytes after the name are not zero".to_string());
    }
    let name =
        std::str::from_utf8(&raw.name[..len]).map_err(|_| "name is not ASCII".to_string())?;
    check_name(name).map_err(|problem| format!("stored name `{name}`: {problem}"))?;
    Ok(name.to_string())
}

fn io_error(dev: &dyn BlockDevice, action: &'static str) -> impl FnOnce(io::Error) -> NsdError {
    let device = dev.name().to_string();
    move |source| NsdError::Io {
        device,
        action,
        error: source,
    }
}

/// Writes `d` as the descriptor of `dev` and flushes it to stable storage.
pub fn write_descriptor(dev: &dyn BlockDevice, d: &NsdDescriptor) -> Result<(), NsdError> {
    check_name(&d.name).map_err(|problem| NsdError::InvalidName {
        name: d.name.clone(),
        problem,
    })?;
    let sector = encode(d);
    // Decoding what is about to be written catches an encoder bug before it reaches disk.
    let check = decode(&sector, dev.name()).expect("freshly encoded descriptor decodes");
    assert_eq!(check.as_ref(), Some(d));
    let write = io_error(dev, "writing the NSD descriptor");
    dev.write_at(&sector, NSD_DESCRIPTOR_OFFSET)
        .map_err(write)?;
    dev.flush()
        .map_err(io_error(dev, "flushing the NSD descriptor"))
}

/// Reads the descriptor of `dev`: `None` when the device is not an NSD (no magic).
pub fn read_descriptor(dev: &dyn BlockDevice) -> Result<Option<NsdDescriptor>, NsdError> {
    let mut sector = AlignedBuf::zeroed(NSD_DESCRIPTOR_BYTES as usize);
    let read = io_error(dev, "reading the NSD descriptor");
    dev.read_at(&mut sector, NSD_DESCRIPTOR_OFFSET)
        .map_err(read)?;
    decode(&sector, dev.name())
}

/// Zeroes the descriptor sector, so the device is no longer an NSD, and flushes.
pub fn erase_descriptor(dev: &dyn BlockDevice) -> Result<(), NsdError> {
    let zeros = AlignedBuf::zeroed(NSD_DESCRIPTOR_BYTES as usize);
    let write = io_error(dev, "erasing the NSD descriptor");
    dev.write_at(&zeros, NSD_DESCRIPTOR_OFFSET).map_err(write)?;
    dev.flush()
        .map_err(io_error(dev, "flushing the erased NSD descriptor"))
}

/// True when either file-system descriptor slot of `dev` starts with the file-system magic.
fn holds_file_system(dev: &dyn BlockDevice) -> Result<bool, NsdError> {
    let mut sector = AlignedBuf::zeroed(NSD_DESCRIPTOR_BYTES as usize);
    for offset in FS_DESCRIPTOR_SLOT_OFFSETS {
        // A device too small to have the slot cannot hold a file system there.
        if offset + sector.len() as u64 > dev.size_bytes() {
            continue;
        }
        let read = io_error(dev, "reading a file-system descriptor slot");
        dev.read_at(&mut sector, offset).map_err(read)?;
        if sector[..FS_DESCRIPTOR_MAGIC.len()] == FS_DESCRIPTOR_MAGIC {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Tells whether `dev` is already in use, before `nsd create` overwrites it.
///
/// A file-system descriptor takes precedence over an NSD descriptor: an NSD that belongs
/// to a file system has both, and "holds a file system" is the graver warning.
pub fn probe_in_use(dev: &dyn BlockDevice) -> Result<InUse, NsdError> {
    if holds_file_system(dev)? {
        return Ok(InUse::FileSystem);
    }
    Ok(match read_descriptor(dev)? {
        Some(d) => InUse::Nsd(d),
        None => InUse::Free,
    })
}

/// Refuses devices smaller than [`MIN_NSD_BYTES`].
pub fn check_device_size(dev: &dyn BlockDevice) -> Result<(), NsdError> {
    let size_bytes = dev.size_bytes();
    if size_bytes < MIN_NSD_BYTES {
        return Err(NsdError::TooSmall {
            device: dev.name().to_string(),
            size_bytes,
            min_bytes: MIN_NSD_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "descriptor_tests.rs"]
mod tests;
