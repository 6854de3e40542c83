//! The metadata page: a fixed-size, self-checking unit of on-disk metadata, and the byte
//! layout of the B+tree nodes stored in pages.
//!
//! ```text
//! offset  size  field       meaning
//! ------  ----  ----------  ------------------------------------------------------------
//!      0     4  magic       b"TMPG"
//!      4     4  crc32c      CRC-32C of the whole page with this field taken as zero
//!      8     1  version     1, or 2 when branch pointers carry a second address (`-m 2`)
//!      9     1  kind        1 = B+tree leaf, 2 = B+tree branch
//!     10     1  level       0 for leaves, height above the leaves for branches
//!     11     1  zero
//!     12     2  entries     leaf: key/value pairs; branch: separator keys
//!     14     2  zero
//!     16     4  used        payload bytes in use (the rest of the page is zero)
//!     20     4  page_bytes  the page size of the store that wrote it
//!     24     8  owner       the store's owner id (a file system's), so a page of another
//!                           file system is never taken for ours
//!     32     8  generation  the checkpoint that wrote the page
//!     40     8  address     where the page was written (catches misdirected writes)
//!     48     …  payload
//!
//! leaf payload, entries in ascending key order:
//!   +--------+--------+-----------+-------------+
//!   | klen   | vlen   | key       | value       |  ...next entry...
//!   | u16    | u16    | klen B    | vlen B      |
//!   +--------+--------+-----------+-------------+
//!
//! branch payload: the leftmost child, then one separator per further child; child i+1
//! holds the keys >= separator i (and < separator i+1):
//!   +----------+--------+   +--------+---------+----------+--------+
//!   | child 0  | crc 0  |   | klen   | key     | child    | crc    |  ...
//!   | addr u64 | u32    |   | u16    | klen B  | addr u64 | u32    |
//!   +----------+--------+   +--------+---------+----------+--------+
//!
//! version 2 (metadata replicated, `-m 2`): every child pointer is followed by the address
//! of the page's second copy, on a disk of another failure group (all ones: no second copy):
//!   +----------+--------+-------------+
//!   | addr u64 | crc u32| second u64  |   20 bytes instead of 12
//!   +----------+--------+-------------+
//! ```
//!
//! Both copies of a page hold the same bytes, the first address included (the misdirected-
//! write check compares it with the pointer's first address, whichever copy was read).
//!
//! A parent keeps its child's checksum beside its address, so a page that is intact but
//! stale (a write the drive lost, or an older page at a reused address) is caught on read,
//! not only a torn or misdirected one.

use crate::leaf::Leaf;
use crate::{MetaError, MetaResult, PageAddr};

pub const MAGIC: [u8; 4] = *b"TMPG";
pub const VERSION: u8 = 1;
/// The version of pages whose branch pointers carry a second address.
pub const VERSION_MIRRORED: u8 = 2;
pub const HEADER_BYTES: usize = 48;
/// Smallest page: one sector, the drives' atomic write unit.
pub const MIN_PAGE_BYTES: usize = 4096;
/// Largest page: a metadata page is one sub-block, and sub-blocks stop at 32 KiB for the
/// largest file-system blocks (16 MiB / 512).
pub const MAX_PAGE_BYTES: usize = 64 * 1024;
/// Longest key: a directory entry key is an 8-byte hash and a 255-byte name.
pub const MAX_KEY_BYTES: usize = 512;
/// Bytes a leaf entry takes besides its key and value.
pub const LEAF_ENTRY_OVERHEAD: usize = 4;
/// Bytes of a child pointer (address and checksum).
pub const PTR_BYTES: usize = 12;
/// Bytes of a child pointer with a second address (version 2).
pub const MIRRORED_PTR_BYTES: usize = 20;
/// The second address of a pointer whose page has one copy.
const NO_SECOND_COPY: u64 = u64::MAX;

pub const KIND_LEAF: u8 = 1;
pub const KIND_BRANCH: u8 = 2;

/// Where a page is and what it must hash to: what a parent keeps for each child.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagePtr {
    pub addr: PageAddr,
    pub crc: u32,
    /// The page's second copy (same bytes), in a store whose pages are replicated.
    pub mirror: Option<PageAddr>,
}

