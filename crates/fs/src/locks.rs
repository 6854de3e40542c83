//! Advisory file locks across nodes: `fcntl` byte-range locks, `flock` whole-file locks,
//! and the append lock that makes O_APPEND atomic when several nodes append to one file.
//!
//! The metanode of a file holds its locks ([`LockTable`], in the owner's state): every
//! node's kernel hands lock requests to its mount (`FUSE_GETLK`, `FUSE_SETLK`,
//! `FUSE_SETLKW`), which asks the owner, so a lock taken on one node conflicts with one
//! taken on any other. A holder is one lock owner of one mount: the kernel's
//! `lock_owner` (the process's file table for `fcntl`, the open file for `flock` and OFD
//! locks) together with the mount's random client name. The three classes never conflict
//! with each other, as on Linux `flock` and `fcntl` locks do not.
//!
//! A waiting lock (`F_SETLKW`) is not queued at the owner: the client asks again, backing
//! off up to [`WAIT_POLL_MAX`], until it is granted or the application is interrupted. No
//! request ever waits at the owner, so no owner death, takeover or lost message can leave
//! one hanging; the price is that waiters are not served in order. A lock of a node the
//! cluster expelled is dropped at the first conflict it causes (the owner asks the daemon
//! whether its holder's node is still live), so a dead node's locks free themselves once
//! its lease ran out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::inode::Ino;

/// Longest pause between two attempts of a waiting lock.
pub const WAIT_POLL_MAX: Duration = Duration::from_millis(100);

/// Locks held in one file system, at most: each is a few dozen bytes, and a client that
/// asks for more is refused with ENOLCK, as the kernel refuses past its own limits.
pub const LOCKS_MAX: usize = 1 << 20;

/// How long a waiter's wait-for edge lasts without being asked again: ten of its longest
/// pauses between tries (see [`LockTable::wait_closes_cycle`]).
const WAIT_EDGE_LIVE: Duration = Duration::from_secs(1);
/// The longest chain of waiters deadlock detection follows (Linux follows 10); a longer
/// cycle waits as the kernel's would, interruptible.
const WAIT_CHAIN_MAX: usize = 16;

/// The end of a lock that runs to the end of the file however far it grows (the kernel's
/// `OFFSET_MAX`).
pub const TO_END: u64 = i64::MAX as u64;

/// Which family a lock belongs to; locks of different classes never conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockClass {
    /// `fcntl` record locks (and OFD locks).
    Posix,
    /// `flock` locks, whole-file.
    Flock,
    /// Taken by the file system itself around an O_APPEND write of a shared file.
    Append,
    /// Taken by the file system itself around a write into a block (or a truncate) of a
    /// shared file: nodes writing one block take turns (see [`DataToken`]).
    Data,
    /// Taken by the file system itself, on the root directory at the file system
    /// manager, around a move of a directory into another directory where several owners
    /// serve the namespace: the cluster's one rename lock (`across_owners.rs`).
    Rename,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// Who holds a lock: lock owner `owner` of mount `client`, in class `class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Holder {
    pub client: u64,
    pub owner: u64,
    pub class: LockClass,
}

/// One held lock: bytes `start..=end` of a file (`end` [`TO_END`] for "to the end").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    pub holder: Holder,
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
    /// The process that took it, for `F_GETLK`.
    pub pid: u32,
}

impl Lock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    /// Whether `self` keeps `other` (a lock wanted by someone else) from being granted.
    fn conflicts_with(&self, other: &Lock) -> bool {
        self.holder != other.holder
            && self.holder.class == other.holder.class
            && self.overlaps(other.start, other.end)
            && (self.kind == LockKind::Write || other.kind == LockKind::Write)
    }
}

/// A lock request as a client sends it to the owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockCall {
    pub lock: Lock,
    /// Only ask which lock would conflict (`F_GETLK`); change nothing.
    pub test: bool,
    /// The caller waits for the lock (`F_SETLKW`), asking again while it is refused: the
    /// owner records whom it waits for and refuses with EDEADLK a wait that would close a
    /// cycle of waiters.
    pub wait: bool,
}

/// The locks of every file of one owner, with the node each client mount runs on (for
/// dropping the locks of a node the cluster expelled).
#[derive(Default)]
pub struct LockTable {
    files: HashMap<Ino, Vec<Lock>>,
    count: usize,
    /// Where each client's requests came from: `None` for this node's own mount.
    origins: HashMap<u64, Option<Origin>>,
    /// Files whose kept data token is being taken back from its holder: no kept token is
    /// granted for them until that is done (see [`KeptTokens`]).
    revoking: std::collections::HashSet<Ino>,
    /// When a kept data token of each file was last taken back: written from several nodes,
    /// it is not kept again for [`DATA_HOT_WINDOW`].
    data_revoked: HashMap<Ino, std::time::Instant>,
    /// Whom each waiting `fcntl` lock owner waits for (the holder of the lock that refused
    /// its last `F_SETLKW` try) and when it last asked: the wait-for graph that deadlock
    /// detection follows. A waiter asks again at least every [`WAIT_POLL_MAX`]; an edge not
    /// renewed within [`WAIT_EDGE_LIVE`] is gone (granted, interrupted, or its process or
    /// node died).
    waits_for: HashMap<Holder, (Holder, std::time::Instant)>,
    /// Files whose kept data token's holder (the client here) may gather small writes in
    /// its memory (`write_behind.rs`, `MetanodeRequest::Gather`): the token is taken back
    /// before anyone else reads the file. A mark whose kept token is gone is stale and
    /// dropped when found.
    gathering: HashMap<Ino, u64>,
}

/// The node (and its incarnation) a lock request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    pub node: u32,
    pub incarnation: u64,
}

/// Why a lock could not be granted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Held by someone else: the first conflicting lock.
    Conflict(Lock),
    /// The table is full ([`LOCKS_MAX`]).
    TooMany,
}

impl LockTable {
    /// The first lock that keeps `want` from being granted, if any.
    pub fn conflict(&self, ino: Ino, want: &Lock) -> Option<Lock> {
        if want.kind == LockKind::Unlock {
            return None;
        }
        self.files
            .get(&ino)?
            .iter()
            .find(|l| l.conflicts_with(want))
            .copied()
    }

