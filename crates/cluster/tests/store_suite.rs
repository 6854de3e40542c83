//! openraft's own storage test suite against the redb-backed log and state machine store.

mod store_support;

use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageError, StorageIOError};
use store_support::{open_kv, KvConfig, KvLog, KvMachine};
use tempfile::TempDir;

/// Each suite case gets a fresh file in its own temporary directory, removed with the guard.
struct RedbStoreBuilder;

impl StoreBuilder<KvConfig, KvLog, KvMachine, TempDir> for RedbStoreBuilder {
    async fn build(&self) -> Result<(TempDir, KvLog, KvMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        let (log, machine) = open_kv(&dir.path().join("raft.redb"))
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok((dir, log, machine))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(RedbStoreBuilder).expect("openraft storage suite");
}
