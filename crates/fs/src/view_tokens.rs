//! Read tokens on block maps: a client keeps the views of files it read (size, block
//! references, sector checksums) until the owner revokes them, instead of asking the owner
//! for the block map of every read.
//!
//! The owner grants a view as held (`MetanodeReply::HeldView`) only to another node, and
//! only when it can reach that node again (`FileSystem::on_view_revoke`, set by the
//! daemon). It records the holder *before* it reads the view, so every change logged after
//! that point finds the holder: `FileSystem::log` takes the holders of every inode whose
//! size, block map or checksums a change touches, and once the metadata lock is let go
//! (`MetaGuard`'s drop, on the thread that logged) sends each node `DropViews` and waits
//! for its answer, before the change's operation returns. Never under the metadata lock:
//! a node answering may itself be waiting for this owner (its daemon's tables are locked
//! by a thread that asks this owner something), and a revocation sent under the lock
//! would wait for it forever. A node that does not answer is waited for until the cluster
//! expels it, as for a fence. The node that made the change is not asked: it drops its
//! own views of the inode around every change it sends.
//!
//! On the client a view is kept only if no revocation (and no change of its own) arrived
//! between sending the request and reading the answer (`ViewCache::seq`): a revocation
//! can overtake the answer it revokes. Views are dropped when the owner moves (their
//! generation). A cached view is a copy of what the owner said: a write of another node
//! that returned before a read began was logged before it returned, so its revocation
//! reached this node first, and the read asks again.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::inode::Ino;
use crate::locks::Origin;
use crate::meta::Change;
use crate::metanode::FileView;

/// Inodes whose views an owner tracks holders for, at most; past it no new view is granted
/// as held (the answer is a plain view), so the table stays bounded.
const HELD_INODES_MAX: usize = 65_536;
/// Views a client keeps, at most; past it the cache starts over.
const CACHED_VIEWS_MAX: usize = 16_384;

/// Sends a node the inodes whose views it must drop; returns once it answered, or once it
/// is gone from the cluster.
pub(crate) type RevokeHook = Box<dyn Fn(Origin, Vec<Ino>) + Send + Sync>;

/// The owner's record of which nodes hold views of which inodes.
#[derive(Default)]
pub(crate) struct ViewHolders {
    holders: Mutex<HashMap<Ino, Vec<Origin>>>,
    count: AtomicUsize,
    pub(crate) revoke: std::sync::OnceLock<RevokeHook>,
}