    /// Takes, changes or drops (`LockKind::Unlock`) `want`'s holder's locks on its range,
    /// as `fcntl(F_SETLK)` does: the holder's own locks there are replaced (split where
    /// they reach outside), adjacent ones of the same kind merged.
    pub fn set(&mut self, ino: Ino, want: Lock, origin: Option<Origin>) -> Result<(), Refused> {
        assert!(
            want.start <= want.end,
            "lock range {}..={}",
            want.start,
            want.end
        );
        if let Some(c) = self.conflict(ino, &want) {
            return Err(Refused::Conflict(c));
        }
        if want.kind != LockKind::Unlock && self.count + 2 > LOCKS_MAX {
            return Err(Refused::TooMany);
        }
        self.apply(ino, want, origin);
        Ok(())
    }

    /// What an owner granted, in a mount's mirror of its own locks (`held_locks`): taken
    /// as it is, never refused. A conflict there is another holder of this mount whose
    /// give-back reached the owner before its entry here went; refusing the grant left it
    /// out of the mirror, and its holder's give-back (`unlock_all`, which asks the owner
    /// only for what the mirror holds) then never reached the owner: the cluster's rename
    /// lock stayed taken until every other rename waited 120 s and failed with EIO.
    pub(crate) fn record(&mut self, ino: Ino, granted: Lock) {
        self.apply(ino, granted, None);
    }

    fn apply(&mut self, ino: Ino, want: Lock, origin: Option<Origin>) {
        self.origins.insert(want.holder.client, origin);
        self.waits_for.remove(&want.holder);
        let locks = self.files.entry(ino).or_default();
        let before = locks.len();
        let mut kept = Vec::with_capacity(locks.len() + 2);
        for l in locks.drain(..) {
            if l.holder != want.holder || !l.overlaps(want.start, want.end) {
                kept.push(l);
                continue;
            }
            // The parts of the holder's old lock outside the new range stay.
            if l.start < want.start {
                kept.push(Lock {
                    end: want.start - 1,
                    ..l
                });
            }
            if l.end > want.end {
                kept.push(Lock {
                    start: want.end + 1,
                    ..l
                });
            }
        }
        if want.kind != LockKind::Unlock {
            let mut new = want;
            // Merge with the holder's locks of the same kind that touch it.
            kept.retain(|l| {
                let touches = l.holder == want.holder
                    && l.kind == want.kind
                    && l.start <= new.end.saturating_add(1)
                    && new.start <= l.end.saturating_add(1);
                if touches {
                    new.start = new.start.min(l.start);
                    new.end = new.end.max(l.end);
                }
                !touches
            });
            kept.push(new);
        }
        *locks = kept;
        self.count = self.count + locks.len() - before;
        if locks.is_empty() {
            self.files.remove(&ino);
        }
    }

    /// Drops every lock of `holder` on `ino` (a close for `fcntl` locks, the last close of
    /// an open file for `flock`).
    pub fn drop_holder(&mut self, ino: Ino, holder: Holder) {
        self.waits_for.remove(&holder);
        let Some(locks) = self.files.get_mut(&ino) else {
            return;
        };
        let before = locks.len();
        locks.retain(|l| l.holder != holder);
        self.count -= before - locks.len();
        if locks.is_empty() {
            self.files.remove(&ino);
        }
    }

    /// Drops every lock of the clients whose origin `dead` says is gone; returns how many.
    pub fn drop_dead(&mut self, dead: impl Fn(Origin) -> bool) -> usize {
        let gone: Vec<u64> = self
            .origins
            .iter()
            .filter(|(_, o)| o.is_some_and(&dead))
            .map(|(c, _)| *c)
            .collect();
        if gone.is_empty() {
            return 0;
        }
        let mut dropped = 0;
        self.files.retain(|_, locks| {
            let before = locks.len();
            locks.retain(|l| !gone.contains(&l.holder.client));
            dropped += before - locks.len();
            !locks.is_empty()
        });
        self.waits_for
            .retain(|w, (h, _)| !gone.contains(&w.client) && !gone.contains(&h.client));
        for c in gone {
            self.origins.remove(&c);
        }
        self.count -= dropped;
        dropped
    }

    /// The origin recorded for `client`'s requests.
    pub fn origin(&self, client: u64) -> Option<Origin> {
        self.origins.get(&client).copied().flatten()
    }

    /// Every lock of `client`, by file (what it hands a new owner at a takeover).
    pub fn of_client(&self, client: u64) -> Vec<(Ino, Lock)> {
        let mut out = Vec::new();
        for (ino, locks) in &self.files {
            out.extend(
                locks
                    .iter()
                    .filter(|l| l.holder.client == client)
                    .map(|l| (*ino, *l)),
            );
        }
        out
    }

    /// Locks held in all.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether `holder` has any lock on `ino` (asked at every close: no copy).
    pub fn holds(&self, ino: Ino, holder: Holder) -> bool {
        self.files
            .get(&ino)
            .is_some_and(|locks| locks.iter().any(|l| l.holder == holder))
    }

    /// The kept data token of `ino` that the mount whose requests come from `origin` holds,
    /// unless it is being taken back.
    fn kept_by(&self, ino: Ino, origin: Origin) -> Option<Lock> {
        if self.revoking.contains(&ino) {
            return None;
        }
        let locks = self.files.get(&ino)?;
        locks
            .iter()
            .find(|l| is_kept_data(l) && self.origin(l.holder.client) == Some(origin))
            .copied()
    }

    /// Marks `ino` as gathered by the mount of `origin`, if it keeps the file's data token;
    /// false if it does not (given back, or being taken back, meanwhile).
    pub(crate) fn mark_gathering(&mut self, ino: Ino, origin: Origin) -> bool {
        match self.kept_by(ino, origin) {
            Some(lock) => {
                self.gathering.insert(ino, lock.holder.client);
                true
            }
            None => false,
        }
    }

    /// The kept data token of the mount that may have gathered writes of `ino`, and where
    /// it runs; `None` (and a stale mark dropped) when no mount does.
    pub(crate) fn gatherer(&mut self, ino: Ino) -> Option<(Lock, Origin)> {
        let client = *self.gathering.get(&ino)?;
        let origin = self.origin(client);
        let kept = self.files.get(&ino).and_then(|locks| {
            locks
                .iter()
                .find(|l| is_kept_data(l) && l.holder.client == client)
                .copied()
        });
        match (kept, origin) {
            (Some(lock), Some(origin)) => Some((lock, origin)),
            _ => {
                self.gathering.remove(&ino);
                None
            }
        }
    }

    /// A new kept data token of `ino` was granted: whoever gathered under an old one
    /// gave it back, and the new holder gathers only once it asks.
    pub(crate) fn unmark_gathering(&mut self, ino: Ino) {
        self.gathering.remove(&ino);
    }