impl PagePtr {
    /// The on-disk form (12 bytes), also used by callers that keep a tree root in their own
    /// records (an inode slot, a descriptor).
    pub fn to_bytes(self) -> [u8; PTR_BYTES] {
        let mut out = [0u8; PTR_BYTES];
        out[..8].copy_from_slice(&self.addr.0.to_le_bytes());
        out[8..].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    pub fn from_bytes(bytes: &[u8; PTR_BYTES]) -> PagePtr {
        PagePtr {
            addr: PageAddr(u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))),
            crc: u32::from_le_bytes(bytes[8..].try_into().expect("4 bytes")),
            mirror: None,
        }
    }

    fn to_bytes_mirrored(self) -> [u8; MIRRORED_PTR_BYTES] {
        let mut out = [0u8; MIRRORED_PTR_BYTES];
        out[..PTR_BYTES].copy_from_slice(&self.to_bytes());
        let second = self.mirror.map_or(NO_SECOND_COPY, |a| a.0);
        out[PTR_BYTES..].copy_from_slice(&second.to_le_bytes());
        out
    }

    fn from_bytes_mirrored(bytes: &[u8]) -> PagePtr {
        let mut ptr = PagePtr::from_bytes(bytes[..PTR_BYTES].try_into().expect("12 bytes"));
        let second = le64(bytes, PTR_BYTES);
        ptr.mirror = (second != NO_SECOND_COPY).then_some(PageAddr(second));
        ptr
    }

    /// The addresses of every copy of the page.
    pub fn copies(self) -> impl Iterator<Item = PageAddr> {
        std::iter::once(self.addr).chain(self.mirror)
    }
}

/// Where a checkpoint puts a changed page: its address, and its second copy's when the
/// store's pages are replicated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePlace {
    pub addr: PageAddr,
    pub mirror: Option<PageAddr>,
}

impl From<PageAddr> for PagePlace {
    fn from(addr: PageAddr) -> PagePlace {
        PagePlace { addr, mirror: None }
    }
}

/// The fixed facts every page of one store carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageFormat {
    pub page_bytes: usize,
    pub owner: u64,
    /// Branch pointers carry a second address (version-2 pages): metadata replicated.
    pub mirrored: bool,
}

impl PageFormat {
    pub fn new(page_bytes: usize, owner: u64) -> MetaResult<PageFormat> {
        if !(MIN_PAGE_BYTES..=MAX_PAGE_BYTES).contains(&page_bytes) || !page_bytes.is_power_of_two()
        {
            return Err(MetaError::BadPageSize(page_bytes));
        }
        Ok(PageFormat {
            page_bytes,
            owner,
            mirrored: false,
        })
    }

    /// The same format with a second address in every branch pointer (`-m 2`).
    pub fn with_mirrors(self) -> PageFormat {
        PageFormat {
            mirrored: true,
            ..self
        }
    }

    /// Bytes of a child pointer in the pages this store writes.
    pub fn ptr_bytes(&self) -> usize {
        ptr_bytes(self.version())
    }

    /// The version of the pages this store writes.
    pub fn version(&self) -> u8 {
        if self.mirrored {
            VERSION_MIRRORED
        } else {
            VERSION
        }
    }

    /// The largest key plus value a leaf entry may hold: half a page's payload, so that a
    /// full node always splits into two nodes that fit.
    pub fn max_entry_bytes(&self) -> usize {
        (self.page_bytes - HEADER_BYTES) / 2 - LEAF_ENTRY_OVERHEAD
    }

    pub fn payload_bytes(&self) -> usize {
        self.page_bytes - HEADER_BYTES
    }
}

/// A decoded B+tree node. Children of a decoded branch are on disk; the store replaces
/// them by in-memory nodes as the tree changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    Leaf(Leaf),
    Branch {
        level: u8,
        first: PagePtr,
        seps: Vec<(Vec<u8>, PagePtr)>,
    },
}

