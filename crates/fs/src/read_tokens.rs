//! Read tokens on what a client caches of an inode: its attributes, its protection
//! (attributes and access ACL), the bytes it holds, a directory's names (and the absence of
//! a name), and a file's block-map views (size, block references, sector checksums). A
//! client keeps what the owner grants until the owner revokes it, instead of asking the
//! owner for every `stat`, lookup, permission check and read.
//!
//! One token per inode covers everything a node caches of it but its protection: a change
//! of any kind to an inode revokes all of it. Coarser than GPFS's separate attribute,
//! entry and byte-range tokens, and enough: what a client caches of an inode is refetched
//! in one round trip. The protection (kind, mode, owner, group and ACL: what permission
//! checks read) has a token of its own (`protection_key`), revoked only by a change of
//! those: a directory that several nodes create in at once changes its names and times
//! with every create, so its one token is never granted (`HOT_WINDOW`), but each create
//! on every node checks its permissions, a round trip each if they went with the names.
//!
//! A name has a token of its own too (`name_key`): every `Found` and `Made` answer keeps
//! the name it is about under it, revoked only by a change of that name (put or removed).
//! A shared directory that several nodes create in is never granted whole, but the names
//! a node made or found there stay its own until someone renames or removes them, so a
//! `stat` of a file it made asks nothing (IO500's mdtest hard: every rank stats and
//! removes the files it created in one shared directory).
//!
//! The owner grants only to another node (`MetanodeReply::Held`, `HeldView`; what a
//! node's `Make` made too, recorded after it and read again), and only when
//! it can reach that node again (`FileSystem::on_read_revoke`, set by the daemon). It
//! records the holder *before* it reads what it answers, so every change logged after that
//! point finds the holder: `FileSystem::log` takes the holders of every inode a change
//! touches, and once the metadata lock is let go (`MetaGuard`'s drop, on the thread that
//! logged) sends each node `DropHeld` and waits for its answer, before the change's
//! operation returns. Never under the metadata lock: a node answering may itself be waiting
//! for this owner (its daemon's tables are locked by a thread that asks this owner
//! something), and a revocation sent under the lock would wait for it forever. A node that
//! does not answer is waited for until the cluster expels it, as for a fence.
//!
//! The node whose request made the change is not sent a revocation: the owner lists the
//! inodes it holds that its own request changed in the answer (`MetanodeReply::Changed`),
//! and it drops them when the answer arrives. It stays a holder.
//!
//! An inode that was revoked from a node within the last `HOT_WINDOW` is not granted: a
//! directory several nodes create in at once, or a file several nodes write, would
//! otherwise cost a revocation round trip to every other node per change, more than the
//! caching saves. Its readers ask the owner each time until it has been quiet for a while.
//!
//! On the client what was granted is kept only if no revocation (and no change of its own)
//! arrived between sending the request and reading the answer (`HeldCache::seq`): a
//! revocation can overtake the answer it revokes. Everything is dropped when the owner
//! moves (its generation). A cached answer is a copy of what the owner said: a change of
//! another node that returned before a read began was logged before it returned, so its
//! revocation reached this node first, and the read asks again.
//!
//! The kernel of a node keeps names and attributes of other owners' inodes while the
//! mount holds them (`KernelKept`, `FileSystem::kernel_may_keep_name`): a revocation
//! makes the kernel's names invalid when it was given names in a revoked directory, and
//! drops the revoked inodes' attributes, before it is answered, so the change it is for
//! returns only after that. Attributes only in answers to the kernel's `GETATTR`, whose
//! answers a revocation overtook the kernel discards by itself; names only where the
//! kernel knows `FUSE_NOTIFY_INC_EPOCH`, which also makes a name invalid whose lookup was
//! in flight when it came.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::access::Protection;
use crate::inode::{Attr, Ino};
use crate::locks::Origin;
use crate::meta::Change;
use crate::metanode::FileView;

/// Inodes an owner tracks holders for, at most; past it nothing new is granted (the answer
/// is a plain one), so the table stays bounded.
const HELD_INODES_MAX: usize = 65_536;
/// Inodes revoked at once, those granted longest ago, when the table is this close to full
/// (`ReadHolders::evict_if_full`): holders are alive and keep what they were granted until
/// it changes, so without it a table filled once granted nothing to anyone again.
const EVICT_BATCH: usize = HELD_INODES_MAX / 16;
/// Things (views, names, attributes) a client keeps, at most; past it the cache starts
/// over.
const CACHED_MAX: usize = 65_536;
/// How long after a revocation an inode is not granted again (see the module comment):
/// far longer than the round trips it saves, short enough that a directory or file others
/// stopped changing is cached again at once to a person's eye.
pub(crate) const HOT_WINDOW: Duration = Duration::from_millis(250);

/// The bit that makes an inode number the key of its protection's token: inode numbers
/// stay far below it (shards times the inodes of one, both bounded).
const PROTECTION_BIT: Ino = 1 << 63;

/// The key under which owners record holders of `ino`'s protection, and clients keep it.
pub(crate) fn protection_key(ino: Ino) -> Ino {
    debug_assert_eq!(
        ino & PROTECTION_BIT,
        0,
        "inode {ino} collides with a protection key"
    );
    ino | PROTECTION_BIT
}

