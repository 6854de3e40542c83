//! Namespace operations whose names and inodes different owners serve (owner slots): the
//! client takes them in steps, one owner at a time, each step durable before the next
//! starts, so that no owner waits on another and no two can deadlock. The order of the
//! steps keeps one rule at every instant, whatever crashes (an owner or this client): no
//! name ever names a freed inode. A link count goes up before a name is added and down
//! only after a name is gone, so what a crash between two steps can leave is a link count
//! one too high (fsck names the inode and sets it right) or, in the middle of a rename,
//! the file under both names; an rmdir leaves at worst an unreachable empty directory.
//!
//! A directory that moves to another directory where several owners serve the namespace
//! moves under the cluster's one rename lock (a lock of class `Rename` on the root at the
//! file system manager, as the kernel's one rename mutex per file system): its check that
//! it does not move below itself walks parents that several owners serve, and no other
//! move may change them meanwhile. Its steps: its parent pointer, the new name (its new
//! parent counts one more link), the old name (the old parent one fewer). The parent
//! pointer goes first because an rmdir (which takes no rename lock) removes a directory
//! only by the name its parent pointer names, and a move does not take a directory an
//! rmdir sealed: so no rmdir by the old name can free the directory after the new name
//! went in (that left the new name naming a freed inode). A crash between the steps
//! leaves the directory with the new parent named only in the old one (fsck sets the
//! pointer back) or named in both parents (fsck keeps the name its parent pointer names).
//!
//! The owner side of each step is in `namespace.rs` (`Namespace::put_entry`,
//! `Namespace::take_entry`, `Namespace::count_link`, `Namespace::reparent`, and the
//! rmdir's `seal_dir`, `drop_entry_of`, `drop_sealed_dir`). RENAME_EXCHANGE within one
//! directory is the directory owner's alone, whoever serves the inodes; between directories
//! of different owners it is not built (EXDEV): every order of its steps leaves one inode
//! named nowhere at some instant.

use std::time::Duration;

use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, FileKind, Ino, ROOT_INO};
use crate::locks::{Holder, Lock, LockClass, LockKind, TO_END};

/// How often a rename looks again at a target that another node changed between its look
/// and its step (each round costs a few round trips; a target that changes this often is
/// not one an application can rename over meaningfully anyway).
const RETARGETS_MAX: usize = 8;

/// Deepest chain of parents a directory move walks (the root is found long before on any
/// real tree; a longer chain is a damaged one).
const DEPTH_MAX: usize = 65_536;

/// How long a directory move waits for the rename lock before it fails with EIO: its
/// holder is another move in flight (a few round trips), or a dead node's, freed once the
/// cluster expels it.
const RENAME_LOCK_WAIT_MAX: Duration = Duration::from_secs(120);

/// Lock owners of the rename lock, one per thread, so that two threads of one mount take
/// turns as two nodes do.
static RENAME_LOCK_OWNERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

std::thread_local! {
    static RENAME_LOCK_OWNER: u64 =
        RENAME_LOCK_OWNERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The cluster's rename lock, held until dropped.
pub(crate) struct RenameLock<'a> {
    fs: &'a FileSystem,
    holder: Holder,
}

impl Drop for RenameLock<'_> {
    fn drop(&mut self) {
        self.fs.give_back_rename_lock(self.holder);
    }
}

impl FileSystem {
    /// Whether a directory move between two directories may need the rename lock: on a
    /// mount that other nodes' mounts share, or one that knows of owner slots.
    pub(crate) fn moves_take_the_rename_lock(&self) -> bool {
        self.owner_slot() != 0
            || self.shared.load(std::sync::atomic::Ordering::Acquire)
            || self
                .owner_map
                .iter()
                .any(|s| s.load(std::sync::atomic::Ordering::Relaxed) != 0)
    }