std::thread_local! {
    /// The node whose request this thread serves: it is not asked to drop its views of
    /// what its own request changes.
    pub(crate) static SERVING: std::cell::Cell<Option<Origin>> = const { std::cell::Cell::new(None) };
    /// Revocations this thread's changes made, sent once it lets the metadata lock go.
    static PENDING: std::cell::RefCell<Vec<(Origin, Vec<Ino>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The metadata lock of an owner, with its record of view holders: whoever logged
/// changes under it sends their revocations when it lets go (see the module comment).
pub(crate) struct MetaLock {
    meta: Mutex<crate::fs::Meta>,
    pub(crate) holders: ViewHolders,
}

pub(crate) struct MetaGuard<'a> {
    guard: Option<parking_lot::MutexGuard<'a, crate::fs::Meta>>,
    holders: &'a ViewHolders,
}

impl MetaLock {
    pub(crate) fn new(meta: crate::fs::Meta) -> MetaLock {
        MetaLock {
            meta: Mutex::new(meta),
            holders: ViewHolders::default(),
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
        for (node, inos) in pending {
            revoke(node, inos);
        }
    }
}

impl ViewHolders {
    /// Records `holder` as holding views of `ino`, before the view is read; false when this
    /// owner cannot revoke (no way to reach other nodes) or tracks too many inodes.
    pub(crate) fn grant(&self, ino: Ino, holder: Origin) -> bool {
        if self.revoke.get().is_none() {
            return false;
        }
        let mut holders = self.holders.lock();
        if !holders.contains_key(&ino) && holders.len() >= HELD_INODES_MAX {
            return false;
        }
        let of = holders.entry(ino).or_default();
        if !of.contains(&holder) {
            of.push(holder);
        }
        self.count.store(holders.len(), Ordering::Release);
        true
    }

    /// Takes the holders of every view of what `changes` touch, except the serving node's
    /// own, for this thread to revoke once it lets the metadata lock go; the caller holds
    /// that lock, so every holder recorded before these changes is found.
    pub(crate) fn revoke_changed(&self, changes: &[Change]) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let serving = SERVING.get();
        let mut by_node: HashMap<Origin, Vec<Ino>> = HashMap::new();
        {
            let mut holders = self.holders.lock();
            for ino in changes.iter().filter_map(view_changed) {
                let Some(of) = holders.remove(&ino) else {
                    continue;
                };
                for holder in of {
                    if Some(holder) == serving {
                        // Its own request's change: it drops its views of it itself (or,
                        // for an access time, need not), and stays a holder, since it may
                        // keep what it asks next.
                        holders.insert(ino, vec![holder]);
                    } else {
                        by_node.entry(holder).or_default().push(ino);
                    }
                }
            }
            self.count.store(holders.len(), Ordering::Release);
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

/// The inode whose view (size, block map, checksums) a change makes stale. Settling a
/// sector's pending alternative counts too: a view that still lists the old checksum as
/// the alternative lets a read-ahead slot read before the in-place write landed pass as
/// current, after that write returned.
fn view_changed(change: &Change) -> Option<Ino> {
    match change {
        Change::PutAttr(attr) => Some(attr.ino),
        Change::Inline { ino, .. }
        | Change::MapBlock { ino, .. }
        | Change::Sectors { ino, .. }
        | Change::Settle { ino, .. }
        | Change::Truncate { ino, .. }
        | Change::Unmap { ino, .. }
        | Change::FreeInode { ino }
        | Change::SetPool { ino, .. }
        | Change::Revert { ino, .. } => Some(*ino),
        Change::DirInsert { .. }
        | Change::DirRemove { .. }
        | Change::SetParent { .. }
        | Change::SetXattr { .. }
        | Change::RemoveXattr { .. }
        | Change::Answered { .. } => None,
    }
}

/// One inode's held views: by block range asked for, with the owner generation that
/// granted each.
type ViewsOf = HashMap<(u64, u64), (u64, FileView)>;

/// A client's held views, by inode and block range asked for.
#[derive(Default)]
pub(crate) struct ViewCache {
    /// The views, and how many there are in all.
    views: Mutex<(HashMap<Ino, ViewsOf>, usize)>,
    /// Counts revocations and this client's own changes: a view whose request was sent
    /// before the count moved is not kept.
    seq: AtomicU64,
}

impl ViewCache {
    /// The view of `blocks` of `ino` held from the owner of generation `generation`.
    pub(crate) fn get(&self, ino: Ino, blocks: &Range<u64>, generation: u64) -> Option<FileView> {
        let views = self.views.lock();
        let (g, view) = views.0.get(&ino)?.get(&(blocks.start, blocks.end))?;
        (*g == generation).then(|| view.clone())
    }

    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// Keeps a held view, unless anything was revoked since `seq` was read (before the
    /// request went out).
    pub(crate) fn keep(
        &self,
        ino: Ino,
        blocks: &Range<u64>,
        generation: u64,
        seq: u64,
        view: &FileView,
    ) {
        let mut views = self.views.lock();
        if self.seq() != seq {
            return;
        }
        if views.1 >= CACHED_VIEWS_MAX {
            views.0.clear();
            views.1 = 0;
        }
        let of = views.0.entry(ino).or_default();
        if of
            .insert((blocks.start, blocks.end), (generation, view.clone()))
            .is_none()
        {
            views.1 += 1;
        }
    }

    /// Drops the views of `inos` (a revocation, or a change this client makes).
    pub(crate) fn drop_inos(&self, inos: &[Ino]) {
        let mut views = self.views.lock();
        self.seq.fetch_add(1, Ordering::AcqRel);
        for ino in inos {
            if let Some(of) = views.0.remove(ino) {
                views.1 -= of.len();
            }
        }
    }

    /// Drops every view (a namespace change of this client's, whose inodes it may not
    /// know).
    pub(crate) fn drop_all(&self) {
        let mut views = self.views.lock();
        self.seq.fetch_add(1, Ordering::AcqRel);
        views.0.clear();
        views.1 = 0;
    }
}