/// What a page header says, checked against what the reader expected.
struct Header {
    version: u8,
    kind: u8,
    level: u8,
    entries: u16,
    used: u32,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// CRC-32C of a page with its checksum field taken as zero.
pub fn page_crc(page: &[u8]) -> u32 {
    let c = crc32c::crc32c(&page[..4]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &page[8..])
}

/// Writes a node into `page` (zeroed first), stamping generation and address, and returns
/// the pointer a parent keeps.
pub(crate) fn encode(
    format: &PageFormat,
    node: &Decoded,
    generation: u64,
    addr: PageAddr,
    page: &mut [u8],
) -> PagePtr {
    match node {
        Decoded::Leaf(leaf) => encode_leaf(format, leaf, generation, addr, page),
        Decoded::Branch { level, first, seps } => {
            assert_eq!(page.len(), format.page_bytes);
            page.fill(0);
            let mut at = HEADER_BYTES;
            let put = |page: &mut [u8], at: &mut usize, ptr: &PagePtr| {
                if format.mirrored {
                    page[*at..*at + MIRRORED_PTR_BYTES].copy_from_slice(&ptr.to_bytes_mirrored());
                } else {
                    assert!(ptr.mirror.is_none(), "second copy in a store of one copy");
                    page[*at..*at + PTR_BYTES].copy_from_slice(&ptr.to_bytes());
                }
                *at += format.ptr_bytes();
            };
            put(page, &mut at, first);
            for (k, child) in seps {
                page[at..at + 2].copy_from_slice(&(k.len() as u16).to_le_bytes());
                at += 2;
                page[at..at + k.len()].copy_from_slice(k);
                at += k.len();
                put(page, &mut at, child);
            }
            assert!(
                at <= format.page_bytes,
                "node of {at} bytes encoded into a page"
            );
            seal(
                format,
                page,
                (KIND_BRANCH, *level, seps.len()),
                at,
                generation,
                addr,
            )
        }
    }
}

/// [`encode`] of a leaf, without a copy of it first.
pub(crate) fn encode_leaf(
    format: &PageFormat,
    leaf: &Leaf,
    generation: u64,
    addr: PageAddr,
    page: &mut [u8],
) -> PagePtr {
    assert_eq!(page.len(), format.page_bytes);
    let at = HEADER_BYTES;
    // A leaf in memory is its page payload already.
    let payload = leaf.payload();
    assert!(
        at + payload.len() <= format.page_bytes,
        "leaf of {} bytes encoded into a page",
        at + payload.len()
    );
    page[..at].fill(0);
    page[at..at + payload.len()].copy_from_slice(payload);
    page[at + payload.len()..].fill(0);
    seal(
        format,
        page,
        (KIND_LEAF, 0, leaf.len()),
        at + payload.len(),
        generation,
        addr,
    )
}

/// Writes the header of a page whose payload ends at `end` and returns its pointer.
fn seal(
    format: &PageFormat,
    page: &mut [u8],
    (kind, level, entries): (u8, u8, usize),
    end: usize,
    generation: u64,
    addr: PageAddr,
) -> PagePtr {
    page[0..4].copy_from_slice(&MAGIC);
    page[8] = format.version();
    page[9] = kind;
    page[10] = level;
    page[12..14].copy_from_slice(&(entries as u16).to_le_bytes());
    page[16..20].copy_from_slice(&((end - HEADER_BYTES) as u32).to_le_bytes());
    page[20..24].copy_from_slice(&(format.page_bytes as u32).to_le_bytes());
    page[24..32].copy_from_slice(&format.owner.to_le_bytes());
    page[32..40].copy_from_slice(&generation.to_le_bytes());
    page[40..48].copy_from_slice(&addr.0.to_le_bytes());
    let crc = page_crc(page);
    page[4..8].copy_from_slice(&crc.to_le_bytes());
    PagePtr {
        addr,
        crc,
        mirror: None,
    }
}

/// Checks a page read from `ptr.addr` and decodes it. `level` is what the parent implies
/// (None for a root, whose level the page itself says).
pub(crate) fn decode(
    format: &PageFormat,
    ptr: PagePtr,
    level: Option<u8>,
    page: &[u8],
) -> MetaResult<Decoded> {
    let bad = |reason: String| MetaError::Corrupt {
        addr: ptr.addr,
        reason,
    };
    let header = check_header(format, ptr, page).map_err(bad)?;
    if let Some(want) = level {
        if header.level != want {
            return Err(bad(format!(
                "page is at level {} where its parent expects level {want}",
                header.level
            )));
        }
    }
    let end = HEADER_BYTES + header.used as usize;
    let mut at = HEADER_BYTES;
    let take = |at: &mut usize, n: usize| -> Result<std::ops::Range<usize>, String> {
        if *at + n > end {
            return Err(format!(
                "entry runs past the {} payload bytes in use",
                header.used
            ));
        }
        let r = *at..*at + n;
        *at += n;
        Ok(r)
    };
    let node = match header.kind {
        KIND_LEAF => {
            if header.level != 0 {
                return Err(bad(format!("leaf page at level {}", header.level)));
            }
            let leaf =
                Leaf::parse(&page[at..end], header.entries as usize, MAX_KEY_BYTES).map_err(bad)?;
            at = end;
            Decoded::Leaf(leaf)
        }
        KIND_BRANCH => {
            if header.level == 0 {
                return Err(bad("branch page at level 0".into()));
            }
            let width = ptr_bytes(header.version);
            let pointer = |r: std::ops::Range<usize>| {
                if width == PTR_BYTES {
                    PagePtr::from_bytes(page[r].try_into().expect("12 bytes"))
                } else {
                    PagePtr::from_bytes_mirrored(&page[r])
                }
            };
            let r = take(&mut at, width).map_err(bad)?;
            let first = pointer(r);
            let mut seps = Vec::with_capacity(header.entries as usize);
            for _ in 0..header.entries {
                let r = take(&mut at, 2).map_err(bad)?;
                let klen = le16(page, r.start) as usize;
                if klen > MAX_KEY_BYTES {
                    return Err(bad(format!("key of {klen} bytes")));
                }
                let k = take(&mut at, klen).map_err(bad)?;
                let p = take(&mut at, width).map_err(bad)?;
                let child = pointer(p);
                seps.push((page[k].to_vec(), child));
            }
            check_order(seps.iter().map(|(k, _)| k)).map_err(bad)?;
            Decoded::Branch {
                level: header.level,
                first,
                seps,
            }
        }
        other => return Err(bad(format!("unknown page kind {other}"))),
    };
    if at != end {
        return Err(bad(format!(
            "{} entries end at payload byte {} but the header says {} are in use",
            header.entries,
            at - HEADER_BYTES,
            header.used
        )));
    }
    Ok(node)
}

fn check_header(format: &PageFormat, ptr: PagePtr, page: &[u8]) -> Result<Header, String> {
    if page.len() != format.page_bytes {
        return Err(format!(
            "read {} bytes for a {}-byte page",
            page.len(),
            format.page_bytes
        ));
    }
    if page[0..4] != MAGIC {
        if page.iter().all(|b| *b == 0) {
            return Err("page is all zeros (never written, or its write was lost)".into());
        }
        return Err("no metadata page magic (overwritten, or a misdirected read)".into());
    }
    let stored = le32(page, 4);
    let computed = page_crc(page);
    if stored != computed {
        return Err(format!(
            "checksum mismatch: page says {stored:08x}, contents hash to {computed:08x} \
             (torn or damaged write)"
        ));
    }
    if page[8] != VERSION && page[8] != VERSION_MIRRORED {
        return Err(format!(
            "page format version {} (this build reads {VERSION} and {VERSION_MIRRORED})",
            page[8]
        ));
    }
    let page_bytes = le32(page, 20) as usize;
    if page_bytes != format.page_bytes {
        return Err(format!(
            "page written with {page_bytes}-byte pages, not {}",
            format.page_bytes
        ));
    }
    let owner = le64(page, 24);
    if owner != format.owner {
        return Err(format!(
            "page belongs to owner {owner:016x}, not {:016x}",
            format.owner
        ));
    }
    let addr = le64(page, 40);
    if addr != ptr.addr.0 {
        return Err(format!(
            "page was written for address {addr:#x} (misdirected write)"
        ));
    }
    if stored != ptr.crc {
        return Err(format!(
            "page is intact but not the one its parent names (checksum {stored:08x}, \
             expected {:08x}): a stale page, whose newer write was lost",
            ptr.crc
        ));
    }
    let used = le32(page, 16);
    if used as usize > format.payload_bytes() {
        return Err(format!(
            "header says {used} payload bytes in a {}-byte page",
            format.page_bytes
        ));
    }
    Ok(Header {
        version: page[8],
        kind: page[9],
        level: page[10],
        entries: le16(page, 12),
        used,
    })
}

fn check_order<'a>(keys: impl Iterator<Item = &'a Vec<u8>>) -> Result<(), String> {
    let mut prev: Option<&Vec<u8>> = None;
    for k in keys {
        if let Some(p) = prev {
            if p >= k {
                return Err("keys out of order".into());
            }
        }
        prev = Some(k);
    }
    Ok(())
}

