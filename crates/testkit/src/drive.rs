//! The simulated drive every test suite uses to break storage on purpose.
//!
//! [`SimDrive`] wraps a real drive (a file or a block device opened by [`FileDrive`], or any
//! [`BlockDevice`]) and injects exactly these faults, each switched through [`Faults`]:
//!
//! - **power loss** (with a volatile cache, [`SimDrive::with_cache`]): writes are held in a
//!   [`VolatileCache`] until a flush, so the drive keeps a *written* image (what reads see)
//!   apart from its *durable* image (the backing drive). [`SimDrive::power_cut`] keeps a
//!   random subset of the unflushed sectors, tearing multi-sector writes at sector
//!   boundaries but never inside a 4 KiB sector, and fails every later request. Survivable
//!   because the layers above promise durability only for what they flushed, and their
//!   checksums are per sector, the unit a real drive writes atomically.
//! - **crashed instance** (`dead`): writes and flushes fail, reads still work. A process
//!   that dies stops writing; a test that drops a mounted file system in-process must stop
//!   its background threads from writing behind the next mount's back in the same way.
//! - **media errors**: every read (`fail_reads`) or write (`fail_writes`) fails with EIO,
//!   every request at or past a byte offset fails with EIO (`bad_from`), or writes start
//!   failing after a countdown (`writes_until_failure`), as a drive wearing out mid-run.
//!   Survivable because they are reported: the layers above must fail the request or
//!   repair it from redundancy, never return wrong data.
//! - **a vanished device** (`vanished`): everything fails with ENODEV, as a pulled drive.
//! - **an unreachable device** (`unreachable`): everything fails with a timeout, as a
//!   remote namespace with no path; the drive may come back with its data intact.
//!
//! A hook can also hold a flush ([`SimDrive::set_flush_hook`]), for tests that observe
//! what happens while a flush is in progress (group commit).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tessera_drive::{BlockDevice, FileDrive, VolatileCache, VolatileCacheConfig};

/// The fault switches of one drive; shared, so they can outlive a reopen of the drive.
#[derive(Debug)]
pub struct Faults {
    /// Every read fails with EIO.
    pub fail_reads: AtomicBool,
    /// Every write fails with EIO.
    pub fail_writes: AtomicBool,
    /// Requests that touch bytes at or past this offset fail with EIO (`u64::MAX`: none).
    pub bad_from: AtomicU64,
    /// The device has gone: everything fails with ENODEV.
    pub vanished: AtomicBool,
    /// The device cannot be reached: everything fails with a timeout, as the NVMe/TCP
    /// host reports a namespace without a usable path.
    pub unreachable: AtomicBool,
    /// When positive, counts writes down; the write that reaches zero and every later one
    /// fail with EIO.
    pub writes_until_failure: AtomicI64,
    /// The instance crashed: writes and flushes fail, reads still work.
    pub dead: AtomicBool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            bad_from: AtomicU64::new(u64::MAX),
            vanished: AtomicBool::new(false),
            unreachable: AtomicBool::new(false),
            writes_until_failure: AtomicI64::new(0),
            dead: AtomicBool::new(false),
        }
    }
}

type FlushHook = Arc<dyn Fn() + Send + Sync>;

/// A drive with injectable faults (see the module documentation).
pub struct SimDrive {
    /// What requests go to: the volatile cache when there is one, else `backing`.
    front: Arc<dyn BlockDevice>,
    cache: Option<Arc<VolatileCache>>,
    pub faults: Arc<Faults>,
    flush_hook: Mutex<Option<FlushHook>>,
}

