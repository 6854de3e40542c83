//! A volatile write cache in front of any [`BlockDevice`], as an NVMe drive has one.
//!
//! A drive with a volatile write cache (Identify Controller VWC = 1) acknowledges a write as
//! soon as the data is in its cache; only Flush (or a write with FUA) puts it on stable
//! storage. On power loss the cache is gone, except for whatever the drive happened to
//! write out (destage) on its own before: some unflushed writes survive and others do not,
//! in no particular order, and a write of several sectors may survive in part, torn at a
//! sector boundary. Never inside a sector: the 4 KiB sector is the atomic unit the layers
//! above rely on (their checksums are per sector).
//!
//! [`VolatileCache`] behaves that way so that a missing flush shows up in a test:
//! - writes land in an in-memory cache of whole sectors and are acknowledged;
//! - reads see the cache over the backing device;
//! - [`BlockDevice::flush`] writes the cache out, flushes the backing device, then returns;
//! - [`VolatileCache::write_through`] (FUA) writes to the backing device and flushes it,
//!   replacing any cached copy of those sectors;
//! - sectors are destaged early at random (seeded), one at a time, so a multi-sector write
//!   can be torn; the cache is bounded and destages its oldest sectors when full;
//! - [`VolatileCache::power_cut`] keeps a random subset of the cached sectors, drops the
//!   rest and fails every later request, as a drive that lost power.
//!
//! When the process holding the cache dies (a drive server killed with SIGKILL), the cache
//! dies with it: that is the power loss of every drive the process served.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{check_io, AlignedBuf, BlockDevice, SECTOR_BYTES};

/// How a [`VolatileCache`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolatileCacheConfig {
    /// Seeds the choice of sectors destaged early and kept at a power cut.
    pub seed: u64,
    /// Most bytes held; a write beyond it destages the oldest sectors first.
    pub capacity_bytes: u64,
    /// Each written sector is destaged at once with probability 1 in this (0: never), and
    /// as often one older cached sector is; the rest wait for a flush or for room.
    pub early_destage_one_in: u32,
}

impl Default for VolatileCacheConfig {
    fn default() -> Self {
        VolatileCacheConfig {
            seed: 1,
            capacity_bytes: 64 << 20,
            early_destage_one_in: 8,
        }
    }
}

#[derive(Debug)]
struct Cached {
    /// Write order, so the oldest sector is destaged first when the cache is full.
    age: u64,
    data: Box<[u8]>,
}

#[derive(Debug)]
struct State {
    /// Sector index to its newest unflushed content.
    sectors: BTreeMap<u64, Cached>,
    /// Age to sector index, for the sectors in `sectors`.
    by_age: BTreeMap<u64, u64>,
    next_age: u64,
    rng: u64,
    powered_off: bool,
}

impl State {
    fn next_random(&mut self) -> u64 {
        // xorshift64: cheap, and a seed replays a run exactly.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn chance(&mut self, one_in: u32) -> bool {
        one_in != 0 && self.next_random().is_multiple_of(u64::from(one_in))
    }

    fn remove(&mut self, sector: u64) -> Option<Cached> {
        let c = self.sectors.remove(&sector)?;
        self.by_age.remove(&c.age);
        Some(c)
    }

    fn insert(&mut self, sector: u64, data: &[u8]) {
        self.remove(sector);
        let age = self.next_age;
        self.next_age += 1;
        self.by_age.insert(age, sector);
        self.sectors.insert(
            sector,
            Cached {
                age,
                data: data.into(),
            },
        );
    }
}

/// A drive with a volatile write cache over `backing` (see the module documentation).
pub struct VolatileCache {
    backing: Arc<dyn BlockDevice>,
    config: VolatileCacheConfig,
    state: Mutex<State>,
}

