//! Namespace changes of other nodes' clients answered before they are durable.
//!
//! An owner makes a change of another node's client durable before it answers only where
//! it must: otherwise a client whose create was answered and whose owner then died would
//! go on writing a file the new owner never heard of. A log commit per create and unlink
//! is most of what a client waits for in a directory it shares with other nodes (IO500's
//! mdtest hard), so the common namespace changes (`Make`, `DropName`, `AddName`,
//! `MoveName`, see [`answered_early`]) are answered as soon as they are logged, with their
//! log position (`MetanodeReply::Early`), as Lustre's servers answer before their
//! transactions commit. The client keeps each such `Once` request, in order with its data
//! updates, until a commit covers its position, and hands the ones not known durable to
//! a new owner at its fence (`HandedChange::Namespace`). The new owner, after replaying
//! the dead owner's log, does each again whose log record its open of the log did not
//! reach (`Journal::opened_end`; the durable records are a prefix), a `Make` under the
//! inode number the client was told (`FileSystem::replay_namespace`).
//!
//! Handed over per client, in that client's order. That is enough only if no change
//! answered early depends on a change of *another* origin that is not durable yet: such
//! a change could be lost (the owner's own processes die with it) or be done again after
//! this one (clients are fenced one by one). So an owner commits before it answers a
//! change that touches what another origin changed since the last commit
//! ([`Uncommitted`]), commit on share, as Lustre's COS does: a name (`name_key`), an
//! inode made, linked, freed or moved, a file's attributes, and for a directory's removal
//! its set of names. Directories' own attributes do not count: the creates and unlinks of
//! other names in a shared directory change its times, size and link count, and doing
//! them again recomputes those. A directory's move is always committed first: it depends
//! on the chain of its new parent's ancestors, which no key covers.

use std::collections::HashMap;

use crate::inode::{FileKind, Ino};
use crate::locks::Origin;
use crate::meta::Change;
use crate::metanode_wire::MetanodeRequest;
use tessera_journal::Lsn;

/// Entries the record of uncommitted changes holds before it is swept of durable ones.
const UNCOMMITTED_SWEEP: usize = 16_384;

/// Whether an owner may answer `request` from another node's client once it is logged,
/// before it is durable: the `Once` namespace changes the client can hand to a new owner
/// and that replay the same. Not the steps of a change across owners (`across_owners.rs`):
/// each must be durable before the next goes to another owner; nor a directory made for
/// another owner slot (the manager gives that slot a shard with it).
pub(crate) fn answered_early(request: &MetanodeRequest) -> bool {
    use MetanodeRequest as Q;
    match request {
        Q::Once { request, .. } => match &**request {
            Q::Make { node, .. } => node.for_slot.is_none(),
            Q::DropName { .. } | Q::AddName { .. } | Q::MoveName { .. } => true,
            _ => false,
        },
        _ => false,
    }
}