impl std::fmt::Debug for SimDrive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDrive")
            .field("drive", &self.front.name())
            .field("cache", &self.cache.is_some())
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl SimDrive {
    /// Written and durable are the same (no cache): for media-error and reachability tests.
    pub fn new(backing: Arc<dyn BlockDevice>, faults: Arc<Faults>) -> SimDrive {
        SimDrive {
            front: backing,
            cache: None,
            faults,
            flush_hook: Mutex::new(None),
        }
    }

    /// With a volatile write cache: what is not flushed is lost by [`SimDrive::power_cut`]
    /// or by dropping the drive.
    pub fn with_cache(
        backing: Arc<dyn BlockDevice>,
        faults: Arc<Faults>,
        cache: VolatileCacheConfig,
    ) -> SimDrive {
        let cache = Arc::new(VolatileCache::new(backing, cache));
        SimDrive {
            front: cache.clone(),
            cache: Some(cache),
            faults,
            flush_hook: Mutex::new(None),
        }
    }

    /// Opens the file or block device at `path` behind a fresh set of faults, no cache.
    pub fn open(path: &Path) -> io::Result<SimDrive> {
        Ok(SimDrive::new(
            Arc::new(FileDrive::open(path)?),
            Arc::default(),
        ))
    }

    /// Power loss: unflushed writes survive at random, sector by sector; every later
    /// request fails. Without a cache every completed write survives; the drive still
    /// stops.
    pub fn power_cut(&self) {
        if let Some(cache) = &self.cache {
            cache.power_cut();
        }
        self.faults.dead.store(true, Ordering::SeqCst);
    }

    /// Bytes written but not durable yet.
    pub fn unflushed_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.cached_bytes())
    }

    /// Runs `hook` at the start of every flush (it may block to hold the flush).
    pub fn set_flush_hook(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.flush_hook.lock().unwrap() = Some(Arc::new(hook));
    }

    /// The faults every request meets: reachability, presence, and (for writes and
    /// flushes) a crashed instance. Media errors do not fail a flush.
    fn check_reachable(&self, write: bool) -> io::Result<()> {
        let f = &self.faults;
        let name = self.name();
        if f.unreachable.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{name}: injected: no usable path"),
            ));
        }
        if f.vanished.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc_enodev()));
        }
        if write && f.dead.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!("{name}: crashed instance")));
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: usize, write: bool) -> io::Result<()> {
        self.check_reachable(write)?;
        let f = &self.faults;
        if write && f.writes_until_failure.load(Ordering::Relaxed) > 0 {
            // The write that takes the count from 1 to 0 is the first to fail.
            if f.writes_until_failure.fetch_sub(1, Ordering::Relaxed) <= 1 {
                f.fail_writes.store(true, Ordering::Relaxed);
            }
        }
        let failing = if write { &f.fail_writes } else { &f.fail_reads };
        let past_bad = offset.saturating_add(len as u64) > f.bad_from.load(Ordering::Relaxed);
        if failing.load(Ordering::Relaxed) || past_bad {
            // A raw EIO, as a real drive reports it, so callers map it the same way.
            return Err(io::Error::from_raw_os_error(libc_eio()));
        }
        Ok(())
    }
}

impl SimDrive {
    fn run_flush_hook(&self) {
        // Called without the lock held: a hook that stalls one flush must not stall others.
        let hook = self.flush_hook.lock().unwrap().clone();
        if let Some(hook) = hook {
            hook();
        }
    }
}

fn libc_enodev() -> i32 {
    19
}

fn libc_eio() -> i32 {
    5
}