impl std::fmt::Debug for VolatileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolatileCache")
            .field("backing", &self.backing.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl VolatileCache {
    pub fn new(backing: Arc<dyn BlockDevice>, config: VolatileCacheConfig) -> VolatileCache {
        VolatileCache {
            backing,
            config,
            state: Mutex::new(State {
                sectors: BTreeMap::new(),
                by_age: BTreeMap::new(),
                next_age: 0,
                // xorshift must not start at zero.
                rng: config.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                powered_off: false,
            }),
        }
    }

    /// The cache state; a panic elsewhere must not make the drive refuse I/O (the state is
    /// consistent between statements that can panic).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device under the cache: what survives a power cut.
    pub fn backing(&self) -> &Arc<dyn BlockDevice> {
        &self.backing
    }

    /// Bytes written but not yet on the backing device.
    pub fn cached_bytes(&self) -> u64 {
        self.lock().sectors.len() as u64 * SECTOR_BYTES
    }

    /// A write with Force Unit Access: on stable storage when this returns, whatever the
    /// cache held for those sectors superseded.
    pub fn write_through(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let mut st = self.powered(self.lock())?;
        for i in 0..buf.len() as u64 / SECTOR_BYTES {
            st.remove(offset / SECTOR_BYTES + i);
        }
        self.backing.write_at(buf, offset)?;
        self.backing.flush()
    }

    /// Power loss: each cached sector reaches the backing device or not, at random; the
    /// cache is emptied and every later request fails.
    pub fn power_cut(&self) {
        let mut st = self.lock();
        if st.powered_off {
            return;
        }
        st.powered_off = true;
        let sectors: Vec<u64> = st.sectors.keys().copied().collect();
        for sector in sectors {
            let keep = st.chance(2);
            let c = st.remove(sector).expect("listed above");
            if keep {
                // A drive losing power cannot report an error; a failed destage is a lost one.
                let _ = self.destage(sector, &c.data);
            }
        }
    }

    fn powered<'a>(&self, st: MutexGuard<'a, State>) -> io::Result<MutexGuard<'a, State>> {
        if st.powered_off {
            return Err(io::Error::other(format!(
                "{}: the drive lost power (simulated); reopen it",
                self.name()
            )));
        }
        Ok(st)
    }

    fn destage(&self, sector: u64, data: &[u8]) -> io::Result<()> {
        let buf = AlignedBuf::from_slice(data);
        self.backing.write_at(&buf, sector * SECTOR_BYTES)
    }

    /// Destages a cached sector, putting it back if the backing device refuses it.
    fn destage_cached(&self, st: &mut State, sector: u64) -> io::Result<()> {
        let Some(c) = st.remove(sector) else {
            return Ok(());
        };
        if let Err(e) = self.destage(sector, &c.data) {
            st.insert(sector, &c.data);
            return Err(e);
        }
        Ok(())
    }

    /// The drive's own destaging after a write: random early destage (of the sectors just
    /// written and of one older sector), then the oldest sectors while over capacity.
    fn destage_some(&self, st: &mut State, first: u64, count: u64) -> io::Result<()> {
        let one_in = self.config.early_destage_one_in;
        for sector in first..first + count {
            if st.chance(one_in) {
                self.destage_cached(st, sector)?;
            }
        }
        if st.chance(one_in) {
            let from = st.next_random() % (self.size_bytes() / SECTOR_BYTES);
            let pick = st.sectors.range(from..).next().map(|(s, _)| *s);
            if let Some(sector) = pick {
                self.destage_cached(st, sector)?;
            }
        }
        let capacity = (self.config.capacity_bytes / SECTOR_BYTES).max(1) as usize;
        while st.sectors.len() > capacity {
            let oldest = *st.by_age.values().next().expect("cache not empty");
            self.destage_cached(st, oldest)?;
        }
        Ok(())
    }

    /// Writes every cached sector, in runs of adjacent sectors; a run that fails stays
    /// cached (the next flush retries it).
    fn write_back(&self, st: &mut State) -> io::Result<()> {
        const RUN_SECTORS: u64 = 256;
        while let Some((&first, _)) = st.sectors.iter().next() {
            let mut run = vec![first];
            while run.len() < RUN_SECTORS as usize
                && st.sectors.contains_key(&(first + run.len() as u64))
            {
                run.push(first + run.len() as u64);
            }
            let mut buf = AlignedBuf::zeroed(run.len() * SECTOR_BYTES as usize);
            for (i, s) in run.iter().enumerate() {
                let at = i * SECTOR_BYTES as usize;
                buf[at..at + SECTOR_BYTES as usize].copy_from_slice(&st.sectors[s].data);
            }
            self.backing.write_at(&buf, first * SECTOR_BYTES)?;
            for s in run {
                st.remove(s);
            }
        }
        Ok(())
    }
}

impl BlockDevice for VolatileCache {
    fn name(&self) -> &str {
        self.backing.name()
    }

