//! On-disk formats of a pdisk: the label, the framed metadata and dirty-bitmap slots, and
//! the strip header. All integers are little-endian; every record carries a magic, a format
//! version and a CRC-32C.
//!
//! ```text
//! offset 0     4 KiB         1 MiB        +S          +2S         +2S+D       +2S+2D   (1 MiB aligned)
//!   +--------+---- ~ ----+------------+------------+------------+------------+-- ~ --+-----------------
//!   | pdisk  | (zero)    | DA meta    | DA meta    | dirty map  | dirty map  |(zero) | strip slots:
//!   | label  |           | slot A     | slot B     | slot A     | slot B     |       | [header][data]
//!   +--------+---- ~ ----+------------+------------+------------+------------+-- ~ --+-----------------
//! ```
//!
//! `S` is the metadata slot size chosen at array creation (recorded in every label) and `D`
//! is [`DIRTY_SLOT_BYTES`].

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::error::NAME_MAX_BYTES;

/// The alignment of everything on a pdisk.
pub const SECTOR: u64 = tessera_drive::SECTOR_BYTES;
/// Size of one sector as `usize`, for buffer arithmetic.
pub const SECTOR_USIZE: usize = SECTOR as usize;

/// The pdisk label sits in the first sector.
pub const LABEL_OFFSET: u64 = 0;
/// Where the first metadata slot starts.
pub const META_OFFSET: u64 = 1 << 20;
/// Smallest and largest metadata slot: 1/256 of the smallest pdisk, clamped to this range.
pub const META_SLOT_BYTES_MIN: u64 = 1 << 20;
pub const META_SLOT_BYTES_MAX: u64 = 256 << 20;
/// One dirty-region bitmap slot; bounds `vdisks x regions` (see `dirty.rs`).
pub const DIRTY_SLOT_BYTES: u64 = 64 << 10;
/// Data areas start on a 1 MiB boundary so strip slots of large strips stay aligned.
pub const DATA_ALIGN: u64 = 1 << 20;
/// The smallest pdisk: label and metadata plus room for a useful number of strips.
pub const PDISK_BYTES_MIN: u64 = 32 << 20;

/// `b"TSRPDK01"`: the first bytes of every pdisk.
pub const LABEL_MAGIC: [u8; 8] = *b"TSRPDK01";
pub const LABEL_VERSION: u32 = 1;
/// `b"TSRDAM01"`: a metadata slot.
pub const META_MAGIC: [u8; 8] = *b"TSRDAM01";
/// `b"TSRDRT01"`: a dirty-region bitmap slot.
pub const DIRTY_MAGIC: [u8; 8] = *b"TSRDRT01";
pub const SLOT_VERSION: u32 = 1;
/// `b"TSRSTR01"`: a strip header.
pub const STRIP_MAGIC: [u8; 8] = *b"TSRSTR01";

const _: () = assert!(META_OFFSET.is_multiple_of(SECTOR));
const _: () = assert!(DIRTY_SLOT_BYTES.is_multiple_of(SECTOR));
const _: () = assert!(META_SLOT_BYTES_MIN.is_multiple_of(SECTOR));
const _: () = assert!(NAME_MAX_BYTES < 64);

/// Where a pdisk's regions are, derived from its size and the array's metadata slot size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PdiskLayout {
    pub meta_slot_bytes: u64,
    pub data_start: u64,
    pub data_end: u64,
}

impl PdiskLayout {
    pub fn new(device_bytes: u64, meta_slot_bytes: u64) -> PdiskLayout {
        assert!(meta_slot_bytes.is_multiple_of(SECTOR));
        let meta_end = META_OFFSET + 2 * meta_slot_bytes + 2 * DIRTY_SLOT_BYTES;
        let data_start = meta_end.div_ceil(DATA_ALIGN) * DATA_ALIGN;
        let data_end = (device_bytes / SECTOR * SECTOR).max(data_start);
        PdiskLayout {
            meta_slot_bytes,
            data_start,
            data_end,
        }
    }

