//! A damaged `raft.redb` is refused at open with an error that names the file and says what to
//! do, and never panics: flipped bytes anywhere in the file, a file cut short, garbage, a file
//! of a newer format, and records that do not decode. A flipped byte that open does not notice
//! must have hit space that holds nothing: everything written still reads back unchanged.

mod store_support;

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};
use rand::{Rng, SeedableRng};
use redb::TableDefinition;
use store_support::{log_id, open_kv, runtime, set_entry, KvState};
use tessera_cluster::store::{StoreError, FORMAT_VERSION};

type RecordTable = TableDefinition<'static, &'static str, &'static [u8]>;

const META: RecordTable = TableDefinition::new("meta");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const STATE_MACHINE: RecordTable = TableDefinition::new("state_machine");

/// What a healthy file reads back as, to compare a file that opened despite a flipped byte.
#[derive(Debug, PartialEq)]
struct Contents {
    vote: Option<Vote<u64>>,
    committed: Option<openraft::LogId<u64>>,
    entries: Vec<openraft::Entry<store_support::KvConfig>>,
    state: KvState,
    snapshot_meta: Option<openraft::SnapshotMeta<u64, openraft::BasicNode>>,
}

fn write_store(path: &Path) {
    runtime().block_on(async {
        let (mut log, mut machine) = open_kv(path).unwrap();
        let entries: Vec<_> = (1..=40)
            .map(|i| set_entry(3, i, &format!("key{i}"), "val"))
            .collect();
        log.save_vote(&Vote::new(3, 1)).await.unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_committed(Some(log_id(3, 30))).await.unwrap();
        machine.apply(entries[..30].to_vec()).await.unwrap();
        machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    });
}

fn read_contents(path: &Path) -> Result<Contents, StoreError> {
    let (mut log, mut machine) = open_kv(path)?;
    let contents = runtime().block_on(async {
        Contents {
            vote: log.read_vote().await.unwrap(),
            committed: log.read_committed().await.unwrap(),
            entries: log.try_get_log_entries(0..1000).await.unwrap(),
            state: machine.state(),
            snapshot_meta: machine
                .get_current_snapshot()
                .await
                .unwrap()
                .map(|s| s.meta),
        }
    });
    Ok(contents)
}

/// Opens `path` and insists on a damage report that names the file and the way out.
fn assert_damaged(path: &Path, why: &str) -> String {
    let err = open_kv(path)
        .err()
        .unwrap_or_else(|| panic!("{why}: damaged file opened"));
    let message = err.to_string();
    assert!(
        matches!(err, StoreError::Damaged { .. }),
        "{why}: {message}"
    );
    assert!(
        message.contains(&path.display().to_string()),
        "{why}: {message}"
    );
    assert!(message.contains("tessera node add"), "{why}: {message}");
    message
}

#[test]
fn flipped_bytes_are_refused_or_harmless_and_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original.redb");
    write_store(&original);
    let healthy = read_contents(&original).unwrap();
    let bytes = fs::read(&original).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    // Every page start (headers and page headers) plus random positions anywhere.
    let mut positions: Vec<usize> = (0..bytes.len()).step_by(4096).collect();
    positions.extend((0..150).map(|_| rng.gen_range(0..bytes.len())));
    let damaged = dir.path().join("damaged.redb");
    let mut refused = 0;
    for position in positions {
        let mut copy = bytes.clone();
        copy[position] ^= 1 << rng.gen_range(0..8);
        fs::write(&damaged, &copy).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| read_contents(&damaged)));
        match outcome {
            Err(_) => panic!("open panicked on a byte flipped at offset {position}"),
            Ok(Ok(contents)) => assert_eq!(contents, healthy, "offset {position}: silent damage"),
            Ok(Err(err)) => {
                assert!(
                    matches!(err, StoreError::Damaged { .. }),
                    "offset {position}: {err}"
                );
                assert!(err.to_string().contains("tessera node add"), "{err}");
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "no flip was detected at all: the integrity check does not run"
    );
}