impl BlockDevice for SimDrive {
    fn name(&self) -> &str {
        self.front.name()
    }
    fn size_bytes(&self) -> u64 {
        self.front.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len(), false)?;
        self.front.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len(), true)?;
        self.front.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.check_reachable(true)?;
        self.run_flush_hook();
        self.front.flush()
    }
    /// A write that syncs: the flush hook holds it as it holds a flush, and the volatile
    /// cache (when there is one) writes these sectors through, leaving the rest cached.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len(), true)?;
        self.run_flush_hook();
        self.front.write_fua(buf, offset)
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, usize::try_from(len).unwrap_or(usize::MAX), true)?;
        self.front.discard(offset, len)
    }
    fn can_discard(&self) -> bool {
        self.front.can_discard()
    }
    fn discard_zeroes(&self) -> bool {
        self.front.discard_zeroes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_drive::AlignedBuf;

    fn backing(dir: &tempfile::TempDir) -> Arc<dyn BlockDevice> {
        let path = dir.path().join("d");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        Arc::new(FileDrive::open(&path).unwrap())
    }

    fn block(byte: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(4096);
        b.fill(byte);
        b
    }

    #[test]
    fn power_cut_keeps_what_was_flushed_and_stops_the_drive() {
        let dir = tempfile::tempdir().unwrap();
        let config = VolatileCacheConfig {
            early_destage_one_in: 0,
            ..VolatileCacheConfig::default()
        };
        let d = SimDrive::with_cache(backing(&dir), Arc::default(), config);
        d.write_at(&block(1), 0).unwrap();
        d.flush().unwrap();
        d.write_at(&block(2), 0).unwrap();
        assert_eq!(d.unflushed_bytes(), 4096);
        let mut seen = block(0);
        d.read_at(&mut seen, 0).unwrap();
        assert_eq!(seen[0], 2, "reads see the written image");
        d.power_cut();
        assert!(d.write_at(&block(3), 0).is_err() && d.flush().is_err());
        let again = SimDrive::open(&dir.path().join("d")).unwrap();
        again.read_at(&mut seen, 0).unwrap();
        assert!(seen.iter().all(|&b| b == 1 || b == 2) && seen.iter().all(|&b| b == seen[0]));
    }

    /// A write through survives the power cut; it makes no other cached write durable, so
    /// a missing flush of those still shows.
    #[test]
    fn a_write_through_survives_a_power_cut_and_leaves_other_writes_cached() {
        let dir = tempfile::tempdir().unwrap();
        let config = VolatileCacheConfig {
            early_destage_one_in: 0,
            ..VolatileCacheConfig::default()
        };
        let d = SimDrive::with_cache(backing(&dir), Arc::default(), config);
        d.write_at(&block(5), 8192).unwrap();
        d.write_fua(&block(4), 4096).unwrap();
        assert_eq!(d.unflushed_bytes(), 4096, "only the plain write is cached");
        d.power_cut();
        assert!(
            d.write_fua(&block(6), 0).is_err(),
            "a dead drive takes nothing"
        );
        let again = SimDrive::open(&dir.path().join("d")).unwrap();
        let mut seen = block(0);
        again.read_at(&mut seen, 4096).unwrap();
        assert!(seen.iter().all(|&b| b == 4));
    }

    #[test]
    fn media_errors_countdown_and_a_crashed_instance() {
        let dir = tempfile::tempdir().unwrap();
        let faults = Arc::new(Faults::default());
        let d = SimDrive::new(backing(&dir), faults.clone());
        faults.bad_from.store(8192, Ordering::Relaxed);
        assert_eq!(
            d.read_at(&mut block(0), 8192).unwrap_err().raw_os_error(),
            Some(5)
        );
        d.read_at(&mut block(0), 4096).unwrap();
        faults.bad_from.store(u64::MAX, Ordering::Relaxed);
        faults.writes_until_failure.store(2, Ordering::Relaxed);
        d.write_at(&block(1), 0).unwrap();
        assert!(d.write_at(&block(1), 0).is_err());
        assert!(faults.fail_writes.load(Ordering::Relaxed));
        faults.fail_writes.store(false, Ordering::Relaxed);
        faults.dead.store(true, Ordering::Relaxed);
        assert!(d.write_at(&block(1), 0).is_err());
        d.read_at(&mut block(0), 0).unwrap();
        faults.unreachable.store(true, Ordering::Relaxed);
        let e = d.read_at(&mut block(0), 0).unwrap_err();
        assert!(tessera_drive::is_unreachable(&e), "{e}");
    }
}