    /// Offset of metadata slot `slot` (0 = A, 1 = B).
    pub fn meta_slot(&self, slot: u64) -> u64 {
        assert!(slot < 2);
        META_OFFSET + slot * self.meta_slot_bytes
    }

    /// Offset of dirty-bitmap slot `slot` (0 = A, 1 = B).
    pub fn dirty_slot(&self, slot: u64) -> u64 {
        assert!(slot < 2);
        META_OFFSET + 2 * self.meta_slot_bytes + slot * DIRTY_SLOT_BYTES
    }

    pub fn data_sectors(&self) -> u64 {
        (self.data_end - self.data_start) / SECTOR
    }
}

/// The metadata slot size for an array whose smallest pdisk has `smallest_bytes`.
pub fn meta_slot_bytes_for(smallest_bytes: u64) -> u64 {
    let raw = (smallest_bytes / 256).clamp(META_SLOT_BYTES_MIN, META_SLOT_BYTES_MAX);
    raw / SECTOR * SECTOR
}

// ---------------------------------------------------------------------------------------
// Pdisk label
// ---------------------------------------------------------------------------------------

/// The label exactly as stored (format version 1, 4096 bytes):
///
/// ```text
/// offset  size  field             meaning
///      0     8  magic             b"TSRPDK01"
///      8     4  format_version    1
///     12     4  crc32c            of the 4096 bytes with this field zero
///     16    16  da_uuid           the array this pdisk belongs to
///     32    16  pdisk_uuid        this pdisk's permanent identity
///     48     8  device_bytes      device size when the label was written
///     56     8  created_unix      seconds since 1970 when the label was written
///     64     4  pdisk_index       position in the array's pdisk table
///     68     4  slot              enclosure slot
///     72     8  meta_slot_bytes   size of each metadata slot (S)
///     80     1  da_name_len
///     81     1  pdisk_name_len
///     82     1  enclosure_len
///     83     5  reserved0         zero
///     88    64  da_name           zero padded
///    152    64  pdisk_name        zero padded
///    216    64  enclosure         zero padded
///    280  3816  reserved          zero
/// ```
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct RawLabel {
    magic: [u8; 8],
    format_version: U32,
    crc32c: U32,
    da_uuid: [u8; 16],
    pdisk_uuid: [u8; 16],
    device_bytes: U64,
    created_unix: U64,
    pdisk_index: U32,
    slot: U32,
    meta_slot_bytes: U64,
    da_name_len: u8,
    pdisk_name_len: u8,
    enclosure_len: u8,
    reserved0: [u8; 5],
    da_name: [u8; 64],
    pdisk_name: [u8; 64],
    enclosure: [u8; 64],
    reserved: [u8; 3816],
}

const LABEL_CRC_OFFSET: usize = 12;
const _: () = assert!(std::mem::size_of::<RawLabel>() == SECTOR_USIZE);
const _: () = assert!(std::mem::offset_of!(RawLabel, crc32c) == LABEL_CRC_OFFSET);
const _: () = assert!(std::mem::offset_of!(RawLabel, pdisk_index) == 64);
const _: () = assert!(std::mem::offset_of!(RawLabel, da_name) == 88);
const _: () = assert!(std::mem::offset_of!(RawLabel, enclosure) == 216);
const _: () = assert!(std::mem::offset_of!(RawLabel, reserved) == 280);

/// What a pdisk label says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub da_uuid: [u8; 16],
    pub da_name: String,
    pub pdisk_uuid: [u8; 16],
    pub pdisk_index: u32,
    pub pdisk_name: String,
    pub enclosure: String,
    pub slot: u32,
    pub device_bytes: u64,
    pub created_unix: u64,
    pub meta_slot_bytes: u64,
}

fn crc_with_hole(bytes: &[u8], hole: usize) -> u32 {
    let crc = crc32c::crc32c(&bytes[..hole]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &bytes[hole + 4..])
}

fn put_name(dst: &mut [u8; 64], name: &str) -> u8 {
    assert!(name.len() <= NAME_MAX_BYTES);
    dst[..name.len()].copy_from_slice(name.as_bytes());
    name.len() as u8
}