    /// The kept data tokens a fenced client hands a new owner carry their gathering mark
    /// in the lock's `pid` ([`GATHERING_PID`]): restored here, with the lock as granted.
    pub(crate) fn restore_gathering(&mut self, ino: Ino, lock: &mut Lock) -> bool {
        if is_kept_data(lock) && lock.pid == GATHERING_PID {
            lock.pid = 0;
            self.gathering.insert(ino, lock.holder.client);
            return true;
        }
        false
    }

    /// Whether a mount other than `client` holds a data token (a write's, or one it
    /// keeps) of `ino`.
    pub(crate) fn data_held_by_others(&self, ino: Ino, client: u64) -> bool {
        self.files.get(&ino).is_some_and(|locks| {
            locks
                .iter()
                .any(|l| l.holder.class == LockClass::Data && l.holder.client != client)
        })
    }

    /// The locks on `ino`, for tests and diagnostics.
    pub fn locks_of(&self, ino: Ino) -> Vec<Lock> {
        self.files.get(&ino).cloned().unwrap_or_default()
    }

    /// Records that `waiter` waits for `holder` (its `F_SETLKW` was refused by a lock of
    /// `holder`), unless that would close a cycle of waiters: `holder`, through a chain of
    /// live waits, waits for `waiter` already. Then nothing is recorded and the answer is
    /// true: the waiter gets EDEADLK, as `fcntl` gives on one node, instead of every
    /// process of the cycle waiting for ever. Waiters and holders are lock owners of any
    /// node, so cycles across nodes are found as on one.
    pub fn wait_closes_cycle(&mut self, waiter: Holder, holder: Holder) -> bool {
        let now = std::time::Instant::now();
        let live = |at: &std::time::Instant| now.duration_since(*at) < WAIT_EDGE_LIVE;
        if self.waits_for.len() >= LOCKS_MAX {
            self.waits_for.retain(|_, (_, at)| live(at));
        }
        let mut at = holder;
        for _ in 0..WAIT_CHAIN_MAX {
            if at == waiter {
                return true;
            }
            match self.waits_for.get(&at) {
                Some((next, since)) if live(since) => at = *next,
                _ => break,
            }
        }
        if at == waiter {
            return true;
        }
        self.waits_for.insert(waiter, (holder, now));
        false
    }

    /// Whether a node may keep the data token of `ino` now: none is being taken back, and
    /// none was within [`DATA_HOT_WINDOW`].
    pub(crate) fn may_keep(&self, ino: Ino) -> bool {
        !self.revoking.contains(&ino)
            && self
                .data_revoked
                .get(&ino)
                .is_none_or(|at| at.elapsed() >= DATA_HOT_WINDOW)
    }

    /// Marks the kept data token of `ino` as being taken back; false when another request
    /// is taking it back already (then the caller waits for that).
    pub(crate) fn start_revoking(&mut self, ino: Ino) -> bool {
        self.revoking.insert(ino)
    }

    /// The kept data token `holder` had on `ino` was given back: its locks go, and the file
    /// is not kept again for a while.
    pub(crate) fn end_revoking(&mut self, ino: Ino, holder: Holder) {
        self.drop_holder(ino, holder);
        self.revoking.remove(&ino);
        self.gathering.remove(&ino);
        if self.data_revoked.len() >= KEPT_MAX {
            self.data_revoked
                .retain(|_, at| at.elapsed() < DATA_HOT_WINDOW);
        }
        self.data_revoked.insert(ino, std::time::Instant::now());
    }
}

/// Whether `lock` is a data token its holder keeps after its write (see [`KeptTokens`]).
pub(crate) fn is_kept_data(lock: &Lock) -> bool {
    lock.holder.class == LockClass::Data && lock.holder.owner == KEPT_DATA_OWNER
}

/// The `pid` a kept data token carries in a fenced client's handover when its holder may
/// have gathered writes of the file (kept tokens otherwise carry 0): the new owner marks
/// it as the old one had ([`LockTable::restore_gathering`]).
pub(crate) const GATHERING_PID: u32 = u32::MAX;

/// Longest wait at the owner of a conflicting data-token or append-lock request before it
/// is answered with the conflict (and asked again): short enough that a serving thread is
/// never parked for long and a dead holder is noticed at the next ask, long enough that a
/// token moves between nodes at the give-back, not at the next poll.
pub(crate) const OWNER_WAIT: Duration = Duration::from_millis(50);

/// The lock owner number of a node's data tokens: one holder per mount, since the node's
/// own writers of a block take turns locally before they ask (`data_token_locks`).
const DATA_TOKEN_OWNER: u64 = u64::MAX;

/// The lock owner number of a data token a client mount keeps after its write, for the
/// whole file, until the owner takes it back (see [`KeptTokens`]).
pub(crate) const KEPT_DATA_OWNER: u64 = u64::MAX - 1;

/// How long after a kept data token of a file was taken back the owner grants none for it:
/// writers on several nodes then take a token per write, which costs two round trips, where
/// keeping it would cost a revocation round trip per write of the other node.
pub(crate) const DATA_HOT_WINDOW: Duration = Duration::from_millis(250);

/// How long a client asks only per-write tokens for a file after the owner refused to let
/// it keep one, or took one back: it would most likely be refused again.
const KEEP_COOLING: Duration = Duration::from_secs(1);

/// Kept data tokens per mount, at most (each is one lock at the owner); past it, a batch
/// of [`KEPT_EVICT_BATCH`] that no write is using is given back in one request per owner.
const KEPT_MAX: usize = 4096;

/// Kept data tokens given back together when the table is full: one `DropKept` per owner
/// and batch, where one `Lock` per new file (and another for its own token, which a full
/// table could not take with the create) cost mdtest hard two round trips per file once a
/// client had written 4,096 files.
const KEPT_EVICT_BATCH: usize = KEPT_MAX / 16;

/// Longest wait of a write for the data token of its block: its holder is another node's
/// write in flight, whose own waits are bounded, or a dead node's, freed at its expel.
const DATA_WAIT_MAX: Duration = Duration::from_secs(120);

/// Bytes `start..=end` of a shared file, held for writing by this mount at the file's
/// owner until dropped: two nodes never write the same sectors (or truncate under a write)
/// at once. Without it their read-modify-writes of shared sectors, their choices of new
/// space for an unmapped block and their checksum records interleave: lost bytes and
/// checksum errors (IOR's shared-file pattern showed both). An in-place write holds just
/// the sectors it touches, so nodes writing different parts of one mapped block (IOR's
/// 47008-byte pieces) proceed together, as this node's own writers do under the block's
/// shared lock; a write that changes the block's extent (a new block, copy-on-write, a
/// growing fragment) widens its token to the whole block first. Taken per write and
/// given back after it, not cached: a step short of GPFS's byte-range tokens, which a node
/// keeps until another asks.
pub(crate) struct DataToken<'a> {
    fs: &'a crate::fs::FileSystem,
    ino: Ino,
    lock: Lock,
    /// Whether `lock` is held at the owner (not after a failed widening).
    held: bool,
    _local: Option<parking_lot::MutexGuard<'a, ()>>,
    /// The whole-file token this mount keeps, when the write runs under it: nothing to ask
    /// or give back, only to tell the token that this write is done with it.
    kept: Option<Arc<KeptToken>>,
}

