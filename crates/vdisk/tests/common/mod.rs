//! Shared helpers: file-backed pdisks in a temporary directory, a fault-injecting device
//! wrapper, and data patterns.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
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

/// Faults injected into one device.
#[derive(Default, Debug)]
pub struct Faults {
    /// Every read fails with EIO.
    pub fail_reads: AtomicBool,
    /// Every write fails with EIO.
    pub fail_writes: AtomicBool,
    /// The device has gone: everything fails with ENODEV.
    pub vanished: AtomicBool,
    /// The device cannot be reached (a remote drive with no path): everything fails with
    /// a timeout, as the NVMe/TCP host reports it.
    pub unreachable: AtomicBool,
    /// When positive, counts writes down; the write that reaches zero and every later one
    /// fail with EIO.
    pub writes_until_failure: AtomicI64,
}

/// A drive that fails on command. Faults are a property of the path, so they survive
/// reopening the array.
#[derive(Debug)]
pub struct FaultyDrive {
    inner: FileDrive,
    faults: Arc<Faults>,
}

fn unreachable(dev: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{dev}: injected: no usable path"),
    )
}

fn eio(what: &str, dev: &str) -> io::Error {
    io::Error::other(format!("{dev}: injected {what} error (EIO)"))
}

impl BlockDevice for FaultyDrive {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.faults.unreachable.load(Ordering::Relaxed) {
            return Err(unreachable(self.name()));
        }
        if self.faults.vanished.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc_enodev()));
        }
        if self.faults.fail_reads.load(Ordering::Relaxed) {
            return Err(eio("read", self.name()));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.faults.unreachable.load(Ordering::Relaxed) {
            return Err(unreachable(self.name()));
        }
        if self.faults.vanished.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc_enodev()));
        }
        let left = self.faults.writes_until_failure.load(Ordering::Relaxed);
        if left > 0
            && self
                .faults
                .writes_until_failure
                .fetch_sub(1, Ordering::Relaxed)
                <= 1
        {
            self.faults.fail_writes.store(true, Ordering::Relaxed);
        }
        if self.faults.fail_writes.load(Ordering::Relaxed) {
            return Err(eio("write", self.name()));
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        if self.faults.unreachable.load(Ordering::Relaxed) {
            return Err(unreachable(self.name()));
        }
        if self.faults.vanished.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc_enodev()));
        }
        self.inner.flush()
    }
}

fn libc_enodev() -> i32 {
    19
}

/// Hands out [`FaultyDrive`]s and keeps their fault switches by path.
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
            let inner = FileDrive::open(path)?;
            let d: Arc<dyn BlockDevice> = Arc::new(FaultyDrive { inner, faults });
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
