//! Helpers shared by the journal tests: real files as drives, and page surgery that follows
//! the documented on-disk format.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
use tessera_journal::{format, Journal, JournalRegion, Lsn, Record};

/// Asserts two record lists are equal, printing LSNs and lengths rather than payloads.
#[track_caller]
pub fn assert_records(actual: &[Record], expected: &[Record], context: &str) {
    if actual != expected {
        let brief = |rs: &[Record]| -> Vec<(Lsn, usize)> {
            rs.iter().map(|r| (r.lsn, r.payload.len())).collect()
        };
        panic!(
            "{context}: records differ\n  actual   {:?}\n  expected {:?}",
            brief(actual),
            brief(expected)
        );
    }
}

pub const PAGE: u64 = 4096;
pub const LOG_ID: [u8; 16] = *b"tessera-journal0";

/// A formatted journal region in a temporary file. The region starts at 8 KiB and is
/// followed by a spare page, so offset mistakes show up as wrong data rather than passing.
pub struct Disk {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub dev: Arc<dyn BlockDevice>,
    pub region: JournalRegion,
}

impl Disk {
    pub fn new(region_bytes: u64) -> Disk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drive");
        let region = JournalRegion {
            offset: 2 * PAGE,
            bytes: region_bytes,
        };
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(region.offset + region.bytes + PAGE).unwrap();
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
        format(&*dev, region, LOG_ID).unwrap();
        Disk {
            dir,
            path,
            dev,
            region,
        }
    }

    pub fn open(&self, replay_from: Lsn) -> (Journal, Vec<Record>) {
        Journal::open(self.dev.clone(), self.region, LOG_ID, replay_from).unwrap()
    }

    pub fn data_pages(&self) -> u64 {
        self.region.bytes / PAGE - 1
    }

    /// Device offset of the slot holding page `seq`.
    pub fn slot_offset(&self, seq: u64) -> u64 {
        self.region.offset + PAGE * (1 + seq % self.data_pages())
    }

    pub fn read_page(&self, seq: u64) -> Vec<u8> {
        let mut buf = AlignedBuf::zeroed(PAGE as usize);
        self.dev.read_at(&mut buf, self.slot_offset(seq)).unwrap();
        buf.to_vec()
    }

    pub fn write_page(&self, seq: u64, bytes: &[u8]) {
        assert_eq!(bytes.len(), PAGE as usize);
        self.dev
            .write_at(&AlignedBuf::from_slice(bytes), self.slot_offset(seq))
            .unwrap();
    }

    /// Damages page `seq` in one of several ways a crash or stray write could.
    pub fn damage_page(&self, seq: u64, how: Damage, rng: &mut impl rand::Rng) {
        let mut page = self.read_page(seq);
        match how {
            Damage::Zero => page.fill(0),
            Damage::FlipByte => {
                let at = rng.gen_range(0..page.len());
                page[at] ^= 1 << rng.gen_range(0..8);
            }
            // The second half still holds what the slot held before: here, 0xff bytes.
            Damage::TearHalf => page[2048..].fill(0xff),
            Damage::Garbage => rng.fill(&mut page[..]),
        }
        self.write_page(seq, &page);
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Damage {
    Zero,
    FlipByte,
    TearHalf,
    Garbage,
}

pub const DAMAGES: [Damage; 4] = [
    Damage::Zero,
    Damage::FlipByte,
    Damage::TearHalf,
    Damage::Garbage,
];

/// The page holding the last byte of a record ending at `lsn`.
pub fn last_page_of(lsn: Lsn) -> u64 {
    (lsn - 1) / PAGE
}

/// A payload whose bytes depend on `tag`, so mix-ups are visible.
pub fn payload(tag: u64, len: usize) -> Vec<u8> {
    tessera_testkit::pattern(len, tag)
}