/// Whether `key` is an inode's own key: neither a protection's nor a name's.
pub(crate) fn is_inode_key(key: Ino) -> bool {
    key & (PROTECTION_BIT | NAME_BIT) == 0
}

/// The bit that makes a key a name's (`name_key`): below the protection bit, above every
/// inode number.
const NAME_BIT: Ino = 1 << 62;

/// The key under which owners record holders of `name` in `dir` alone, and clients keep
/// it (`HeldOf::named`): a hash of the two, so that a change of the name finds its
/// holders without a table per directory. Two names that share a key only revoke each
/// other; a client keeps the directory and name beside the inode, never the key alone.
pub(crate) fn name_key(dir: Ino, name: &[u8]) -> Ino {
    debug_assert_eq!(
        dir & (PROTECTION_BIT | NAME_BIT),
        0,
        "inode {dir} collides with a name key"
    );
    // FNV-1a over the directory and the name, then a finalizer: cheap, and spread well
    // enough that names of one directory rarely share a key.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in dir.to_le_bytes().iter().chain(name) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    NAME_BIT | (h & (NAME_BIT - 1))
}

/// Sends a node the inodes whose held copies it must drop; returns once it answered, or
/// once it is gone from the cluster.
pub(crate) type RevokeHook = Box<dyn Fn(Origin, Vec<Ino>) + Send + Sync>;

/// The nodes holding copies of one inode, and when it was last granted (the table's grant
/// count then): eviction takes the oldest, and leaves an entry granted again meanwhile.
#[derive(Default)]
struct Held {
    of: Vec<Origin>,
    granted: u64,
}

#[derive(Default)]
struct Table {
    holders: HashMap<Ino, Held>,
    /// Grants so far (`Held::granted`).
    grants: u64,
    /// When each inode was last revoked from another node (`HOT_WINDOW`).
    revoked: HashMap<Ino, Instant>,
    /// When the full table was last swept of holders gone from the cluster.
    swept: Option<Instant>,
    /// Files another node may gather writes of (`write_behind.rs`), with that node: only
    /// it is granted them meanwhile, since what others kept would miss its writes.
    gathering: HashMap<Ino, Origin>,
}

/// How often a full table may be swept of holders gone from the cluster: a table full of
/// live holders is not swept on every request.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The owner's record of which nodes hold copies of which inodes.
#[derive(Default)]
pub(crate) struct ReadHolders {
    table: Mutex<Table>,
    count: AtomicUsize,
    /// Entries of `Table::gathering`, read without the lock.
    gathering: AtomicUsize,
    /// An eviction is running (at most one at a time).
    evicting: std::sync::atomic::AtomicBool,
    pub(crate) revoke: std::sync::OnceLock<RevokeHook>,
    /// Names other nodes looked up lately (by `name_key`, with when and by whom), granted
    /// or not: a file whose last name goes right after is kept a moment for the lookup's
    /// node to open (`Namespace::release_or_keep`). Entries older than `FOUND_KEPT` go
    /// when it grows past `FOUND_MAX`.
    found: Mutex<HashMap<Ino, (Instant, Origin)>>,
}

/// How long a lookup by another node counts as recent (`ReadHolders::found_lately`).
pub(crate) const FOUND_KEPT: Duration = Duration::from_secs(1);
/// Names recorded as looked up, at most (pruned of old ones past it).
const FOUND_MAX: usize = 65_536;

std::thread_local! {
    /// The node whose request this thread serves: it is not sent revocations for what its
    /// own request changes, it is told in the answer.
    pub(crate) static SERVING: std::cell::Cell<Option<Origin>> = const { std::cell::Cell::new(None) };
    /// Revocations this thread's changes made, sent once it lets the metadata lock go.
    static PENDING: std::cell::RefCell<Vec<(Origin, Vec<Ino>)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Inodes the serving node holds that this thread's changes touched.
    static OWN_CHANGED: std::cell::RefCell<Vec<Ino>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes the inodes held by the serving node that the changes this thread logged since
/// the last call touched (`MetanodeReply::Changed`).
pub(crate) fn take_own_changed() -> Vec<Ino> {
    let mut inos = OWN_CHANGED.with(|o| std::mem::take(&mut *o.borrow_mut()));
    inos.sort_unstable();
    inos.dedup();
    inos
}

/// The metadata lock of an owner, with its record of view holders: whoever logged
/// changes under it sends their revocations when it lets go (see the module comment).
pub(crate) struct MetaLock {
    meta: Mutex<crate::fs::Meta>,
    pub(crate) holders: std::sync::Arc<ReadHolders>,
}

pub(crate) struct MetaGuard<'a> {
    guard: Option<parking_lot::MutexGuard<'a, crate::fs::Meta>>,
    holders: &'a ReadHolders,
}

impl MetaLock {
    pub(crate) fn new(meta: crate::fs::Meta) -> MetaLock {
        MetaLock {
            meta: Mutex::new(meta),
            holders: std::sync::Arc::default(),
        }
    }

    pub(crate) fn lock(&self) -> MetaGuard<'_> {
        MetaGuard {
            guard: Some(self.meta.lock()),
            holders: &self.holders,
        }
    }
}

impl std::ops::Deref for MetaGuard<'_> {
    type Target = crate::fs::Meta;
    fn deref(&self) -> &crate::fs::Meta {
        self.guard.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for MetaGuard<'_> {
    fn deref_mut(&mut self) -> &mut crate::fs::Meta {
        self.guard.as_mut().expect("held until drop")
    }
}