std::thread_local! {
    /// The newest log position a change of this thread's request was logged at.
    static LOGGED: std::cell::Cell<Option<Lsn>> = const { std::cell::Cell::new(None) };
    /// Whether a change of this thread's request touched what another origin changed
    /// since the last commit (it must be durable before it is answered).
    static SHARED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Forgets what the last request of this thread logged.
pub(crate) fn start() {
    LOGGED.set(None);
    SHARED.set(false);
}

/// Where the request this thread serves was logged, if it may be answered before that is
/// durable (`None`: nothing logged, or it touched another origin's uncommitted change).
pub(crate) fn finish() -> Option<Lsn> {
    let logged = LOGGED.take();
    let shared = SHARED.take();
    logged.filter(|_| !shared)
}

/// The key of a directory's set of names (a name no entry can have): changed by every
/// name put in or removed, read by the directory's removal, which needs it empty.
fn contents_key(dir: Ino) -> Ino {
    crate::read_tokens::name_key(dir, b"/")
}

/// The keys a change touches (see the module comment): names, inodes made, linked, freed
/// or moved, and the attributes of what is not a directory. A name put in or taken out
/// of a directory depends on the directory (it must exist: made, moved or removed by
/// another origin is shared) and, with `marks`, changes its set of names, which only the
/// directory's removal depends on (the creates of other names in a shared directory do
/// not depend on each other).
fn keys(change: &Change, marks: bool) -> impl Iterator<Item = Ino> {
    let in_dir = |dir: Ino| if marks { contents_key(dir) } else { dir };
    let (a, b, c) = match change {
        Change::DirInsert { dir, name, entry } => (
            Some(crate::read_tokens::name_key(*dir, name)),
            Some(entry.ino),
            Some(in_dir(*dir)),
        ),
        Change::DirRemove { dir, name } => (
            Some(crate::read_tokens::name_key(*dir, name)),
            None,
            Some(in_dir(*dir)),
        ),
        Change::FreeInode { ino } => (Some(*ino), Some(contents_key(*ino)), None),
        Change::SetParent { dir, .. } => (Some(*dir), None, None),
        Change::PutAttr(attr) if attr.kind != FileKind::Directory => (Some(attr.ino), None, None),
        _ => (None, None, None),
    };
    a.into_iter().chain(b).chain(c)
}

/// What each key was last changed by, and at which log position, while that may not be
/// durable: an owner's record for commit on share (see the module comment).
#[derive(Default)]
pub(crate) struct Uncommitted {
    last: HashMap<Ino, (Lsn, Option<Origin>)>,
    /// Whether another node's change was ever noted: until then nothing is (a file
    /// system used by its own node alone pays nothing for this), and the first such
    /// change is committed before it is answered, since nothing before it was noted.
    on: bool,
    /// The size past which the record is swept next: twice what a sweep left, so that a
    /// record full of changes not yet durable is not swept at every change.
    sweep_at: usize,
}

impl Uncommitted {
    /// Notes `changes`, logged at `lsn` by `origin` (`None`: this node's own processes),
    /// and marks the request this thread serves as shared when they touch a key another
    /// origin changed after `durable`. Called under the metadata lock, with the changes.
    pub(crate) fn note(
        &mut self,
        changes: &[Change],
        lsn: Lsn,
        origin: Option<Origin>,
        durable: Lsn,
    ) {
        LOGGED.set(Some(LOGGED.get().map_or(lsn, |l| l.max(lsn))));
        if !self.on {
            if origin.is_none() {
                return;
            }
            self.on = true;
            SHARED.set(true);
        }
        if self.last.len() >= self.sweep_at.max(UNCOMMITTED_SWEEP) {
            self.last.retain(|_, (at, _)| *at > durable);
            self.sweep_at = 2 * self.last.len();
        }
        // A directory moved depends on the whole chain of its new parent's ancestors
        // (no loop), which no key covers: always committed first. Rare.
        let mut shared = changes
            .iter()
            .any(|c| matches!(c, Change::SetParent { .. }));
        for key in changes.iter().flat_map(|c| keys(c, false)) {
            if let Some((at, by)) = self.last.get(&key) {
                shared |= *at > durable && *by != origin;
            }
        }
        for key in changes.iter().flat_map(|c| keys(c, true)) {
            self.last.insert(key, (lsn, origin));
        }
        if shared {
            SHARED.set(true);
        }
    }
}

std::thread_local! {
    /// The inode number a `Make` done again for a fenced client must take (the number
    /// the dead owner answered with), read once by the next `make_locked` of this thread.
    pub(crate) static MAKE_AS: std::cell::Cell<Option<Ino>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::{Attr, DirEntry, Timestamp};

    const A: Option<Origin> = Some(Origin {
        node: 2,
        incarnation: 1,
    });
    const B: Option<Origin> = Some(Origin {
        node: 3,
        incarnation: 1,
    });
    const LOCAL: Option<Origin> = None;

    fn put(dir: Ino, name: &str, ino: Ino) -> Change {
        Change::DirInsert {
            dir,
            name: name.as_bytes().to_vec(),
            entry: DirEntry {
                ino,
                kind: FileKind::Regular,
                cookie: 0,
            },
        }
    }

    fn take(dir: Ino, name: &str) -> Change {
        Change::DirRemove {
            dir,
            name: name.as_bytes().to_vec(),
        }
    }

    fn attr(ino: Ino, kind: FileKind) -> Change {
        let t = Timestamp::default();
        Change::PutAttr(Attr {
            ino,
            kind,
            perm: 0o644,
            uid: 0,
            gid: 0,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            generation: 0,
        })
    }

    /// Notes `changes` by `origin` at `lsn` with `durable` as the durable LSN; returns
    /// whether the request must be committed before it is answered.
    fn shared(
        u: &mut Uncommitted,
        changes: &[Change],
        lsn: Lsn,
        origin: Option<Origin>,
        durable: Lsn,
    ) -> bool {
        start();
        u.note(changes, lsn, origin, durable);
        finish().is_none()
    }

    #[test]
    fn only_what_another_origin_changed_and_did_not_commit_is_shared() {
        let mut u = Uncommitted::default();
        let dir = 5;
        // Nothing is noted before another node's first change, which is committed first.
        assert!(!shared(&mut u, &[put(dir, "early", 8)], 80, LOCAL, 0));
        assert!(shared(&mut u, &[put(dir, "first", 9)], 90, B, 0));
        // Three origins create other names in one directory (its times change each time):
        // nothing shared.
        assert!(!shared(
            &mut u,
            &[
                put(dir, "l", 10),
                attr(10, FileKind::Regular),
                attr(dir, FileKind::Directory)
            ],
            100,
            LOCAL,
            0
        ));
        assert!(!shared(
            &mut u,
            &[
                put(dir, "a", 11),
                attr(11, FileKind::Regular),
                attr(dir, FileKind::Directory)
            ],
            110,
            A,
            0
        ));
        assert!(!shared(
            &mut u,
            &[
                put(dir, "b", 12),
                attr(12, FileKind::Regular),
                attr(dir, FileKind::Directory)
            ],
            120,
            B,
            0
        ));
        // A's own unlink of its name: its own change.
        assert!(!shared(
            &mut u,
            &[take(dir, "a"), Change::FreeInode { ino: 11 }],
            130,
            A,
            0
        ));
        // B removes the name this node's process made, not committed: shared; once the
        // commit covers it, not.
        assert!(shared(
            &mut u,
            &[take(dir, "l"), Change::FreeInode { ino: 10 }],
            140,
            B,
            0
        ));
        assert!(!shared(&mut u, &[put(dir, "l", 13)], 150, A, 140));
        // A file another origin wrote since the commit (its attributes), linked by A:
        // shared.
        assert!(!shared(&mut u, &[attr(12, FileKind::Regular)], 155, B, 150));
        assert!(shared(
            &mut u,
            &[put(dir, "b2", 12), attr(12, FileKind::Regular)],
            160,
            A,
            150
        ));
        // The removal of a directory another origin took a name out of: shared; a create
        // in it by another origin is not, but its removal after that is.
        let sub = 20;
        assert!(!shared(&mut u, &[put(sub, "x", 21)], 170, A, 160));
        assert!(shared(
            &mut u,
            &[take(dir, "sub"), Change::FreeInode { ino: sub }],
            180,
            B,
            160
        ));
        assert!(!shared(
            &mut u,
            &[take(dir, "sub2"), Change::FreeInode { ino: 22 }],
            190,
            B,
            160
        ));
        // A name made in a directory another origin made and did not commit: shared (a
        // replay of it alone would find no directory).
        assert!(!shared(
            &mut u,
            &[put(dir, "newdir", 40), attr(dir, FileKind::Directory)],
            195,
            B,
            190
        ));
        assert!(shared(&mut u, &[put(40, "f", 41)], 196, A, 190));
        // A directory's move: always.
        assert!(shared(
            &mut u,
            &[Change::SetParent {
                dir: 30,
                parent: dir
            }],
            200,
            A,
            190
        ));
    }
}
