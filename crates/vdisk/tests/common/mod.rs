//! Shared helpers: file-backed pdisks in a temporary directory behind simulated drives
//! that inject faults, and data patterns.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tessera_drive::{AlignedBuf, BlockDevice};
use tessera_vdisk::{DaOptions, DeclusteredArray, DeviceOpener, PdiskSpec};

pub const MIB: u64 = 1 << 20;

/// Sparse files standing in for drives.
pub struct TestPdisks {
    pub dir: tempfile::TempDir,
    pub specs: Vec<PdiskSpec>,
}

impl TestPdisks {
    pub fn paths(&self) -> Vec<PathBuf> {
        self.specs.iter().map(|s| s.device.clone()).collect()
    }

    pub fn path_of(&self, pdisk: &str) -> PathBuf {
        self.specs
            .iter()
            .find(|s| s.name == pdisk)
            .map(|s| s.device.clone())
            .expect("known pdisk")
    }

    /// A new sparse file in the same directory (for replacements).
    pub fn new_file(&self, name: &str, bytes: u64) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::File::create(&path)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        path
    }
}

/// `count` pdisks of `bytes` each, `count / enclosures` per enclosure (round robin).
pub fn make_pdisks(count: usize, enclosures: usize, bytes: u64) -> TestPdisks {
    let dir = tempfile::tempdir().unwrap();
    let specs = (0..count)
        .map(|i| {
            let device = dir.path().join(format!("pd{i:02}"));
            std::fs::File::create(&device)
                .unwrap()
                .set_len(bytes)
                .unwrap();
            PdiskSpec {
                name: format!("e{}s{:02}", i % enclosures, i / enclosures),
                device,
                enclosure: format!("e{}", i % enclosures),
                slot: (i / enclosures) as u32,
            }
        })
        .collect();
    TestPdisks { dir, specs }
}

/// Deterministic bytes: every 8-byte word depends on the seed and its position.
pub fn pattern(len: usize, seed: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    buf
}

/// Flips one bit of a file at `offset`, behind the array's back.
pub fn flip_bit(path: &Path, offset: u64, bit: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 1 << (bit % 8);
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

/// Faults injected into one device: the simulated drive shared by every test suite.
pub use tessera_testkit::{Faults, SimDrive};

/// Hands out [`SimDrive`]s and keeps their fault switches by path.
#[derive(Default, Clone)]
pub struct FaultBox {
    faults: Arc<Mutex<HashMap<PathBuf, Arc<Faults>>>>,
}

impl FaultBox {
    pub fn faults(&self, path: &Path) -> Arc<Faults> {
        self.faults
            .lock()
            .unwrap()
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }

    pub fn opener(&self) -> DeviceOpener {
        let me = self.clone();
        Arc::new(move |path: &Path| {
            let faults = me.faults(path);
            if faults.vanished.load(Ordering::Relaxed) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{}: no such device", path.display()),
                ));
            }
            let inner = Arc::new(tessera_testkit::open_drive_waiting(path)?);
            let d: Arc<dyn BlockDevice> = Arc::new(SimDrive::new(inner, faults));
            Ok(d)
        })
    }

    pub fn options(&self) -> DaOptions {
        DaOptions {
            opener: Some(self.opener()),
            ..DaOptions::default()
        }
    }
}

/// Creates an array over `t` with the given options.
pub fn create(t: &TestPdisks, opts: DaOptions) -> Arc<DeclusteredArray> {
    DeclusteredArray::create("da1", &t.specs, opts).unwrap()
}

/// Writes `data` and reads it back through a vdisk, checking equality.
pub fn write_read(v: &dyn BlockDevice, offset: u64, data: &[u8]) {
    v.write_at(data, offset).unwrap();
    let mut back = AlignedBuf::zeroed(data.len());
    v.read_at(&mut back, offset).unwrap();
    assert!(back[..] == data[..], "data read back at {offset} differs");
}

pub fn read(v: &dyn BlockDevice, offset: u64, len: usize) -> io::Result<AlignedBuf> {
    let mut back = AlignedBuf::zeroed(len);
    v.read_at(&mut back, offset)?;
    Ok(back)
}
