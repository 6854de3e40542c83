//! The shared state of an open declustered array ([`DaCore`]) and of its vdisks
//! ([`VdiskCore`]), with the metadata, dirty-bitmap and flush paths.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};
use tessera_drive::AlignedBuf;
use tessera_ec::{Code, Codec};

use crate::cache::HeaderCache;
use crate::dirty::{self, DirtyMap};
use crate::error::VdiskError;
use crate::layout::{self, SECTOR, SECTOR_USIZE};
use crate::meta::{DaConfig, MetaImage, PdiskState, StaleStrip, VdiskRecord, META_FORMAT};
use crate::pdisk::{DeviceOpener, Pdisk};
use crate::status::Progress;

/// Stripe locks: a striped table, so memory stays fixed however many stripes there are.
const STRIPE_LOCKS: usize = 4096;
/// Stripe versions: `epoch << EPOCH_SHIFT | counter`.
const EPOCH_SHIFT: u32 = 40;
/// Recent events kept for `status`.
const EVENTS_MAX: usize = 64;
/// Stale strips tracked before the pdisk holding them is declared dead instead.
pub const STALE_MAX: usize = 4096;

/// Where a strip lives: pdisk index and first sector of its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub pdisk: u16,
    pub sector: u64,
}

impl Loc {
    fn pack(self) -> u64 {
        assert!(self.sector < 1 << 48);
        u64::from(self.pdisk) << 48 | self.sector
    }

    fn unpack(v: u64) -> Loc {
        Loc {
            pdisk: (v >> 48) as u16,
            sector: v & ((1 << 48) - 1),
        }
    }

    pub fn offset(self) -> u64 {
        self.sector * SECTOR
    }
}

/// Per-vdisk counters, read by [`crate::Vdisk::stats`].
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub full_stripe_writes: AtomicU64,
    pub rmw_writes: AtomicU64,
    pub degraded_reads: AtomicU64,
    pub checksum_errors_repaired: AtomicU64,
    pub unrecoverable: AtomicU64,
    /// Whole stripes deallocated on their pdisks (TRIM), and ranges handed down that were
    /// not (partial stripes, degraded stripes, pdisks that cannot deallocate to zeros).
    pub discarded_stripes: AtomicU64,
    pub discards_skipped: AtomicU64,
}

/// A vdisk's shape and stripe map.
#[derive(Debug)]
pub struct VdiskCore {
    pub id: u32,
    pub name: String,
    pub code: Code,
    pub codec: Codec,
    pub k: usize,
    pub m: usize,
    pub n: usize,
    pub block_bytes: u64,
    pub strip_bytes: usize,
    pub sps: usize,
    pub header_bytes: usize,
    pub slot_sectors: u64,
    pub stripes: u64,
    pub region_stripes: u64,
    map: Vec<AtomicU64>,
    /// Bumped by every `set_loc`: the status walk over the map is redone only when it moved.
    map_changes: AtomicU64,
    pub stats: Counters,
    pub deleted: AtomicBool,
}

impl VdiskCore {
    pub fn from_record(r: &VdiskRecord) -> Result<VdiskCore, VdiskError> {
        let code: Code = r.code.into();
        let codec = Codec::new(code)?;
        if codec.id() != r.codec_id {
            return Err(VdiskError::Invalid(format!(
                "vdisk `{}`: recorded parity format {} but this Tessera's codec for {code} is \
                 format {}; the vdisk cannot be read by this version",
                r.name,
                r.codec_id,
                codec.id()
            )));
        }
        let n = code.total_strips();
        let sps = (r.strip_bytes / SECTOR) as usize;
        let header_bytes = layout::strip_header_bytes(n, sps);
        let map = r
            .map_pdisk
            .iter()
            .zip(&r.map_sector)
            .map(|(&pdisk, &sector)| AtomicU64::new(Loc { pdisk, sector }.pack()))
            .collect();
        Ok(VdiskCore {
            id: r.id,
            name: r.name.clone(),
            code,
            codec,
            k: code.data_strips(),
            m: code.parity_strips(),
            n,
            block_bytes: r.block_bytes,
            strip_bytes: r.strip_bytes as usize,
            sps,
            header_bytes,
            slot_sectors: (header_bytes as u64 + r.strip_bytes) / SECTOR,
            stripes: r.stripes,
            region_stripes: r.region_stripes,
            map,
            map_changes: AtomicU64::new(0),
            stats: Counters::default(),
            deleted: AtomicBool::new(false),
        })
    }

