//! The mounted file system: the client's state (data-path locks, read-ahead, counters, the
//! way to the metanodes) and the owner's ([`Owner`]: the metanode state of every shard, the
//! recovery log, the allocation map, checkpoints), with mount, log and commit, checkpoint,
//! the background flusher and unmount.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use tessera_alloc::{AllocMap, Extent, PoolId};
use tessera_drive::BlockDevice;
use tessera_journal::{Journal, JournalError, Lsn};
use tessera_nsd::NsdId;

use crate::descriptor::{read_descriptor, AtimeMode, FsDescriptor};
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};
use crate::inode::{Ino, Timestamp};
use crate::meta::{Change, MetaState};
use crate::pmon::{Pmon, PmonSnapshot};
use crate::prefetch::Prefetcher;

pub use crate::namespace::{DirListing, SetAttr, StatFs};

/// Striped per-inode data locks: writers of one file serialize (read-modify-write of a block
/// must not interleave), readers share. A fixed stripe count bounds memory.
const INODE_LOCK_STRIPES: usize = 1024;
/// Striped per-block locks: writers of different blocks of one file proceed in parallel,
/// writers of the same block serialize their read-modify-write.
const BLOCK_LOCK_STRIPES: usize = 4096;
/// Writers of one block exclude each other per segment of this size (the largest FUSE
/// request), so sequential 1 MiB writes into a 4 MiB block run side by side.
const SEGMENT_BYTES: u64 = 1 << 20;

pub(crate) fn stripe(key: &[u64], stripes: usize) -> usize {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for k in key {
        h = (h ^ k).wrapping_mul(0x0100_0000_01B3).rotate_left(29);
    }
    (h % stripes as u64) as usize
}
/// How often the background flusher commits the log when nobody asked for fsync.
pub(crate) const COMMIT_INTERVAL: Duration = Duration::from_secs(5);
/// Checkpoint when the log is fuller than this fraction, so appends rarely find it full.
const CHECKPOINT_LOG_FRACTION: f64 = 0.5;

/// Fixed facts derived from the descriptor, copied out so hot paths need no lock.
#[derive(Clone, Debug)]
pub(crate) struct Geometry {
    pub block_bytes: u64,
    pub sub_block_bytes: u64,
    /// Where block 0 starts on every disk.
    pub data_start_bytes: u64,
    pub sub_blocks_per_block: u32,
    pub inline_max_bytes: usize,
    pub data_pool: PoolId,
    pub data_pool_name: String,
    pub atime: AtimeMode,
    pub max_inodes: u64,
    /// The file system's name, for messages.
    pub fs_name: String,
    /// `-r` at create: the file system keeps data copies in several failure groups, so a
    /// data disk may be down.
    pub data_copies: u8,
}

/// Everything guarded by the metadata lock.
pub(crate) struct Meta {
    pub state: MetaState,
    pub alloc: AllocMap,
    /// Extents released by logged changes; they return to the allocator only once the change
    /// that released them is durable, so a crash can never expose reused blocks to their
    /// previous owner.
    pub pending_free: Vec<(Lsn, Extent)>,
    /// Open handles per inode, so an unlinked file lives until its last close.
    pub open: HashMap<Ino, u32>,
    /// Data extents allocated but not yet mapped by a logged change (a write between its
    /// allocation and its log record): a checkpoint stores the allocation map without them,
    /// so a crash before their record leaks nothing.
    pub unlogged: HashSet<Extent>,
    /// Extents whose release is durable, being deallocated on their thin-provisioned disk
    /// (TRIM) before they return to the allocator: a block given out again before its
    /// discard landed would lose what its new owner wrote. A checkpoint stores them free.
    pub discarding: Vec<Extent>,
    /// Directories whose removal another owner is finishing (their entry lives in a
    /// directory another slot serves; see `FileSystem::remove_across_owners`): no name
    /// goes into them until the deadline, after which the seal lapses.
    pub sealed: HashMap<Ino, std::time::Instant>,
    /// Files whose last link went while another node may have just looked them up, kept
    /// (orphans, nlink 0) until their time is up (`Namespace::release_or_keep`), oldest
    /// first; then freed unless opened meanwhile (`FileSystem::free_lingering`).
    pub lingering: std::collections::VecDeque<crate::namespace::Lingering>,
    /// What each origin changed since the last commit, for answering other nodes' changes
    /// before they are durable (`early_answer.rs`).
    pub uncommitted: crate::early_answer::Uncommitted,
}

/// What only the node that owns the shards keeps: the descriptor, every shard's metadata
/// state, the recovery log, the allocation map's stored slots, the installed placement
/// policy and the checkpoint's state. A client reaches it through the metanode interface
/// (`metanode.rs`); on one node it lives inside the `FileSystem` that is also the client.
pub(crate) struct Owner {
    pub(crate) desc: Mutex<FsDescriptor>,
    /// The newest descriptor written, under which descriptor writes are serialised: a
    /// checkpoint's, and the one a log copy falling behind makes from inside a commit
    /// (see [`FileSystem::write_descriptor`]). `desc` may be ahead of it (an administrative
    /// change waiting for the checkpoint that commits it).
    pub(crate) written_desc: Mutex<FsDescriptor>,
    /// The recovery log's two copies, with metadata replicated (`-m 2`).
    /// Replaced with the journal when `restripe -m` moves the log.
    pub(crate) log_copies: RwLock<Option<Arc<crate::mirrored_log::MirroredLog>>>,
    /// What a log copy falling behind calls to record it (writes the descriptor).
    pub(crate) log_hook: std::sync::OnceLock<crate::mirrored_log::OnBehind>,
    pub(crate) meta: crate::read_tokens::MetaLock,
    /// The recovery log; replaced only when `restripe -m` moves it to another disk (see
    /// `restripe.rs`), so callers take a handle and never hold this lock.
    pub(crate) journal: RwLock<Arc<Journal>>,
    pub(crate) checkpoint_lock: Mutex<()>,
    pub(crate) commit_lock: Mutex<()>,
    /// Metadata pages a durable checkpoint superseded, freed under the next metadata lock.
    pub(crate) deferred_frees: Mutex<Vec<Extent>>,
    /// Which slot of each stored allocation-map chunk a checkpoint must not overwrite; used
    /// under the checkpoint lock.
    pub(crate) map_slots: Mutex<crate::alloc_map::MapSlots>,
    /// Why this mount rebuilt the allocation map from the metadata instead of reading it.
    pub(crate) map_rebuilt: Option<String>,
    /// The installed policy, when it applies (see `placement.rs`).
    pub(crate) policy: RwLock<Option<Arc<crate::placement::Installed>>>,
    /// A checkpoint failed after giving its pages addresses: no further checkpoint is safe.
    pub(crate) checkpoint_failed: AtomicBool,
    /// Changed metadata pages held before the background flusher starts a checkpoint, and
    /// before a change waits for one itself (see `set_metadata_cache_bytes`).
    pub(crate) dirty_pages_soft: AtomicUsize,
    pub(crate) dirty_pages_hard: AtomicUsize,
    /// Bytes given back to thin-provisioned disks since the mount, and discards that failed.
    pub(crate) discarded_bytes: std::sync::atomic::AtomicU64,
    pub(crate) discard_errors: std::sync::atomic::AtomicU64,
    /// Sub-blocks of the system pool's metadata disks that file data leaves free, so that
    /// checkpoints always find pages (0 when data goes to other disks only); grows when a
    /// disk is added.
    pub(crate) metadata_reserve_sub_blocks: std::sync::atomic::AtomicU64,
    /// Every node's `fcntl`, `flock` and append locks on this owner's files (`locks.rs`).
    pub(crate) locks: Mutex<crate::locks::LockTable>,
    /// Signalled whenever locks are given back: data-token and append requests that
    /// conflict wait on it a little at the owner (`locks::OWNER_WAIT`) instead of asking
    /// again from afar.
    pub(crate) lock_released: parking_lot::Condvar,
    /// On the owner of an owner slot other than 0: its region and the record its last
    /// checkpoint wrote, which is its commit point where slot 0's is the descriptor.
    /// `None` on the file system manager.
    pub(crate) slot: Option<crate::slot::SlotOwner>,
    /// On the manager, one slot or region given at a time (`provide_slot`,
    /// `provide_region`): two nodes asking at once would otherwise be given the same free
    /// region. On a slot's owner, one region asked for at a time (`allocate_in_another_region`):
    /// writers that all found the regions full ask once.
    pub(crate) providing: Mutex<()>,
    /// On the manager, when it last asked every slot for a region back and none gave one:
    /// on a full file system every failed allocation would ask them all again.
    pub(crate) found_no_region: Mutex<Option<std::time::Instant>>,
    /// How to take a kept data token back from another node (see
    /// [`FileSystem::on_data_revoke`]); none granted until set.
    pub(crate) data_revoke: std::sync::OnceLock<crate::read_tokens::RevokeHook>,
    /// Data replication of new files (`-r`, `-K`; `fs change -r` changes it).
    pub(crate) replication: RwLock<crate::descriptor::Replication>,
}