#[test]
fn truncated_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original.redb");
    write_store(&original);
    let healthy = read_contents(&original).unwrap();
    let bytes = fs::read(&original).unwrap();
    let cut = dir.path().join("cut.redb");
    let lengths = [
        1,
        64,
        511,
        4096,
        4097,
        bytes.len() / 2,
        bytes.len() - 4096,
        bytes.len() - 1,
    ];
    for length in lengths {
        fs::write(&cut, &bytes[..length]).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| read_contents(&cut)));
        match outcome {
            Err(_) => panic!("open panicked on a file cut to {length} bytes"),
            // Only the unused tail of the last region may go without losing anything.
            Ok(Ok(contents)) => assert_eq!(contents, healthy, "cut to {length}: silent damage"),
            Ok(Err(_)) => {
                fs::write(&cut, &bytes[..length]).unwrap();
                assert_damaged(&cut, &format!("cut to {length} bytes"));
            }
        }
    }
    fs::write(&cut, b"").unwrap();
    let message = assert_damaged(&cut, "empty file");
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn garbage_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let garbage: Vec<u8> = (0..3 * 4096).map(|_| rng.gen()).collect();
    fs::write(&path, garbage).unwrap();
    assert_damaged(&path, "random bytes");
    fs::write(&path, b"{\"nodes\": []}\n").unwrap();
    assert_damaged(&path, "a JSON file");
}

/// Rewrites one record of a closed store with raw redb, bypassing the store's own encoding.
fn rewrite(path: &Path, table: TableDefinition<&str, &[u8]>, key: &str, value: Option<&[u8]>) {
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(table).unwrap();
        match value {
            Some(value) => table.insert(key, value).unwrap(),
            None => table.remove(key).unwrap(),
        };
    }
    txn.commit().unwrap();
}

#[test]
fn newer_format_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    write_store(&path);
    let newer = (FORMAT_VERSION + 1).to_le_bytes();
    rewrite(&path, META, "format_version", Some(&newer));
    let err = open_kv(&path).err().expect("newer format refused");
    let message = err.to_string();
    assert!(matches!(err, StoreError::NewerFormat { found, .. } if found == FORMAT_VERSION + 1));
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("version {}", FORMAT_VERSION + 1)),
        "{message}"
    );

    rewrite(&path, META, "format_version", Some(b"\x01\x00"));
    let message = assert_damaged(&path, "short format version");
    assert!(message.contains("not 4"), "{message}");
    rewrite(&path, META, "format_version", None);
    let message = assert_damaged(&path, "missing format version");
    assert!(
        message.contains("format version record is missing"),
        "{message}"
    );
}

#[test]
fn records_that_do_not_decode_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, RecordTable, &str, &[u8]); 5] = [
        (
            "vote",
            META,
            "vote",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ),
        ("committed", META, "committed", b"\x07"),
        ("applied", STATE_MACHINE, "applied", b""),
        ("state", STATE_MACHINE, "state", b"\x05ab"),
        (
            "snapshot_data",
            STATE_MACHINE,
            "snapshot_data",
            b"\x01\x00\x00\x00\xff",
        ),
    ];
    for (index, (name, table, key, garbage)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("case{index}.redb"));
        write_store(&path);
        rewrite(&path, table, key, Some(garbage));
        let message = assert_damaged(&path, name);
        assert!(message.contains(name), "{name}: {message}");
    }

    let path = dir.path().join("stray.redb");
    write_store(&path);
    let mut vote = postcard::to_allocvec(&Vote::<u64>::new(3, 1)).unwrap();
    vote.push(0);
    rewrite(&path, META, "vote", Some(&vote));
    let message = assert_damaged(&path, "vote with a stray byte");
    assert!(message.contains("stray"), "{message}");

    let path = dir.path().join("log.redb");
    write_store(&path);
    let db = redb::Database::create(&path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(LOG)
        .unwrap()
        .insert(17u64, b"\x02\x09".as_slice())
        .unwrap();
    txn.commit().unwrap();
    drop(db);
    let message = assert_damaged(&path, "log entry");
    assert!(message.contains("log entry"), "{message}");
}