fn get_name(src: &[u8; 64], len: u8) -> Result<String, String> {
    let len = usize::from(len);
    if len > NAME_MAX_BYTES {
        return Err(format!("name length {len} exceeds {NAME_MAX_BYTES}"));
    }
    std::str::from_utf8(&src[..len])
        .map(str::to_string)
        .map_err(|_| "name is not UTF-8".to_string())
}

impl Label {
    /// The 4096-byte sector holding this label.
    pub fn encode(&self) -> Vec<u8> {
        let mut raw = RawLabel::new_zeroed();
        raw.magic = LABEL_MAGIC;
        raw.format_version = U32::new(LABEL_VERSION);
        raw.da_uuid = self.da_uuid;
        raw.pdisk_uuid = self.pdisk_uuid;
        raw.device_bytes = U64::new(self.device_bytes);
        raw.created_unix = U64::new(self.created_unix);
        raw.pdisk_index = U32::new(self.pdisk_index);
        raw.slot = U32::new(self.slot);
        raw.meta_slot_bytes = U64::new(self.meta_slot_bytes);
        raw.da_name_len = put_name(&mut raw.da_name, &self.da_name);
        raw.pdisk_name_len = put_name(&mut raw.pdisk_name, &self.pdisk_name);
        raw.enclosure_len = put_name(&mut raw.enclosure, &self.enclosure);
        raw.crc32c = U32::new(crc_with_hole(raw.as_bytes(), LABEL_CRC_OFFSET));
        let bytes = raw.as_bytes().to_vec();
        // The encoder and decoder must agree before anything reaches a disk.
        assert_eq!(Label::decode(&bytes).ok().flatten().as_ref(), Some(self));
        bytes
    }

