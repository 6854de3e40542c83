//! The Raft log half: vote, committed log id, entries, truncation and purge.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use redb::ReadableTable;

use super::db::{self, Db, KEY_COMMITTED, KEY_LAST_PURGED, KEY_VOTE, LOG, META};
use super::error::{RedbResultExt, StoreError};
use super::StoreTypeConfig;

/// The most entries one `limited_get_log_entries` returns, so that a follower far behind is
/// fed in bounded messages rather than one that holds the whole log.
pub const LOG_READ_ENTRIES_MAX: u64 = 256;

/// The Raft log in `raft.redb`. Cloning gives another handle on the same file; the clone is
/// also the log reader that replication streams use.
pub struct LogStore<C> {
    db: Arc<Db>,
    _config: PhantomData<C>,
}

impl<C> Clone for LogStore<C> {
    fn clone(&self) -> Self {
        LogStore {
            db: Arc::clone(&self.db),
            _config: PhantomData,
        }
    }
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, err: StoreError) -> StorageError<u64> {
    StorageIOError::new(subject, verb, AnyError::new(&err)).into()
}

fn read_logs_err(err: StoreError) -> StorageError<u64> {
    io_err(ErrorSubject::Logs, ErrorVerb::Read, err)
}

fn write_logs_err(err: StoreError) -> StorageError<u64> {
    io_err(ErrorSubject::Logs, ErrorVerb::Write, err)
}

impl<C: StoreTypeConfig> LogStore<C> {
    pub(crate) fn new(db: Arc<Db>) -> Self {
        LogStore {
            db,
            _config: PhantomData,
        }
    }

    /// Decodes every stored record once, so that a damaged file is refused at open with a
    /// [`StoreError`] instead of failing Raft later.
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        self.db.get::<Vote<u64>>(META, KEY_VOTE)?;
        self.db.get::<Option<LogId<u64>>>(META, KEY_COMMITTED)?;
        self.db.get::<LogId<u64>>(META, KEY_LAST_PURGED)?;
        let mut next = Bound::Unbounded;
        let mut expected_index = None;
        loop {
            let batch = db::log_range(&self.db, next, Bound::Unbounded, 1024)?;
            let Some(&(last_index, _)) = batch.last() else {
                return Ok(());
            };
            for (index, bytes) in &batch {
                let entry: openraft::Entry<C> = db::decode(&self.db.path, "log entry", bytes)?;
                if entry.log_id.index != *index || expected_index.is_some_and(|e| e != *index) {
                    let detail = format!("log entry at key {index} is out of sequence");
                    return Err(StoreError::damaged(&self.db.path, detail));
                }
                expected_index = Some(index + 1);
            }
            next = Bound::Excluded(last_index);
        }
    }

    fn read_entries(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
        limit: usize,
    ) -> Result<Vec<openraft::Entry<C>>, StoreError> {
        let raw = db::log_range(&self.db, start, end, limit)?;
        let mut entries = Vec::with_capacity(raw.len());
        for (index, bytes) in raw {
            let entry: openraft::Entry<C> = db::decode(&self.db.path, "log entry", &bytes)?;
            if entry.log_id.index != index {
                let detail = format!(
                    "log entry at key {index} claims index {}",
                    entry.log_id.index
                );
                return Err(StoreError::damaged(&self.db.path, detail));
            }
            entries.push(entry);
        }
        Ok(entries)
    }

    fn last_entry_log_id(&self) -> Result<Option<LogId<u64>>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn
            .open_table(LOG)
            .at(&self.db.path, "open the log table")?;
        let Some((_, bytes)) = table.last().at(&self.db.path, "read the last log entry")? else {
            return Ok(None);
        };
        let entry: openraft::Entry<C> = db::decode(&self.db.path, "log entry", bytes.value())?;
        Ok(Some(entry.log_id))
    }

    fn append_entries(&self, entries: Vec<openraft::Entry<C>>) -> Result<(), StoreError> {
        let path = &self.db.path;
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(LOG).at(path, "open the log table")?;
            let mut previous: Option<u64> = None;
            for entry in &entries {
                let index = entry.log_id.index;
                assert!(
                    previous.is_none_or(|p| p + 1 == index),
                    "append batch has a gap"
                );
                let bytes = db::encode(path, "log entry", entry)?;
                table
                    .insert(index, bytes.as_slice())
                    .at(path, "write a log entry")?;
                previous = Some(index);
            }
        }
        txn.commit().at(path, "commit log entries")
    }

    /// Deletes the entries at and after `from_index`: a new leader overrides them.
    fn truncate_from(&self, from_index: u64) -> Result<(), StoreError> {
        let path = &self.db.path;
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(LOG).at(path, "open the log table")?;
            table
                .retain_in(from_index.., |_, _| false)
                .at(path, "truncate the log")?;
        }
        txn.commit().at(path, "commit the log truncation")
    }

    /// Records `upto` as purged and deletes the entries up to it, in one transaction so that a
    /// crash never leaves entries below the purge mark or a purge mark above missing entries.
    fn purge_upto(&self, upto: LogId<u64>) -> Result<(), StoreError> {
        let path = &self.db.path;
        let bytes = db::encode(path, KEY_LAST_PURGED, &upto)?;
        let txn = self.db.begin_write()?;
        {
            let mut meta = txn.open_table(META).at(path, "open the meta table")?;
            meta.insert(KEY_LAST_PURGED, bytes.as_slice())
                .at(path, "write the purge mark")?;
            let mut table = txn.open_table(LOG).at(path, "open the log table")?;
            table
                .retain_in(..=upto.index, |_, _| false)
                .at(path, "purge the log")?;
        }
        txn.commit().at(path, "commit the log purge")
    }
}