impl Drop for MetaGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        if pending.is_empty() {
            return;
        }
        let Some(revoke) = self.holders.revoke.get() else {
            return;
        };
        // Each revocation waits for its node's answer (bounded: `Daemon::revoke`); several
        // nodes are asked at once, so a change that many nodes hold waits for the slowest
        // of them, not for their sum.
        let mut by_node: Vec<(Origin, Vec<Ino>)> = Vec::new();
        for (node, inos) in pending {
            match by_node.iter_mut().find(|(n, _)| *n == node) {
                Some((_, all)) => all.extend(inos),
                None => by_node.push((node, inos)),
            }
        }
        for (_, inos) in &mut by_node {
            inos.sort_unstable();
            inos.dedup();
        }
        if let [(node, inos)] = &mut by_node[..] {
            revoke(*node, std::mem::take(inos));
            return;
        }
        std::thread::scope(|scope| {
            for (node, inos) in by_node {
                scope.spawn(move || revoke(node, inos));
            }
        });
    }
}

impl ReadHolders {
    /// Records `holder` as holding copies of `ino`, before what it is answered is read;
    /// false when this owner cannot revoke (no way to reach other nodes), tracks too many
    /// inodes, or revoked this one from another node within `HOT_WINDOW`.
    pub(crate) fn grant(&self, ino: Ino, holder: Origin) -> bool {
        if self.revoke.get().is_none() {
            return false;
        }
        let mut table = self.table.lock();
        if table.gathering.get(&ino).is_some_and(|g| *g != holder) {
            return false;
        }
        if let Some(at) = table.revoked.get(&ino) {
            if at.elapsed() < HOT_WINDOW {
                return false;
            }
            table.revoked.remove(&ino);
        }
        if !table.holders.contains_key(&ino) && table.holders.len() >= HELD_INODES_MAX {
            return false;
        }
        table.grants += 1;
        let granted = table.grants;
        let held = table.holders.entry(ino).or_default();
        held.granted = granted;
        if !held.of.contains(&holder) {
            held.of.push(holder);
        }
        self.count.store(table.holders.len(), Ordering::Release);
        true
    }