    /// Decodes a label sector: `Ok(None)` without the magic, `Err(reason)` when it is
    /// damaged or of another format version.
    pub fn decode(sector: &[u8]) -> Result<Option<Label>, String> {
        assert_eq!(sector.len(), SECTOR_USIZE);
        let raw = RawLabel::ref_from_bytes(sector).expect("one sector");
        if raw.magic != LABEL_MAGIC {
            return Ok(None);
        }
        let version = raw.format_version.get();
        if version != LABEL_VERSION {
            return Err(format!(
                "format version {version}, this Tessera reads version {LABEL_VERSION}"
            ));
        }
        let (stored, computed) = (raw.crc32c.get(), crc_with_hole(sector, LABEL_CRC_OFFSET));
        if stored != computed {
            return Err(format!(
                "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ));
        }
        Ok(Some(Label {
            da_uuid: raw.da_uuid,
            da_name: get_name(&raw.da_name, raw.da_name_len)?,
            pdisk_uuid: raw.pdisk_uuid,
            pdisk_index: raw.pdisk_index.get(),
            pdisk_name: get_name(&raw.pdisk_name, raw.pdisk_name_len)?,
            enclosure: get_name(&raw.enclosure, raw.enclosure_len)?,
            slot: raw.slot.get(),
            device_bytes: raw.device_bytes.get(),
            created_unix: raw.created_unix.get(),
            meta_slot_bytes: raw.meta_slot_bytes.get(),
        }))
    }
}

// ---------------------------------------------------------------------------------------
// Framed slots (metadata and dirty bitmaps)
// ---------------------------------------------------------------------------------------

/// The 64-byte frame in front of a metadata or dirty-bitmap payload:
///
/// ```text
/// 0        8          12        16           24            32          48        64
/// +--------+----------+---------+------------+-------------+-----------+---------+---------
/// | magic  | version  | crc32c  | generation | payload_len | da_uuid   | zero    | payload
/// |        | u32 = 1  |         | u64        | u64         | [u8; 16]  |         | (postcard)
/// +--------+----------+---------+------------+-------------+-----------+---------+---------
/// ```
///
/// The CRC covers the frame (with the CRC field zero) and the payload. Generation `g` is
/// written to slot `g mod 2`, so a torn write leaves generation `g - 1` in the other slot.
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct RawFrame {
    magic: [u8; 8],
    version: U32,
    crc32c: U32,
    generation: U64,
    payload_len: U64,
    da_uuid: [u8; 16],
    zero: [u8; 16],
}

pub const FRAME_BYTES: usize = 64;
const FRAME_CRC_OFFSET: usize = 12;
const _: () = assert!(std::mem::size_of::<RawFrame>() == FRAME_BYTES);
const _: () = assert!(std::mem::offset_of!(RawFrame, crc32c) == FRAME_CRC_OFFSET);

/// Frames `payload` for slot writing; the result is padded to whole sectors.
pub fn frame(magic: [u8; 8], generation: u64, da_uuid: [u8; 16], payload: &[u8]) -> Vec<u8> {
    let mut raw = RawFrame::new_zeroed();
    raw.magic = magic;
    raw.version = U32::new(SLOT_VERSION);
    raw.generation = U64::new(generation);
    raw.payload_len = U64::new(payload.len() as u64);
    raw.da_uuid = da_uuid;
    let total = (FRAME_BYTES + payload.len()).div_ceil(SECTOR_USIZE) * SECTOR_USIZE;
    let mut out = vec![0u8; total];
    out[..FRAME_BYTES].copy_from_slice(raw.as_bytes());
    out[FRAME_BYTES..FRAME_BYTES + payload.len()].copy_from_slice(payload);
    let crc = crc_with_hole(&out[..FRAME_BYTES + payload.len()], FRAME_CRC_OFFSET);
    out[FRAME_CRC_OFFSET..FRAME_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Bytes of the payload length field, so a reader can read a frame's first sector and then
/// the rest.
pub fn frame_total_bytes(first_sector: &[u8]) -> Option<u64> {
    let raw = RawFrame::ref_from_bytes(&first_sector[..FRAME_BYTES]).ok()?;
    Some((FRAME_BYTES as u64 + raw.payload_len.get()).div_ceil(SECTOR) * SECTOR)
}

/// A verified frame: its generation, array and payload.
pub struct Unframed<'a> {
    pub generation: u64,
    pub da_uuid: [u8; 16],
    pub payload: &'a [u8],
}

/// Checks a frame read back from a slot: `None` when the magic, version or CRC is wrong
/// (an empty, torn or foreign slot, all of which mean "use the other slot").
pub fn unframe(magic: [u8; 8], bytes: &[u8]) -> Option<Unframed<'_>> {
    let raw = RawFrame::ref_from_bytes(bytes.get(..FRAME_BYTES)?).ok()?;
    if raw.magic != magic || raw.version.get() != SLOT_VERSION {
        return None;
    }
    let len = usize::try_from(raw.payload_len.get()).ok()?;
    let end = FRAME_BYTES.checked_add(len)?;
    let body = bytes.get(..end)?;
    if crc_with_hole(body, FRAME_CRC_OFFSET) != raw.crc32c.get() {
        return None;
    }
    Some(Unframed {
        generation: raw.generation.get(),
        da_uuid: raw.da_uuid,
        payload: &bytes[FRAME_BYTES..end],
    })
}

// ---------------------------------------------------------------------------------------
// Strip header
// ---------------------------------------------------------------------------------------

/// The fixed part of a strip header (64 bytes), followed by the stripe's checksum table:
/// `strips x sectors_per_strip` CRC-32Cs (u32), strip-major, data strips first. The header
/// is padded with zeros to a whole number of sectors.
///
/// ```text
/// offset  size  field              meaning
///      0     8  magic              b"TSRSTR01"
///      8     4  crc32c             of the fixed part and table, this field zero
///     12     2  format_version     1
///     14     2  reserved           zero
///     16    16  da_uuid            the array
///     32     4  vdisk_id           never reused within an array
///     36     2  strip_index        0..k data, k..k+m parity
///     38     1  codec_id           parity format (tessera-ec `Codec::id`)
///     39     1  strips             k + m
///     40     8  stripe             stripe number within the vdisk
///     48     8  version            stripe write version; larger is newer
///     56     4  lost_mask          strips whose content was lost (reads fail with EIO)
///     60     4  sectors_per_strip
///     64  4*n*s table              crc32c of every sector of every strip
/// ```
#[derive(FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
struct RawStripHeader {
    magic: [u8; 8],
    crc32c: U32,
    format_version: U16,
    reserved: U16,
    da_uuid: [u8; 16],
    vdisk_id: U32,
    strip_index: U16,
    codec_id: u8,
    strips: u8,
    stripe: U64,
    version: U64,
    lost_mask: U32,
    sectors_per_strip: U32,
}

const STRIP_FIXED_BYTES: usize = 64;
const STRIP_CRC_OFFSET: usize = 8;
const STRIP_VERSION: u16 = 1;
const _: () = assert!(std::mem::size_of::<RawStripHeader>() == STRIP_FIXED_BYTES);
const _: () = assert!(std::mem::offset_of!(RawStripHeader, crc32c) == STRIP_CRC_OFFSET);
const _: () = assert!(std::mem::offset_of!(RawStripHeader, stripe) == 40);

/// Bytes of the header of a strip of a stripe with `strips` strips of `sectors` sectors.
pub fn strip_header_bytes(strips: usize, sectors: usize) -> usize {
    (STRIP_FIXED_BYTES + 4 * strips * sectors).div_ceil(SECTOR_USIZE) * SECTOR_USIZE
}

/// Which strip a header claims to belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StripId {
    pub vdisk_id: u32,
    pub stripe: u64,
    pub strip_index: u16,
}

/// A decoded strip header. The table is the stripe's checksum table as of `version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripHeader {
    pub version: u64,
    pub codec_id: u8,
    pub lost_mask: u32,
    pub sectors_per_strip: u32,
    /// `strips * sectors_per_strip` entries, strip-major.
    pub table: Vec<u32>,
}