/// A mounted file system on this node: the client (the data path with its locks and
/// read-ahead, the counters, the way to the metanodes) and, when this node owns the
/// shards, the owner's state. A client-only mount ([`FileSystem::mount_client`]) has no
/// owner: every metadata request goes to the node that owns them.
pub struct FileSystem {
    pub(crate) owner: Option<Owner>,
    /// The descriptor a client-only mount read when it started, or later when it learned
    /// of added disks (an owner keeps its own).
    pub(crate) client_desc: Option<Mutex<FsDescriptor>>,
    /// Opens disks added to the file system since this mount started (see
    /// [`FileSystem::set_disk_opener`]).
    pub(crate) disk_opener: std::sync::OnceLock<crate::disks::DiskOpener>,
    /// One learning of added disks at a time (`FileSystem::learn_added_devices`).
    pub(crate) learning_disks: Mutex<()>,
    /// The disks' devices by disk index; grows when a disk is added (`disk add`).
    pub(crate) devices: Arc<DiskSet>,
    pub(crate) geo: Geometry,
    pub(crate) pmon: Pmon,
    pub(crate) prefetch: Prefetcher,
    inode_locks: Vec<RwLock<()>>,
    block_locks: Vec<RwLock<()>>,
    segment_locks: Vec<Mutex<()>>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    flusher: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) unmounted: AtomicBool,
    /// Held shared while another node's request is served, exclusively by the unmount
    /// before its final checkpoint: once a mount that serves a slot or the file system
    /// is let go (and another node may mount it next and write its log), no request
    /// still in flight here logs anything after that checkpoint.
    pub(crate) serving: RwLock<()>,
    fenced: AtomicBool,
    /// Where this node's client sends its metanode requests when not to its own owner
    /// directly: set at mount by `TESSERA_METANODE_LOOPBACK=1` (see `metanode_wire.rs`).
    pub(crate) remote: std::sync::OnceLock<Arc<crate::metanode_wire::RemoteMetanode>>,
    /// `remote` is this mount's own owner through the wire form: every request goes there.
    pub(crate) loopback: AtomicBool,
    /// Which owner slot serves each shard, as this mount last read the owner map (the
    /// descriptor); where requests for an inode go (see [`FileSystem::route`]).
    pub(crate) owner_map: Vec<std::sync::atomic::AtomicU32>,
    /// The ways to other slots' owners, made on first use (see `route_slots_through`).
    pub(crate) slot_routes: Vec<std::sync::OnceLock<Arc<crate::metanode_wire::RemoteMetanode>>>,
    pub(crate) slot_channel: std::sync::OnceLock<SlotChannelHook>,
    /// What this node's kernel keeps of inodes other nodes serve, under held read tokens
    /// (see [`FileSystem::kernel_may_keep_name`]).
    pub(crate) kernel_kept: crate::read_tokens::KernelKept,
    /// Told what other nodes' requests change (see [`FileSystem::on_remote_change`]).
    pub(crate) remote_change: std::sync::OnceLock<RemoteChangeHook>,
    /// Whether this node may answer from what its own metanode keeps (see
    /// [`FileSystem::on_serve_check`]).
    pub(crate) serve_check: std::sync::OnceLock<ServeCheck>,
    /// Whether the node a lock holder's requests came from is gone from the cluster (see
    /// [`FileSystem::on_lock_holder_check`]).
    pub(crate) holder_gone: std::sync::OnceLock<HolderGoneHook>,
    /// This mount's name as a lock holder, and the locks it holds (a mirror of its part of
    /// the owner's table: a close asks the owner only when it holds something, and a new
    /// owner is handed them at a takeover).
    pub(crate) lock_client: u64,
    pub(crate) held_locks: Mutex<crate::locks::LockTable>,
    /// Serialises this node's O_APPEND writes of a shared file by inode (striped); the
    /// append lock at the owner serialises the nodes.
    pub(crate) append_locks: Vec<Mutex<()>>,
    /// Other nodes may mount the file system (see [`FileSystem::set_shared`]), and this
    /// node's writers of one block take turns before asking for its data token.
    pub(crate) shared: AtomicBool,
    pub(crate) data_token_locks: Vec<Mutex<()>>,
    /// The data tokens a client mount keeps until the owner takes them back.
    pub(crate) kept_data: crate::locks::KeptTokens,
    /// Small writes gathered in memory (`write_behind.rs`), on a mount that gathers.
    pub(crate) write_behind: crate::write_behind::WriteBehind,
    /// Where this mount last placed a block of each file it writes (a placement hint).
    pub(crate) placed: crate::data::LastPlaced,
    /// On a client-only mount: how many times each inode is open here. The owner counts
    /// them too, in memory; a new owner is handed them at its fence, so that a file
    /// unlinked while open on this node outlives a takeover until its last close here.
    pub(crate) client_opens: Mutex<HashMap<Ino, u32>>,
    /// `readReplicaPolicy`: which copy of a replicated block reads try first (see
    /// `replication.rs`).
    pub(crate) read_policy: std::sync::atomic::AtomicU8,
    /// Reads of replicated blocks so far: every sixteenth tries the copies in another
    /// order, so that the latency of every disk keeps being measured.
    pub(crate) replica_reads: std::sync::atomic::AtomicU64,
}

impl Owner {
    #[allow(clippy::too_many_arguments)]
    fn new(
        desc: FsDescriptor,
        state: MetaState,
        alloc: AllocMap,
        journal: Journal,
        log_copies: Option<Arc<crate::mirrored_log::MirroredLog>>,
        map_slots: crate::alloc_map::MapSlots,
        map_rebuilt: Option<String>,
        slot: Option<crate::slot::SlotOwner>,
    ) -> Owner {
        let reserve = metadata_reserve(&desc);
        let policy = crate::placement::load(&desc);
        let replication = desc.replication();
        Owner {
            written_desc: Mutex::new(desc.clone()),
            desc: Mutex::new(desc),
            log_copies: RwLock::new(log_copies),
            log_hook: std::sync::OnceLock::new(),
            meta: crate::read_tokens::MetaLock::new(Meta {
                state,
                alloc,
                pending_free: Vec::new(),
                open: HashMap::new(),
                unlogged: HashSet::new(),
                sealed: HashMap::new(),
                lingering: std::collections::VecDeque::new(),
                uncommitted: crate::early_answer::Uncommitted::default(),
                discarding: Vec::new(),
            }),
            journal: RwLock::new(Arc::new(journal)),
            checkpoint_lock: Mutex::new(()),
            commit_lock: Mutex::new(()),
            deferred_frees: Mutex::new(Vec::new()),
            map_slots: Mutex::new(map_slots),
            map_rebuilt,
            policy: RwLock::new(policy),
            checkpoint_failed: AtomicBool::new(false),
            dirty_pages_soft: AtomicUsize::new(crate::checkpoint::DIRTY_PAGES_SOFT),
            dirty_pages_hard: AtomicUsize::new(crate::checkpoint::DIRTY_PAGES_HARD),
            discarded_bytes: std::sync::atomic::AtomicU64::new(0),
            discard_errors: std::sync::atomic::AtomicU64::new(0),
            metadata_reserve_sub_blocks: std::sync::atomic::AtomicU64::new(reserve),
            locks: Mutex::new(crate::locks::LockTable::default()),
            lock_released: parking_lot::Condvar::new(),
            slot,
            providing: Mutex::new(()),
            found_no_region: Mutex::new(None),
            data_revoke: std::sync::OnceLock::new(),
            replication: RwLock::new(replication),
        }
    }
}

type SlotChannelHook = Box<dyn Fn(u32) -> Option<Box<dyn crate::MetanodeChannel>> + Send + Sync>;

/// Where a request about an inode goes.
pub(crate) enum Route<'a> {
    /// This mount's own owner state serves its shard.
    Here,
    /// Another node's owner, over this channel.
    There(&'a crate::metanode_wire::RemoteMetanode),
}

type HolderGoneHook = Box<dyn Fn(crate::locks::Origin) -> bool + Send + Sync>;

type RemoteChangeHook = Box<dyn Fn(Vec<crate::CacheChange>) + Send + Sync>;

/// Why this node may not answer from the metadata it owns now.
#[derive(Clone, Debug)]
pub enum ServeRefusal {
    /// Its disk lease lapsed: it may be renewed (a short loss of contact), or the cluster
    /// expels the node and others take its metadata over.
    Lapsed(String),
    /// The node was expelled since the mount: others own its metadata now; the mount is
    /// stale for good.
    Stale(String),
}

/// See [`FileSystem::on_serve_check`].
pub type ServeCheck = Box<dyn Fn() -> Result<(), ServeRefusal> + Send + Sync>;

impl std::fmt::Debug for FileSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileSystem({})", self.geo.data_pool_name)
    }
}

impl FileSystem {
    /// Mounts the file system found on `disks`: reads the newest descriptor, loads every
    /// shard's checkpoint, replays the recovery log, rebuilds the allocation map and reclaims
    /// inodes that were unlinked while open when the previous owner stopped.
    pub fn mount(disks: Vec<(NsdId, Arc<dyn BlockDevice>)>) -> FsResult<Arc<FileSystem>> {
        let fs = FileSystem::mount_keeping_orphans(disks)?;
        fs.reclaim_orphans()?;
        Ok(fs)
    }