    /// When the table is nearly full (`EVICT_BATCH` from it): revokes, on a thread of its
    /// own, the `EVICT_BATCH` inodes granted longest ago, and forgets those not granted
    /// again meanwhile, so that the table has room again; as GPFS's token manager revokes
    /// tokens when its memory for them runs out. Without it, holders that never see a
    /// change (every file a node created or looked at) kept the table full for good, and
    /// each path component of every operation on every node went to the owner again.
    /// The entries stay in the table until their holders answered: a change meanwhile
    /// finds them and revokes them itself, before it returns. Not on the requesting
    /// thread: the node asking may be one of the holders, and its answer to the
    /// revocation may wait for its kernel, which waits for that request.
    pub(crate) fn evict_if_full(self: &std::sync::Arc<Self>) {
        if self.count.load(Ordering::Acquire) < HELD_INODES_MAX - EVICT_BATCH
            || self.revoke.get().is_none()
            || self.evicting.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let holders = self.clone();
        let spawned = std::thread::Builder::new()
            .name("token-evict".into())
            .spawn(move || {
                holders.evict_oldest();
                holders.evicting.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            tracing::warn!("could not start a thread to revoke read tokens: {e}");
            self.evicting.store(false, Ordering::Release);
        }
    }

    /// The eviction of [`Self::evict_if_full`], on the calling thread.
    fn evict_oldest(&self) {
        let Some(revoke) = self.revoke.get() else {
            return;
        };
        let victims: Vec<(Ino, u64, Vec<Origin>)> = {
            let table = self.table.lock();
            let mut ages: Vec<(u64, Ino)> =
                table.holders.iter().map(|(i, h)| (h.granted, *i)).collect();
            let n = EVICT_BATCH.min(ages.len());
            if n == 0 {
                return;
            }
            ages.select_nth_unstable(n - 1);
            ages[..n]
                .iter()
                .map(|(granted, ino)| (*ino, *granted, table.holders[ino].of.clone()))
                .collect()
        };
        let mut by_node: HashMap<Origin, Vec<Ino>> = HashMap::new();
        for (ino, _, of) in &victims {
            for holder in of {
                by_node.entry(*holder).or_default().push(*ino);
            }
        }
        std::thread::scope(|scope| {
            for (node, inos) in by_node {
                scope.spawn(move || revoke(node, inos));
            }
        });
        let mut table = self.table.lock();
        for (ino, granted, _) in victims {
            if table
                .holders
                .get(&ino)
                .is_some_and(|h| h.granted == granted)
            {
                table.holders.remove(&ino);
            }
        }
        self.count.store(table.holders.len(), Ordering::Release);
    }

    /// Forgets every inode `holder` holds: its mount is going (`MetanodeRequest::
    /// Leaving`), so there is nothing left to revoke there.
    pub(crate) fn forget(&self, holder: Origin) {
        let mut table = self.table.lock();
        table.holders.retain(|_, held| {
            held.of.retain(|h| *h != holder);
            !held.of.is_empty()
        });
        self.count.store(table.holders.len(), Ordering::Release);
    }

    /// When the table is full: forgets the holders whose node `gone` says is gone from the
    /// cluster (expelled, or a new incarnation), at most once per `SWEEP_INTERVAL`. A node
    /// that died never unmounts (`forget`), and what it held stayed recorded until each
    /// inode changed, keeping the table full and every other node granted nothing new.
    pub(crate) fn sweep_if_full(&self, gone: &dyn Fn(Origin) -> bool) {
        if self.count.load(Ordering::Acquire) < HELD_INODES_MAX {
            return;
        }
        let origins: Vec<Origin> = {
            let mut table = self.table.lock();
            if table.swept.is_some_and(|at| at.elapsed() < SWEEP_INTERVAL) {
                return;
            }
            table.swept = Some(Instant::now());
            let mut origins: Vec<Origin> = table
                .holders
                .values()
                .flat_map(|h| &h.of)
                .copied()
                .collect();
            origins.sort_unstable_by_key(|o| (o.node, o.incarnation));
            origins.dedup();
            origins
        };
        // Asked without the table locked: the answer may take the daemon's own locks.
        let dead: Vec<Origin> = origins.into_iter().filter(|o| gone(*o)).collect();
        for holder in dead {
            self.forget(holder);
        }
    }

    /// Node `gatherer` may gather writes of `ino` from now on: nobody else is granted it
    /// until [`Self::stop_gathering`]. The other nodes holding it are taken out of the
    /// table and returned, for the caller to revoke (without the lock: see the module
    /// comment).
    pub(crate) fn start_gathering(&self, ino: Ino, gatherer: Origin) -> Vec<Origin> {
        let mut table = self.table.lock();
        table.gathering.insert(ino, gatherer);
        self.gathering
            .store(table.gathering.len(), Ordering::Release);
        let Some(held) = table.holders.remove(&ino) else {
            return Vec::new();
        };
        let (own, others): (Vec<Origin>, Vec<Origin>) =
            held.of.into_iter().partition(|h| *h == gatherer);
        if !own.is_empty() {
            let granted = held.granted;
            table.holders.insert(ino, Held { of: own, granted });
        }
        self.count.store(table.holders.len(), Ordering::Release);
        others
    }

    /// `ino` is granted to anyone again: nobody gathers writes of it now.
    pub(crate) fn stop_gathering(&self, ino: Ino) {
        if self.gathering.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut table = self.table.lock();
        table.gathering.remove(&ino);
        self.gathering
            .store(table.gathering.len(), Ordering::Release);
    }

    /// Whether another node may gather writes of some file (see
    /// [`Self::start_gathering`]); most owners: none, and their requests skip every check.
    pub(crate) fn any_gathering(&self) -> bool {
        self.gathering.load(Ordering::Acquire) > 0
    }

    /// How many inodes some node holds copies of.
    pub(crate) fn tracked(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Whether some node holds copies under `key` (to spare a change the work of finding
    /// out whether it touched what they hold).
    pub(crate) fn held_by_any(&self, key: Ino) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.table.lock().holders.contains_key(&key)
    }

    /// Records that node `by` looked up `name` in `dir` (see `ReadHolders::found`).
    pub(crate) fn note_found(&self, dir: Ino, name: &[u8], by: Origin) {
        let mut found = self.found.lock();
        if found.len() >= FOUND_MAX {
            found.retain(|_, (at, _)| at.elapsed() < FOUND_KEPT);
        }
        if found.len() < FOUND_MAX {
            found.insert(name_key(dir, name), (Instant::now(), by));
        }
    }

    /// Whether a node other than the one whose request this thread serves looked up
    /// `name` in `dir` within `FOUND_KEPT`. Not the remover itself: `rm` looks its file up
    /// first, and keeping every removed file would keep its blocks from a writer that
    /// removed it to make room (a process of the remover's own node racing it is answered
    /// ESTALE and looks again, as on one node).
    pub(crate) fn found_lately(&self, dir: Ino, name: &[u8]) -> bool {
        let serving = SERVING.get();
        self.found
            .lock()
            .get(&name_key(dir, name))
            .is_some_and(|(at, by)| at.elapsed() < FOUND_KEPT && Some(*by) != serving)
    }

    /// Whether a node other than the one whose request this thread serves holds copies
    /// under `key` (every holder, for the owner's own requests).
    pub(crate) fn held_by_others(&self, key: Ino) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let serving = SERVING.get();
        self.table
            .lock()
            .holders
            .get(&key)
            .is_some_and(|held| held.of.iter().any(|h| Some(*h) != serving))
    }

    /// Takes the holders of every inode `changes` touch, for this thread to revoke once it
    /// lets the metadata lock go, and notes those the serving node holds for its answer;
    /// the caller holds that lock, so every holder recorded before these changes is found.
    /// `protections` are the inodes whose protection the changes changed (see
    /// [`protection_key`]).
    pub(crate) fn revoke_changed(&self, changes: &[Change], protections: &[Ino]) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let serving = SERVING.get();
        let mut by_node: HashMap<Origin, Vec<Ino>> = HashMap::new();
        let mut own = Vec::new();
        {
            let mut table = self.table.lock();
            let now = Instant::now();
            let keys = changes
                .iter()
                .flat_map(changed_keys)
                .chain(protections.iter().map(|i| protection_key(*i)));
            for ino in keys {
                let Some(held) = table.holders.remove(&ino) else {
                    continue;
                };
                let mut others = false;
                for holder in held.of {
                    if Some(holder) == serving {
                        // Its own request's change: told in the answer, and it stays a
                        // holder, since it may keep what it asks next.
                        let granted = held.granted;
                        table.holders.insert(
                            ino,
                            Held {
                                of: vec![holder],
                                granted,
                            },
                        );
                        own.push(ino);
                    } else {
                        others = true;
                        by_node.entry(holder).or_default().push(ino);
                    }
                }
                if others {
                    table.revoked.insert(ino, now);
                }
            }
            if table.revoked.len() > HELD_INODES_MAX {
                table.revoked.retain(|_, at| at.elapsed() < HOT_WINDOW);
            }
            self.count.store(table.holders.len(), Ordering::Release);
        }
        if !own.is_empty() {
            OWN_CHANGED.with(|o| o.borrow_mut().extend(own));
        }
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            for (node, mut inos) in by_node {
                inos.sort_unstable();
                inos.dedup();
                p.push((node, inos));
            }
        });
    }
}

