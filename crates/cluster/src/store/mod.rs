//! Persistent Raft storage for the configuration repository: the Raft log and the applied
//! state machine of one node, both in one redb file (`$TESSERA_HOME/cluster/raft.redb` in the
//! daemon; the path is a parameter here).
//!
//! [`open`] returns the two halves openraft's storage-v2 API asks for, [`LogStore`]
//! (`RaftLogStorage` + `RaftLogReader`) and [`StateMachineStore`] (`RaftStateMachine` +
//! `RaftSnapshotBuilder`), sharing one `Arc<redb::Database>`. The application state is any
//! [`Replicated`] type; the store applies commands to it, persists it, snapshots it and hands
//! out read-only copies for listings that do not go through Raft.
//!
//! # Durability
//!
//! Every write is a redb transaction with `Durability::Immediate`: when `commit` returns, the
//! data is on stable storage (redb fsyncs its two-slot commit header). Hence:
//! - `append` calls openraft's flush callback only after its commit returned, so this node
//!   counts towards a quorum only for entries that survive kill -9 and power loss;
//! - the vote, the committed log id, truncation and purge are durable on return;
//! - `apply` writes the new state, the last applied log id and the last membership in one
//!   transaction per batch, so the state is never ahead of or behind the log id Raft resumes
//!   from;
//! - installing a snapshot replaces state, applied log id, membership and current snapshot in
//!   one transaction.
//!
//! The store calls redb inline on the caller's task. A commit costs one or two fsyncs (about
//! a millisecond on SSDs), configuration changes are rare, and keeping the I/O on the Raft task
//! leaves the store free of any runtime, which a deterministic simulation needs.
//!
//! # Table layout
//!
//! | table           | key                  | value                                          |
//! |-----------------|----------------------|------------------------------------------------|
//! | `meta`          | `"format_version"`   | u32 little-endian, 4 bytes: [`FORMAT_VERSION`] |
//! | `meta`          | `"vote"`             | `Vote<u64>`                                    |
//! | `meta`          | `"committed"`        | `Option<LogId<u64>>`                           |
//! | `meta`          | `"last_purged"`      | `LogId<u64>`                                   |
//! | `log`           | log index (u64)      | `openraft::Entry<C>`                           |
//! | `state_machine` | `"applied"`          | `{ last_applied, last_membership }` (1)        |
//! | `state_machine` | `"state"`            | the application state `S`                      |
//! | `state_machine` | `"snapshot_meta"`    | `SnapshotMeta<u64, BasicNode>`                 |
//! | `state_machine` | `"snapshot_data"`    | snapshot blob (2)                              |
//! | `state_machine` | `"snapshot_seq"`     | u64: snapshots built so far, for unique ids    |
//!
//! Keys of `meta` and `state_machine` are `&str`, values `&[u8]`. (1) `last_applied:
//! Option<LogId<u64>>`, `last_membership: StoredMembership<u64, BasicNode>`. (2) below.
//!
//! Values other than the format version are postcard encodings of the named Rust types, so
//! their bytes follow the field order of those types; changing any of them (openraft's
//! included, which is why openraft is pinned) means bumping [`FORMAT_VERSION`]. A record must
//! decode whole: stray bytes after its end count as damage.
//!
//! A snapshot blob is bytes 0..4 the format version (u32 little-endian), then the postcard
//! encoding of `{ applied: {last_applied, last_membership}, state: S }`. Blobs travel between
//! nodes, so the receiver checks the version before it decodes the body, and checks that the
//! body agrees with the snapshot metadata sent beside it.
//!
//! # Versioning and damage
//!
//! A new file is stamped with [`FORMAT_VERSION`] in its first commit, together with the
//! creation of all three tables. At open: a file of a newer version is refused
//! ([`StoreError::NewerFormat`]); a file without the stamp, with a missing table, with a page
//! that fails redb's checksum (the whole file is verified at open), or with a record that does
//! not decode is refused as [`StoreError::Damaged`], which tells the operator to remove the file
//! and re-add the node, since the quorum holds the configuration. Nothing is repaired in place.

mod db;
mod error;
mod log;
mod state_machine;

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use openraft::{BasicNode, RaftTypeConfig};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use db::FORMAT_VERSION;
pub use error::StoreError;
pub use log::{LogStore, LOG_READ_ENTRIES_MAX};
pub use state_machine::{AppliedWatch, StateMachineStore};

/// The application state the Raft log replicates (the cluster configuration).
///
/// `apply` must be deterministic: every node applies the same commands in the same order and
/// must reach the same state. It must not fail either; a command that is invalid against the
/// state returns that verdict in its `Response`.
pub trait Replicated:
    Default + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The command carried in a normal log entry (`C::D`).
    type Command;
    /// The outcome of one command (`C::R`); blank and membership entries answer `default()`.
    type Response: Default;

    fn apply(&mut self, command: &Self::Command) -> Self::Response;
}

/// The Raft type configurations this store serves: `u64` node ids, [`BasicNode`] addresses,
/// openraft's own entries and in-memory snapshot blobs. The async runtime stays open.
pub trait StoreTypeConfig:
    RaftTypeConfig<
    NodeId = u64,
    Node = BasicNode,
    Entry = openraft::Entry<Self>,
    SnapshotData = Cursor<Vec<u8>>,
>
{
}

impl<C> StoreTypeConfig for C where
    C: RaftTypeConfig<
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<C>,
        SnapshotData = Cursor<Vec<u8>>,
    >
{
}

/// Opens (or creates) the Raft store at `path` and returns its log and state machine halves.
///
/// Every record is decoded once here, so a damaged file or one of a newer format fails now,
/// with a [`StoreError`] naming the file and what to do, and not later inside Raft. The file
/// is locked: a second open, in this process or another, fails with [`StoreError::InUse`]
/// until both halves are dropped.
pub fn open<C, S>(path: &Path) -> Result<(LogStore<C>, StateMachineStore<C, S>), StoreError>
where
    C: StoreTypeConfig,
    S: Replicated<Command = C::D, Response = C::R>,
{
    let db = Arc::new(db::Db::open(path)?);
    let log_store = LogStore::new(Arc::clone(&db));
    log_store.validate()?;
    let state_machine = StateMachineStore::load(db)?;
    Ok((log_store, state_machine))
}
