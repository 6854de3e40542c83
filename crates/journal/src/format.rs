//! Byte-level encoding of the log header page and of data pages (see the crate docs for the
//! diagrams). Everything is little-endian with explicit widths; nothing here does I/O.

use crate::{JournalRegion, Lsn};

/// Size of every page, including the log header page. Equal to the drive sector size so
/// that one page is one aligned write.
pub(crate) const PAGE_BYTES: usize = 4096;
/// Bytes of the header at the start of every data page.
pub(crate) const PAGE_HEADER_BYTES: usize = 64;
/// Record bytes one data page carries.
pub(crate) const PAGE_PAYLOAD_BYTES: usize = PAGE_BYTES - PAGE_HEADER_BYTES;
/// Bytes of the `{len u32, crc32c u32}` frame in front of every record payload.
pub(crate) const FRAME_HEADER_BYTES: usize = 8;
/// `first_record` value of a page in which no record starts (it only continues one).
pub(crate) const NO_RECORD_START: u16 = u16::MAX;

const LOG_MAGIC: u32 = u32::from_le_bytes(*b"TJLH");
const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"TJLP");
const FORMAT_VERSION: u32 = 1;

const _: () = assert!(PAGE_BYTES as u64 == tessera_drive::SECTOR_BYTES);
const _: () = assert!(PAGE_PAYLOAD_BYTES < NO_RECORD_START as usize);
const _: () = assert!(PAGE_HEADER_BYTES == 64);

/// Where the data pages of a region are, and how a page sequence maps onto them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub region_offset: u64,
    /// Number of data pages in the circular array (the region minus its header page).
    pub data_pages: u64,
}

impl Geometry {
    pub fn new(region: JournalRegion) -> Geometry {
        let pages = region.bytes / PAGE_BYTES as u64;
        assert!(pages >= 2, "region must hold a header page and data pages");
        Geometry {
            region_offset: region.offset,
            data_pages: pages - 1,
        }
    }

    /// Device offset of the slot that holds page `seq` (slot 0 is the header page).
    pub fn page_offset(&self, seq: u64) -> u64 {
        self.region_offset + PAGE_BYTES as u64 * (1 + seq % self.data_pages)
    }

    /// How many pages starting at `seq` are contiguous on the device (up to the wrap).
    pub fn pages_until_wrap(&self, seq: u64) -> u64 {
        self.data_pages - seq % self.data_pages
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.data_pages * PAGE_BYTES as u64
    }

    /// The largest payload one record may carry: a quarter of the log, so a few maximal
    /// records always fit between checkpoints.
    pub fn max_record_bytes(&self) -> usize {
        let pages = usize::try_from(self.data_pages / 4)
            .unwrap_or(usize::MAX)
            .max(1);
        let bytes = pages.saturating_mul(PAGE_PAYLOAD_BYTES) - FRAME_HEADER_BYTES;
        bytes.min(u32::MAX as usize)
    }
}

/// The page that holds the byte at `lsn`; an LSN on a page boundary names the next page.
pub(crate) fn page_of(lsn: Lsn) -> u64 {
    lsn / PAGE_BYTES as u64
}

/// The LSN of the byte at `pos` within the payload of page `seq`.
pub(crate) fn lsn_at(seq: u64, pos: usize) -> Lsn {
    seq * PAGE_BYTES as u64 + (PAGE_HEADER_BYTES + pos) as u64
}

/// Contents of the log header page (slot 0 of the region).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LogHeader {
    pub log_id: [u8; 16],
    pub region: JournalRegion,
    /// Changes on every format, so pages of an earlier format of the same region (even with
    /// the same log_id) never pass as pages of this one.
    pub format_epoch: u64,
}