fn to_bounds<RB: RangeBounds<u64>>(range: &RB) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl<C: StoreTypeConfig> RaftLogReader<C> for LogStore<C> {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<C::Entry>, StorageError<u64>> {
        let (start, end) = to_bounds(&range);
        self.read_entries(start, end, usize::MAX)
            .map_err(read_logs_err)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<C::Entry>, StorageError<u64>> {
        let end = end.min(start.saturating_add(LOG_READ_ENTRIES_MAX));
        let limit = usize::try_from(LOG_READ_ENTRIES_MAX).expect("small constant");
        self.read_entries(Bound::Included(start), Bound::Excluded(end), limit)
            .map_err(read_logs_err)
    }
}

impl<C: StoreTypeConfig> RaftLogStorage<C> for LogStore<C> {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<u64>> {
        let last_purged_log_id = self
            .db
            .get::<LogId<u64>>(META, KEY_LAST_PURGED)
            .map_err(read_logs_err)?;
        let last_entry = self.last_entry_log_id().map_err(read_logs_err)?;
        let last_log_id = last_entry.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let err = |e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e);
        self.db.put(META, KEY_VOTE, vote).map_err(err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        let err = |e| io_err(ErrorSubject::Vote, ErrorVerb::Read, e);
        self.db.get(META, KEY_VOTE).map_err(err)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        self.db
            .put(META, KEY_COMMITTED, &committed)
            .map_err(write_logs_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        let committed = self.db.get::<Option<LogId<u64>>>(META, KEY_COMMITTED);
        committed.map(Option::flatten).map_err(read_logs_err)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = C::Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // The commit below is durable when it returns, so the callback may fire right after it:
        // Raft counts this node towards a quorum only from that moment.
        let result = self.append_entries(entries.into_iter().collect());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(err) => {
                let io = std::io::Error::other(err.to_string());
                callback.log_io_completed(Err(io));
                Err(write_logs_err(err))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.truncate_from(log_id.index).map_err(write_logs_err)
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let purged = self
            .db
            .get::<LogId<u64>>(META, KEY_LAST_PURGED)
            .map_err(read_logs_err)?;
        assert!(
            purged.is_none_or(|p| p <= log_id),
            "purge mark moves backwards"
        );
        self.purge_upto(log_id).map_err(write_logs_err)
    }
}
