//! Golden bytes of every record kind in `raft.redb`. The values are postcard encodings of Rust
//! types (openraft's among them), so a reordered field or a changed dependency would change
//! the file format silently; this test makes it loud, and the fix is a new `FORMAT_VERSION`
//! with a migration, not a new golden value.

mod store_support;

use std::collections::BTreeSet;
use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{Entry, EntryPayload, Membership, RaftSnapshotBuilder, Vote};
use redb::{ReadableDatabase, TableDefinition};
use store_support::{log_id, open_kv, runtime, set_entry, KvConfig};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const STATE_MACHINE: TableDefinition<&str, &[u8]> = TableDefinition::new("state_machine");

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_fixed_store(path: &Path) {
    runtime().block_on(async {
        let (mut log, mut machine) = open_kv(path).unwrap();
        let voters = BTreeSet::from([1u64]);
        let membership = Entry::<KvConfig> {
            log_id: log_id(2, 1),
            payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
        };
        let entries = vec![membership, set_entry(2, 2, "k", "v")];
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_committed(Some(log_id(2, 2))).await.unwrap();
        machine.apply(entries).await.unwrap();
        machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        log.purge(log_id(2, 1)).await.unwrap();
    });
}

#[test]
fn every_record_kind_keeps_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    write_fixed_store(&path);
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let record = |key: &str| hex(meta.get(key).unwrap().expect(key).value());
    assert_eq!(record("format_version"), "01000000");
    // Vote { leader_id: { term 2, node_id 1 }, committed: false }
    assert_eq!(record("vote"), "020100");
    // Some(LogId { leader_id: { term 2, node_id 1 }, index 2 })
    assert_eq!(record("committed"), "01020102");
    assert_eq!(record("last_purged"), "020101");

    let log = txn.open_table(LOG).unwrap();
    // LogId, then EntryPayload::Normal (1), KvCommand::Set (0), "k", "v".
    assert_eq!(
        hex(log.get(2).unwrap().unwrap().value()),
        "020102".to_owned() + "0100016b0176"
    );

    let machine = txn.open_table(STATE_MACHINE).unwrap();
    let record = |key: &str| hex(machine.get(key).unwrap().expect(key).value());
    // last_applied Some((2,1),2); membership log id Some((2,1),1), configs [[1]],
    // nodes {1: BasicNode { addr: "" }}.
    let applied = "01020102".to_owned() + "01020101" + "010101" + "010100";
    assert_eq!(record("applied"), applied);
    // The key-value state: a map of one pair.
    assert_eq!(record("state"), "01016b0176");
    assert_eq!(record("snapshot_seq"), "01");
    assert_eq!(
        record("snapshot_data"),
        "01000000".to_owned() + &applied + "01016b0176"
    );
}
