//! Nothing the store acknowledged is lost to kill -9. A child process (this test binary run
//! again) saves votes, appends, commits, applies, snapshots and purges in a loop, printing a
//! line after each operation returned; the parent SIGKILLs it at a random moment, reopens the
//! file and checks that everything printed is there. Several rounds run on the same file, so
//! later rounds also start from a file that was killed mid-write.

mod store_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};
use rand::Rng;
use store_support::{log_id, open_kv, runtime, set_entry, KvCommand};

const CHILD_ENV: &str = "TESSERA_STORE_CRASH_CHILD";
const ROUNDS_ENV: &str = "TESSERA_STORE_CRASH_ROUNDS";
const ROUNDS_DEFAULT: u32 = 8;
/// Bounds the child's loop in case the parent never kills it.
const CHILD_ENTRIES_MAX: u64 = 100_000;
/// A snapshot and a purge of the log behind it every this many entries.
const SNAPSHOT_EVERY: u64 = 8;
const PURGE_LAG: u64 = 4;

#[test]
#[ignore = "the child of kill9_loses_nothing_acknowledged; runs only when re-executed by it"]
fn crash_child() {
    let path = std::env::var_os(CHILD_ENV).expect("set by kill9_loses_nothing_acknowledged");
    runtime().block_on(child_loop(Path::new(&path)));
}

fn value_of(index: u64) -> String {
    format!("value{index}")
}

async fn child_loop(path: &Path) {
    let (mut log, mut machine) = open_kv(path).expect("child opens the store");
    let last_log = log
        .get_log_state()
        .await
        .unwrap()
        .last_log_id
        .map_or(0, |id| id.index);
    let applied = machine.last_applied().map_or(0, |id| id.index);
    if applied < last_log {
        // Raft re-applies committed entries after a restart; do the same before new work.
        let entries = log
            .try_get_log_entries(applied + 1..=last_log)
            .await
            .unwrap();
        machine.apply(entries).await.unwrap();
    }
    for index in last_log + 1..=last_log + CHILD_ENTRIES_MAX {
        let term = index;
        log.save_vote(&Vote::new(term, 1)).await.unwrap();
        println!("vote {term}");
        let entry = set_entry(term, index, &format!("key{index}"), &value_of(index));
        log.blocking_append([entry.clone()]).await.unwrap();
        println!("appended {index}");
        log.save_committed(Some(entry.log_id)).await.unwrap();
        println!("committed {index}");
        machine.apply([entry]).await.unwrap();
        println!("applied {index}");
        if index % SNAPSHOT_EVERY == 0 {
            machine
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
            println!("snapshot {index}");
            let purge_index = index - PURGE_LAG;
            log.purge(log_id(purge_index, purge_index)).await.unwrap();
            println!("purged {purge_index}");
        }
    }
}

/// The highest index the child acknowledged for each kind of operation.
fn acknowledged(lines: &[String]) -> BTreeMap<String, u64> {
    let mut highest = BTreeMap::new();
    for line in lines {
        // The test harness prints `test crash_child ... ` without a newline before the first
        // acknowledgement, so the pair is the last two words of a line.
        let words: Vec<&str> = line.split_whitespace().collect();
        let [.., kind, number] = words.as_slice() else {
            continue;
        };
        let Ok(number) = number.parse::<u64>() else {
            continue;
        };
        let entry = highest.entry(kind.to_string()).or_insert(0);
        *entry = number.max(*entry);
    }
    highest
}

/// Runs the child until a random moment, SIGKILLs it, and returns the lines it completed.
fn run_child_and_kill(path: &Path, kill_after: Duration) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        let mut lines = Vec::new();
        let mut stdout = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                // A line cut by the kill has no newline and was never acknowledged in full.
                Ok(n) if n > 0 && line.ends_with('\n') => lines.push(line),
                _ => return lines,
            }
        }
    });
    thread::sleep(kill_after);
    if let Some(status) = child.try_wait().unwrap() {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        panic!("child exited by itself with {status} before the kill:\n{stderr}");
    }
    child.kill().expect("SIGKILL the child");
    child.wait().unwrap();
    reader.join().unwrap()
}

fn check_reopened(path: &Path, highest: &BTreeMap<String, u64>) {
    let get = |kind: &str| highest.get(kind).copied().unwrap_or(0);
    let (mut log, mut machine) = open_kv(path).expect("store reopens after kill -9");
    runtime().block_on(async {
        let vote = log.read_vote().await.unwrap();
        assert!(
            vote.map_or(0, |v| v.leader_id.term) >= get("vote"),
            "vote lost: {vote:?}"
        );
        let committed = log.read_committed().await.unwrap().map_or(0, |id| id.index);
        assert!(
            committed >= get("committed"),
            "committed {committed} < {}",
            get("committed")
        );
        let state = log.get_log_state().await.unwrap();
        let purged = state.last_purged_log_id.map_or(0, |id| id.index);
        let last = state.last_log_id.map_or(0, |id| id.index);
        assert!(
            purged >= get("purged"),
            "purge mark {purged} < {}",
            get("purged")
        );
        assert!(
            last >= get("appended"),
            "log ends at {last}, {} acked",
            get("appended")
        );
        let entries = log.try_get_log_entries(purged + 1..=last).await.unwrap();
        let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
        assert_eq!(
            indexes,
            (purged + 1..=last).collect::<Vec<_>>(),
            "log has holes"
        );
        for entry in &entries {
            let openraft::EntryPayload::Normal(KvCommand::Set { value, .. }) = &entry.payload
            else {
                panic!("unexpected entry {entry:?}");
            };
            assert_eq!(*value, value_of(entry.log_id.index));
        }
        let applied = machine.last_applied().map_or(0, |id| id.index);
        assert!(
            applied >= get("applied"),
            "applied {applied} < {}",
            get("applied")
        );
        let map = machine.state().map;
        assert_eq!(map.len() as u64, applied, "state and last applied disagree");
        for index in 1..=applied {
            assert_eq!(map.get(&format!("key{index}")), Some(&value_of(index)));
        }
        let snapshot = machine.get_current_snapshot().await.unwrap();
        let snapshot_index = snapshot
            .and_then(|s| s.meta.last_log_id)
            .map_or(0, |id| id.index);
        assert!(
            snapshot_index >= get("snapshot"),
            "snapshot {snapshot_index} lost"
        );
    });
}

#[test]
fn kill9_loses_nothing_acknowledged() {
    let rounds = match std::env::var(ROUNDS_ENV) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{ROUNDS_ENV}={text} is no number")),
        Err(_) => ROUNDS_DEFAULT,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let mut rng = rand::thread_rng();
    let mut acknowledged_total = 0;
    for round in 0..rounds {
        // The first round runs long enough for the child to get going on a loaded machine,
        // so that the file the later rounds kill has history in it.
        let kill_after_ms = if round == 0 {
            2000
        } else {
            rng.gen_range(150..1200)
        };
        let kill_after = Duration::from_millis(kill_after_ms);
        let lines = run_child_and_kill(&path, kill_after);
        let highest = acknowledged(&lines);
        eprintln!("round {round}: killed after {kill_after:?}, acknowledged {highest:?}");
        acknowledged_total += lines.len();
        if path.exists() {
            check_reopened(&path, &highest);
        }
    }
    assert!(
        acknowledged_total > 0,
        "the child never acknowledged anything"
    );
}