/// The keys a change makes what others hold under them stale: a name's own
/// (`name_key`) for a name put or removed, and the inode it changes (`changed_ino`).
fn changed_keys(change: &Change) -> impl Iterator<Item = Ino> {
    let name = match change {
        Change::DirInsert { dir, name, .. } | Change::DirRemove { dir, name } => {
            Some(name_key(*dir, name))
        }
        _ => None,
    };
    name.into_iter().chain(changed_ino(change))
}

/// The inode a change makes what others hold of it stale: its attributes, a directory's
/// names, its extended attributes (an ACL among them), its size, block map or checksums.
/// Settling a sector's pending alternative counts too: a view that still lists the old
/// checksum as the alternative lets a read-ahead slot read before the in-place write
/// landed pass as current, after that write returned.
fn changed_ino(change: &Change) -> Option<Ino> {
    match change {
        Change::PutAttr(attr) => Some(attr.ino),
        Change::DirInsert { dir, .. }
        | Change::DirRemove { dir, .. }
        | Change::SetParent { dir, .. }
        | Change::DirSize { dir, .. } => Some(*dir),
        Change::Inline { ino, .. }
        | Change::MapBlock { ino, .. }
        | Change::MapCopies { ino, .. }
        | Change::SetReplicas { ino, .. }
        | Change::DropCopies { ino, .. }
        | Change::Sectors { ino, .. }
        | Change::Settle { ino, .. }
        | Change::Truncate { ino, .. }
        | Change::Unmap { ino, .. }
        | Change::SetXattr { ino, .. }
        | Change::RemoveXattr { ino, .. }
        | Change::FreeInode { ino }
        | Change::SetPool { ino, .. }
        | Change::Revert { ino, .. } => Some(*ino),
        Change::Answered { .. } => None,
    }
}

/// What a client holds of one inode, all granted by the owner of `generation`.
#[derive(Default)]
pub(crate) struct HeldOf {
    generation: u64,
    /// Block-map views by block range asked for.
    pub(crate) views: HashMap<(u64, u64), FileView>,
    pub(crate) attr: Option<Attr>,
    pub(crate) held_bytes: Option<u64>,
    pub(crate) protection: Option<Protection>,
    /// A directory's names: the inode each names, or `None` for a name known absent.
    pub(crate) names: HashMap<Vec<u8>, Option<Ino>>,
    /// Every name of the directory is in `names`: one missing is absent. Known of a
    /// directory this client made (empty), kept across its own name changes in it when
    /// the answers say what each name became; a create's lookup of a new name then asks
    /// the owner nothing.
    pub(crate) complete: bool,
    /// Under a name's own key (`name_key`): the directory, the name and the inode it
    /// names, for each name held under that key.
    pub(crate) named: Vec<(Ino, Vec<u8>, Ino)>,
}

impl HeldOf {
    fn items(&self) -> usize {
        self.views.len()
            + self.names.len()
            + self.named.len()
            + usize::from(self.attr.is_some())
            + usize::from(self.held_bytes.is_some())
            + usize::from(self.protection.is_some())
    }
}

/// This client's own name changes in flight, per directory: how many were sent in all and
/// how many are unanswered. What an answer says a name became is kept only if no other
/// name change of the same directory was in flight at any time during its own flight:
/// then the owner did them in the order their answers came.
#[derive(Default)]
struct DirFlight {
    sent: u64,
    unanswered: u32,
}

/// What a name in a directory became after this client's change of it: `(directory, name,
/// the inode it names or None for absent)`.
pub(crate) type NameAfter<'a> = (Ino, &'a [u8], Option<Ino>);

/// A directory's part in one name change's flight: the directory, its send number, and
/// whether nothing else was in flight for it when it went out.
pub(crate) type FlightTicket = Vec<(Ino, u64, bool)>;

/// What a client holds, by inode, and how many things in all.
#[derive(Default)]
pub(crate) struct HeldCache {
    held: Mutex<(HashMap<Ino, HeldOf>, usize)>,
    flights: Mutex<HashMap<Ino, DirFlight>>,
    /// Counts revocations and this client's own changes: an answer whose request was sent
    /// before the count moved is not kept.
    seq: AtomicU64,
}