/// A data token a client mount keeps after its write, for the whole file, until the owner
/// takes it back: a file written by one node at a time (IOR easy, a checkpoint, a log) then
/// costs no token round trips, where a token per write costs two. The owner grants it only
/// to another node (it cannot revoke its own mount, whose requests cost nothing anyway), when
/// nobody else holds a data token of the file and none was taken back within
/// [`DATA_HOT_WINDOW`]; any other request that conflicts with it makes the owner take it
/// back (`GiveBackData`), and the holder answers once its writes under it are done.
#[derive(Default)]
pub(crate) struct KeptToken {
    state: parking_lot::Mutex<KeptState>,
    drained: parking_lot::Condvar,
}

#[derive(Default)]
struct KeptState {
    /// Taken back (or being taken back): writes may not start under it.
    revoked: bool,
    /// Writes running under it.
    users: usize,
    /// The owner let this mount gather small writes of the file under it
    /// (`MetanodeRequest::Gather`): it takes the token back before anyone else reads the
    /// file, and this mount writes what it gathered before it gives the token back.
    gathers: bool,
    /// Small writes made under it (the second one asks to gather).
    small_writes: u32,
    /// Whether this mount asked to gather under it already.
    gather_asked: bool,
}

impl KeptToken {
    fn enter(&self) -> bool {
        let mut s = self.state.lock();
        if s.revoked {
            return false;
        }
        s.users += 1;
        true
    }

    fn leave(&self) {
        let mut s = self.state.lock();
        s.users -= 1;
        if s.users == 0 {
            self.drained.notify_all();
        }
    }

    /// Whether writes of the file may be gathered under this token now (asked while the
    /// file's gathered runs are locked, so that [`Self::stop_gathering`] followed by a
    /// flush finds every write gathered before it).
    pub(crate) fn gathers(&self) -> bool {
        let s = self.state.lock();
        s.gathers && !s.revoked
    }

    /// Counts a small write under this token: true once, at the second, when this mount
    /// should ask the owner to let it gather.
    pub(crate) fn should_ask_to_gather(&self) -> bool {
        let mut s = self.state.lock();
        if s.revoked || s.gathers || s.gather_asked {
            return false;
        }
        s.small_writes += 1;
        if s.small_writes < 2 {
            return false;
        }
        s.gather_asked = true;
        true
    }

    /// The owner let this mount gather under the token; false if it was taken back
    /// meanwhile.
    pub(crate) fn start_gathering(&self) -> bool {
        let mut s = self.state.lock();
        s.gathers = !s.revoked;
        s.gathers
    }

    /// No write is gathered under the token from now on.
    pub(crate) fn stop_gathering(&self) {
        self.state.lock().gathers = false;
    }

    /// Stops new writes under the token and waits for those running.
    fn revoke_and_drain(&self) {
        let mut s = self.state.lock();
        s.revoked = true;
        while s.users > 0 {
            self.drained.wait(&mut s);
        }
    }
}

/// The data tokens a client mount keeps, and the files it does not ask to keep one for now.
#[derive(Default)]
pub(crate) struct KeptTokens {
    inner: parking_lot::Mutex<KeptInner>,
}

#[derive(Default)]
struct KeptInner {
    tokens: HashMap<Ino, Arc<KeptToken>>,
    /// When the owner last refused to let this mount keep the token of a file, or took it
    /// back ([`KEEP_COOLING`]).
    cooling: HashMap<Ino, std::time::Instant>,
}

impl KeptInner {
    fn cool(&mut self, ino: Ino) {
        if self.cooling.len() >= KEPT_MAX {
            self.cooling.retain(|_, at| at.elapsed() < KEEP_COOLING);
        }
        self.cooling.insert(ino, std::time::Instant::now());
    }

    fn may_ask(&self, ino: Ino) -> bool {
        self.cooling
            .get(&ino)
            .is_none_or(|at| at.elapsed() >= KEEP_COOLING)
    }

    /// Room for one more kept token: nothing to give back while the table has room; when
    /// it is full, the batch [`KeptInner::evict`] took out to give back; `None` when every
    /// kept token is in use.
    fn make_room(&mut self, idle: &dyn Fn(Ino) -> bool) -> Option<Vec<Ino>> {
        if self.tokens.len() < KEPT_MAX {
            return Some(Vec::new());
        }
        Some(self.evict(idle)).filter(|old| !old.is_empty())
    }

    /// Takes up to [`KEPT_EVICT_BATCH`] kept tokens no write is using out of the table, to
    /// give back (the table is full); empty if every one is in use. A token writes were
    /// gathered under goes only if `idle` says nothing of the file is gathered now (asked
    /// under the token's state lock, which a gathering write takes under the file's runs:
    /// a write that gathers after that finds the token revoked).
    fn evict(&mut self, idle: &dyn Fn(Ino) -> bool) -> Vec<Ino> {
        let inos: Vec<Ino> = self
            .tokens
            .iter()
            .filter_map(|(ino, token)| {
                let mut s = token.state.lock();
                let free = s.users == 0 && !s.revoked && (!s.gathers || idle(*ino));
                free.then(|| {
                    s.revoked = true;
                    *ino
                })
            })
            .take(KEPT_EVICT_BATCH)
            .collect();
        for ino in &inos {
            self.tokens.remove(ino);
        }
        inos
    }
}

impl KeptTokens {
    /// How many files this mount keeps the data token of.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().tokens.len()
    }
}

