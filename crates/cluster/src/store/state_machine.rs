//! The state machine half: the applied configuration, its last applied log id and membership,
//! and the current snapshot, all in `raft.redb`.

use std::io::Cursor;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use redb::ReadableTable;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::db::{
    self, Db, FORMAT_VERSION, KEY_APPLIED, KEY_SNAPSHOT_DATA, KEY_SNAPSHOT_META, KEY_SNAPSHOT_SEQ,
    KEY_STATE, STATE_MACHINE,
};
use super::error::{RedbResultExt, StoreError};
use super::{Replicated, StoreTypeConfig};

/// What Raft needs to know about the applied state besides the state itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct AppliedMeta {
    last_applied: Option<LogId<u64>>,
    last_membership: StoredMembership<u64, BasicNode>,
}

/// One applied version of the state. Readers hold an `Arc` of it, so that a reader never
/// blocks `apply` and never sees a half-applied batch.
struct Applied<S> {
    meta: AppliedMeta,
    state: S,
}

/// The body of a snapshot blob, after its 4-byte format version.
#[derive(Serialize)]
struct SnapshotBodyRef<'a, S> {
    meta: &'a AppliedMeta,
    state: &'a S,
}

#[derive(Deserialize)]
struct SnapshotBody<S> {
    meta: AppliedMeta,
    state: S,
}

struct Shared<S> {
    db: Arc<Db>,
    current: Mutex<Arc<Applied<S>>>,
    applied_tx: watch::Sender<Option<LogId<u64>>>,
}

/// What [`StateMachineStore::subscribe`] returns.
pub type AppliedWatch = watch::Receiver<Option<LogId<u64>>>;

/// The applied configuration. Cloning gives another handle on the same state; the clone is
/// also the snapshot builder.
pub struct StateMachineStore<C, S> {
    shared: Arc<Shared<S>>,
    _config: PhantomData<C>,
}

impl<C, S> Clone for StateMachineStore<C, S> {
    fn clone(&self) -> Self {
        StateMachineStore {
            shared: Arc::clone(&self.shared),
            _config: PhantomData,
        }
    }
}

fn sm_err(verb: ErrorVerb, err: StoreError) -> StorageError<u64> {
    StorageIOError::new(ErrorSubject::StateMachine, verb, AnyError::new(&err)).into()
}

fn snapshot_err(verb: ErrorVerb, err: StoreError) -> StorageError<u64> {
    StorageIOError::new(ErrorSubject::Snapshot(None), verb, AnyError::new(&err)).into()
}