    fn size_bytes(&self) -> u64 {
        self.backing.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let st = self.powered(self.lock())?;
        self.backing.read_at(buf, offset)?;
        let first = offset / SECTOR_BYTES;
        let end = first + buf.len() as u64 / SECTOR_BYTES;
        for (sector, c) in st.sectors.range(first..end) {
            let at = ((sector - first) * SECTOR_BYTES) as usize;
            buf[at..at + SECTOR_BYTES as usize].copy_from_slice(&c.data);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let mut st = self.powered(self.lock())?;
        let first = offset / SECTOR_BYTES;
        for (i, data) in buf.chunks(SECTOR_BYTES as usize).enumerate() {
            st.insert(first + i as u64, data);
        }
        self.destage_some(&mut st, first, buf.len() as u64 / SECTOR_BYTES)
    }

    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_through(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        let mut st = self.powered(self.lock())?;
        self.write_back(&mut st)?;
        self.backing.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::check_discard(self, offset, len)?;
        let mut st = self.powered(self.lock())?;
        // Writes still in the cache would land on the range after it was given back.
        let first = offset / SECTOR_BYTES;
        for s in first..first + len / SECTOR_BYTES {
            st.remove(s);
        }
        self.backing.discard(offset, len)
    }

    fn can_discard(&self) -> bool {
        self.backing.can_discard()
    }

    fn discard_zeroes(&self) -> bool {
        self.backing.discard_zeroes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileDrive;

    const DRIVE_BYTES: u64 = 1 << 20;

    fn drive(dir: &tempfile::TempDir) -> Arc<dyn BlockDevice> {
        let path = dir.path().join("d");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(DRIVE_BYTES).unwrap();
        Arc::new(FileDrive::open(&path).unwrap())
    }

    fn never_early(seed: u64) -> VolatileCacheConfig {
        VolatileCacheConfig {
            seed,
            capacity_bytes: 64 << 20,
            early_destage_one_in: 0,
        }
    }

    fn sector(byte: u8, sectors: usize) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(sectors * SECTOR_BYTES as usize);
        b.fill(byte);
        b
    }

    fn read(dev: &dyn BlockDevice, offset: u64, sectors: usize) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(sectors * SECTOR_BYTES as usize);
        dev.read_at(&mut b, offset).unwrap();
        b
    }

    #[test]
    fn reads_see_unflushed_writes_and_only_flushed_ones_reach_the_backing_device() {
        let dir = tempfile::tempdir().unwrap();
        let backing = drive(&dir);
        let cache = VolatileCache::new(backing.clone(), never_early(1));
        cache.write_at(&sector(7, 2), 0).unwrap();
        assert_eq!(&read(&cache, 0, 2)[..], &sector(7, 2)[..]);
        assert_eq!(&read(backing.as_ref(), 0, 2)[..], &sector(0, 2)[..]);
        assert_eq!(cache.cached_bytes(), 2 * SECTOR_BYTES);
        cache.flush().unwrap();
        assert_eq!(cache.cached_bytes(), 0);
        assert_eq!(&read(backing.as_ref(), 0, 2)[..], &sector(7, 2)[..]);
    }

    #[test]
    fn fua_writes_are_durable_and_replace_cached_copies() {
        let dir = tempfile::tempdir().unwrap();
        let backing = drive(&dir);
        let cache = VolatileCache::new(backing.clone(), never_early(1));
        cache.write_at(&sector(1, 4), 0).unwrap();
        cache.write_through(&sector(2, 2), SECTOR_BYTES).unwrap();
        cache.power_cut();
        let after = read(backing.as_ref(), 0, 4);
        assert_eq!(&after[4096..3 * 4096], &sector(2, 2)[..]);
        assert!(
            cache.read_at(&mut sector(0, 1), 0).is_err(),
            "no I/O after power loss"
        );
    }

    #[test]
    fn power_cut_keeps_some_sectors_loses_others_and_never_tears_a_sector() {
        let dir = tempfile::tempdir().unwrap();
        let backing = drive(&dir);
        let cache = VolatileCache::new(backing.clone(), never_early(3));
        // 64 distinct sectors; each survives whole or not at all.
        cache.write_at(&sector(9, 64), 0).unwrap();
        cache.power_cut();
        let after = read(backing.as_ref(), 0, 64);
        let kept = after
            .chunks(SECTOR_BYTES as usize)
            .filter(|s| {
                assert!(s.iter().all(|&b| b == s[0]), "a sector mixes old and new");
                s[0] == 9
            })
            .count();
        assert!(
            0 < kept && kept < 64,
            "kept {kept} of 64: not a random subset"
        );
    }

    #[test]
    fn early_destage_tears_multi_sector_writes_and_the_cache_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let backing = drive(&dir);
        let config = VolatileCacheConfig {
            seed: 5,
            capacity_bytes: 16 * SECTOR_BYTES,
            early_destage_one_in: 4,
        };
        let cache = VolatileCache::new(backing.clone(), config);
        cache.write_at(&sector(4, 8), 0).unwrap();
        let early = read(backing.as_ref(), 0, 8)
            .chunks(SECTOR_BYTES as usize)
            .filter(|s| s[0] == 4)
            .count();
        assert!(0 < early && early < 8, "{early} of 8 destaged early");
        cache.write_at(&sector(5, 64), 64 * SECTOR_BYTES).unwrap();
        assert!(cache.cached_bytes() <= 16 * SECTOR_BYTES);
        // The oldest went first: the first write is on the backing device by now.
        assert_eq!(&read(backing.as_ref(), 0, 8)[..], &sector(4, 8)[..]);
    }
}