thread_local! {
    /// The data tokens this thread holds, as (inode, start, end): a write a truncate makes
    /// into the block it cuts runs under the truncate's token, and must not ask again (the
    /// local turn is not reentrant, and at the owner its give-back would cut a hole in the
    /// truncate's range).
    static HELD: std::cell::RefCell<Vec<(Ino, u64, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl DataToken<'_> {
    /// Makes this token cover `start..=end` (a superset of what it holds). The narrow range
    /// is given back before the wide one is asked for: two nodes each holding sectors of one
    /// block and both asking for all of it would otherwise wait for each other. Whoever
    /// writes the block meanwhile, the caller plans its write again afterwards.
    pub(crate) fn widen(&mut self, start: u64, end: u64) -> crate::FsResult<()> {
        if self.kept.is_some() || (self.held && self.lock.start <= start && end <= self.lock.end) {
            return Ok(());
        }
        self.give_back();
        let lock = Lock {
            start,
            end,
            ..self.lock
        };
        self.fs
            .lock_until(self.ino, lock, Some(&|| false), Some(DATA_WAIT_MAX))?;
        HELD.with(|h| h.borrow_mut().push((self.ino, start, end)));
        self.lock = lock;
        self.held = true;
        Ok(())
    }

    fn give_back(&mut self) {
        if !std::mem::take(&mut self.held) {
            return;
        }
        forget_held(self.ino, self.lock.start, self.lock.end);
        let unlock = Lock {
            kind: LockKind::Unlock,
            ..self.lock
        };
        let call = LockCall {
            lock: unlock,
            test: false,
            wait: false,
        };
        let r =
            crate::metanode::Namespace::lock(self.fs.namespace_of(self.ino), self.ino, call, None);
        self.fs.held_locks.lock().record(self.ino, unlock);
        if let Err(e) = r {
            tracing::error!(
                "inode {}: giving back the data token of bytes {}..={}: {e}; other nodes wait \
                 for it until this node leaves the cluster",
                self.ino,
                self.lock.start,
                self.lock.end
            );
        }
    }
}

impl Drop for DataToken<'_> {
    fn drop(&mut self) {
        match self.kept.take() {
            Some(kept) => {
                forget_held(self.ino, self.lock.start, self.lock.end);
                kept.leave();
            }
            None => self.give_back(),
        }
    }
}

/// Takes `(ino, start, end)` off this thread's list of held tokens.
fn forget_held(ino: Ino, start: u64, end: u64) {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if let Some(i) = h.iter().rposition(|t| *t == (ino, start, end)) {
            h.remove(i);
        }
    });
}

/// How often a give-back of locks is sent before it is given up
/// ([`crate::fs::FileSystem::give_back_locks_until_answered`]): about 2.5 s of pauses.
const GIVE_BACK_TRIES: u32 = 8;

/// Longest wait of an O_APPEND write for the append lock of its file. Its holder is
/// another node's append in flight, whose own waits are bounded, or a dead node's, freed
/// once the cluster expels it; past this something is wrong and the write fails with EIO.
const APPEND_WAIT_MAX: Duration = Duration::from_secs(120);

impl crate::fs::FileSystem {
    /// Tells this owner how to learn whether the node a lock holder's requests came from
    /// is gone from the cluster (expelled, or restarted as a new incarnation): its locks
    /// are dropped at the first conflict they cause. Only the first function set is used.
    pub fn on_lock_holder_check(&self, gone: Box<dyn Fn(Origin) -> bool + Send + Sync>) {
        let _ = self.holder_gone.set(gone);
    }

    /// The holder that lock owner `owner` (the kernel's `lock_owner`) of this mount is.
    pub fn lock_holder(&self, owner: u64, class: LockClass) -> Holder {
        Holder {
            client: self.lock_client,
            owner,
            class,
        }
    }

    /// Lets this owner let other nodes keep data tokens until it takes them back
    /// ([`KeptToken`]): `revoke(node, inodes)` sends node `node` the files whose tokens it
    /// must give back and returns once it answered (its writes under them are done) or is
    /// gone from the cluster. Called by a thread serving a conflicting token request,
    /// holding no lock. Only the first function set is used.
    pub fn on_data_revoke(&self, revoke: Box<dyn Fn(Origin, Vec<Ino>) + Send + Sync>) {
        if self.is_owner() {
            let _ = self.owner().data_revoke.set(revoke);
        }
    }

    /// Lets this owner grant other nodes views they keep until it revokes them
    /// (`read_tokens.rs`): `revoke(node, inodes)` sends node `node` the inodes whose
    /// views it must drop and returns once it answered or is gone from the cluster. It is
    /// called by the thread that logged the change, once it let the metadata lock go and
    /// before the change's operation returns.
    /// Only the first function set is used.
    pub fn on_read_revoke(&self, revoke: Box<dyn Fn(Origin, Vec<Ino>) + Send + Sync>) {
        if self.is_owner() {
            let _ = self.owner().meta.holders.revoke.set(revoke);
        }
    }

    /// `F_GETLK`: the lock that keeps `want` from being granted, if any.
    pub fn lock_test(&self, ino: Ino, want: Lock) -> crate::FsResult<Option<Lock>> {
        let call = LockCall {
            lock: want,
            test: true,
            wait: false,
        };
        crate::metanode::Namespace::lock(self.namespace_of(ino), ino, call, None)
    }

    /// `F_SETLK` (`cancelled` `None`: EAGAIN on a conflict) and `F_SETLKW` (asks again
    /// until granted, or EINTR once `cancelled` says the caller was interrupted).
    pub fn lock_set(
        &self,
        ino: Ino,
        want: Lock,
        cancelled: Option<&dyn Fn() -> bool>,
    ) -> crate::FsResult<()> {
        self.lock_until(ino, want, cancelled, None)
    }