impl<C, S> StateMachineStore<C, S>
where
    C: StoreTypeConfig,
    S: Replicated<Command = C::D, Response = C::R>,
{
    /// Loads the applied state, decoding every record so that damage is refused at open.
    pub(crate) fn load(db: Arc<Db>) -> Result<Self, StoreError> {
        let meta = db.get::<AppliedMeta>(STATE_MACHINE, KEY_APPLIED)?;
        let state = db.get::<S>(STATE_MACHINE, KEY_STATE)?;
        let (meta, state) = match (meta, state) {
            (Some(meta), Some(state)) => (meta, state),
            (None, None) => (AppliedMeta::default(), S::default()),
            _ => {
                let detail = "applied state and last applied log id are not both present";
                return Err(StoreError::damaged(&db.path, detail));
            }
        };
        db.get::<SnapshotMeta<u64, BasicNode>>(STATE_MACHINE, KEY_SNAPSHOT_META)?;
        db.get::<u64>(STATE_MACHINE, KEY_SNAPSHOT_SEQ)?;
        if let Some(data) = db.get_raw(STATE_MACHINE, KEY_SNAPSHOT_DATA)? {
            decode_snapshot::<S>(&data).map_err(|detail| {
                StoreError::damaged(&db.path, format!("record `{KEY_SNAPSHOT_DATA}`: {detail}"))
            })?;
        }
        let (applied_tx, _) = watch::channel(meta.last_applied);
        let current = Mutex::new(Arc::new(Applied { meta, state }));
        let shared = Arc::new(Shared {
            db,
            current,
            applied_tx,
        });
        Ok(StateMachineStore {
            shared,
            _config: PhantomData,
        })
    }

    /// A copy of the applied state, read locally without going through Raft: what this node
    /// has applied, which may lag the leader.
    pub fn state(&self) -> S {
        self.current().state.clone()
    }

    /// Runs `read` on the applied state without copying it.
    pub fn read<R>(&self, read: impl FnOnce(&S) -> R) -> R {
        read(&self.current().state)
    }

    /// The log id of the last entry applied to [`Self::state`].
    pub fn last_applied(&self) -> Option<LogId<u64>> {
        self.current().meta.last_applied
    }

    /// The last membership this state machine has applied.
    pub fn last_membership(&self) -> StoredMembership<u64, BasicNode> {
        self.current().meta.last_membership.clone()
    }

    /// Notified with the last applied log id after every applied batch or installed snapshot.
    pub fn subscribe(&self) -> AppliedWatch {
        self.shared.applied_tx.subscribe()
    }

    /// The path of the file this store lives in, for messages.
    pub fn path(&self) -> &Path {
        &self.shared.db.path
    }

    fn current(&self) -> Arc<Applied<S>> {
        // A poisoned lock only means a reader panicked while cloning an `Arc`; the value inside
        // is always a whole applied version.
        Arc::clone(
            &self
                .shared
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    fn publish(&self, next: Applied<S>) {
        let last_applied = next.meta.last_applied;
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        self.shared.applied_tx.send_replace(last_applied);
    }

    /// Writes the applied state and its log id in one durable transaction, so that after a
    /// crash the state is never ahead of or behind the log id Raft resumes from.
    fn persist_applied(
        &self,
        next: &Applied<S>,
        snapshot: Option<(&SnapshotMeta<u64, BasicNode>, &[u8])>,
    ) -> Result<(), StoreError> {
        let path = &self.shared.db.path;
        let meta = db::encode(path, KEY_APPLIED, &next.meta)?;
        let state = db::encode(path, KEY_STATE, &next.state)?;
        let txn = self.shared.db.begin_write()?;
        {
            let mut table = txn
                .open_table(STATE_MACHINE)
                .at(path, "open the state machine")?;
            table
                .insert(KEY_APPLIED, meta.as_slice())
                .at(path, "write the applied log id")?;
            table
                .insert(KEY_STATE, state.as_slice())
                .at(path, "write the applied state")?;
            if let Some((snapshot_meta, data)) = snapshot {
                let encoded = db::encode(path, KEY_SNAPSHOT_META, snapshot_meta)?;
                table
                    .insert(KEY_SNAPSHOT_META, encoded.as_slice())
                    .at(path, "write snapshot")?;
                table
                    .insert(KEY_SNAPSHOT_DATA, data)
                    .at(path, "write snapshot data")?;
            }
        }
        txn.commit().at(path, "commit the applied state")
    }

    fn apply_batch(&self, entries: Vec<C::Entry>) -> Result<Vec<C::R>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let current = self.current();
        let mut next = Applied {
            meta: current.meta.clone(),
            state: current.state.clone(),
        };
        let mut responses = Vec::with_capacity(entries.len());
        for entry in entries {
            assert!(
                next.meta.last_applied < Some(entry.log_id),
                "entries applied out of order"
            );
            next.meta.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Blank => blank_response::<S>(),
                EntryPayload::Normal(command) => next.state.apply(&command),
                EntryPayload::Membership(membership) => {
                    next.meta.last_membership =
                        StoredMembership::new(Some(entry.log_id), membership);
                    blank_response::<S>()
                }
            };
            responses.push(response);
        }
        self.persist_applied(&next, None)?;
        self.publish(next);
        Ok(responses)
    }

    fn build(&self) -> Result<Snapshot<C>, StoreError> {
        let path = &self.shared.db.path;
        let current = self.current();
        let body = SnapshotBodyRef {
            meta: &current.meta,
            state: &current.state,
        };
        let mut data = FORMAT_VERSION.to_le_bytes().to_vec();
        data.extend_from_slice(&db::encode(path, "snapshot", &body)?);
        let txn = self.shared.db.begin_write()?;
        let meta = {
            let mut table = txn
                .open_table(STATE_MACHINE)
                .at(path, "open the state machine")?;
            let seq: u64 = match table.get(KEY_SNAPSHOT_SEQ).at(path, "read the counter")? {
                Some(bytes) => db::decode(path, KEY_SNAPSHOT_SEQ, bytes.value())?,
                None => 0,
            };
            let seq = seq + 1;
            let meta = SnapshotMeta {
                last_log_id: current.meta.last_applied,
                last_membership: current.meta.last_membership.clone(),
                snapshot_id: snapshot_id(current.meta.last_applied, seq),
            };
            let seq_bytes = db::encode(path, KEY_SNAPSHOT_SEQ, &seq)?;
            let meta_bytes = db::encode(path, KEY_SNAPSHOT_META, &meta)?;
            table
                .insert(KEY_SNAPSHOT_SEQ, seq_bytes.as_slice())
                .at(path, "write counter")?;
            table
                .insert(KEY_SNAPSHOT_META, meta_bytes.as_slice())
                .at(path, "write snapshot")?;
            table
                .insert(KEY_SNAPSHOT_DATA, data.as_slice())
                .at(path, "write snapshot data")?;
            meta
        };
        txn.commit().at(path, "commit the snapshot")?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }

    fn install(
        &self,
        meta: &SnapshotMeta<u64, BasicNode>,
        data: Vec<u8>,
    ) -> Result<(), StoreError> {
        let body = decode_snapshot::<S>(&data).map_err(|detail| StoreError::BadSnapshot {
            id: meta.snapshot_id.clone(),
            detail,
        })?;
        let meta_matches = body.meta.last_applied == meta.last_log_id
            && body.meta.last_membership == meta.last_membership;
        if !meta_matches {
            let detail = "its contents disagree with the metadata sent with it".to_string();
            return Err(StoreError::BadSnapshot {
                id: meta.snapshot_id.clone(),
                detail,
            });
        }
        let next = Applied {
            meta: body.meta,
            state: body.state,
        };
        self.persist_applied(&next, Some((meta, &data)))?;
        self.publish(next);
        Ok(())
    }

    fn current_snapshot(&self) -> Result<Option<Snapshot<C>>, StoreError> {
        let db = &self.shared.db;
        let meta = db.get::<SnapshotMeta<u64, BasicNode>>(STATE_MACHINE, KEY_SNAPSHOT_META)?;
        let Some(meta) = meta else { return Ok(None) };
        let Some(data) = db.get_raw(STATE_MACHINE, KEY_SNAPSHOT_DATA)? else {
            return Err(StoreError::damaged(
                &db.path,
                "snapshot metadata without its data",
            ));
        };
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// The answer to a blank or membership entry. A function of its own because inside the impl
/// `S::Response` is normalised to `C::R`, which does not carry the `Default` bound.
fn blank_response<S: Replicated>() -> S::Response {
    S::Response::default()
}

fn snapshot_id(last_applied: Option<LogId<u64>>, seq: u64) -> String {
    match last_applied {
        Some(id) => format!(
            "{}-{}-{}-{seq}",
            id.leader_id.term, id.leader_id.node_id, id.index
        ),
        None => format!("empty-{seq}"),
    }
}

/// Splits a snapshot blob into its version and body. The version comes first and is checked
/// before the body is touched, so a snapshot from a newer leader is refused by name.
fn decode_snapshot<S: Replicated>(data: &[u8]) -> Result<SnapshotBody<S>, String> {
    let Some((version, body)) = data.split_first_chunk::<4>() else {
        return Err(format!(
            "snapshot is {} bytes, shorter than its header",
            data.len()
        ));
    };
    let version = u32::from_le_bytes(*version);
    if version != FORMAT_VERSION {
        return Err(format!(
            "snapshot format version {version}, this tessera reads only version {FORMAT_VERSION}"
        ));
    }
    let (body, rest) = postcard::take_from_bytes::<SnapshotBody<S>>(body)
        .map_err(|err| format!("snapshot body does not decode: {err}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "snapshot has {} stray bytes after its end",
            rest.len()
        ));
    }
    Ok(body)
}

impl<C, S> RaftSnapshotBuilder<C> for StateMachineStore<C, S>
where
    C: StoreTypeConfig,
    S: Replicated<Command = C::D, Response = C::R>,
{
    async fn build_snapshot(&mut self) -> Result<Snapshot<C>, StorageError<u64>> {
        self.build().map_err(|e| snapshot_err(ErrorVerb::Write, e))
    }
}

impl<C, S> RaftStateMachine<C> for StateMachineStore<C, S>
where
    C: StoreTypeConfig,
    S: Replicated<Command = C::D, Response = C::R>,
{
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let current = self.current();
        Ok((
            current.meta.last_applied,
            current.meta.last_membership.clone(),
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<C::R>, StorageError<u64>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_batch(entries.into_iter().collect())
            .map_err(|e| sm_err(ErrorVerb::Write, e))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        self.install(meta, snapshot.into_inner())
            .map_err(|e| snapshot_err(ErrorVerb::Write, e))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<C>>, StorageError<u64>> {
        self.current_snapshot()
            .map_err(|e| snapshot_err(ErrorVerb::Read, e))
    }
}