    pub fn loc(&self, stripe: u64, strip: usize) -> Loc {
        Loc::unpack(self.map[stripe as usize * self.n + strip].load(Ordering::Acquire))
    }

    pub fn set_loc(&self, stripe: u64, strip: usize, loc: Loc) {
        self.map[stripe as usize * self.n + strip].store(loc.pack(), Ordering::Release);
        self.map_changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Changes of the strip map so far (see `set_loc`).
    pub fn map_changes(&self) -> u64 {
        self.map_changes.load(Ordering::Acquire)
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.stripes * self.block_bytes
    }

    pub fn slot_bytes(&self) -> usize {
        self.header_bytes + self.strip_bytes
    }

    pub fn regions(&self) -> u64 {
        self.stripes.div_ceil(self.region_stripes)
    }

    pub fn record(&self) -> VdiskRecord {
        let (map_pdisk, map_sector) = (0..self.map.len())
            .map(|i| Loc::unpack(self.map[i].load(Ordering::Acquire)))
            .map(|l| (l.pdisk, l.sector))
            .unzip();
        VdiskRecord {
            id: self.id,
            name: self.name.clone(),
            code: self.code.into(),
            codec_id: self.codec.id(),
            block_bytes: self.block_bytes,
            strip_bytes: self.strip_bytes as u64,
            stripes: self.stripes,
            region_stripes: self.region_stripes,
            map_pdisk,
            map_sector,
        }
    }
}

/// Settings that can change while the array is open.
#[derive(Clone, Debug)]
pub struct Settings {
    pub spare_pdisks: u32,
    pub rebuild_io_share: u8,
    pub scrub_rate_mb_s: u32,
    pub pdisk_error_limit: u32,
    pub next_vdisk_id: u32,
}

/// One strip of a stripe as seen by an operation.
#[derive(Clone, Debug)]
pub struct StripSlot {
    pub pd: Arc<Pdisk>,
    pub loc: Loc,
    pub readable: bool,
    pub writable: bool,
}

/// Per (vdisk, what went wrong): how many strips, and the first one's message.
pub type FailedMoves = std::collections::BTreeMap<(String, &'static str), (u64, String)>;

/// The state shared by an array, its vdisk handles and its background workers.
pub struct DaCore {
    pub uuid: [u8; 16],
    pub name: String,
    pub created_unix: u64,
    pub meta_slot_bytes: u64,
    pub settings: Mutex<Settings>,
    pub pdisks: RwLock<Vec<Arc<Pdisk>>>,
    pub vdisks: RwLock<BTreeMap<String, Arc<VdiskCore>>>,
    locks: Vec<RwLock<()>>,
    pub headers: HeaderCache,
    pub dirty: DirtyMap,
    version: AtomicU64,
    write_epoch: u64,
    /// Metadata generation, held while writing it.
    meta_gen: Mutex<u64>,
    /// Bumped by every change that must be durable before a write relying on it returns
    /// (pdisk states, stale strips); `meta_saved` is the value last written.
    meta_changes: AtomicU64,
    meta_saved: AtomicU64,
    stale: Mutex<HashSet<StaleStrip>>,
    stale_count: AtomicUsize,
    /// Slots to return to the free space once the metadata no longer points at them.
    pending_free: Mutex<Vec<(u16, u64, u64)>>,
    events: Mutex<VecDeque<String>>,
    pub wake: Condvar,
    pub wake_lock: Mutex<bool>,
    pub stop: AtomicBool,
    /// Set by `close` (and drop): vdisk handles fail from then on.
    pub closed: AtomicBool,
    pub last_foreground: Mutex<Option<Instant>>,
    pub rebuild: Mutex<Progress>,
    pub scrub: Mutex<Progress>,
    /// Strips the maintenance worker could not rebuild (data lost): not retried until a
    /// pdisk changes state.
    pub given_up: Mutex<HashSet<(u32, u64, u16)>>,
    /// Strips that could not be rebuilt or moved in the current maintenance step, per
    /// (vdisk, what went wrong): a count and the first strip's message. Reported as one
    /// event each when the step ends, since a vdisk that lost data has thousands.
    pub failed_moves: Mutex<FailedMoves>,
    /// The last rebalance round could move nothing; cleared when pdisks or vdisks change.
    pub rebalance_stuck: AtomicBool,
    pub opener: DeviceOpener,
    /// What the last status walk over every strip found, and what it depended on.
    pub(crate) status_walk: Mutex<Option<crate::da::StatusWalk>>,
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub use crate::pool::run_all;

pub struct CoreInit {
    pub config: DaConfig,
    pub pdisks: Vec<Arc<Pdisk>>,
    pub vdisks: Vec<Arc<VdiskCore>>,
    pub stale: Vec<StaleStrip>,
    pub write_epoch: u64,
    pub meta_generation: u64,
    pub dirty_generation: u64,
    pub opener: DeviceOpener,
}

impl DaCore {
    pub fn new(init: CoreInit) -> DaCore {
        let c = &init.config;
        let dirty = DirtyMap::default();
        for v in &init.vdisks {
            dirty.add_vdisk(v.id, v.regions());
        }
        *dirty.persist_lock.lock() = init.dirty_generation;
        let stale: HashSet<StaleStrip> = init.stale.into_iter().collect();
        DaCore {
            uuid: c.uuid,
            name: c.name.clone(),
            created_unix: c.created_unix,
            meta_slot_bytes: c.meta_slot_bytes,
            settings: Mutex::new(Settings {
                spare_pdisks: c.spare_pdisks,
                rebuild_io_share: c.rebuild_io_share,
                scrub_rate_mb_s: c.scrub_rate_mb_s,
                pdisk_error_limit: c.pdisk_error_limit,
                next_vdisk_id: c.next_vdisk_id,
            }),
            pdisks: RwLock::new(init.pdisks),
            vdisks: RwLock::new(
                init.vdisks
                    .into_iter()
                    .map(|v| (v.name.clone(), v))
                    .collect(),
            ),
            locks: (0..STRIPE_LOCKS).map(|_| RwLock::new(())).collect(),
            headers: HeaderCache::default(),
            dirty,
            version: AtomicU64::new(init.write_epoch << EPOCH_SHIFT),
            write_epoch: init.write_epoch,
            meta_gen: Mutex::new(init.meta_generation),
            meta_changes: AtomicU64::new(0),
            meta_saved: AtomicU64::new(0),
            stale_count: AtomicUsize::new(stale.len()),
            stale: Mutex::new(stale),
            pending_free: Mutex::new(Vec::new()),
            status_walk: Mutex::new(None),
            events: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            wake_lock: Mutex::new(false),
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            last_foreground: Mutex::new(None),
            rebuild: Mutex::new(Progress::default()),
            scrub: Mutex::new(Progress::default()),
            given_up: Mutex::new(HashSet::new()),
            failed_moves: Mutex::new(std::collections::BTreeMap::new()),
            rebalance_stuck: AtomicBool::new(false),
            opener: init.opener,
        }
    }

    /// A new stripe version, larger than every version written before (in this or any
    /// earlier open of the array).
    pub fn next_version(&self) -> u64 {
        let v = self.version.fetch_add(1, Ordering::AcqRel) + 1;
        assert_eq!(
            v >> EPOCH_SHIFT,
            self.write_epoch,
            "stripe version counter overflow"
        );
        v
    }

    pub fn stripe_lock(&self, vdisk_id: u32, stripe: u64) -> &RwLock<()> {
        let h = crate::placement::mix(u64::from(vdisk_id) << 44 ^ stripe);
        &self.locks[(h % STRIPE_LOCKS as u64) as usize]
    }

    pub fn pdisk(&self, index: u16) -> Arc<Pdisk> {
        self.pdisks.read()[usize::from(index)].clone()
    }

    pub fn pdisk_by_name(&self, name: &str) -> Result<Arc<Pdisk>, VdiskError> {
        let pdisks = self.pdisks.read();
        pdisks
            .iter()
            .rev()
            .find(|p| p.name == name && p.state() != PdiskState::Replaced)
            .or_else(|| pdisks.iter().find(|p| p.name == name))
            .cloned()
            .ok_or_else(|| VdiskError::NoSuchPdisk {
                da: self.name.clone(),
                pdisk: name.to_string(),
            })
    }

    pub fn is_stale(&self, s: &StaleStrip) -> bool {
        self.stale_count.load(Ordering::Acquire) > 0 && self.stale.lock().contains(s)
    }

    pub fn stale_list(&self) -> Vec<StaleStrip> {
        let mut v: Vec<StaleStrip> = self.stale.lock().iter().copied().collect();
        v.sort_by_key(|s| (s.vdisk_id, s.stripe, s.strip));
        v
    }

    /// Records a strip whose write failed. Returns false when the list is full (the caller
    /// then declares the pdisk dead instead).
    pub fn add_stale(&self, s: StaleStrip) -> bool {
        let mut set = self.stale.lock();
        if set.len() >= STALE_MAX && !set.contains(&s) {
            return false;
        }
        if set.insert(s) {
            self.stale_count.store(set.len(), Ordering::Release);
            self.meta_changes.fetch_add(1, Ordering::AcqRel);
        }
        true
    }

    /// Forgets a stale strip after it was rewritten in full (made durable by the next
    /// metadata write; until then a crash only causes a harmless second rewrite).
    pub fn clear_stale(&self, s: &StaleStrip) {
        if self.stale_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut set = self.stale.lock();
        if set.remove(s) {
            self.stale_count.store(set.len(), Ordering::Release);
        }
    }

    pub fn forget_stale_of_vdisk(&self, vdisk_id: u32) {
        let mut set = self.stale.lock();
        set.retain(|s| s.vdisk_id != vdisk_id);
        self.stale_count.store(set.len(), Ordering::Release);
    }

    /// The strips of a stripe with their pdisks and what may be done with them now.
    pub fn view(&self, vd: &VdiskCore, stripe: u64) -> Vec<StripSlot> {
        let pdisks = self.pdisks.read();
        (0..vd.n)
            .map(|i| {
                let loc = vd.loc(stripe, i);
                let pd = pdisks[usize::from(loc.pdisk)].clone();
                let stale = self.is_stale(&StaleStrip {
                    vdisk_id: vd.id,
                    stripe,
                    strip: i as u16,
                });
                StripSlot {
                    readable: pd.readable() && !stale,
                    writable: pd.writable(),
                    pd,
                    loc,
                }
            })
            .collect()
    }

    pub fn event(&self, text: String) {
        tracing::warn!(da = %self.name, "{text}");
        let mut e = self.events.lock();
        if e.len() == EVENTS_MAX {
            e.pop_front();
        }
        e.push_back(format!("{} {text}", now_unix()));
    }

    pub fn events(&self) -> Vec<String> {
        self.events.lock().iter().cloned().collect()
    }

    /// Wakes the maintenance worker (rebuild, catch-up, rebalance).
    pub fn kick(&self) {
        *self.wake_lock.lock() = true;
        self.wake.notify_all();
    }

    pub fn note_foreground(&self) {
        *self.last_foreground.lock() = Some(Instant::now());
    }

    /// Changes a pdisk's state in memory; the caller persists.
    pub fn set_pdisk_state(&self, pd: &Pdisk, state: PdiskState, why: &str) {
        let old = pd.state();
        if old == state {
            return;
        }
        pd.set_state(state);
        self.meta_changes.fetch_add(1, Ordering::AcqRel);
        self.event(format!("pdisk {}: {old} -> {state}: {why}", pd.name));
        self.kick();
    }

    /// Counts an I/O error against a pdisk and declares it dead past the limit. Returns
    /// true when the pdisk was declared dead now (the caller persists the metadata).
    pub fn note_io_error(&self, pd: &Pdisk, what: &str, err: &std::io::Error) -> bool {
        let limit = u64::from(self.settings.lock().pdisk_error_limit);
        tracing::warn!(da = %self.name, pdisk = %pd.name, "{what}: {err}");
        let state = pd.state();
        if tessera_drive::is_unreachable(err) {
            // A drive that cannot be reached (its enclosure or the network is down) is not
            // a failing drive: written around and probed, not rebuilt at once.
            let mut unreachable = pd.unreachable.lock();
            if unreachable.is_some() {
                return false;
            }
            if state == PdiskState::Ok {
                let now = std::time::Instant::now();
                *unreachable = Some(crate::pdisk::Unreachable {
                    since: now,
                    last_probe: now,
                    failed_probes: 0,
                });
                // Suspended under the same guard: the worker's probe reads the state under
                // it too, and took a pdisk marked unreachable but not yet suspended for one
                // an administrator had resumed (it forgot the mark, and the next failed
                // flush declared the pdisk dead instead of waiting for its enclosure).
                self.set_pdisk_state(
                    pd,
                    PdiskState::Suspended,
                    &format!(
                        "unreachable ({what}: {err}); written around, probed every {} s, \
                         resumed when it answers, dead after {limit} failed probes",
                        crate::worker::PROBE_INTERVAL.as_secs()
                    ),
                );
                drop(unreachable);
                return false;
            }
        }
        let failing = matches!(
            state,
            PdiskState::Ok | PdiskState::Draining | PdiskState::Suspended
        );
        if failing && pd.io_errors() >= limit {
            self.set_pdisk_state(
                pd,
                PdiskState::Dead,
                &format!(
                    "{} I/O errors (limit {limit}); last: {what}: {err}",
                    pd.io_errors()
                ),
            );
            return true;
        }
        false
    }

    /// The metadata image of the current state.
    pub fn image(&self) -> MetaImage {
        let vdisks = self.vdisks.read();
        self.image_with(&vdisks)
    }

    /// The metadata image with the given vdisk table (for callers holding its lock).
    pub fn image_with(&self, vdisks: &BTreeMap<String, Arc<VdiskCore>>) -> MetaImage {
        let s = self.settings.lock().clone();
        MetaImage {
            format: META_FORMAT,
            da: DaConfig {
                uuid: self.uuid,
                name: self.name.clone(),
                created_unix: self.created_unix,
                meta_slot_bytes: self.meta_slot_bytes,
                spare_pdisks: s.spare_pdisks,
                rebuild_io_share: s.rebuild_io_share,
                scrub_rate_mb_s: s.scrub_rate_mb_s,
                pdisk_error_limit: s.pdisk_error_limit,
                next_vdisk_id: s.next_vdisk_id,
            },
            pdisks: self.pdisks.read().iter().map(|p| p.record()).collect(),
            vdisks: vdisks.values().map(|v| v.record()).collect(),
            stale: self.stale_list(),
            write_epoch: self.write_epoch,
        }
    }

    /// Encodes the metadata and checks that it fits its slot.
    pub fn encode_meta(&self, image: &MetaImage) -> Result<Vec<u8>, VdiskError> {
        let payload = image.encode();
        let framed = layout::frame(layout::META_MAGIC, 0, self.uuid, &payload);
        if framed.len() as u64 > self.meta_slot_bytes {
            return Err(VdiskError::MetadataFull {
                da: self.name.clone(),
                needed_bytes: framed.len() as u64,
                area_bytes: self.meta_slot_bytes,
            });
        }
        Ok(payload)
    }

    /// Writes the metadata (next generation, alternate slot) to every pdisk that has a
    /// device and is in service, and flushes. Succeeds when at least one copy is durable.
    ///
    /// Everything the image says about strips (a new location, a strip no longer stale)
    /// was written before the image was taken, so the pdisks are flushed between taking the
    /// image and writing it. A pdisk that fails that flush is declared dead and the image
    /// is taken again. Slots released by moves are reused only after an image that no
    /// longer references them is durable.
    pub fn persist_meta(&self) -> Result<(), VdiskError> {
        let mut generation = self.meta_gen.lock();
        for _ in 0..8 {
            let pending = std::mem::take(&mut *self.pending_free.lock());
            let changes = self.meta_changes.load(Ordering::Acquire);
            let image = self.image();
            let payload = match self.encode_meta(&image) {
                Ok(p) => p,
                Err(e) => {
                    self.pending_free.lock().extend(pending);
                    return Err(e);
                }
            };
            if !self.flush_all_quietly() {
                self.pending_free.lock().extend(pending);
                continue;
            }
            let next = *generation + 1;
            let framed = layout::frame(layout::META_MAGIC, next, self.uuid, &payload);
            let framed = AlignedBuf::from_slice(&framed);
            let targets: Vec<Arc<Pdisk>> = self
                .pdisks
                .read()
                .iter()
                .filter(|p| p.dev.is_some() && p.state().in_service())
                .cloned()
                .collect();
            let results = write_everywhere(&targets, &framed, |p| p.layout.meta_slot(next % 2));
            let mut ok = 0;
            let mut newly_dead = false;
            for (p, r) in targets.iter().zip(results) {
                match r {
                    Ok(()) => ok += 1,
                    Err(e) => newly_dead |= self.note_io_error(p, "writing metadata", &e),
                }
            }
            if ok == 0 {
                self.pending_free.lock().extend(pending);
                return Err(VdiskError::Invalid(format!(
                    "declustered array `{}`: the metadata could not be written to any \
                     pdisk; check the devices",
                    self.name
                )));
            }
            *generation = next;
            self.meta_saved.fetch_max(changes, Ordering::AcqRel);
            let pdisks = self.pdisks.read();
            for (p, start, len) in pending {
                pdisks[usize::from(p)].space.lock().release(start, len);
            }
            drop(pdisks);
            if !newly_dead {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The pdisks in service written since their last flush. An unreachable one is left
    /// out, as a dead one is: its strips are written around and caught up (or found by
    /// their checksums) when it returns, so the stripes are durable without it.
    fn pdisks_to_flush(&self) -> Vec<Arc<Pdisk>> {
        self.pdisks
            .read()
            .iter()
            .filter(|p| {
                p.has_unflushed_writes()
                    && p.dev.is_some()
                    && p.state().in_service()
                    && !p.is_unreachable()
            })
            .cloned()
            .collect()
    }

    /// Flushes every pdisk with unflushed writes; one that fails is declared dead. True
    /// when all flushes succeeded.
    fn flush_all_quietly(&self) -> bool {
        let targets = self.pdisks_to_flush();
        let jobs: Vec<Box<dyn FnOnce() -> std::io::Result<()> + Send + '_>> = targets
            .iter()
            .map(|p| Box::new(move || p.flush_if_needed()) as Box<dyn FnOnce() -> _ + Send>)
            .collect();
        let mut all_ok = true;
        for (p, r) in targets.iter().zip(run_all(jobs)) {
            if let Err(e) = r {
                all_ok = false;
                self.note_io_error(p, "flush", &e);
                if p.state().in_service() && !p.is_unreachable() {
                    self.set_pdisk_state(p, PdiskState::Dead, &format!("flush failed: {e}"));
                }
            }
        }
        all_ok
    }

    /// Persists the metadata if a state change or stale strip is not durable yet.
    pub fn ensure_meta_persisted(&self) -> Result<(), VdiskError> {
        if self.meta_saved.load(Ordering::Acquire) < self.meta_changes.load(Ordering::Acquire) {
            self.persist_meta()?;
        }
        Ok(())
    }

    /// Frees a slot once the next metadata write no longer references it.
    pub fn free_after_persist(&self, loc: Loc, sectors: u64) {
        self.pending_free
            .lock()
            .push((loc.pdisk, loc.sector, sectors));
    }

    /// Makes bitmap version `need` durable (no-op if it already is).
    pub fn persist_dirty(&self, need: u64) -> Result<(), VdiskError> {
        let mut generation = self.dirty.persist_lock.lock();
        if need != u64::MAX && self.dirty.persisted(need) {
            return Ok(());
        }
        let (version, bits) = self.dirty.snapshot();
        let next = *generation + 1;
        let framed = layout::frame(layout::DIRTY_MAGIC, next, self.uuid, &dirty::encode(&bits));
        assert!(framed.len() as u64 <= layout::DIRTY_SLOT_BYTES);
        let framed = AlignedBuf::from_slice(&framed);
        let targets: Vec<Arc<Pdisk>> = self
            .pdisks
            .read()
            .iter()
            .filter(|p| p.writable())
            .cloned()
            .collect();
        let results = write_everywhere(&targets, &framed, |p| p.layout.dirty_slot(next % 2));
        let mut ok = 0;
        for (p, r) in targets.iter().zip(results) {
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    self.note_io_error(p, "writing the dirty-region bitmap", &e);
                }
            }
        }
        if ok == 0 {
            return Err(VdiskError::Invalid(format!(
                "declustered array `{}`: the dirty-region bitmap could not be written to any \
                 pdisk; writes are refused",
                self.name
            )));
        }
        *generation = next;
        self.dirty.mark_persisted(version);
        Ok(())
    }

    /// Flushes every pdisk written since its last flush. A pdisk whose flush fails may have
    /// lost any recent write, so it is declared dead (its strips are rebuilt from the
    /// others). Fails when more pdisks failed than `tolerance`.
    pub fn flush_pdisks(&self, tolerance: usize) -> Result<(), VdiskError> {
        let targets = self.pdisks_to_flush();
        let jobs: Vec<Box<dyn FnOnce() -> std::io::Result<()> + Send + '_>> = targets
            .iter()
            .map(|p| {
                let p = p.clone();
                Box::new(move || p.flush_if_needed()) as Box<dyn FnOnce() -> _ + Send>
            })
            .collect();
        let mut failed = Vec::new();
        for (p, r) in targets.iter().zip(run_all(jobs)) {
            if let Err(e) = r {
                self.note_io_error(p, "flush", &e);
                // An unreachable drive stays suspended: writes it may have lost are caught
                // up (stripe versions) or found by their checksums when it returns.
                if (p.state().readable() || p.state() == PdiskState::Suspended)
                    && !p.is_unreachable()
                {
                    self.set_pdisk_state(p, PdiskState::Dead, &format!("flush failed: {e}"));
                }
                failed.push(format!("{} ({e})", p.name));
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        self.persist_meta()?;
        if failed.len() > tolerance {
            return Err(VdiskError::Invalid(format!(
                "declustered array `{}`: flush failed on pdisks {}; recent writes may be lost",
                self.name,
                failed.join(", ")
            )));
        }
        Ok(())
    }
}

/// Writes `buf` at a per-pdisk offset on every target in parallel, then flushes each.
fn write_everywhere(
    targets: &[Arc<Pdisk>],
    buf: &AlignedBuf,
    offset: impl Fn(&Pdisk) -> u64 + Sync,
) -> Vec<std::io::Result<()>> {
    let offset = &offset;
    let jobs: Vec<Box<dyn FnOnce() -> std::io::Result<()> + Send + '_>> = targets
        .iter()
        .map(|p| {
            Box::new(move || {
                p.write(buf, offset(p))?;
                p.flush_if_needed()
            }) as Box<dyn FnOnce() -> _ + Send>
        })
        .collect();
    run_all(jobs)
}

/// A sector-aligned buffer of `sectors` sectors.
pub fn sectors_buf(sectors: usize) -> AlignedBuf {
    AlignedBuf::zeroed(sectors * SECTOR_USIZE)
}