    pub(crate) fn lock_until(
        &self,
        ino: Ino,
        want: Lock,
        cancelled: Option<&dyn Fn() -> bool>,
        limit: Option<Duration>,
    ) -> crate::FsResult<()> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            let call = LockCall {
                lock: want,
                test: false,
                wait: cancelled.is_some(),
            };
            let conflict =
                crate::metanode::Namespace::lock(self.namespace_of(ino), ino, call, None)?;
            let Some(conflict) = conflict else {
                // The mirror of this mount's own locks never conflicts with itself.
                self.held_locks.lock().record(ino, want);
                return Ok(());
            };
            let Some(cancelled) = cancelled else {
                return Err(crate::FsError::WouldBlock);
            };
            if cancelled() {
                return Err(crate::FsError::Interrupted);
            }
            if limit.is_some_and(|l| started.elapsed() > l) {
                return Err(crate::FsError::Remote {
                    errno: libc::EIO,
                    message: format!(
                        "waited {}s for a lock of inode {ino} held by lock owner {:x} of \
                         mount {:x}; giving up",
                        started.elapsed().as_secs(),
                        conflict.holder.owner,
                        conflict.holder.client
                    ),
                });
            }
            if !matches!(want.holder.class, LockClass::Data | LockClass::Append) {
                // The owner waited for these already (`OWNER_WAIT`).
                std::thread::sleep(pause);
                pause = (pause * 2).min(WAIT_POLL_MAX);
            }
        }
    }

    /// Drops every lock `holder` has on `ino` (a close drops a process's `fcntl` locks,
    /// the last close of an open file its `flock`); asks the owner only when this mount
    /// holds some.
    pub fn unlock_all(&self, ino: Ino, holder: Holder) -> crate::FsResult<()> {
        if !self.held_locks.lock().holds(ino, holder) {
            return Ok(());
        }
        self.give_back_locks_until_answered(ino, holder)
    }

    /// [`Self::give_back_locks`], asked again (with pauses, a bounded number of times)
    /// while the owner cannot be reached: the holder is alive, so no expel would ever free
    /// a give-back that was lost, and every other node would wait for the lock in vain (a
    /// close's `fcntl` locks, an append lock, the rename lock). Safe to repeat: an unlock
    /// of what `holder` does not hold changes nothing. A fenced node is not asked again:
    /// the owner dropped its locks when it fenced it.
    pub(crate) fn give_back_locks_until_answered(
        &self,
        ino: Ino,
        holder: Holder,
    ) -> crate::FsResult<()> {
        let mut pause = Duration::from_millis(20);
        let mut attempt = 1;
        loop {
            match self.give_back_locks(ino, holder) {
                Ok(()) => return Ok(()),
                Err(e) if attempt == GIVE_BACK_TRIES || matches!(e, crate::FsError::Fenced) => {
                    return Err(e)
                }
                Err(e) => {
                    tracing::warn!(
                        "inode {ino}: giving back the {:?} locks of lock owner {:x}: {e}; \
                         asking again",
                        holder.class,
                        holder.owner
                    );
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                    attempt += 1;
                }
            }
        }
    }

    /// Asks `ino`'s owner to drop every lock of `holder`, whatever this mount's mirror
    /// says (the owner changes nothing where `holder` holds none), and forgets them here.
    pub(crate) fn give_back_locks(&self, ino: Ino, holder: Holder) -> crate::FsResult<()> {
        let all = Lock {
            holder,
            start: 0,
            end: TO_END,
            kind: LockKind::Unlock,
            pid: 0,
        };
        let call = LockCall {
            lock: all,
            test: false,
            wait: false,
        };
        let result = crate::metanode::Namespace::lock(self.namespace_of(ino), ino, call, None);
        self.held_locks.lock().drop_holder(ino, holder);
        result.map(|_| ())
    }

    /// Whether other nodes may mount this file system (a shared mount): then writes take
    /// data tokens ([`DataToken`]) and appends the append lock. Set at mount by the access
    /// layer; a one-node mount needs neither.
    pub fn set_shared(&self, shared: bool) {
        self.shared
            .store(shared, std::sync::atomic::Ordering::Release);
    }

    /// The data token of bytes `start..=end` of `ino` (nothing on a mount that is not
    /// shared, or inside a token this thread holds). Writers of this node into the same
    /// block take turns here first, so the owner sees one request of this node at a time
    /// for it, and no two of this node's tokens (one holder at the owner) ever overlap.
    pub(crate) fn data_token(
        &self,
        ino: Ino,
        start: u64,
        end: u64,
    ) -> crate::FsResult<Option<DataToken<'_>>> {
        if !self.shared.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(None);
        }
        let covered = HELD.with(|h| {
            h.borrow()
                .iter()
                .any(|(i, s, e)| *i == ino && *s <= start && end <= *e)
        });
        if covered {
            return Ok(None);
        }
        if let Some(token) = self.kept_data_token(ino)? {
            return Ok(Some(token));
        }
        let block = start / self.geo.block_bytes;
        // A real hash of both: `ino ^ (block << 17)` kept only the inode's low bits, so
        // every block of a file shared one turn and a node's writers of one file took
        // turns for all of it.
        let stripe = crate::fs::stripe(&[ino, block], self.data_token_locks.len());
        let local = self.data_token_locks[stripe].lock();
        let lock = Lock {
            holder: self.lock_holder(DATA_TOKEN_OWNER, LockClass::Data),
            start,
            end,
            kind: LockKind::Write,
            pid: 0,
        };
        self.lock_until(ino, lock, Some(&|| false), Some(DATA_WAIT_MAX))?;
        HELD.with(|h| h.borrow_mut().push((ino, start, end)));
        Ok(Some(DataToken {
            fs: self,
            ino,
            lock,
            held: true,
            _local: Some(local),
            kept: None,
        }))
    }

    /// The whole-file data token this client mount keeps for `ino`, asked for if it keeps
    /// none and may ask (see [`KeptToken`]); `None` when the write must take a token of its
    /// own.
    fn kept_data_token(&self, ino: Ino) -> crate::FsResult<Option<DataToken<'_>>> {
        // A mount that serves the file itself takes its tokens in its own table; one that
        // reaches another owner (a client, or a slot's owner writing another slot's file)
        // keeps them.
        if self.serves(ino) {
            return Ok(None);
        }
        let whole = self.kept_whole();
        let (existing, evicted) = {
            let mut inner = self.kept_data.inner.lock();
            match inner.tokens.get(&ino) {
                Some(token) => (Some(Arc::clone(token)), Vec::new()),
                None if !inner.may_ask(ino) => return Ok(None),
                None => match inner.make_room(&|i| self.gathered_idle(i)) {
                    Some(old) => (None, old),
                    None => return Ok(None),
                },
            }
        };
        // Files a long-running client wrote before give way to the new ones.
        self.give_back_evicted(&evicted, whole);
        let token = match existing {
            Some(token) => token,
            None => {
                let asked = std::time::Instant::now();
                let call = LockCall {
                    lock: whole,
                    test: false,
                    wait: false,
                };
                let refused =
                    crate::metanode::Namespace::lock(self.namespace_of(ino), ino, call, None)?;
                let mut inner = self.kept_data.inner.lock();
                if refused.is_some() {
                    inner.cool(ino);
                    return Ok(None);
                }
                // Taken back while the grant was on its way: the owner drops it.
                if inner.cooling.get(&ino).is_some_and(|at| *at >= asked) {
                    return Ok(None);
                }
                self.held_locks.lock().record(ino, whole);
                Arc::clone(inner.tokens.entry(ino).or_default())
            }
        };
        if !token.enter() {
            return Ok(None);
        }
        HELD.with(|h| h.borrow_mut().push((ino, whole.start, whole.end)));
        Ok(Some(DataToken {
            fs: self,
            ino,
            lock: whole,
            held: false,
            _local: None,
            kept: Some(token),
        }))
    }

    /// The data token a mount asks to keep with the create of a file in `parent` that
    /// another owner serves (`NewNode::keep_data`): the whole-file token it keeps, when its
    /// table has room or can make some.
    pub(crate) fn data_token_to_keep_at_create(&self, parent: Ino) -> Option<Lock> {
        // The new file is in its directory's shard: served here or elsewhere with it.
        if self.serves(parent) || !self.shared.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let whole = self.kept_whole();
        let evicted = self
            .kept_data
            .inner
            .lock()
            .make_room(&|i| self.gathered_idle(i))?;
        self.give_back_evicted(&evicted, whole);
        Some(whole)
    }

    /// The data token this mount keeps for `ino`, if any.
    pub(crate) fn kept_token(&self, ino: Ino) -> Option<Arc<KeptToken>> {
        self.kept_data.inner.lock().tokens.get(&ino).cloned()
    }

    /// The owner granted the data token of `ino` with its create: kept as if asked for.
    pub(crate) fn keep_data_token_made(&self, ino: Ino) {
        let whole = self.kept_whole();
        self.held_locks.lock().record(ino, whole);
        self.kept_data.inner.lock().tokens.entry(ino).or_default();
    }

    /// The owner takes back the data tokens this mount keeps for `inos` (`GiveBackData`):
    /// returns once no write of this node runs under them. The owner then drops them from
    /// its table.
    pub(crate) fn give_back_kept(&self, inos: &[Ino]) {
        let holder = self.lock_holder(KEPT_DATA_OWNER, LockClass::Data);
        for &ino in inos {
            let token = {
                let mut inner = self.kept_data.inner.lock();
                inner.cool(ino);
                inner.tokens.get(&ino).cloned()
            };
            let Some(token) = token else { continue };
            // What was gathered under it is written while it is still held.
            token.stop_gathering();
            self.flush_gathered_quietly(ino);
            token.revoke_and_drain();
            let mut inner = self.kept_data.inner.lock();
            if inner
                .tokens
                .get(&ino)
                .is_some_and(|t| Arc::ptr_eq(t, &token))
            {
                inner.tokens.remove(&ino);
            }
            self.held_locks.lock().drop_holder(ino, holder);
        }
    }

    /// The whole-file data token a client mount keeps: its lock at the owner.
    fn kept_whole(&self) -> Lock {
        Lock {
            holder: self.lock_holder(KEPT_DATA_OWNER, LockClass::Data),
            start: 0,
            end: TO_END,
            kind: LockKind::Write,
            pid: 0,
        }
    }

    /// Gives back every kept data token (a client mount's unmount): otherwise the owner
    /// would take each back from this node with a revocation the next time another node
    /// writes the file, long after this mount has gone.
    pub(crate) fn give_back_all_kept(&self) {
        let whole = self.kept_whole();
        let tokens: Vec<(Ino, Arc<KeptToken>)> =
            self.kept_data.inner.lock().tokens.drain().collect();
        for (_, token) in &tokens {
            token.revoke_and_drain();
        }
        let inos: Vec<Ino> = tokens.iter().map(|(ino, _)| *ino).collect();
        self.give_back_evicted(&inos, whole);
    }

    /// Gives the kept tokens of `inos`, taken out of the table, back to their owners: one
    /// request per owner.
    fn give_back_evicted(&self, inos: &[Ino], whole: Lock) {
        if inos.is_empty() {
            return;
        }
        {
            let mut held = self.held_locks.lock();
            for &ino in inos {
                held.drop_holder(ino, whole.holder);
            }
        }
        let mut by_owner: Vec<(&dyn crate::metanode::Namespace, Vec<Ino>)> = Vec::new();
        for &ino in inos {
            let owner = self.namespace_of(ino);
            match by_owner
                .iter_mut()
                .find(|(o, _)| std::ptr::addr_eq(*o, owner))
            {
                Some((_, list)) => list.push(ino),
                None => by_owner.push((owner, vec![ino])),
            }
        }
        for (owner, inos) in by_owner {
            if let Err(e) = owner.drop_kept(whole.holder, &inos, None) {
                // Still recorded at the owner: another node's write takes each back.
                tracing::warn!("giving back {} kept data tokens: {e}", inos.len());
            }
        }
    }

    /// How many kept data tokens this owner has granted, to all nodes (a diagnostic).
    pub fn kept_data_tokens_granted(&self) -> usize {
        if !self.is_owner() {
            return 0;
        }
        let table = self.owner().locks.lock();
        table
            .files
            .values()
            .map(|locks| locks.iter().filter(|l| is_kept_data(l)).count())
            .sum()
    }

    /// How many inodes other nodes hold read tokens on at this owner (a diagnostic).
    pub fn read_tokens_granted(&self) -> usize {
        if !self.is_owner() {
            return 0;
        }
        self.owner().meta.holders.tracked()
    }

    /// How many files this mount keeps the data token of (a diagnostic).
    pub fn kept_data_tokens(&self) -> usize {
        self.kept_data.len()
    }

    /// Appends `data` to the end of `ino` atomically with respect to every other O_APPEND
    /// writer on any node: this node's appenders of the file take turns, and the nodes
    /// take the file's append lock at its owner, so the size each reads is the end the
    /// previous append left. Returns the offset written at.
    ///
    /// What this node gathered of the file stays gathered (a log appended in small pieces
    /// is gathered like one written at offsets): the end read here includes it, and another
    /// node's append asks this owner for the append lock, or the gathering node's owner,
    /// which first has what was gathered written (`write_behind.rs`).
    pub fn append(&self, ino: Ino, data: &[u8], sync: bool) -> crate::FsResult<u64> {
        let _local = self.append_locks[ino as usize % self.append_locks.len()].lock();
        let holder = self.lock_holder(0, LockClass::Append);
        let whole = Lock {
            holder,
            start: 0,
            end: TO_END,
            kind: LockKind::Write,
            pid: std::process::id(),
        };
        if let Err(e) = self.lock_until(ino, whole, Some(&|| false), Some(APPEND_WAIT_MAX)) {
            // The owner may have granted it and the answer been lost on the way back; no
            // append of this node holds it now (they take turns above).
            let _ = self.give_back_locks_until_answered(ino, holder);
            return Err(e);
        }
        let written = (|| -> crate::FsResult<u64> {
            // The size as every append that returned left it: on the file's owner, what
            // another node gathered of it comes back first (`getattr`), as a remote size
            // request's does; without it, an append gathered on a client just before was
            // overwritten by this one.
            let at = self.getattr(ino)?.size;
            self.write(ino, at, data, sync)?;
            Ok(at)
        })();
        let unlocked = self.unlock_all(ino, holder);
        let at = written?;
        unlocked?;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(client: u64, owner: u64) -> Holder {
        Holder {
            client,
            owner,
            class: LockClass::Posix,
        }
    }

    fn lock(holder: Holder, start: u64, end: u64, kind: LockKind) -> Lock {
        Lock {
            holder,
            start,
            end,
            kind,
            pid: 7,
        }
    }

    #[test]
    fn a_wait_that_closes_a_cycle_of_waiters_is_a_deadlock() {
        let mut t = LockTable::default();
        let (a, b, c, d) = (h(1, 1), h(2, 1), h(3, 9), h(1, 2));
        // a waits for b, b for c: no cycle yet; c waiting for a closes one.
        assert!(!t.wait_closes_cycle(a, b));
        assert!(!t.wait_closes_cycle(b, c));
        assert!(t.wait_closes_cycle(c, a), "c -> a -> b -> c");
        // Nothing was recorded for the refused waiter; another owner of a's node is
        // someone else.
        assert!(!t.wait_closes_cycle(d, c));
        // A grant ends a wait: once b holds a lock, a chain through b is broken.
        t.set(5, lock(b, 0, 9, LockKind::Write), None).unwrap();
        assert!(
            !t.wait_closes_cycle(c, a),
            "a -> b ends at b, who waits no more"
        );
        // Waiting for oneself (two locks of one owner never conflict, but a stale edge
        // could say so) and a dropped holder.
        assert!(t.wait_closes_cycle(a, a));
        t.drop_holder(5, c);
        assert!(!t.wait_closes_cycle(b, c));
        // Edges that are not renewed die.
        let mut t = LockTable::default();
        assert!(!t.wait_closes_cycle(a, b));
        t.waits_for.get_mut(&a).unwrap().1 -= WAIT_EDGE_LIVE;
        assert!(!t.wait_closes_cycle(b, a), "a's wait is stale");
    }

    #[test]
    fn readers_share_and_a_writer_excludes_across_clients() {
        let mut t = LockTable::default();
        let (a, b) = (h(1, 1), h(2, 1));
        t.set(5, lock(a, 0, 99, LockKind::Read), None).unwrap();
        t.set(5, lock(b, 50, 149, LockKind::Read), None).unwrap();
        let w = lock(b, 90, 200, LockKind::Write);
        assert_eq!(
            t.set(5, w, None),
            Err(Refused::Conflict(lock(a, 0, 99, LockKind::Read)))
        );
        // Past a's range it is granted; another file is independent.
        t.set(5, lock(b, 100, 200, LockKind::Write), None).unwrap();
        t.set(6, lock(a, 0, TO_END, LockKind::Write), None).unwrap();
        assert_eq!(
            t.conflict(5, &lock(a, 150, 150, LockKind::Read))
                .unwrap()
                .holder,
            b
        );
    }

    #[test]
    fn a_holders_own_locks_are_replaced_split_and_merged() {
        let mut t = LockTable::default();
        let a = h(1, 1);
        t.set(1, lock(a, 0, 99, LockKind::Write), None).unwrap();
        // Unlocking the middle splits it.
        t.set(1, lock(a, 40, 59, LockKind::Unlock), None).unwrap();
        assert_eq!(
            t.locks_of(1),
            vec![
                lock(a, 0, 39, LockKind::Write),
                lock(a, 60, 99, LockKind::Write)
            ]
        );
        // Downgrading part of it replaces that part.
        t.set(1, lock(a, 0, 9, LockKind::Read), None).unwrap();
        assert_eq!(t.len(), 3);
        // Filling the hole with the same kind merges all write parts.
        t.set(1, lock(a, 40, 59, LockKind::Write), None).unwrap();
        let mut got = t.locks_of(1);
        got.sort_by_key(|l| l.start);
        assert_eq!(
            got,
            vec![
                lock(a, 0, 9, LockKind::Read),
                lock(a, 10, 99, LockKind::Write)
            ]
        );
        t.drop_holder(1, a);
        assert!(t.is_empty() && t.locks_of(1).is_empty());
    }

    #[test]
    fn classes_do_not_conflict_and_dead_nodes_lose_their_locks() {
        let mut t = LockTable::default();
        let flock = Holder {
            class: LockClass::Flock,
            ..h(1, 1)
        };
        t.set(
            1,
            lock(flock, 0, TO_END, LockKind::Write),
            Some(Origin {
                node: 3,
                incarnation: 1,
            }),
        )
        .unwrap();
        t.set(1, lock(h(2, 1), 0, TO_END, LockKind::Write), None)
            .unwrap();
        assert!(t
            .conflict(1, &lock(h(9, 9), 0, 0, LockKind::Read))
            .is_some());
        assert_eq!(t.drop_dead(|o| o.node == 4), 0);
        assert_eq!(t.drop_dead(|o| o.node == 3), 1);
        // The local mount's locks (no origin) never count as dead.
        assert_eq!(t.drop_dead(|_| true), 0);
        assert_eq!(t.len(), 1);
    }

    proptest! {
        /// Against a byte-by-byte model: after any sequence of sets, each byte of each
        /// holder is locked with the kind the last set covering it asked for, and no two
        /// holders hold conflicting locks on one byte.
        #[test]
        fn matches_a_per_byte_model(
            ops in proptest::collection::vec((0u64..3, 0u64..64, 0u64..16, 0u8..3), 1..60)
        ) {
            let mut t = LockTable::default();
            let mut model: HashMap<(u64, u64), LockKind> = HashMap::new();
            for (client, start, len, kind) in ops {
                let kind = [LockKind::Read, LockKind::Write, LockKind::Unlock][kind as usize];
                let want = lock(h(client, 0), start, start + len, kind);
                let conflicts = (start..=start + len).any(|b| {
                    model.iter().any(|((c, byte), k)| {
                        *c != client && *byte == b && kind != LockKind::Unlock
                            && (*k == LockKind::Write || kind == LockKind::Write)
                    })
                });
                let r = t.set(0, want, None);
                prop_assert_eq!(r.is_err(), conflicts);
                if r.is_ok() {
                    for b in start..=start + len {
                        if kind == LockKind::Unlock {
                            model.remove(&(client, b));
                        } else {
                            model.insert((client, b), kind);
                        }
                    }
                }
                let locks = t.locks_of(0);
                let mut seen: HashMap<(u64, u64), LockKind> = HashMap::new();
                for l in &locks {
                    for b in l.start..=l.end {
                        prop_assert!(seen.insert((l.holder.client, b), l.kind).is_none());
                    }
                }
                prop_assert_eq!(&seen, &model);
                prop_assert_eq!(t.len(), locks.len());
            }
        }
    }
}