fn ptr_bytes(version: u8) -> usize {
    if version == VERSION_MIRRORED {
        MIRRORED_PTR_BYTES
    } else {
        PTR_BYTES
    }
}

/// Bytes a branch separator takes besides its key.
pub(crate) fn branch_entry_overhead(format: &PageFormat) -> usize {
    2 + format.ptr_bytes()
}

/// Bytes a branch node takes when encoded.
pub(crate) fn branch_bytes<'a>(format: &PageFormat, keys: impl Iterator<Item = &'a [u8]>) -> usize {
    HEADER_BYTES
        + format.ptr_bytes()
        + keys
            .map(|k| branch_entry_overhead(format) + k.len())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: PageFormat = PageFormat {
        page_bytes: 4096,
        owner: 0x0123_4567_89ab_cdef,
        mirrored: false,
    };

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn leaf() -> Decoded {
        Decoded::Leaf(Leaf::from_entries(&[
            (b"a".to_vec(), b"1".to_vec()),
            (b"bc".to_vec(), Vec::new()),
        ]))
    }

    fn branch() -> Decoded {
        Decoded::Branch {
            level: 1,
            first: PagePtr {
                addr: PageAddr(0x10),
                crc: 0xaabb_ccdd,
                mirror: None,
            },
            seps: vec![(
                b"m".to_vec(),
                PagePtr {
                    addr: PageAddr(0x20),
                    crc: 0x1122_3344,
                    mirror: None,
                },
            )],
        }
    }

    #[test]
    fn golden_leaf_page() {
        let mut page = vec![0u8; 4096];
        let ptr = encode(&FORMAT, &leaf(), 2, PageAddr(3), &mut page);
        assert_eq!(
            hex(&page[..HEADER_BYTES + 12]),
            concat!(
                "544d5047", // magic
                "21241e33", // crc32c
                "01",
                "01",
                "00",
                "00", // version, kind leaf, level 0, zero
                "0200",
                "0000",             // entries, zero
                "0c000000",         // used
                "00100000",         // page bytes
                "efcdab8967452301", // owner
                "0200000000000000", // generation
                "0300000000000000", // address
                "0100",
                "0100",
                "61",
                "31", // "a" -> "1"
                "0200",
                "0000",
                "6263", // "bc" -> ""
            )
        );
        assert_eq!(ptr.crc, 0x331e_2421);
        assert!(page[HEADER_BYTES + 12..].iter().all(|b| *b == 0));
        assert_eq!(decode(&FORMAT, ptr, Some(0), &page).unwrap(), leaf());
    }

    #[test]
    fn golden_branch_page() {
        let mut page = vec![0u8; 4096];
        let ptr = encode(&FORMAT, &branch(), 9, PageAddr(0x30), &mut page);
        assert_eq!(hex(&page[8..16]), "0102010001000000");
        assert_eq!(
            hex(&page[HEADER_BYTES..HEADER_BYTES + 27]),
            concat!(
                "1000000000000000",
                "ddccbbaa", // child 0
                "0100",
                "6d", // separator "m"
                "2000000000000000",
                "44332211", // child 1
            )
        );
        assert_eq!(decode(&FORMAT, ptr, Some(1), &page).unwrap(), branch());
    }

    #[test]
    fn golden_branch_page_with_second_copies() {
        let format = FORMAT.with_mirrors();
        let Decoded::Branch {
            level,
            mut first,
            mut seps,
        } = branch()
        else {
            unreachable!()
        };
        first.mirror = Some(PageAddr(0x0001_0000_0000_0040));
        seps[0].1.mirror = None;
        let node = Decoded::Branch { level, first, seps };
        let mut page = vec![0u8; 4096];
        let ptr = encode(&format, &node, 9, PageAddr(0x30), &mut page);
        // Version 2, kind branch, level 1, one separator.
        assert_eq!(hex(&page[8..16]), "0202010001000000");
        assert_eq!(
            hex(&page[HEADER_BYTES..HEADER_BYTES + 43]),
            concat!(
                "1000000000000000",
                "ddccbbaa",
                "4000000000000100", // child 0, second copy on disk 1
                "0100",
                "6d", // separator "m"
                "2000000000000000",
                "44332211",
                "ffffffffffffffff", // child 1, one copy
            )
        );
        assert_eq!(decode(&format, ptr, Some(1), &page).unwrap(), node);
        // A store of one copy reads it too (the page says its own pointer width).
        assert_eq!(decode(&FORMAT, ptr, Some(1), &page).unwrap(), node);
    }

    #[test]
    fn every_flipped_bit_of_the_used_part_is_refused() {
        for node in [leaf(), branch()] {
            let mut page = vec![0u8; 4096];
            let ptr = encode(&FORMAT, &node, 1, PageAddr(7), &mut page);
            let used = HEADER_BYTES + le32(&page, 16) as usize;
            for byte in 0..used + 8 {
                for bit in 0..8 {
                    let mut bad = page.clone();
                    bad[byte] ^= 1 << bit;
                    let err = decode(&FORMAT, ptr, None, &bad).unwrap_err();
                    assert!(err.to_string().contains("metadata page 0x7"), "{err}");
                }
            }
        }
    }

    #[test]
    fn wrong_place_owner_level_and_stale_pages_are_named() {
        let mut page = vec![0u8; 4096];
        let ptr = encode(&FORMAT, &leaf(), 1, PageAddr(7), &mut page);
        let err = |ptr: PagePtr, level, page: &[u8], format: &PageFormat| {
            decode(format, ptr, level, page).unwrap_err().to_string()
        };
        let moved = PagePtr {
            addr: PageAddr(8),
            ..ptr
        };
        assert!(err(moved, None, &page, &FORMAT).contains("misdirected"));
        let other = PageFormat { owner: 5, ..FORMAT };
        assert!(err(ptr, None, &page, &other).contains("belongs to owner"));
        assert!(err(ptr, Some(1), &page, &FORMAT).contains("expects level 1"));
        let stale = PagePtr { crc: 1, ..ptr };
        assert!(err(stale, None, &page, &FORMAT).contains("stale page"));
        assert!(err(ptr, None, &[0u8; 4096], &FORMAT).contains("all zeros"));
        let mut newer = page.clone();
        newer[8] = 3;
        let crc = page_crc(&newer);
        newer[4..8].copy_from_slice(&crc.to_le_bytes());
        let ptr2 = PagePtr { crc, ..ptr };
        assert!(err(ptr2, None, &newer, &FORMAT).contains("format version 3"));
    }

    #[test]
    fn a_page_whose_checksum_matches_but_whose_entries_lie_is_refused() {
        // Damage that keeps the checksum valid (a bug that wrote bad entries): the decoder
        // must not panic or read past the page.
        let mut page = vec![0u8; 4096];
        encode(&FORMAT, &leaf(), 1, PageAddr(7), &mut page);
        for (at, value) in [(12usize, 200u16), (48, 4000), (50, 9000)] {
            let mut bad = page.clone();
            bad[at..at + 2].copy_from_slice(&value.to_le_bytes());
            let crc = page_crc(&bad);
            bad[4..8].copy_from_slice(&crc.to_le_bytes());
            let ptr = PagePtr {
                addr: PageAddr(7),
                crc,
                mirror: None,
            };
            assert!(decode(&FORMAT, ptr, None, &bad).is_err());
        }
    }

    proptest::proptest! {
        #[test]
        fn random_pages_with_valid_checksums_never_panic(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 4048),
            kind in 0u8..4, level in 0u8..3, entries in 0u16..300, used in 0u32..5000,
        ) {
            let mut page = vec![0u8; 4096];
            page[..4].copy_from_slice(&MAGIC);
            page[8] = VERSION;
            page[9] = kind;
            page[10] = level;
            page[12..14].copy_from_slice(&entries.to_le_bytes());
            page[16..20].copy_from_slice(&used.to_le_bytes());
            page[20..24].copy_from_slice(&4096u32.to_le_bytes());
            page[24..32].copy_from_slice(&FORMAT.owner.to_le_bytes());
            page[40..48].copy_from_slice(&7u64.to_le_bytes());
            page[48..].copy_from_slice(&body);
            let crc = page_crc(&page);
            page[4..8].copy_from_slice(&crc.to_le_bytes());
            let _ = decode(&FORMAT, PagePtr { addr: PageAddr(7), crc, mirror: None }, None, &page);
        }
    }
}