    /// Takes the cluster's rename lock (waits for it, up to a bound).
    pub(crate) fn rename_lock(&self) -> FsResult<RenameLock<'_>> {
        let holder = self.lock_holder(RENAME_LOCK_OWNER.with(|o| *o), LockClass::Rename);
        let want = Lock {
            holder,
            start: 0,
            end: TO_END,
            kind: LockKind::Write,
            pid: 0,
        };
        if let Err(e) = self.lock_until(ROOT_INO, want, Some(&|| false), Some(RENAME_LOCK_WAIT_MAX))
        {
            // The manager may have granted it and the answer been lost on the way back.
            self.give_back_rename_lock(holder);
            return Err(e);
        }
        Ok(RenameLock { fs: self, holder })
    }

    /// Gives the rename lock of `holder` back, asking again while the manager cannot be
    /// reached ([`FileSystem::give_back_locks_until_answered`]). It is sent whatever this
    /// mount's mirror says, so a take whose grant was made and its answer lost goes back
    /// too.
    pub(crate) fn give_back_rename_lock(&self, holder: Holder) {
        if let Err(e) = self.give_back_locks_until_answered(ROOT_INO, holder) {
            tracing::error!(
                "giving back the cluster's rename lock: {e}; directory moves on every node \
                 wait for it until this node leaves the cluster: restart Tessera on this \
                 node if they fail with EIO"
            );
        }
    }

    /// rmdir of directory `ino`, which another slot serves than `parent`'s (a directory
    /// made for a slot), in three steps that never leave an entry naming a freed inode:
    /// its owner checks it is empty and seals it (no name goes in meanwhile, for a bounded
    /// time); `parent`'s owner removes the entry if it still names `ino`, durably; then the
    /// directory goes. A crash between the last two leaves an unreachable empty directory
    /// (fsck names it); a failed second step lifts the seal.
    pub(crate) fn rmdir_across_owners(&self, parent: Ino, name: &[u8], ino: Ino) -> FsResult<()> {
        self.routed(ino, |ns| ns.seal_dir(ino, Some(parent)))?;
        if let Err(e) = self.routed(parent, |ns| ns.drop_entry_of(parent, name, ino)) {
            let _ = self.routed(ino, |ns| ns.seal_dir(ino, None));
            return Err(e);
        }
        self.routed(ino, |ns| ns.drop_sealed_dir(ino))
    }

    /// unlink of `name` in `parent`, naming file `ino` that another owner serves (it was
    /// renamed or linked there from a directory of its own owner's): the name goes, then
    /// the link.
    pub(crate) fn unlink_across_owners(&self, parent: Ino, name: &[u8], ino: Ino) -> FsResult<()> {
        self.routed(parent, |ns| ns.take_entry(parent, name, ino))?;
        self.routed(ino, |ns| ns.count_link(ino, false))
    }

    /// link of file `ino` as `name` in `parent` where different owners serve the two: the
    /// link count goes up first, then the name goes in (or, refused, the count down again).
    pub(crate) fn link_across_owners(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        let attr = self.getattr(ino)?;
        if attr.kind == FileKind::Directory {
            return Err(FsError::NotSupported("hard links to directories".into()));
        }
        self.routed(ino, |ns| ns.count_link(ino, true))?;
        if let Err(e) = self.routed(parent, |ns| {
            ns.put_entry(parent, name, (ino, attr.kind), None)
        }) {
            self.take_back_link(ino);
            return Err(e);
        }
        self.getattr(ino)
    }

    /// rename of `name` in `parent` to `new_name` in `new_parent` where different owners
    /// serve the directories or the file: one link more, the new name (replacing what it
    /// named, whose link goes next), the old name, one link fewer. Between the new name
    /// and the old name's removal another node may see both (the one window in which this
    /// rename is not atomic). A directory moves under the rename lock
    /// (`move_dir_across_owners`).
    pub(crate) fn rename_across_owners(
        &self,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
        noreplace: bool,
        locked: bool,
    ) -> FsResult<()> {
        let src = self.lookup(parent, name)?;
        if src.kind == FileKind::Directory {
            return self.move_dir_across_owners(
                (parent, name),
                (new_parent, new_name),
                (src.ino, noreplace),
                locked,
            );
        }
        let mut last = FsError::Exists;
        for _ in 0..RETARGETS_MAX {
            let dst = match self.lookup(new_parent, new_name) {
                Ok(a) => Some(a),
                Err(FsError::NotFound) => None,
                Err(e) => return Err(e),
            };
            if let Some(d) = &dst {
                if d.ino == src.ino {
                    return Ok(()); // Two links to one inode: POSIX says do nothing.
                }
                if noreplace {
                    return Err(FsError::Exists);
                }
                if d.kind == FileKind::Directory {
                    return Err(FsError::IsDir);
                }
            }
            let replace = dst.map(|d| d.ino);
            self.routed(src.ino, |ns| ns.count_link(src.ino, true))?;
            let put = (src.ino, src.kind);
            match self.routed(new_parent, |ns| {
                ns.put_entry(new_parent, new_name, put, replace)
            }) {
                Ok(()) => {}
                Err(e) => {
                    self.take_back_link(src.ino);
                    match e {
                        // The target changed since this client looked: look again.
                        FsError::Exists | FsError::NotFound if !noreplace => {
                            last = e;
                            continue;
                        }
                        e => return Err(e),
                    }
                }
            }
            if let Some(replaced) = replace {
                self.take_back_link(replaced);
            }
            match self.routed(parent, |ns| ns.take_entry(parent, name, src.ino)) {
                Ok(()) => {}
                // Renamed or removed by another node meanwhile: that one came first, and
                // this rename's new name goes again (what it replaced stays replaced).
                Err(FsError::NotFound) => {
                    if self
                        .routed(new_parent, |ns| {
                            ns.take_entry(new_parent, new_name, src.ino)
                        })
                        .is_ok()
                    {
                        self.take_back_link(src.ino);
                    }
                    return Err(FsError::NotFound);
                }
                // The old name's owner failed (its step may still have landed): both names
                // stay, with the count that says so, rather than risk neither.
                Err(e) => return Err(e),
            }
            self.take_back_link(src.ino);
            return Ok(());
        }
        Err(last)
    }

    /// A rename of directory `dir` within `parent` over a name whose inode another owner
    /// serves: `parent`'s owner moves the name wherever `dir` is (`move_name`), but cannot
    /// tell whether the directory in the way is empty. That one goes first (ENOTEMPTY if
    /// it is not empty), as in a move between directories, then the name moves; looked at
    /// again when another node put a name there meanwhile. It answered EXDEV before. The
    /// caller holds the rename lock.
    fn move_dir_over_another_owners(
        &self,
        parent: Ino,
        (name, new_name): (&[u8], &[u8]),
        (dir, noreplace): (Ino, bool),
    ) -> FsResult<()> {
        let how = crate::metanode::RenameHow {
            noreplace,
            exchange: false,
            dirs_may_move: true,
        };
        let mut last = FsError::AcrossOwners(
            "a rename within a directory over a name that keeps coming back".into(),
        );
        for _ in 0..RETARGETS_MAX {
            if self.lookup(parent, name)?.ino != dir {
                return Err(FsError::NotFound);
            }
            match self.lookup(parent, new_name) {
                Ok(d) if d.ino == dir => return Ok(()),
                Ok(_) if noreplace => return Err(FsError::Exists),
                Ok(d) if d.kind != FileKind::Directory => return Err(FsError::NotDir),
                Ok(_) => match self.remove(parent, new_name, true) {
                    Ok(()) | Err(FsError::NotFound) => {}
                    Err(e) => return Err(e),
                },
                Err(FsError::NotFound) => {}
                Err(e) => return Err(e),
            }
            match self.routed(parent, |ns| {
                ns.move_name((parent, name), (parent, new_name), how)
            }) {
                Err(e @ FsError::AcrossOwners(_)) => last = e,
                done => return done,
            }
        }
        Err(last)
    }

    /// A move of directory `dir` from `name` in `parent` to `new_name` in `new_parent`
    /// where different owners serve them or it, or that a rename without the lock found
    /// (`RenameHow::dirs_may_move`), under the rename lock (taken here unless the caller
    /// holds it: `locked`).
    fn move_dir_across_owners(
        &self,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
        (dir, noreplace): (Ino, bool),
        locked: bool,
    ) -> FsResult<()> {
        let _lock = if locked {
            None
        } else {
            Some(self.rename_lock()?)
        };
        if parent == new_parent {
            return self.move_dir_over_another_owners(parent, (name, new_name), (dir, noreplace));
        }
        let mut up = new_parent;
        for depth in 0.. {
            if up == dir {
                return Err(FsError::Invalid(
                    "cannot move a directory into itself".into(),
                ));
            }
            if up == ROOT_INO {
                break;
            }
            if depth == DEPTH_MAX {
                return Err(FsError::Corrupt(format!(
                    "directory {new_parent} has more than {DEPTH_MAX} parents above it"
                )));
            }
            up = self.lookup(up, b"..")?.ino;
        }
        // The source again, under the lock: it may have moved since the caller looked.
        if self.lookup(parent, name)?.ino != dir {
            return Err(FsError::NotFound);
        }
        match self.lookup(new_parent, new_name) {
            Ok(d) if d.ino == dir => return Ok(()),
            Ok(_) if noreplace => return Err(FsError::Exists),
            Ok(d) if d.kind != FileKind::Directory => return Err(FsError::NotDir),
            // An empty directory in the way goes first (ENOTEMPTY if it is not empty):
            // a crash between the two leaves it removed and the move not done.
            Ok(_) => self.remove(new_parent, new_name, true)?,
            Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        // The parent pointer first: from here an rmdir by the old name finds the directory
        // moving (ENOENT), and one that sealed it before refuses the move (ENOENT), so no
        // removal can free it between its new name going in and its old name going out.
        self.routed(dir, |ns| ns.reparent(dir, parent, new_parent))?;
        let put = (dir, FileKind::Directory);
        if let Err(e) = self.routed(new_parent, |ns| {
            ns.put_entry(new_parent, new_name, put, None)
        }) {
            if let Err(undo) = self.routed(dir, |ns| ns.reparent(dir, new_parent, parent)) {
                tracing::warn!(
                    "directory {dir} keeps directory {new_parent} for its parent after a \
                     failed move ({undo}), though named only in directory {parent}; fsck \
                     sets it right"
                );
            }
            return Err(e);
        }
        // From here the move is done as far as the directory knows; the old name going is
        // what fsck would finish too.
        self.routed(parent, |ns| ns.take_entry(parent, name, dir))
    }

    /// One link fewer to `ino`, after a name of it went (or a step that was to add one
    /// failed). Its failure fails nothing more: the names are right, and a link count one
    /// too high keeps the inode for fsck to set right rather than lose it.
    fn take_back_link(&self, ino: Ino) {
        if let Err(e) = self.routed(ino, |ns| ns.count_link(ino, false)) {
            tracing::warn!(
                "inode {ino} keeps one link too many after an operation across owner slots \
                 ({e}); run fsck to set its link count right"
            );
        }
    }
}