impl HeldCache {
    /// What `look` finds of `ino` among the copies held from the owner of `generation`.
    pub(crate) fn get<T>(
        &self,
        ino: Ino,
        generation: u64,
        look: impl FnOnce(&HeldOf) -> Option<T>,
    ) -> Option<T> {
        let held = self.held.lock();
        held.0
            .get(&ino)
            .filter(|of| of.generation == generation)
            .and_then(look)
    }

    /// The view of `blocks` of `ino` held from the owner of generation `generation`: the
    /// one asked for that range, or cut from a held view of a range that holds it (an
    /// inline file's view is the same for every range).
    pub(crate) fn view(&self, ino: Ino, blocks: &Range<u64>, generation: u64) -> Option<FileView> {
        self.get(ino, generation, |of| {
            if let Some(v) = of.views.get(&(blocks.start, blocks.end)) {
                return Some(v.clone());
            }
            of.views
                .iter()
                .find(|((start, end), v)| {
                    v.is_inline() || (*start <= blocks.start && blocks.end <= *end)
                })
                .map(|(_, v)| v.within(blocks))
        })
    }

    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Keeps what `put` adds to what is held of `ino`, unless anything was revoked or
    /// changed since `seq` was read (before the request went out).
    pub(crate) fn keep(&self, ino: Ino, generation: u64, seq: u64, put: impl FnOnce(&mut HeldOf)) {
        self.put(ino, generation, seq, true, put);
    }

    /// Like [`HeldCache::keep`], only if something of `ino` is held already: an inode
    /// this client holds stays held after its own changes (the owner keeps it as a
    /// holder), one it does not hold was never granted.
    pub(crate) fn keep_held(
        &self,
        ino: Ino,
        generation: u64,
        seq: u64,
        put: impl FnOnce(&mut HeldOf),
    ) {
        self.put(ino, generation, seq, false, put);
    }

    fn put(&self, ino: Ino, generation: u64, seq: u64, new: bool, put: impl FnOnce(&mut HeldOf)) {
        let mut held = self.held.lock();
        if self.seq() != seq {
            return;
        }
        let held_now = held
            .0
            .get(&ino)
            .is_some_and(|of| of.generation == generation);
        if !new && !held_now {
            return;
        }
        if held.1 >= CACHED_MAX {
            held.0.clear();
            held.1 = 0;
        }
        let (map, count) = &mut *held;
        let of = map.entry(ino).or_default();
        if of.generation != generation {
            *count -= of.items();
            *of = HeldOf {
                generation,
                ..HeldOf::default()
            };
        }
        let before = of.items();
        put(of);
        *count = *count + of.items() - before;
    }

    /// The view of `blocks` of `ino`, held (see [`HeldCache::keep`]).
    pub(crate) fn keep_view(
        &self,
        ino: Ino,
        blocks: &Range<u64>,
        generation: u64,
        seq: u64,
        view: &FileView,
    ) {
        self.keep(ino, generation, seq, |of| {
            of.views.insert((blocks.start, blocks.end), view.clone());
        });
    }