fn put_u32(page: &mut [u8], at: usize, v: u32) {
    page[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(page: &mut [u8], at: usize, v: u64) {
    page[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(page: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(page[at..at + 2].try_into().expect("2 bytes"))
}
fn get_u32(page: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(page[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(page: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(page[at..at + 8].try_into().expect("8 bytes"))
}

/// CRC32C of a whole page with its crc field (bytes 4..8) taken as zero.
pub(crate) fn page_crc(page: &[u8]) -> u32 {
    assert_eq!(page.len(), PAGE_BYTES);
    let crc = crc32c::crc32c(&page[..4]);
    let crc = crc32c::crc32c_append(crc, &[0; 4]);
    crc32c::crc32c_append(crc, &page[8..])
}

fn seal_crc(page: &mut [u8]) {
    let crc = page_crc(page);
    put_u32(page, 4, crc);
    assert_eq!(page_crc(page), get_u32(page, 4));
}

impl LogHeader {
    pub fn encode(&self, page: &mut [u8]) {
        assert_eq!(page.len(), PAGE_BYTES);
        page.fill(0);
        put_u32(page, 0, LOG_MAGIC);
        put_u32(page, 8, FORMAT_VERSION);
        put_u32(page, 12, PAGE_BYTES as u32);
        page[16..32].copy_from_slice(&self.log_id);
        put_u64(page, 32, self.region.offset);
        put_u64(page, 40, self.region.bytes);
        put_u64(page, 48, self.format_epoch);
        seal_crc(page);
    }

    /// Decodes a header page; the error says what is wrong with it.
    pub fn decode(page: &[u8]) -> Result<LogHeader, String> {
        assert_eq!(page.len(), PAGE_BYTES);
        if get_u32(page, 0) != LOG_MAGIC {
            return Err("no journal header (bad magic); was the region formatted?".into());
        }
        if get_u32(page, 4) != page_crc(page) {
            return Err("journal header checksum mismatch".into());
        }
        let version = get_u32(page, 8);
        if version != FORMAT_VERSION {
            return Err(format!("unsupported journal format version {version}"));
        }
        let page_bytes = get_u32(page, 12);
        if page_bytes as usize != PAGE_BYTES {
            return Err(format!("unsupported journal page size {page_bytes}"));
        }
        Ok(LogHeader {
            log_id: page[16..32].try_into().expect("16 bytes"),
            region: JournalRegion {
                offset: get_u64(page, 32),
                bytes: get_u64(page, 40),
            },
            format_epoch: get_u64(page, 48),
        })
    }
}

/// The fields of a data page header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageHeader {
    pub log_id: [u8; 16],
    pub format_epoch: u64,
    /// Position of the page in the endless log; the slot is `seq % data_pages`.
    pub seq: u64,
    /// Random per open of the journal ("session"): tells pages of two sessions apart.
    pub session_nonce: u64,
    /// Sequence of the first page this session wrote.
    pub session_first_seq: u64,
    /// Record bytes in the payload area; the rest is zero padding.
    pub used_bytes: u16,
    /// Payload offset of the first record frame that starts in this page, or
    /// [`NO_RECORD_START`]. Bytes before it continue a record from earlier pages.
    pub first_record: u16,
}

impl PageHeader {
    /// Encodes a whole page (header, payload, zero padding, crc) into `page`.
    pub fn encode(&self, payload: &[u8], page: &mut [u8]) {
        assert_eq!(page.len(), PAGE_BYTES);
        assert_eq!(payload.len(), self.used_bytes as usize);
        assert!(payload.len() <= PAGE_PAYLOAD_BYTES);
        assert!(self.first_record == NO_RECORD_START || self.first_record < self.used_bytes);
        put_u32(page, 0, PAGE_MAGIC);
        page[8..24].copy_from_slice(&self.log_id);
        put_u64(page, 24, self.format_epoch);
        put_u64(page, 32, self.seq);
        put_u64(page, 40, self.session_nonce);
        put_u64(page, 48, self.session_first_seq);
        page[56..58].copy_from_slice(&self.used_bytes.to_le_bytes());
        page[58..60].copy_from_slice(&self.first_record.to_le_bytes());
        put_u32(page, 60, 0);
        page[PAGE_HEADER_BYTES..PAGE_HEADER_BYTES + payload.len()].copy_from_slice(payload);
        page[PAGE_HEADER_BYTES + payload.len()..].fill(0);
        seal_crc(page);
    }

    /// Decodes a data page. `None` for anything that is not a whole, self-consistent page
    /// (never written, torn, overwritten by garbage); the caller checks log identity and
    /// sequence.
    pub fn decode(page: &[u8]) -> Option<PageHeader> {
        assert_eq!(page.len(), PAGE_BYTES);
        if get_u32(page, 0) != PAGE_MAGIC || get_u32(page, 4) != page_crc(page) {
            return None;
        }
        let header = PageHeader {
            log_id: page[8..24].try_into().expect("16 bytes"),
            format_epoch: get_u64(page, 24),
            seq: get_u64(page, 32),
            session_nonce: get_u64(page, 40),
            session_first_seq: get_u64(page, 48),
            used_bytes: get_u16(page, 56),
            first_record: get_u16(page, 58),
        };
        let used = header.used_bytes as usize;
        let sane = used <= PAGE_PAYLOAD_BYTES
            && (header.first_record == NO_RECORD_START || header.first_record < header.used_bytes)
            && header.session_first_seq <= header.seq
            && get_u32(page, 60) == 0
            && page[PAGE_HEADER_BYTES + used..].iter().all(|&b| b == 0);
        sane.then_some(header)
    }
}

/// The frame header of a record: payload length and the CRC32C of length and payload.
pub(crate) fn frame_header(payload: &[u8]) -> [u8; FRAME_HEADER_BYTES] {
    let len = u32::try_from(payload.len()).expect("record length checked against the maximum");
    let len_bytes = len.to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload);
    let mut header = [0; FRAME_HEADER_BYTES];
    header[..4].copy_from_slice(&len_bytes);
    header[4..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Splits a frame header into (payload length, crc).
pub(crate) fn parse_frame_header(header: &[u8; FRAME_HEADER_BYTES]) -> (u32, u32) {
    (get_u32(header, 0), get_u32(header, 4))
}

/// Whether `payload` matches the crc of its frame header.
pub(crate) fn frame_crc_ok(payload: &[u8], crc: u32) -> bool {
    frame_header(payload)[4..] == crc.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PageHeader {
        PageHeader {
            log_id: [7; 16],
            format_epoch: 3,
            seq: 42,
            session_nonce: 0xdead_beef,
            session_first_seq: 40,
            used_bytes: 100,
            first_record: 10,
        }
    }

    #[test]
    fn page_roundtrip_and_every_bit_flip_is_detected() {
        let mut page = vec![0; PAGE_BYTES];
        let header = sample();
        header.encode(&[0xab; 100], &mut page);
        assert_eq!(PageHeader::decode(&page), Some(header));
        for byte in [0, 5, 9, 33, 57, 64, 163, 164, 4095] {
            let mut bad = page.clone();
            bad[byte] ^= 0x10;
            assert_eq!(PageHeader::decode(&bad), None, "flip in byte {byte}");
        }
    }

    #[test]
    fn log_header_roundtrip_and_rejects_damage() {
        let header = LogHeader {
            log_id: [1; 16],
            region: JournalRegion {
                offset: 8192,
                bytes: 1 << 20,
            },
            format_epoch: 9,
        };
        let mut page = vec![0; PAGE_BYTES];
        header.encode(&mut page);
        assert_eq!(LogHeader::decode(&page), Ok(header));
        page[40] ^= 1;
        assert!(LogHeader::decode(&page).unwrap_err().contains("checksum"));
        assert!(LogHeader::decode(&[0; PAGE_BYTES])
            .unwrap_err()
            .contains("magic"));
    }

    #[test]
    fn geometry_maps_sequences_onto_slots() {
        let g = Geometry::new(JournalRegion {
            offset: 4096,
            bytes: 5 * 4096,
        });
        assert_eq!(g.data_pages, 4);
        assert_eq!(g.page_offset(0), 2 * 4096);
        assert_eq!(g.page_offset(3), 5 * 4096);
        assert_eq!(g.page_offset(4), 2 * 4096);
        assert_eq!(g.pages_until_wrap(6), 2);
        assert_eq!(lsn_at(2, 0), 2 * 4096 + 64);
        assert_eq!(page_of(lsn_at(2, PAGE_PAYLOAD_BYTES)), 3);
    }
}