    /// [`FileSystem::mount`] for an owner that other nodes mount as clients (a takeover,
    /// or an owner mounting again under live clients): inodes unlinked while open stay
    /// until the clients' fences have said which of them are open there (the dead owner's
    /// open counts died with it); then [`FileSystem::reclaim_orphans`] frees the rest.
    pub fn mount_keeping_orphans(
        disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
    ) -> FsResult<Arc<FileSystem>> {
        let all: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|(_, d)| d.clone()).collect();
        let mut desc = read_descriptor(&all)?;
        let devices = crate::recovery::match_devices(&desc, &disks)?;
        for why in crate::slot::check_records(&desc, &devices) {
            tracing::error!("{why}");
        }
        let mut recovered =
            crate::recovery::recover(&desc, &devices, crate::recovery::MapSource::Stored)?;
        if !recovered.conflicts.is_empty() {
            return Err(FsError::Corrupt(format!(
                "{} block(s) claimed twice, first: {}; run tessera fsck {} -y",
                recovered.conflicts.len(),
                recovered.conflicts[0],
                desc.name
            )));
        }
        if recovered.map_rebuilt.is_some() && !recovered.slot_problems.is_empty() {
            // A rebuilt map counts only the blocks of shards it could open: those of the
            // others would be handed out again.
            return Err(FsError::Corrupt(format!(
                "the allocation map must be rebuilt, but shards of other owner slots cannot be \
                 read ({}); run tessera fsck {}",
                recovered.slot_problems.join("; "),
                desc.name
            )));
        }
        for why in &recovered.slot_problems {
            tracing::error!("{}: {why}; those shards are unavailable", desc.name);
        }
        // Slot 0 serves only its own shards; the others' blocks are counted in the map.
        for shard in std::mem::take(&mut recovered.foreign_shards) {
            recovered.state.release_shard(shard);
        }
        if let Some(why) = &recovered.map_rebuilt {
            tracing::info!(
                "{}: allocation map rebuilt from the metadata: {why}",
                desc.name
            );
        }
        if desc.alloc_map.is_none() {
            // A file system of format version 3: give the map its regions now; the first
            // checkpoint stores it whole and writes a version-4 descriptor naming them. A crash
            // before that leaves the regions unreferenced and this mount's conversion to redo.
            match crate::alloc_map::allocate_regions(&desc, &mut recovered.alloc) {
                Ok(regions) => {
                    recovered.alloc.mark_all_chunks_dirty();
                    recovered.map_slots = crate::alloc_map::MapSlots::none(&recovered.alloc);
                    desc.alloc_map = Some(crate::alloc_map::StoredMap { regions, digest: 0 });
                    tracing::info!(
                        "{}: converting to format version 4: the allocation map is stored \
                         from the next checkpoint on, so later mounts read it instead of \
                         scanning the metadata",
                        desc.name
                    );
                }
                // A full or fragmented system pool: stay at version 3 (mounts keep scanning)
                // rather than refuse the mount.
                Err(e) => tracing::warn!(
                    "{}: cannot convert to format version 4 ({e}); the allocation map stays \
                     unstored and every mount rebuilds it by a scan; free space in the system \
                     pool and mount again to convert",
                    desc.name
                ),
            }
        }
        let geo = geometry(&desc);
        for d in devices.down_disks() {
            recovered.alloc.set_available(d, false);
        }
        if let Some(log) = &recovered.log_copies {
            let was_behind = log.resync(&recovered.journal.replayed_ranges())?;
            let behind = log.behind();
            let recorded = desc.metadata_copies.as_ref().and_then(|c| c.log_behind);
            if behind != recorded || was_behind.is_some() {
                // Before the log takes a record that only one copy would hold.
                let mut next = desc.clone();
                next.generation += 1;
                if let Some(copies) = &mut next.metadata_copies {
                    copies.log_behind = behind;
                }
                crate::descriptor::write_descriptor_quorum(&next, &devices.up())?;
                desc = next;
            }
            log.set_recorded(behind);
        }
        let owner = Owner::new(
            desc,
            recovered.state,
            recovered.alloc,
            recovered.journal,
            recovered.log_copies.clone(),
            recovered.map_slots,
            recovered.map_rebuilt,
            None,
        );
        let fs = FileSystem::assemble(Some(owner), None, devices, geo);
        // Made for every mount: `fs change -m 2` mirrors the log of a mounted file system.
        let weak = Arc::downgrade(&fs);
        let hook: crate::mirrored_log::OnBehind = Arc::new(move |_state| {
            let fs = weak
                .upgrade()
                .ok_or_else(|| std::io::Error::other("the file system is unmounted"))?;
            fs.record_log_state().map_err(std::io::Error::other)
        });
        if let Some(log) = &*fs.owner().log_copies.read() {
            log.set_on_behind(Arc::clone(&hook));
        }
        let _ = fs.owner().log_hook.set(hook);
        fs.start_owner();
        Ok(fs)
    }

    /// Mounts owner slot `slot` (not 0) of the file system found on `disks`: this mount
    /// owns the shards and allocation regions the owner map gives the slot, brought back
    /// from the slot's own record and log ([`crate::recovery::recover_slot`]), and serves
    /// them; its checkpoints write its pages and its regions' chunks, then its record, and
    /// never the descriptor, so it runs beside the file system manager's mount (slot 0) on
    /// the same disks, each with its own device handles. What changes the descriptor or
    /// works on every shard is refused here (`manager_here`). Inodes unlinked while open
    /// are kept, as after a takeover, until [`FileSystem::reclaim_orphans`].
    pub fn mount_slot(
        disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
        slot: u32,
    ) -> FsResult<Arc<FileSystem>> {
        Self::mount_slot_with(disks, slot, false)
    }

    /// [`FileSystem::mount_slot`]; with `accept_log_loss` (fsck's repair) a log that lost
    /// committed records to a damaged page is replayed as far as it goes instead of
    /// refused (`Journal::open_accepting_loss`).
    pub(crate) fn mount_slot_with(
        disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
        slot: u32,
        accept_log_loss: bool,
    ) -> FsResult<Arc<FileSystem>> {
        if slot == 0 {
            return Err(FsError::Usage(
                "slot 0 is the file system manager's: mount it with FileSystem::mount".into(),
            ));
        }
        let all: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|(_, d)| d.clone()).collect();
        let desc = read_descriptor(&all)?;
        let devices = crate::recovery::match_devices(&desc, &disks)?;
        let recovered = crate::recovery::recover_slot(&desc, &devices, slot, accept_log_loss)?;
        let geo = geometry(&desc);
        let mut alloc = recovered.alloc;
        for d in devices.down_disks() {
            if alloc.knows(d) {
                alloc.set_available(d, false);
            }
        }
        let owner = Owner::new(
            recovered.desc,
            recovered.state,
            alloc,
            recovered.journal,
            recovered.log_copies.clone(),
            recovered.map_slots,
            None,
            Some(crate::slot::SlotOwner {
                number: slot,
                region: Mutex::new(recovered.region),
                moves_given_up: Mutex::new(Vec::new()),
                forward_in_doubt: Default::default(),
                // Settled once the owner map no longer gives them here.
                given_back: Mutex::new(
                    recovered
                        .record
                        .given_back
                        .iter()
                        .copied()
                        .filter(|r| crate::slot::region_owner(&desc, *r as usize) == slot)
                        .collect(),
                ),
                record: Mutex::new(recovered.record),
                dropped: Mutex::new(recovered.dropped),
                map_hold: Default::default(),
            }),
        );
        let fs = FileSystem::assemble(Some(owner), None, devices, geo);
        // The descriptor is the manager's to write: the slot asks it (through the route the
        // daemon sets before this mount serves anything), naming the log of the region it
        // writes now (a move under its owner changes it, `slot_move.rs`).
        let weak = Arc::downgrade(&fs);
        let hook: crate::mirrored_log::OnBehind = Arc::new(move |behind| {
            let fs = weak
                .upgrade()
                .ok_or_else(|| std::io::Error::other("the file system is unmounted"))?;
            let log_id = fs.slot_state().region.lock().log_id;
            fs.namespace_manager()
                .record_slot_log(slot, log_id, behind)
                .map_err(|e| {
                    std::io::Error::other(format!(
                        "the file system manager did not record the state of owner slot \
                         {slot}'s log copies: {e}"
                    ))
                })
        });
        if let Some(log) = &recovered.log_copies {
            log.set_on_behind(Arc::clone(&hook));
        }
        let _ = fs.owner().log_hook.set(hook);
        fs.start_owner();
        Ok(fs)
    }

    /// Starts what an owner's mount runs beside its callers: the background flusher and
    /// read-ahead (and, for tests, the metanode's wire form).
    fn start_owner(self: &Arc<Self>) {
        if std::env::var_os("TESSERA_METANODE_LOOPBACK").is_some_and(|v| v == "1") {
            self.route_metadata_through_wire();
            tracing::info!("metanode requests of this mount go through their wire encoding");
        }
        self.start_flusher();
        self.prefetch.start(Arc::downgrade(self));
    }

    /// Starts the background flusher (an owner's commits its log and checkpoints; every
    /// mount's writes what it gathered) and the threads that write what writers handed off
    /// (`write_behind.rs`).
    fn start_flusher(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        let handle = std::thread::Builder::new()
            .name("tessera-flusher".into())
            .spawn(move || flusher(weak, stop))
            .expect("spawn flusher");
        *self.flusher.lock() = Some(handle);
        self.write_behind.start_landing(Arc::downgrade(self));
    }

    /// Mounts the file system found on `disks` as a client of the node that owns its
    /// metadata, reached through `channel`: the data path reads and writes the disks
    /// itself, every metadata request (namespace, block maps, allocation, commits) goes to
    /// the owner. Nothing of the owner's state is loaded, so the mount costs one
    /// descriptor read whatever the file count, and nothing is replayed: the owner's log
    /// is the owner's. Administrative operations on the metadata (checkpoint, restripe,
    /// disk changes, reclaim) are refused here with [`FsError::NotOwner`].
    pub fn mount_client(
        disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
        channel: Box<dyn crate::MetanodeChannel>,
    ) -> FsResult<Arc<FileSystem>> {
        let all: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|(_, d)| d.clone()).collect();
        let desc = read_descriptor(&all)?;
        let devices = crate::recovery::match_devices(&desc, &disks)?;
        let geo = geometry(&desc);
        let fs = FileSystem::assemble(None, Some(desc), devices, geo);
        fs.route_metadata_through(channel);
        fs.start_flusher();
        fs.prefetch.start(Arc::downgrade(&fs));
        Ok(fs)
    }

    /// The mounted file system around its disks and geometry, with the owner's state (a
    /// mount that owns the metadata) or the descriptor a client-only mount read.
    fn assemble(
        owner: Option<Owner>,
        client_desc: Option<FsDescriptor>,
        devices: Arc<DiskSet>,
        geo: Geometry,
    ) -> Arc<FileSystem> {
        debug_assert!(owner.is_some() != client_desc.is_some());
        let prefetch = Prefetcher::new(geo.block_bytes);
        let owner_map = {
            let desc = match (&owner, &client_desc) {
                (Some(o), _) => o.desc.lock().clone(),
                (None, Some(d)) => d.clone(),
                (None, None) => unreachable!("a mount has an owner or a client descriptor"),
            };
            (0..desc.shard_count as usize)
                .map(|s| std::sync::atomic::AtomicU32::new(desc.shard_owner(s).slot))
                .collect()
        };
        let fs = Arc::new(FileSystem {
            owner,
            client_desc: client_desc.map(Mutex::new),
            disk_opener: std::sync::OnceLock::new(),
            learning_disks: Mutex::new(()),
            devices,
            geo,
            pmon: Pmon::default(),
            prefetch,
            inode_locks: (0..INODE_LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            block_locks: (0..BLOCK_LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            segment_locks: (0..BLOCK_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
            flusher: Mutex::new(None),
            unmounted: AtomicBool::new(false),
            serving: RwLock::new(()),
            fenced: AtomicBool::new(false),
            remote: std::sync::OnceLock::new(),
            loopback: AtomicBool::new(false),
            owner_map,
            slot_routes: (0..crate::slot::SLOTS_MAX)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            slot_channel: std::sync::OnceLock::new(),
            kernel_kept: crate::read_tokens::KernelKept::default(),
            remote_change: std::sync::OnceLock::new(),
            serve_check: std::sync::OnceLock::new(),
            holder_gone: std::sync::OnceLock::new(),
            lock_client: crate::metanode_wire::random_client_id(),
            held_locks: Mutex::new(crate::locks::LockTable::default()),
            append_locks: (0..INODE_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            shared: AtomicBool::new(false),
            data_token_locks: (0..BLOCK_LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            kept_data: crate::locks::KeptTokens::default(),
            write_behind: Default::default(),
            placed: crate::data::LastPlaced::default(),
            client_opens: Mutex::new(HashMap::new()),
            read_policy: std::sync::atomic::AtomicU8::new(
                crate::replication::ReadReplicaPolicy::Default as u8,
            ),
            replica_reads: std::sync::atomic::AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&fs);
        fs.devices.on_unknown_disk(Box::new(move || {
            if let Some(fs) = weak.upgrade() {
                if let Err(e) = fs.learn_added_devices() {
                    tracing::error!("{}: learning added disks: {e}", fs.geo.fs_name);
                }
            }
        }));
        fs
    }

    /// How long until the oldest unlinked file kept for other nodes' lookups is due to be
    /// freed, if any is kept (`Meta::lingering`).
    fn lingering_due(&self) -> Option<Duration> {
        let owner = self.owner.as_ref()?;
        let m = owner.meta.lock();
        let first = m.lingering.front()?;
        Some(first.until.saturating_duration_since(Instant::now()))
    }

    /// Wakes the flusher to free a file kept for other nodes' lookups in time.
    pub(crate) fn wake_flusher(&self) {
        self.stop.1.notify_all();
    }

    /// Frees the unlinked files kept for other nodes' lookups (see `Meta::lingering`) whose
    /// time is up, or all of them (at unmount). One opened meanwhile is freed by its last
    /// close instead; one whose inode number went to a new file meanwhile is left alone.
    pub(crate) fn free_lingering(&self, all: bool) -> FsResult<()> {
        let Some(owner) = &self.owner else {
            return Ok(());
        };
        let now = std::time::Instant::now();
        let mut m = owner.meta.lock();
        while let Some(l) = m.lingering.front().copied() {
            if !all && l.until > now {
                break;
            }
            m.lingering.pop_front();
            if m.open.contains_key(&l.ino) {
                continue;
            }
            let still = m.state.find_attr(l.ino).ok().flatten();
            if still.is_some_and(|a| a.nlink == 0 && a.generation == l.generation) {
                self.log(&mut m, vec![Change::FreeInode { ino: l.ino }])?;
            }
        }
        Ok(())
    }

    /// Frees inodes whose last link went away while they were open and that no mount
    /// has open now (after a takeover: none this owner was told of at a client's fence).
    pub fn reclaim_orphans(&self) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let mut orphans: Vec<Ino> = m.state.orphans()?;
        orphans.retain(|ino| !m.open.contains_key(ino));
        for ino in &orphans {
            tracing::info!("reclaiming orphan inode {ino}");
            self.log(&mut m, vec![Change::FreeInode { ino: *ino }])?;
        }
        drop(m);
        if !orphans.is_empty() {
            // Freed blocks only come back once their release is durable; do it now, so the
            // space of files deleted while open shows as free as soon as the mount returns.
            self.sync_own()?;
        }
        Ok(())
    }

    /// Bounds the metadata pages in memory, clean and changed together (changed pages stay
    /// until the next checkpoint, and clean ones give way to them). A small cache costs
    /// speed, never correctness.
    /// A client-only mount has no metadata cache (nothing to bound).
    pub fn set_metadata_cache_pages(&self, pages: usize) {
        if let Some(owner) = &self.owner {
            owner.meta.lock().state.store_mut().set_cache_pages(pages);
        }
    }

    /// Sizes the metadata page memory by `bytes` (`pagepool`), clean and changed pages
    /// together, as GPFS's pagepool bounds its buffers: memory, not pages (a changed leaf
    /// grows while it changes, and every entry costs 4 bytes beside its page). The
    /// background flusher starts a checkpoint when a quarter of the pool has changed and a
    /// change waits for one itself at half, so that writers only wait when changes outrun
    /// the drives and at least half the pool stays for clean pages; a larger pool also lets
    /// more changes to the same page (a directory leaf hit again and again) go out in one
    /// write.
    pub fn set_metadata_cache_bytes(&self, bytes: u64) {
        if self.owner.is_none() {
            return;
        }
        let mut m = self.owner().meta.lock();
        let store = m.state.store_mut();
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        store.set_cache_pages(usize::MAX);
        store.set_cache_bytes(bytes);
        let pages = (bytes / store.dirty_page_memory()).max(8);
        drop(m);
        let soft = (pages / 4).max(crate::checkpoint::DIRTY_PAGES_MIN);
        self.owner().dirty_pages_soft.store(soft, Ordering::Relaxed);
        self.owner()
            .dirty_pages_hard
            .store((pages / 2).max(2 * soft), Ordering::Relaxed);
    }

    /// Bounds the cache of decoded inode records (`maxFilesToCache`).
    pub fn set_inode_cache(&self, records: usize) {
        if let Some(owner) = &self.owner {
            owner.meta.lock().state.set_inode_cache(records);
        }
    }

    /// Bounds the cache of attributes of inodes beyond the record cache (`maxStatCache`).
    pub fn set_stat_cache(&self, entries: usize) {
        if let Some(owner) = &self.owner {
            owner.meta.lock().state.set_stat_cache(entries);
        }
    }

    /// Entries in the inode record cache and the stat cache (none on a client-only mount).
    pub fn inode_cache_len(&self) -> (usize, usize) {
        self.owner
            .as_ref()
            .map_or((0, 0), |owner| owner.meta.lock().state.inode_cache_len())
    }

    /// Records and group commits of the recovery log since the mount (a client-only mount
    /// writes none).
    pub fn journal_stats(&self) -> tessera_journal::JournalStats {
        match &self.owner {
            Some(_) => self.journal().stats(),
            None => tessera_journal::JournalStats::default(),
        }
    }

    /// Counters of the metadata page cache (none on a client-only mount).
    pub fn metadata_cache_stats(&self) -> tessera_meta::StoreStats {
        self.owner
            .as_ref()
            .map(|owner| owner.meta.lock().state.store_mut().stats())
            .unwrap_or_default()
    }

    /// Why this mount rebuilt the allocation map by a scan of the metadata (a file system of
    /// format version 3, a damaged or out-of-date stored map); `None` when it read the map.
    pub fn allocation_map_rebuilt(&self) -> Option<&str> {
        self.owner.as_ref()?.map_rebuilt.as_deref()
    }

    /// The descriptor: the owner's current one, or on a client-only mount the one read
    /// when it mounted.
    pub fn descriptor(&self) -> FsDescriptor {
        match (&self.owner, &self.client_desc) {
            (Some(owner), _) => owner.desc.lock().clone(),
            (None, Some(desc)) => desc.lock().clone(),
            (None, None) => unreachable!("a mount has an owner or a client descriptor"),
        }
    }

    /// The owner's state. Only owner-side code calls this (the metanode's answers, log,
    /// checkpoint, restripe, disk changes), and only on a mount that owns the shards:
    /// every public entry point that reaches it on a client-only mount is refused first
    /// with [`FileSystem::owner_here`], and the data path and namespace calls of a client
    /// go to [`FileSystem::metanode`] and [`FileSystem::namespace_of`].
    pub(crate) fn owner(&self) -> &Owner {
        self.owner
            .as_ref()
            .expect("owner-side call on a client-only mount (refuse it with owner_here)")
    }

    /// Whether this mount owns the file system's metadata (the single-node mount), or is a
    /// client of the node that does.
    pub fn is_owner(&self) -> bool {
        self.owner.is_some()
    }

    /// Where a request about `ino` goes: here when this mount owns the slot that serves
    /// its shard; to the file system manager for slot 0's shards (or when no way to
    /// another slot's owner is known: it answers that the shard is elsewhere); to the
    /// owner of the slot otherwise. A mount that routes through its own wire form sends
    /// everything there.
    pub(crate) fn route(&self, ino: Ino) -> Route<'_> {
        let manager = self.remote.get();
        if self.loopback.load(Ordering::Relaxed) {
            if let Some(r) = manager {
                return Route::There(r);
            }
        }
        let slot = self.slot_serving(ino);
        if self.owner.is_some() && slot == self.owner_slot() {
            return Route::Here;
        }
        if slot != 0 {
            if let Some(r) = self.slot_route(slot) {
                return Route::There(r);
            }
        }
        match manager {
            Some(r) => Route::There(r),
            None => Route::Here,
        }
    }

    /// Whether this mount's own metanode serves `ino` (so that it tells this node's kernel
    /// of every change other nodes make to it, and the kernel may cache it).
    pub fn serves(&self, ino: Ino) -> bool {
        self.owner.is_some() && matches!(self.route(ino), Route::Here)
    }

    /// The owner slot that serves `ino`'s shard, as this mount last read the owner map.
    pub(crate) fn slot_serving(&self, ino: Ino) -> u32 {
        match self.owner_map.len() as u64 {
            0 => 0,
            n => self.owner_map[(ino % n) as usize].load(Ordering::Relaxed),
        }
    }

    /// The owner slots other than 0 this mount knows of: those the owner map gives shards,
    /// those given allocation regions (before any shard) and those made in `desc`.
    pub(crate) fn slots_beside_the_manager(
        &self,
        desc: &FsDescriptor,
    ) -> std::collections::BTreeSet<u32> {
        self.owner_map
            .iter()
            .map(|cell| cell.load(Ordering::Relaxed))
            .chain(
                (0..crate::slot::region_count(desc) as usize)
                    .map(|r| crate::slot::region_owner(desc, r)),
            )
            .chain(desc.slot_regions().iter().map(|r| r.slot))
            .filter(|s| *s != 0)
            .collect()
    }

    /// Whoever answers for owner slot `slot` here: this mount if it owns the slot, else the
    /// way to its owner if this mount has one.
    pub(crate) fn slot_namespace(&self, slot: u32) -> Option<&dyn crate::metanode::Namespace> {
        if self.owner.is_some() && slot == self.owner_slot() {
            return Some(self);
        }
        self.slot_route(slot)
            .map(|r| r as &dyn crate::metanode::Namespace)
    }

    /// The way to the owner of `slot`, made on first use from `route_slots_through`.
    pub(crate) fn slot_route(&self, slot: u32) -> Option<&crate::metanode_wire::RemoteMetanode> {
        let cell = self.slot_routes.get(slot as usize)?;
        if let Some(r) = cell.get() {
            return Some(r);
        }
        let channel = (self.slot_channel.get()?)(slot)?;
        let remote = crate::metanode_wire::RemoteMetanode::new(channel, self.devices.clone());
        let _ = cell.set(Arc::new(remote));
        cell.get().map(|r| &**r)
    }

    /// Sets where requests go from the owner map of `desc`; returns whether it changed.
    pub(crate) fn learn_owner_map(&self, desc: &FsDescriptor) -> bool {
        let mut changed = false;
        for (s, cell) in self.owner_map.iter().enumerate() {
            let slot = desc.shard_owner(s).slot;
            if cell.swap(slot, Ordering::Relaxed) != slot {
                changed = true;
            }
        }
        changed
    }

    /// Reads the owner map from the disks again (a request found its shard elsewhere);
    /// returns whether it changed. An owner's own map changes only by its own gives and
    /// takes, which set it.
    pub(crate) fn reread_owner_map(&self) -> FsResult<bool> {
        let desc = read_descriptor(&self.devices.all())?;
        Ok(self.learn_owner_map(&desc))
    }

    /// The owner slot this mount owns: 0 for the file system manager (and for a
    /// client-only mount, which owns none).
    pub fn owner_slot(&self) -> u32 {
        self.owner
            .as_ref()
            .and_then(|o| o.slot.as_ref())
            .map_or(0, |s| s.number)
    }

    /// Refuses `what` on the owner of a slot other than 0: it changes the descriptor (disks,
    /// replication, policies, the owner map) or works on every shard or allocation region,
    /// which is the file system manager's alone.
    pub(crate) fn manager_here(&self, what: &str) -> FsResult<()> {
        match self.owner_slot() {
            0 => Ok(()),
            slot => Err(FsError::NotSupported(format!(
                "{what} on the owner of slot {slot} of {}: only the file system manager \
                 (slot 0) changes the descriptor or works on every shard and allocation \
                 region; run it on that node (`tessera mount ls {} -L` names it)",
                self.geo.fs_name, self.geo.fs_name
            ))),
        }
    }

    /// Refuses `what` on a client-only mount: it changes or reads what only the owner
    /// keeps, so it must run on the node that owns the file system.
    pub(crate) fn owner_here(&self, what: &str) -> FsResult<()> {
        if self.owner.is_none() {
            return Err(FsError::NotOwner {
                what: what.to_string(),
                fs: self.descriptor().name,
            });
        }
        Ok(())
    }

    pub fn pmon(&self) -> PmonSnapshot {
        self.pmon.snapshot()
    }

    /// Read and write latencies by request size in fine buckets (the Prometheus histograms).
    pub fn latency_histograms(&self) -> crate::pmon::LatencyHistograms {
        self.pmon.latency_histograms()
    }

    /// Held shared by readers and by writers of whole blocks, exclusively by operations that
    /// change a file's shape (truncate, fallocate, inline data).
    pub(crate) fn inode_lock(&self, ino: Ino) -> &RwLock<()> {
        &self.inode_locks[(ino % INODE_LOCK_STRIPES as u64) as usize]
    }

    /// Held shared by writers that stay inside a block's extent, exclusively by writers that
    /// change it; taken under the inode lock.
    pub(crate) fn block_lock(&self, ino: Ino, block: u64) -> &RwLock<()> {
        &self.block_locks[stripe(&[ino, block], BLOCK_LOCK_STRIPES)]
    }

    /// Locks the segments of block `block` that bytes `off..off+len` touch, so that writers
    /// sharing the block never write the same sectors at once (their log records and their
    /// data would land in different orders). Stripes are taken in ascending order.
    pub(crate) fn segment_locks(
        &self,
        ino: Ino,
        block: u64,
        off: u64,
        len: u64,
    ) -> Vec<parking_lot::MutexGuard<'_, ()>> {
        let first = off / SEGMENT_BYTES;
        let last = (off + len.max(1) - 1) / SEGMENT_BYTES;
        let mut stripes: Vec<usize> = (first..=last)
            .map(|s| stripe(&[ino, block, s], BLOCK_LOCK_STRIPES))
            .collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .into_iter()
            .map(|i| self.segment_locks[i].lock())
            .collect()
    }

    /// fsck's fixes of what this owner serves, logged and applied as one transaction.
    pub(crate) fn log_repairs(&self, fixes: Vec<Change>) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        self.log(&mut m, fixes).map(drop)
    }

    /// Logs a transaction and applies it. The caller holds the metadata lock, so log order is
    /// apply order.
    pub(crate) fn log(&self, m: &mut Meta, mut changes: Vec<Change>) -> FsResult<Lsn> {
        if let Some((client, seq)) = ANSWERING.take() {
            // The first record of a client's request says it was done (see
            // `Change::Answered`), atomically with what it did.
            changes.push(Change::Answered { client, seq });
        }
        let protections = self.protections_changed(m, &changes);
        let record = postcard::to_stdvec(&changes).expect("changes serialize");
        let lsn = match self.journal().append(&record) {
            Ok(lsn) => lsn,
            Err(JournalError::Full { .. }) => {
                self.checkpoint_locked(m)?;
                self.journal().append(&record)?
            }
            Err(e) => return Err(e.into()),
        };
        for change in &changes {
            if let Some((_, _, block)) = change.mapped_block() {
                for e in block.extents() {
                    m.unlogged.remove(&e);
                }
            }
            let freed = match m.state.apply(change) {
                Ok(freed) => freed,
                // A page of metadata that cannot be read or is damaged: the change is in the
                // log but not in memory, so this node must stop writing; the next mount
                // replays the log (and fsck repairs what the damage left).
                Err(e @ (FsError::Io(_) | FsError::Corrupt(_))) => {
                    tracing::error!(
                        "applying a logged change failed: {e}; fencing the file system"
                    );
                    self.fenced.store(true, Ordering::SeqCst);
                    return Err(e);
                }
                Err(e) => panic!("metanode built a change it cannot apply: {e}"),
            };
            m.pending_free.extend(freed.into_iter().map(|e| (lsn, e)));
        }
        let durable = self.journal().durable_lsn();
        m.uncommitted
            .note(&changes, lsn, crate::read_tokens::SERVING.get(), durable);
        // Before the operation that logged it returns: no node goes on reading what this
        // changed from a view it holds.
        self.owner()
            .meta
            .holders
            .revoke_changed(&changes, &protections);
        self.pmon.inode_update();
        if m.state.store_mut().dirty_pages() > self.owner().dirty_pages_hard.load(Ordering::Relaxed)
        {
            // The background checkpoint did not keep up: write the changed pages now, so
            // that memory stays bounded however fast metadata changes.
            self.checkpoint_locked(m)?;
        }
        Ok(lsn)
    }

    /// The inodes whose protection (what permission checks read: kind, mode, owner, group,
    /// ACL) `changes` change, among those another node holds it of
    /// (`read_tokens::protection_key`); read before the changes are applied. Any change
    /// of an extended attribute counts (ACLs are extended attributes), and so does
    /// freeing the inode.
    fn protections_changed(&self, m: &mut Meta, changes: &[Change]) -> Vec<Ino> {
        let holders = &self.owner().meta.holders;
        let mut changed = Vec::new();
        for change in changes {
            let ino = match change {
                Change::PutAttr(a) => a.ino,
                Change::SetXattr { ino, .. }
                | Change::RemoveXattr { ino, .. }
                | Change::FreeInode { ino } => *ino,
                _ => continue,
            };
            if !holders.held_by_any(crate::read_tokens::protection_key(ino)) {
                continue;
            }
            let same = match (change, m.state.attr(ino)) {
                (Change::PutAttr(new), Ok(old)) => {
                    (old.kind, old.perm, old.uid, old.gid) == (new.kind, new.perm, new.uid, new.gid)
                }
                _ => false,
            };
            if !same {
                changed.push(ino);
            }
        }
        changed
    }

    /// Makes every change logged up to `lsn` durable. Data blocks are flushed first: a logged
    /// change may reference data written just before it, and the log must never promise data
    /// the drives could still lose.
    pub(crate) fn commit(&self, lsn: Lsn) -> FsResult<()> {
        self.check_fenced()?;
        if self.journal().durable_lsn() >= lsn {
            return Ok(());
        }
        // Group commit: one caller flushes and commits everything appended so far while the
        // others wait, then find their records durable.
        let _one = self.owner().commit_lock.lock();
        if self.journal().durable_lsn() >= lsn {
            return Ok(());
        }
        let upto = self.journal().appended_lsn();
        self.flush_devices()?;
        self.journal().commit(upto)?;
        self.release_frees();
        Ok(())
    }

    /// Makes a synchronous write durable: when its log record is already durable (an
    /// in-place overwrite commits first), only the drives it wrote need a flush.
    pub(crate) fn commit_data(&self, lsn: Lsn, disks: &[u16]) -> FsResult<()> {
        if self.journal().durable_lsn() >= lsn {
            // One copy's disk failing leaves the write durable on the others.
            let mut flushed = false;
            for disk in disks {
                flushed |= self.flush_disk(*disk)?;
            }
            if !flushed && !disks.is_empty() {
                return Err(FsError::Io(std::io::Error::other(
                    "no disk the write went to could be flushed: every one is down",
                )));
            }
            return Ok(());
        }
        self.commit(lsn)
    }

    /// Commits everything logged so far (fsync, sync, periodic flush).
    pub fn sync(&self) -> FsResult<()> {
        self.flush_all_gathered();
        self.commit_all()
    }

    /// Commits everything logged so far, past anything gathered (`write_behind.rs`).
    pub(crate) fn commit_all(&self) -> FsResult<()> {
        self.commit_other_owners(false)?;
        self.sync_own()
    }

    /// Commits everything the other owners this mount reached logged so far, this
    /// client's updates among them (its own data is flushed first, see
    /// `RemoteMetanode::commit`): the manager, unless this mount's requests loop back to
    /// its own owner (committed by `sync_own`), and each other slot's owner that holds
    /// writes of this mount not known durable. With `unmounting`, a slot's owner that does
    /// not answer is named, not waited for: one that unmounted since made what it
    /// acknowledged durable with its final checkpoint, and one that died loses only what
    /// no fsync asked for (its log is replayed at its next mount).
    fn commit_other_owners(&self, unmounting: bool) -> FsResult<()> {
        for (slot, remote) in self.slot_routes.iter().enumerate() {
            let Some(remote) = remote.get().filter(|r| r.has_unsynced()) else {
                continue;
            };
            if unmounting {
                remote.leaving();
            }
            match crate::metanode::Metanode::commit(&**remote, Lsn::MAX) {
                Err(e) if unmounting => tracing::warn!(
                    "{}: writes owner slot {slot} acknowledged are not known durable at \
                     unmount: {e}",
                    self.geo.fs_name
                ),
                other => other?,
            }
        }
        if let Some(remote) = self
            .remote
            .get()
            .filter(|_| !self.loopback.load(Ordering::SeqCst))
        {
            crate::metanode::Metanode::commit(&**remote, Lsn::MAX)?;
        }
        Ok(())
    }

    /// Commits everything this mount's own owner logged so far (nothing on a client-only
    /// mount): what an owner does before it answers another node's change.
    pub(crate) fn sync_own(&self) -> FsResult<()> {
        if self.owner.is_none() {
            return Ok(());
        }
        let lsn = self.journal().appended_lsn();
        self.commit(lsn)?;
        // Space released by changes that another caller made durable comes back now too.
        self.release_frees();
        Ok(())
    }

    fn flush_devices(&self) -> FsResult<()> {
        for disk in 0..self.devices.len() {
            self.flush_disk(disk as u16)?;
        }
        Ok(())
    }

    /// Flushes one disk; `Ok(false)` when it is down, or failed and was taken out: with
    /// copies elsewhere a data disk that fails is marked down, and what it may have lost
    /// fails its checksums and is read from another copy.
    fn flush_disk(&self, disk: u16) -> FsResult<bool> {
        if self.devices.is_down(disk) {
            return Ok(false);
        }
        match self.devices.get(disk).flush() {
            Ok(()) => Ok(true),
            Err(e) if self.replicated() && !self.holds_metadata(disk) => {
                self.mark_down(disk, &format!("a flush failed: {e}"));
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn release_frees(&self) {
        let durable = self.journal().durable_lsn();
        let to_discard = {
            let mut m = self.owner().meta.lock();
            let to_discard = release_frees_upto(&mut m, durable, &self.devices);
            self.apply_deferred_frees(&mut m);
            to_discard
        };
        if to_discard.is_empty() {
            return;
        }
        self.discard_and_free(&to_discard);
    }

    /// Deallocates `extents` (listed in `discarding`) outside the metadata lock, since it
    /// is I/O, then returns them to the allocator. Returns the bytes deallocated.
    fn discard_and_free(&self, extents: &[Extent]) -> u64 {
        let bytes = self.discard_extents(extents);
        let mut m = self.owner().meta.lock();
        for extent in extents {
            let at = m
                .discarding
                .iter()
                .position(|e| e == extent)
                .expect("an extent being discarded is listed");
            m.discarding.swap_remove(at);
            if let Err(e) = m.alloc.free(*extent) {
                panic!("freeing {extent:?} after its discard: {e}");
            }
        }
        bytes
    }

    /// Gives freed data blocks of disk `disk` back to the device from now on (`thinDiskType`
    /// other than `no`), or stops. The device must be able to deallocate.
    pub fn set_discard(&self, disk: u16, on: bool) -> FsResult<()> {
        self.owner_here("turning discard on or off")?;
        let dev = self
            .devices
            .try_get(disk)
            .ok_or_else(|| FsError::Invalid(format!("the file system has no disk {disk}")))?;
        if on && !dev.can_discard() {
            return Err(FsError::Invalid(format!(
                "{}: the device cannot deallocate space (no hole punching or discard)",
                dev.name()
            )));
        }
        self.devices.set_discard(disk, on);
        Ok(())
    }

    /// Gives every wholly free block of the thin-provisioned disks back to the device
    /// (`tessera fs reclaimspace`, mmreclaimspace): space freed before TRIM was turned on,
    /// or whose discard failed. Runs beside I/O: a batch of free blocks is taken from the
    /// allocator (listed as being discarded, so a checkpoint stores them free), discarded
    /// outside the metadata lock, then freed again. `progress` gets blocks looked at and
    /// the total. Returns the bytes given back per disk index.
    pub fn reclaim_space(&self, progress: &mut dyn FnMut(u64, u64)) -> FsResult<Vec<(u16, u64)>> {
        const BATCH_BLOCKS: u64 = 256;
        self.owner_here("reclaiming space")?;
        self.manager_here("reclaiming space")?;
        self.check_fenced()?;
        let (disks, spb) = {
            let m = self.owner().meta.lock();
            let disks: Vec<(u16, u64)> = m
                .alloc
                .disks()
                .iter()
                .filter(|d| self.devices.discard(d.disk))
                .map(|d| (d.disk, d.blocks))
                .collect();
            (disks, m.alloc.sub_blocks_per_block())
        };
        let total: u64 = disks.iter().map(|(_, blocks)| blocks).sum();
        let mut done = 0;
        let mut given_back = Vec::new();
        for (disk, blocks) in disks {
            let mut bytes = 0;
            let mut b = 0;
            while b < blocks {
                let end = (b + BATCH_BLOCKS).min(blocks);
                let taken: Vec<Extent> = {
                    let mut m = self.owner().meta.lock();
                    let mut taken = Vec::new();
                    for block in b..end {
                        let e = Extent {
                            addr: tessera_alloc::DiskAddr {
                                disk,
                                sub_block: block * u64::from(spb),
                            },
                            sub_blocks: spb,
                        };
                        if m.alloc.is_free(e) && m.alloc.mark_used(e).is_ok() {
                            taken.push(e);
                        }
                    }
                    m.discarding.extend_from_slice(&taken);
                    taken
                };
                bytes += self.discard_and_free(&taken);
                done += end - b;
                progress(done, total);
                b = end;
            }
            given_back.push((disk, bytes));
        }
        Ok(given_back)
    }

    /// The NSD name of each disk, by disk index.
    pub fn disk_names(&self) -> Vec<String> {
        self.devices.names()
    }

    /// Bytes given back to thin-provisioned disks since the mount, and discards that failed.
    pub fn discard_stats(&self) -> (u64, u64) {
        self.owner.as_ref().map_or((0, 0), |owner| {
            (
                owner.discarded_bytes.load(Ordering::Relaxed),
                owner.discard_errors.load(Ordering::Relaxed),
            )
        })
    }

    /// Deallocates `extents` on their disks, adjacent ones in one request. A failure costs
    /// only thinness: the blocks are free either way, and the error is logged. Returns the
    /// bytes deallocated.
    pub(crate) fn discard_extents(&self, extents: &[Extent]) -> u64 {
        let mut given_back = 0;
        let desc = self.owner().desc.lock().clone();
        let sub = u64::from(desc.sub_block_size);
        let mut sorted: Vec<Extent> = extents.to_vec();
        sorted.sort_by_key(|e| (e.addr.disk, e.addr.sub_block));
        let mut i = 0;
        while i < sorted.len() {
            let first = sorted[i];
            let mut end = first.addr.sub_block + u64::from(first.sub_blocks);
            let mut j = i + 1;
            while j < sorted.len()
                && sorted[j].addr.disk == first.addr.disk
                && sorted[j].addr.sub_block == end
            {
                end += u64::from(sorted[j].sub_blocks);
                j += 1;
            }
            let dev = self.devices.get(first.addr.disk);
            let offset = desc.sub_block_offset(first.addr.sub_block);
            let len = (end - first.addr.sub_block) * sub;
            match dev.discard(offset, len) {
                Ok(()) => {
                    self.owner()
                        .discarded_bytes
                        .fetch_add(len, Ordering::Relaxed);
                    given_back += len;
                }
                Err(e) => {
                    self.owner().discard_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "{}: cannot give {len} freed bytes back to the device: {e}",
                        desc.name
                    );
                }
            }
            i = j;
        }
        given_back
    }

    /// Writes a checkpoint if the log is getting full or many metadata pages changed.
    pub fn maybe_checkpoint(&self) -> FsResult<()> {
        if self.owner.is_none() {
            return Ok(());
        }
        let used = self.journal().used_bytes() as f64;
        let dirty = self.owner().meta.lock().state.store_mut().dirty_pages();
        if used > self.journal().capacity_bytes() as f64 * CHECKPOINT_LOG_FRACTION
            || dirty > self.owner().dirty_pages_soft.load(Ordering::Relaxed)
        {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Writes the metadata pages changed since the last checkpoint and a new descriptor
    /// naming the new shard roots, then trims the log. Only the placing of the pages holds
    /// the metadata lock; their I/O runs beside new changes, which copy the pages they
    /// change again and land in the log after the checkpoint's LSN.
    pub fn checkpoint(&self) -> FsResult<()> {
        // Lock order: metadata, then checkpoint (as in `log`, which checkpoints when full).
        self.owner_here("a checkpoint")?;
        self.check_fenced()?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        self.apply_deferred_frees(&mut m);
        let lsn = self.journal().appended_lsn();
        let started = std::time::Instant::now();
        let prepared = self.prepare_checkpoint(&mut m)?;
        drop(m);
        let locked = started.elapsed();
        let result = self.write_checkpoint(lsn, &prepared);
        tracing::debug!(
            "checkpoint of {} metadata pages: {} ms under the metadata lock, {} ms in all",
            prepared.pages.len(),
            locked.as_millis(),
            started.elapsed().as_millis()
        );
        if result.is_err() {
            // Set before the checkpoint lock goes: no later checkpoint may start from a
            // cache that names pages this one failed to write.
            self.owner().checkpoint_failed.store(true, Ordering::SeqCst);
        }
        // Lock order is metadata, then checkpoint: let the checkpoint lock go before taking
        // the metadata lock again.
        drop(_one);
        self.finish_checkpoint(&mut self.owner().meta.lock(), &prepared, &result);
        result
    }

    /// The recovery log as of now.
    pub(crate) fn journal(&self) -> Arc<Journal> {
        Arc::clone(&self.owner().journal.read())
    }

    /// Makes `journal` the recovery log (the caller holds the metadata and checkpoint locks
    /// and has made the old one durable up to where the new one starts).
    pub(crate) fn replace_journal(&self, journal: Journal) {
        *self.owner().journal.write() = Arc::new(journal);
    }

    /// A checkpoint that carries an administrative change of the descriptor (disks added or
    /// deleted, map regions or the log moved). When it fails, whether its descriptor landed
    /// only a mount can tell (it replays the log over whichever is durable), so this mount
    /// takes no further checkpoint; with `stop_commits` no further commit either, for
    /// changes after which the in-memory state names disks or a log that the durable
    /// descriptor may not. The error says `what` failed and `then` what to do.
    pub(crate) fn commit_descriptor_change(
        &self,
        m: &mut Meta,
        stop_commits: bool,
        what: &str,
        then: &str,
    ) -> FsResult<()> {
        self.checkpoint_under_lock(m).map_err(|e| {
            self.stop_checkpoints();
            if stop_commits {
                self.fence_commits();
            }
            FsError::Corrupt(format!(
                "{what} failed while writing the checkpoint that commits it: {e}; {then}"
            ))
        })
    }

    /// Changes the descriptor with `change` and commits it in a checkpoint (under the
    /// metadata and checkpoint locks), putting the previous one back in memory when that
    /// fails; `what` and `then` as for [`Self::commit_descriptor_change`].
    pub(crate) fn change_descriptor(
        &self,
        what: &str,
        then: &str,
        change: impl FnOnce(&mut FsDescriptor),
    ) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let mut next = self.owner().desc.lock().clone();
        change(&mut next);
        self.commit_next_descriptor(&mut m, next, what, then)
    }

    /// Puts `next` in place of the descriptor and commits it in a checkpoint (the caller
    /// holds the metadata and checkpoint locks), putting the previous one back in memory
    /// when that fails; `what` and `then` as for [`Self::commit_descriptor_change`].
    pub(crate) fn commit_next_descriptor(
        &self,
        m: &mut Meta,
        next: FsDescriptor,
        what: &str,
        then: &str,
    ) -> FsResult<()> {
        let previous = std::mem::replace(&mut *self.owner().desc.lock(), next);
        let committed = self.commit_descriptor_change(m, false, what, then);
        if committed.is_err() {
            *self.owner().desc.lock() = previous;
        }
        committed
    }

    /// Every later commit and checkpoint fails, without waiting for the flusher (the caller
    /// may hold the metadata lock); `fence` does the rest at unmount.
    pub(crate) fn fence_commits(&self) {
        self.fenced.store(true, Ordering::SeqCst);
    }

    /// No checkpoint after this one until a remount: the in-memory state may describe
    /// something no durable descriptor does.
    pub(crate) fn stop_checkpoints(&self) {
        self.owner().checkpoint_failed.store(true, Ordering::SeqCst);
    }

    /// A checkpoint while the caller holds the metadata lock (the log is full).
    fn checkpoint_locked(&self, m: &mut Meta) -> FsResult<()> {
        let _one = self.owner().checkpoint_lock.lock();
        self.checkpoint_under_lock(m)
    }

    /// A checkpoint while the caller holds the metadata lock and the checkpoint lock (an
    /// administrative change of the descriptor that the checkpoint must carry).
    pub(crate) fn checkpoint_under_lock(&self, m: &mut Meta) -> FsResult<()> {
        self.check_fenced()?;
        self.apply_deferred_frees(m);
        let lsn = self.journal().appended_lsn();
        let prepared = self.prepare_checkpoint(m)?;
        let result = self.write_checkpoint(lsn, &prepared);
        if result.is_err() {
            self.owner().checkpoint_failed.store(true, Ordering::SeqCst);
        }
        self.finish_checkpoint(m, &prepared, &result);
        result
    }

    fn prepare_checkpoint(&self, m: &mut Meta) -> FsResult<crate::checkpoint::Prepared> {
        if self.owner().checkpoint_failed.load(Ordering::SeqCst) {
            m.state.store_mut().poison();
            return Err(FsError::Corrupt(
                "an earlier checkpoint could not write its metadata pages; unmount and mount \
                 again to recover from the log"
                    .into(),
            ));
        }
        let desc = self.owner().desc.lock().clone();
        let unrecorded: Vec<Extent> = m
            .pending_free
            .iter()
            .map(|(_, e)| *e)
            .chain(m.unlogged.iter().copied())
            .chain(m.discarding.iter().copied())
            .collect();
        let slot = self.owner_slot();
        let released = match slot {
            0 => crate::slot::released_hand_over_roots(&desc, &self.devices),
            _ => Vec::new(),
        };
        let Meta { state, alloc, .. } = m;
        crate::checkpoint::prepare(
            &desc,
            slot,
            &self.devices,
            alloc,
            state,
            &unrecorded,
            &released,
        )
    }

    /// After the pages are written (or not): unpin them, or, when they could not be
    /// written, stop checkpointing: the cache now names pages that are not on disk, and only
    /// a remount (replaying the log over the last durable checkpoint) is safe.
    fn finish_checkpoint(
        &self,
        m: &mut Meta,
        prepared: &crate::checkpoint::Prepared,
        result: &FsResult<()>,
    ) {
        match result {
            Ok(()) => m.state.store_mut().written(prepared.generation),
            Err(e) => {
                tracing::error!(
                    "checkpoint of {} metadata pages failed: {e}; no more checkpoints until \
                     the file system is remounted",
                    prepared.pages.len()
                );
                m.state.store_mut().poison();
            }
        }
        self.apply_deferred_frees(m);
    }

    /// Writes the pages of a prepared checkpoint and the descriptor that names them, then
    /// trims the log. The pages it superseded are freed the next time the metadata lock is
    /// taken for it.
    fn write_checkpoint(&self, lsn: Lsn, prepared: &crate::checkpoint::Prepared) -> FsResult<()> {
        // Pages up to the checkpoint LSN must exist on disk so that replay can find the first
        // record after it.
        if self.journal().durable_lsn() < lsn {
            self.flush_devices()?;
            self.journal().commit(lsn)?;
        }
        // Where the map regions are is read past the gate: a move may hold them.
        let chunk_writes = self.enter_chunk_writes();
        let mut desc = self.owner().desc.lock().clone();
        crate::checkpoint::write_pages(&desc, &self.devices, prepared)?;
        let mut map_slots = self.owner().map_slots.lock();
        let chunks = crate::alloc_map::write_chunks(
            &mut desc,
            &self.devices,
            &map_slots,
            prepared.generation,
            &prepared.map,
        )?;
        drop(chunk_writes);
        match &self.owner().slot {
            // Slot 0's commit point is the descriptor.
            None => {
                desc.checkpoint.replay_from = lsn;
                prepared.name_in(&mut desc);
                self.write_descriptor(desc)?;
            }
            // Another slot's is its record.
            Some(slot) => {
                let mut record = slot.record.lock();
                let next = crate::slot::SlotRecord {
                    slot: slot.number,
                    generation: record.generation + 1,
                    replay_from: lsn,
                    page_generation: prepared.generation,
                    shards: prepared
                        .held
                        .iter()
                        .map(|&s| crate::slot::SlotShard {
                            shard: s as u32,
                            generation: desc.shard_owner(s).generation,
                            root: prepared.roots[s],
                            second: Some(prepared.root_mirrors[s])
                                .filter(|a| *a != crate::descriptor::NO_SECOND_COPY),
                        })
                        .collect(),
                    regions: crate::slot::regions_of(&desc, slot.number)
                        .into_iter()
                        .map(|r| r as u32)
                        .collect(),
                    given_back: slot.given_back.lock().clone(),
                    map_digest: map_slots.digest_with(&chunks, prepared.generation),
                    disks_covered: prepared.disks_covered,
                    // Exactly the disks its allocator and digest leave out that the
                    // descriptor still names (one deleted since needs no mention).
                    dropped: slot
                        .dropped
                        .lock()
                        .iter()
                        .copied()
                        .filter(|d| desc.disks.iter().any(|x| x.index == *d))
                        .collect(),
                };
                let region = slot.region.lock().clone();
                let missed =
                    crate::slot::write_record_copies(&desc, &self.devices, &region, &next)?;
                if let Some(log) = &*self.owner().log_copies.read() {
                    // A copy whose record is older than the other's is behind, recorded
                    // before the pages this checkpoint supersedes may be reused.
                    for (c, why) in missed {
                        log.missed(c, &why)?;
                    }
                }
                *record = next;
            }
        }
        map_slots.commit(&chunks, prepared.generation);
        drop(map_slots);
        self.journal().set_tail(lsn);
        self.owner()
            .deferred_frees
            .lock()
            .extend(prepared.superseded.iter().copied());
        Ok(())
    }

    /// Writes `desc` as the next descriptor generation and makes it the one in memory. A
    /// log copy that falls behind writes the descriptor from inside a commit, possibly while
    /// a checkpoint is between its copy of the descriptor and this write: both go through
    /// the newest written descriptor, one at a time, and the generation and the log's state
    /// are taken as they are now, so neither write undoes the other.
    pub(crate) fn write_descriptor(&self, mut desc: FsDescriptor) -> FsResult<()> {
        self.manager_here("writing the file-system descriptor")?;
        let mut written = self.owner().written_desc.lock();
        assert_eq!(
            self.owner().desc.lock().generation,
            written.generation,
            "a descriptor of a mounted file system was written around write_descriptor"
        );
        desc.generation = written.generation + 1;
        if let (Some(copies), Some(log)) =
            (&mut desc.metadata_copies, &*self.owner().log_copies.read())
        {
            copies.log_behind = log.behind();
        }
        // Owner slots' log states are theirs to say (`record_slot_log_state` writes them
        // straight into the newest written descriptor): a change made from an older copy of
        // the descriptor keeps them as the newest says.
        let newest = written
            .slot_regions()
            .iter()
            .chain(written.slot_moves.iter().flatten());
        for r in slot_regions_mut(&mut desc) {
            let recorded = newest.clone().find(|n| n.same_place(r));
            if let (Some(second), Some(recorded)) = (&mut r.second, recorded) {
                second.log_behind = recorded.second.and_then(|s| s.log_behind);
            }
        }
        crate::descriptor::write_descriptor_quorum(&desc, &self.devices.up())?;
        *written = desc.clone();
        *self.owner().desc.lock() = desc;
        Ok(())
    }

    /// Writes the newest written descriptor again with the log copies' state as it is now
    /// (a copy fell behind, or caught up): nothing else of it changes, so an administrative
    /// change waiting in memory for its checkpoint is not written before its time.
    pub(crate) fn record_log_state(&self) -> FsResult<()> {
        self.manager_here("recording the state of the recovery log's copies")?;
        let behind = self
            .owner()
            .log_copies
            .read()
            .as_ref()
            .and_then(|l| l.behind());
        self.rewrite_written_descriptor(&|desc| {
            if let Some(copies) = &mut desc.metadata_copies {
                copies.log_behind = behind;
            }
            Ok(true)
        })?;
        Ok(())
    }

    /// Writes the newest written descriptor again, one generation on, with `change` made
    /// (when it says it changed something), and makes the same change to the one in memory;
    /// nothing else of either changes. Returns whether it wrote.
    fn rewrite_written_descriptor(
        &self,
        change: &dyn Fn(&mut FsDescriptor) -> FsResult<bool>,
    ) -> FsResult<bool> {
        let mut written = self.owner().written_desc.lock();
        let mut desc = written.clone();
        if !change(&mut desc)? {
            return Ok(false);
        }
        desc.generation += 1;
        crate::descriptor::write_descriptor_quorum(&desc, &self.devices.up())?;
        let mut current = self.owner().desc.lock();
        current.generation = desc.generation;
        // What it changes may be gone from the one in memory (a change waiting for its
        // checkpoint removed it).
        let _ = change(&mut current);
        *written = desc;
        Ok(true)
    }

    /// On the file system manager: writes the newest written descriptor again with the
    /// state of the copies of owner slot `slot`'s log `log_id` as its owner says it is now
    /// (`Namespace::record_slot_log`: `Some(c)` copy `c` lacks records, `None` both are
    /// current), in the slot's region or in the region a move of it reserves; as
    /// [`FileSystem::record_log_state`], nothing else of it changes.
    pub(crate) fn record_slot_log_state(
        &self,
        slot: u32,
        log_id: [u8; 16],
        behind: Option<u8>,
    ) -> FsResult<()> {
        self.manager_here("recording the state of an owner slot's log copies")?;
        if behind.is_some_and(|c| c > 1) {
            return Err(FsError::Usage(format!(
                "owner slot {slot}: a log has copies 0 and 1, not {behind:?}"
            )));
        }
        let name = self.geo.fs_name.clone();
        let set = |desc: &mut FsDescriptor| -> FsResult<bool> {
            let second = slot_regions_mut(desc)
                .find(|r| r.slot == slot && r.log_id == log_id)
                .and_then(|r| r.second.as_mut());
            match second {
                Some(second) => {
                    let changed = second.log_behind != behind;
                    second.log_behind = behind;
                    Ok(changed)
                }
                None => Err(FsError::Usage(format!(
                    "{name} has no owner slot {slot} whose log {} has two copies (its region \
                     moved meanwhile?)",
                    hex_id(&log_id)
                ))),
            }
        };
        if !self.rewrite_written_descriptor(&set)? {
            return Ok(());
        }
        match behind {
            Some(c) => tracing::warn!(
                "{name}: owner slot {slot}: copy {} of its log lacks records from now on",
                c + 1
            ),
            None => tracing::info!("{name}: owner slot {slot}: both copies of its log are current"),
        }
        Ok(())
    }

    /// A copy of the recovery log that was behind and whose disk is up again is copied
    /// whole from the current one, and the descriptor then records both current.
    pub(crate) fn catch_up_log(&self) -> FsResult<()> {
        let log = self.owner().log_copies.read().clone();
        if let Some(log) = log {
            if log.catch_up()? {
                if let Some(slot) = &self.owner().slot {
                    let desc = self.owner().desc.lock().clone();
                    let record = slot.record.lock();
                    let region = slot.region.lock().clone();
                    crate::slot::write_record_to_caught_up(
                        &desc,
                        &self.devices,
                        &region,
                        &record,
                        &log,
                    )?;
                    drop(record);
                    // An owner slot's log: the manager records it (`record_slot_log`).
                    log.record_state()?;
                } else {
                    self.record_log_state()?;
                    log.set_recorded(None);
                }
            }
        }
        Ok(())
    }

    /// Frees the metadata pages durable checkpoints superseded. Those of thin-provisioned
    /// disks go to the device first: as releases already durable (LSN 0), so the next
    /// release after a commit deallocates them outside the metadata lock, and checkpoints
    /// store them free meanwhile.
    pub(crate) fn apply_deferred_frees(&self, m: &mut Meta) {
        for extent in std::mem::take(&mut *self.owner().deferred_frees.lock()) {
            if self.devices.discard(extent.addr.disk) {
                m.pending_free.push((0, extent));
                continue;
            }
            m.alloc
                .free(extent)
                .expect("deferred extents were allocated");
        }
    }

    /// Stops all writing at once, without a final checkpoint, as a node must when it loses
    /// its lease: the flusher stops and every later commit or checkpoint fails. Whoever mounts
    /// next recovers by replaying the log. Tests use it to simulate a crash.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        self.unmounted.store(true, Ordering::SeqCst);
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.flusher.lock().take() {
            let _ = h.join();
        }
        self.prefetch.stop();
        self.write_behind.stop_landing(true);
    }

    pub(crate) fn check_fenced(&self) -> FsResult<()> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(FsError::Fenced);
        }
        Ok(())
    }

    /// Final checkpoint and stop. Later calls do nothing.
    pub fn unmount(&self) -> FsResult<()> {
        self.unmount_telling_owners(true)
    }

    /// [`FileSystem::unmount`] of a mount that is not its node's last: a slot this node
    /// took over and gives back while its own mount stays. Other owners know holders by
    /// node, so telling them this mount leaves would make them forget what the node's own
    /// mount holds (and stop revoking it): nothing is said, and what this mount held there
    /// stays recorded for the node, which answers revocations of it from its own mount.
    pub fn let_go(&self) -> FsResult<()> {
        self.unmount_telling_owners(false)
    }

    fn unmount_telling_owners(&self, leaving: bool) -> FsResult<()> {
        if self.unmounted.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // Requests already being served finish first; later ones are refused as not
        // served here (`serve_while_mounted`), so their senders look for the owner again.
        drop(self.serving.write());
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.flusher.lock().take() {
            let _ = h.join();
        }
        self.prefetch.stop();
        self.flush_all_gathered();
        self.write_behind.stop_landing(false);
        self.free_lingering(true)?;
        self.commit_other_owners(true)?;
        self.sync_own()?;
        let client = self.owner.is_none()
            || (self.remote.get().is_some() && !self.loopback.load(Ordering::SeqCst));
        // Data tokens kept at other owners go back to them (any mount that wrote another
        // owner's files keeps some, the manager's too).
        self.give_back_all_kept();
        if client {
            // What a client holds goes back to its owners; a slot's owner that is also the
            // manager's client then checkpoints its own slot.
            let slots = self.slot_routes.iter().filter_map(|r| r.get());
            for remote in self.remote.get().into_iter().chain(slots) {
                if leaving {
                    remote.leave();
                } else {
                    remote.give_back_fragments();
                }
            }
        }
        if self.owner.is_none() {
            return Ok(());
        }
        self.checkpoint()
    }

    pub(crate) fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    pub(crate) fn check_inode_limit(&self, m: &Meta) -> FsResult<()> {
        if m.state.inode_count() >= self.geo.max_inodes {
            return Err(FsError::NoInodes {
                max: self.geo.max_inodes,
            });
        }
        Ok(())
    }
}

/// Returns to the allocator the extents released by changes durable up to `durable`, but
/// those of disks that deallocate: they move to `discarding` and are returned.
fn release_frees_upto(m: &mut Meta, durable: Lsn, disks: &DiskSet) -> Vec<Extent> {
    let mut keep = Vec::with_capacity(m.pending_free.len());
    let mut to_discard = Vec::new();
    for (lsn, extent) in std::mem::take(&mut m.pending_free) {
        if lsn > durable {
            keep.push((lsn, extent));
        } else if disks.discard(extent.addr.disk) {
            to_discard.push(extent);
        } else if let Err(e) = m.alloc.free(extent) {
            panic!("freeing {extent:?} released by lsn {lsn}: {e}");
        }
    }
    m.pending_free = keep;
    m.discarding.extend_from_slice(&to_discard);
    to_discard
}

pub(crate) fn geometry(desc: &FsDescriptor) -> Geometry {
    let data_pool = desc.data_pool();
    Geometry {
        block_bytes: u64::from(desc.block_size),
        sub_block_bytes: u64::from(desc.sub_block_size),
        data_start_bytes: tessera_nsd::layout::data_start_bytes(u64::from(desc.block_size)),
        sub_blocks_per_block: desc.sub_blocks_per_block(),
        // Room is left in the inode for attributes and a few extended attributes.
        inline_max_bytes: (desc.inode_size as usize).saturating_sub(256),
        data_pool,
        data_pool_name: desc.pool_name(data_pool).to_string(),
        atime: desc.atime,
        max_inodes: desc.max_inodes,
        fs_name: desc.name.clone(),
        data_copies: desc.replication().data,
    }
}

/// The metadata reserve: when file data can share the system pool's metadata disks (the
/// default data pool or a placement rule's), 1/64 of their blocks, at least four, stay for
/// metadata pages.
pub(crate) fn metadata_reserve(desc: &FsDescriptor) -> u64 {
    let shared: u64 = desc
        .disks
        .iter()
        .filter(|d| d.pool == 0 && d.usage.holds_metadata() && d.usage.holds_data())
        .map(|d| d.blocks)
        .sum();
    if shared == 0 {
        return 0;
    }
    (shared / 64).max(4) * u64::from(desc.sub_blocks_per_block())
}

/// Commits and checkpoints in the background. It holds the file system only while working,
/// so a file system dropped without unmount stops it at the next tick.
fn flusher(fs: Weak<FileSystem>, stop: Arc<(Mutex<bool>, Condvar)>) {
    let mut committed = Instant::now();
    loop {
        let wait = {
            let Some(fs) = fs.upgrade() else { return };
            let commit = COMMIT_INTERVAL.saturating_sub(committed.elapsed());
            fs.lingering_due().map_or(commit, |due| due.min(commit))
        };
        {
            let mut stopped = stop.0.lock();
            if *stopped {
                return;
            }
            stop.1.wait_for(&mut stopped, wait);
            if *stopped {
                return;
            }
        }
        let Some(fs) = fs.upgrade() else { return };
        if let Err(e) = fs.free_lingering(false) {
            tracing::error!("freeing unlinked files kept for other nodes' lookups: {e}");
        }
        if committed.elapsed() < COMMIT_INTERVAL {
            continue;
        }
        committed = Instant::now();
        if !fs.is_owner() {
            // A client-only mount: its owners commit what it sent them.
            fs.flush_all_gathered();
            continue;
        }
        if let Err(e) = fs.sync().and_then(|()| fs.maybe_checkpoint()) {
            tracing::error!("background commit failed: {e}");
        }
    }
}

std::thread_local! {
    /// The client request (client, sequence number) that the metanode request being served
    /// on this thread carries (`MetanodeRequest::Once`): the owner's namespace methods log
    /// their changes themselves, and the first record they log takes it along. A
    /// thread-local rather than an argument: the request crosses the `Namespace` interface,
    /// whose methods must not know whether a local or a remote client called them.
    pub(crate) static ANSWERING: std::cell::Cell<Option<(u64, u64)>> =
        const { std::cell::Cell::new(None) };
}

/// Every owner slot region the descriptor names: the slots' own, and those their moves
/// reserve (`slot_move.rs`).
fn slot_regions_mut(desc: &mut FsDescriptor) -> impl Iterator<Item = &mut crate::slot::SlotRegion> {
    desc.slots
        .iter_mut()
        .flat_map(|s| s.regions.iter_mut())
        .chain(desc.slot_moves.iter_mut().flatten())
}

fn hex_id(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