    /// A request of this client's that may change something is on its way: answers to
    /// requests sent before it are not kept.
    /// Returns the count after it.
    pub(crate) fn bump(&self) -> u64 {
        let _held = self.held.lock();
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Drops what is held of `inos` (a revocation, or a change this client made).
    pub(crate) fn drop_inos(&self, inos: &[Ino]) {
        let mut held = self.held.lock();
        self.seq.fetch_add(1, Ordering::AcqRel);
        for ino in inos {
            if let Some(of) = held.0.remove(ino) {
                held.1 -= of.items();
            }
        }
    }

    /// Drops what is held of `inos`, the inodes a request of this client's changed. Of a
    /// directory among `parents` (name changes of that request: a create, link, unlink or
    /// rename) it keeps the protection and the other names: a name change changes the
    /// directory's times, size and link count and that name, never its mode, owner or ACL
    /// or another name. `after` says what each changed name became (from the answer), when
    /// the answer tells; it is kept, and a complete directory stays complete, if nothing
    /// else moved the count since the request went out (`sent`, the count then).
    pub(crate) fn drop_changed(
        &self,
        inos: &[Ino],
        parents: &[(Ino, &[u8])],
        after: Option<&[NameAfter<'_>]>,
        ticket: &FlightTicket,
    ) {
        let mut held = self.held.lock();
        let alone = self.land(ticket);
        self.seq.fetch_add(1, Ordering::AcqRel);
        let (map, count) = &mut *held;
        for ino in inos {
            let Some(mut of) = map.remove(ino) else {
                continue;
            };
            *count -= of.items();
            if !parents.iter().any(|(dir, _)| dir == ino) {
                continue;
            }
            for (_, name) in parents.iter().filter(|(dir, _)| dir == ino) {
                of.names.remove(*name);
            }
            match after.filter(|_| alone.contains(ino)) {
                Some(after) => {
                    for (_, name, now) in after.iter().filter(|(dir, _, _)| dir == ino) {
                        of.names.insert(name.to_vec(), *now);
                    }
                }
                None => of.complete = false,
            }
            let kept = HeldOf {
                generation: of.generation,
                names: of.names,
                complete: of.complete,
                ..HeldOf::default()
            };
            *count += kept.items();
            map.insert(*ino, kept);
        }
    }

    /// Notes that a name change of this client's in `dirs` goes out.
    pub(crate) fn take_off(&self, dirs: &[Ino]) -> FlightTicket {
        let mut flights = self.flights.lock();
        dirs.iter()
            .map(|&dir| {
                let f = flights.entry(dir).or_default();
                f.sent += 1;
                f.unanswered += 1;
                (dir, f.sent, f.unanswered == 1)
            })
            .collect()
    }

    /// Ends the flight of `ticket`; returns the directories for which no other name change
    /// of this client's was in flight meanwhile.
    pub(crate) fn land(&self, ticket: &FlightTicket) -> Vec<Ino> {
        let mut flights = self.flights.lock();
        let mut alone = Vec::new();
        for &(dir, sent, clean) in ticket {
            let Some(f) = flights.get_mut(&dir) else {
                continue;
            };
            if clean && f.sent == sent && f.unanswered == 1 {
                alone.push(dir);
            }
            f.unanswered -= 1;
            if f.unanswered == 0 {
                flights.remove(&dir);
            }
        }
        alone
    }

    /// Drops everything (a change of this client's whose answer did not say what it
    /// changed).
    pub(crate) fn drop_all(&self) {
        let mut held = self.held.lock();
        self.seq.fetch_add(1, Ordering::AcqRel);
        held.0.clear();
        held.1 = 0;
    }
}

/// Directories and inodes this node's kernel may keep names in and attributes of, at most,
/// of those another node serves: past it the kernel is given no cache time for more (it
/// asks this mount, whose held copies answer), so the record stays bounded.
const KERNEL_KEPT_MAX: usize = 65_536;

/// What this node's kernel was given cache time for of inodes another node's owner serves,
/// on the strength of the read tokens this mount holds: the directories it was given names
/// in and the inodes whose attributes it keeps. A revocation of such a directory makes
/// every name the kernel keeps invalid (`FUSE_NOTIFY_INC_EPOCH`: per-name invalidation
/// would take the directory's lock, which a create of this node's own there holds while it
/// waits for the owner, which waits for this revocation); a revoked inode's attributes are
/// dropped (`FUSE_NOTIFY_INVAL_INODE`, no lock). The owner moving takes everything.
/// Recorded *before* the held copy is checked, so that a revocation that drops the copy
/// after the check finds the record: the kernel drops a name or attributes it was given,
/// or it was given none.
#[derive(Default)]
pub(crate) struct KernelKept {
    kept: Mutex<KernelKeptTable>,
}

#[derive(Default)]
struct KernelKeptTable {
    /// Keys of directories, and of single names (`name_key`), the kernel keeps names
    /// under.
    dirs: std::collections::HashSet<Ino>,
    attrs: std::collections::HashSet<Ino>,
}

impl KernelKept {
    /// Records that the kernel may be given names held under `key`: a directory's (all
    /// its names) or one name's own (`name_key`). A full record starts over: `drop` is
    /// told to make every name the kernel keeps invalid (under the record's lock, so that
    /// a revocation of a key forgotten here waits until the kernel dropped its names),
    /// since names held under their own keys fill it as fast as files are made and would
    /// otherwise leave the kernel no cache time for anything new. False when there is no
    /// `drop` to tell (give the name no cache time).
    pub(crate) fn note_names(
        &self,
        key: Ino,
        drop: Option<&dyn Fn(Vec<crate::CacheChange>)>,
    ) -> bool {
        let mut kept = self.kept.lock();
        if kept.dirs.contains(&key) {
            return true;
        }
        if kept.dirs.len() >= KERNEL_KEPT_MAX {
            let Some(drop) = drop else {
                return false;
            };
            drop(vec![crate::CacheChange::AllNames]);
            kept.dirs.clear();
        }
        kept.dirs.insert(key)
    }

    /// Records that the kernel keeps a name in `parent` as its own rename left it, full or
    /// not: the kernel keeps it whatever this says. Only a rename adds past the bound, and
    /// the next revocation of any recorded directory takes everything.
    pub(crate) fn note_moved_into(&self, parent: Ino) {
        self.kept.lock().dirs.insert(parent);
    }

    /// Records that the kernel may be given `ino`'s attributes; false when full.
    pub(crate) fn note_attr(&self, ino: Ino) -> bool {
        let mut kept = self.kept.lock();
        kept.attrs.contains(&ino) || (kept.attrs.len() < KERNEL_KEPT_MAX && kept.attrs.insert(ino))
    }

    /// What the kernel must drop once the tokens of `inos` are revoked: every name, when
    /// it was given names in one of them (the record of directories starts over), and the
    /// attributes of each (the caller drops those of every revoked inode).
    pub(crate) fn take(&self, inos: &[Ino]) -> Vec<crate::CacheChange> {
        let mut kept = self.kept.lock();
        for ino in inos {
            kept.attrs.remove(ino);
        }
        if inos.iter().any(|ino| kept.dirs.contains(ino)) {
            kept.dirs.clear();
            return vec![crate::CacheChange::AllNames];
        }
        Vec::new()
    }

    /// Everything the kernel was given (the owner moved: its successor does not know what
    /// this node holds, so nothing it changes would be revoked here).
    pub(crate) fn take_all(&self) -> Vec<crate::CacheChange> {
        let mut kept = self.kept.lock();
        let t = std::mem::take(&mut *kept);
        let mut changes: Vec<crate::CacheChange> =
            t.attrs.into_iter().map(crate::CacheChange::Inode).collect();
        if !t.dirs.is_empty() {
            changes.push(crate::CacheChange::AllNames);
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full table of holders whose node is gone is swept at the next grant that finds it
    /// full, once per interval, and then grants to a live node again.
    #[test]
    fn a_full_table_is_swept_of_holders_gone_from_the_cluster() {
        let holders = ReadHolders::default();
        assert!(holders.revoke.set(Box::new(|_, _| {})).is_ok());
        let dead = Origin {
            node: 2,
            incarnation: 1,
        };
        let live = Origin {
            node: 3,
            incarnation: 1,
        };
        for ino in 0..HELD_INODES_MAX as Ino {
            assert!(holders.grant(ino, dead));
        }
        assert!(!holders.grant(1 << 40, live), "full");
        holders.sweep_if_full(&|o| o == live);
        assert!(!holders.grant(1 << 40, live), "nobody was gone: still full");
        // Within the interval nothing is asked again; after it, the dead node's go.
        holders.sweep_if_full(&|o| o == dead);
        assert_eq!(holders.tracked(), HELD_INODES_MAX);
        holders.table.lock().swept = None;
        holders.sweep_if_full(&|o| o == dead);
        assert_eq!(holders.tracked(), 0);
        assert!(holders.grant(1 << 40, live));
    }

    /// A table nearly full of live holders revokes those granted longest ago and forgets
    /// them once revoked, so that it grants again; one granted again while its revocation
    /// was on its way stays recorded.
    #[test]
    fn a_full_table_of_live_holders_revokes_the_oldest_and_grants_again() {
        let holders = std::sync::Arc::new(ReadHolders::default());
        let revoked = std::sync::Arc::new(Mutex::new(Vec::<(Origin, Vec<Ino>)>::new()));
        let (seen, weak) = (revoked.clone(), std::sync::Arc::downgrade(&holders));
        let regranted: Ino = 7;
        let hook: RevokeHook = Box::new(move |node, inos| {
            // The holder asks for one of them again before it answers.
            if inos.contains(&regranted) {
                assert!(weak.upgrade().unwrap().grant(regranted, node));
            }
            seen.lock().push((node, inos));
        });
        assert!(holders.revoke.set(hook).is_ok());
        let (a, b) = (
            Origin {
                node: 2,
                incarnation: 1,
            },
            Origin {
                node: 3,
                incarnation: 1,
            },
        );
        let below = HELD_INODES_MAX - EVICT_BATCH - 1;
        for ino in 0..below as Ino {
            assert!(holders.grant(ino, if ino % 2 == 0 { a } else { b }));
        }
        holders.evict_if_full();
        assert!(!holders.evicting.load(Ordering::Acquire), "not full enough");
        for ino in below as Ino..HELD_INODES_MAX as Ino {
            assert!(holders.grant(ino, a));
        }
        assert!(!holders.grant(1 << 40, b), "full");
        // Granted anew: no longer among the oldest.
        assert!(holders.grant(1, b));
        holders.evict_if_full();
        let start = Instant::now();
        while holders.evicting.load(Ordering::Acquire) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "eviction never ended"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let revoked = std::mem::take(&mut *revoked.lock());
        assert_eq!(revoked.len(), 2, "one revocation per holding node");
        let mut all: Vec<Ino> = revoked.iter().flat_map(|(_, i)| i.clone()).collect();
        all.sort_unstable();
        let oldest: Vec<Ino> = (0..=EVICT_BATCH as Ino).filter(|i| *i != 1).collect();
        assert_eq!(all, oldest, "the oldest grants, each once");
        for (node, inos) in &revoked {
            assert!(
                inos.iter().all(|i| (i % 2 == 0) == (*node == a)),
                "to their holders"
            );
        }
        // Forgotten but the one granted again meanwhile, which a change must still revoke.
        assert_eq!(holders.tracked(), HELD_INODES_MAX - EVICT_BATCH + 1);
        assert!(holders.held_by_any(regranted));
        assert!(!holders.held_by_any(0) && holders.held_by_any(1));
        assert!(holders.grant(1 << 40, b), "room again");
    }

    #[test]
    fn what_a_name_change_made_is_kept_only_if_it_flew_alone() {
        let held = HeldCache::default();
        // Alone, one after the other: each may keep what it made.
        for _ in 0..2 {
            let t = held.take_off(&[7]);
            assert_eq!(held.land(&t), vec![7]);
        }
        // Overlapping flights in one directory, landing in either order: neither knows
        // the owner's order, so neither keeps anything; another directory is not involved.
        for first_lands_first in [true, false] {
            let a = held.take_off(&[7, 9]);
            let b = held.take_off(&[7]);
            let (one, two) = if first_lands_first {
                (&a, &b)
            } else {
                (&b, &a)
            };
            let landed_one = held.land(one);
            let landed_two = held.land(two);
            assert!(!landed_one.contains(&7) && !landed_two.contains(&7));
            assert!(landed_one.contains(&9) || landed_two.contains(&9));
        }
        // Nothing stays in flight afterwards.
        assert!(held.flights.lock().is_empty());
        let t = held.take_off(&[7]);
        assert_eq!(held.land(&t), vec![7]);
    }
}