impl StripHeader {
    pub fn strips(&self) -> usize {
        self.table.len() / self.sectors_per_strip as usize
    }

    /// The checksum of sector `sector` of strip `strip`.
    pub fn crc(&self, strip: usize, sector: usize) -> u32 {
        self.table[strip * self.sectors_per_strip as usize + sector]
    }

    /// Encodes the header of strip `id` into `out` (exactly the header size).
    pub fn encode_into(&self, da_uuid: [u8; 16], id: StripId, out: &mut [u8]) {
        let strips = self.strips();
        let sps = self.sectors_per_strip as usize;
        assert_eq!(out.len(), strip_header_bytes(strips, sps));
        assert!(usize::from(id.strip_index) < strips);
        out.fill(0);
        let mut raw = RawStripHeader::new_zeroed();
        raw.magic = STRIP_MAGIC;
        raw.format_version = U16::new(STRIP_VERSION);
        raw.da_uuid = da_uuid;
        raw.vdisk_id = U32::new(id.vdisk_id);
        raw.strip_index = U16::new(id.strip_index);
        raw.codec_id = self.codec_id;
        raw.strips = u8::try_from(strips).expect("at most 255 strips");
        raw.stripe = U64::new(id.stripe);
        raw.version = U64::new(self.version);
        raw.lost_mask = U32::new(self.lost_mask);
        raw.sectors_per_strip = U32::new(self.sectors_per_strip);
        out[..STRIP_FIXED_BYTES].copy_from_slice(raw.as_bytes());
        let table_end = STRIP_FIXED_BYTES + 4 * self.table.len();
        for (chunk, crc) in out[STRIP_FIXED_BYTES..table_end]
            .chunks_exact_mut(4)
            .zip(&self.table)
        {
            chunk.copy_from_slice(&crc.to_le_bytes());
        }
        let crc = crc_with_hole(&out[..table_end], STRIP_CRC_OFFSET);
        out[STRIP_CRC_OFFSET..STRIP_CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a header that must belong to strip `id` of a stripe of `strips` strips of
    /// `sps` sectors in array `da_uuid`. `None` for anything else: never written, torn,
    /// damaged, or left over from another strip or vdisk.
    pub fn decode(
        bytes: &[u8],
        da_uuid: [u8; 16],
        id: StripId,
        strips: usize,
        sps: usize,
    ) -> Option<StripHeader> {
        let raw = RawStripHeader::ref_from_bytes(bytes.get(..STRIP_FIXED_BYTES)?).ok()?;
        let matches = raw.magic == STRIP_MAGIC
            && raw.format_version.get() == STRIP_VERSION
            && raw.da_uuid == da_uuid
            && raw.vdisk_id.get() == id.vdisk_id
            && raw.stripe.get() == id.stripe
            && raw.strip_index.get() == id.strip_index
            && usize::from(raw.strips) == strips
            && raw.sectors_per_strip.get() as usize == sps;
        if !matches {
            return None;
        }
        let table_end = STRIP_FIXED_BYTES + 4 * strips * sps;
        let body = bytes.get(..table_end)?;
        if crc_with_hole(body, STRIP_CRC_OFFSET) != raw.crc32c.get() {
            return None;
        }
        let table = body[STRIP_FIXED_BYTES..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Some(StripHeader {
            version: raw.version.get(),
            codec_id: raw.codec_id,
            lost_mask: raw.lost_mask.get(),
            sectors_per_strip: raw.sectors_per_strip.get(),
            table,
        })
    }
}

/// CRC-32C of each sector of `data` (a whole number of sectors).
pub fn sector_crcs(data: &[u8], out: &mut [u32]) {
    assert_eq!(data.len(), out.len() * SECTOR_USIZE);
    for (crc, sector) in out.iter_mut().zip(data.chunks_exact(SECTOR_USIZE)) {
        *crc = crc32c::crc32c(sector);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label() -> Label {
        Label {
            da_uuid: [7; 16],
            da_name: "da1".into(),
            pdisk_uuid: [9; 16],
            pdisk_index: 3,
            pdisk_name: "e1s03".into(),
            enclosure: "e1".into(),
            slot: 3,
            device_bytes: 1 << 30,
            created_unix: 1_700_000_000,
            meta_slot_bytes: 1 << 20,
        }
    }

    #[test]
    fn label_roundtrip_and_bit_flips() {
        let bytes = label().encode();
        assert_eq!(Label::decode(&bytes).unwrap(), Some(label()));
        assert_eq!(&bytes[..8], b"TSRPDK01");
        assert_eq!(u32::from_le_bytes(bytes[64..68].try_into().unwrap()), 3);
        for bit in [100 * 8, 8 * 12 + 1, 4095 * 8 + 7] {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Label::decode(&b).is_err(), "bit {bit}");
        }
        assert_eq!(Label::decode(&[0; 4096]).unwrap(), None);
    }

    #[test]
    fn frame_roundtrip_and_damage() {
        let f = frame(META_MAGIC, 5, [1; 16], b"hello");
        assert_eq!(f.len(), 4096);
        let u = unframe(META_MAGIC, &f).unwrap();
        assert_eq!((u.generation, u.payload), (5, &b"hello"[..]));
        assert!(unframe(DIRTY_MAGIC, &f).is_none());
        let mut g = f.clone();
        g[66] ^= 4;
        assert!(unframe(META_MAGIC, &g).is_none());
    }

    #[test]
    fn strip_header_roundtrip_identity_and_damage() {
        let h = StripHeader {
            version: 42,
            codec_id: 1,
            lost_mask: 0,
            sectors_per_strip: 4,
            table: (0..40).collect(),
        };
        let id = StripId {
            vdisk_id: 2,
            stripe: 77,
            strip_index: 9,
        };
        let mut buf = vec![0u8; strip_header_bytes(10, 4)];
        h.encode_into([3; 16], id, &mut buf);
        assert_eq!(
            StripHeader::decode(&buf, [3; 16], id, 10, 4),
            Some(h.clone())
        );
        let other = StripId { stripe: 78, ..id };
        assert_eq!(StripHeader::decode(&buf, [3; 16], other, 10, 4), None);
        assert_eq!(StripHeader::decode(&buf, [4; 16], id, 10, 4), None);
        buf[64 + 20] ^= 0x10;
        assert_eq!(StripHeader::decode(&buf, [3; 16], id, 10, 4), None);
    }
}
