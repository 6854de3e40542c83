//! What the store holds comes back after the file is closed and opened again: vote, log
//! (with its truncation and purge), committed log id, applied state and the current snapshot.

mod store_support;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder, Vote};
use store_support::{log_id, open_kv, runtime, set_entry, KvState};
use tessera_cluster::store::StoreError;

fn expected_map(pairs: &[(&str, &str)]) -> KvState {
    let mut state = KvState::default();
    for (key, value) in pairs {
        state.map.insert((*key).to_string(), (*value).to_string());
    }
    state
}

#[test]
fn everything_written_comes_back_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster").join("raft.redb");
    let rt = runtime();
    let written: Vec<_> = (1..=6)
        .map(|i| set_entry(2, i, &format!("k{i}"), "v"))
        .collect();
    let snapshot_meta = rt.block_on(async {
        let (mut log, mut machine) = open_kv(&path).unwrap();
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        log.blocking_append(written.clone()).await.unwrap();
        log.save_committed(Some(log_id(2, 5))).await.unwrap();
        machine.apply(written[..3].to_vec()).await.unwrap();
        let snapshot = machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        machine.apply(written[3..5].to_vec()).await.unwrap();
        log.purge(log_id(2, 2)).await.unwrap();
        log.truncate(log_id(2, 6)).await.unwrap();
        snapshot.meta
    });
    assert_eq!(snapshot_meta.last_log_id, Some(log_id(2, 3)));

    rt.block_on(async {
        let (mut log, mut machine) = open_kv(&path).unwrap();
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(2, 1))
        );
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 5)));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(2, 2)));
        assert_eq!(
            state.last_log_id,
            Some(log_id(2, 5)),
            "entry 6 was truncated"
        );
        let entries = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(
            entries,
            written[2..5].to_vec(),
            "entries 1-2 purged, 6 truncated"
        );

        let (last_applied, membership) = machine.applied_state().await.unwrap();
        assert_eq!(last_applied, Some(log_id(2, 5)));
        assert_eq!(membership, Default::default());
        let pairs = [
            ("k1", "v"),
            ("k2", "v"),
            ("k3", "v"),
            ("k4", "v"),
            ("k5", "v"),
        ];
        assert_eq!(machine.state(), expected_map(&pairs));
        assert_eq!(machine.last_applied(), Some(log_id(2, 5)));

        let snapshot = machine
            .get_current_snapshot()
            .await
            .unwrap()
            .expect("snapshot kept");
        assert_eq!(snapshot.meta, snapshot_meta);
    });
}

#[test]
fn installed_snapshot_replaces_state_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (leader_path, follower_path) = (dir.path().join("a.redb"), dir.path().join("b.redb"));
    let rt = runtime();
    let snapshot = rt.block_on(async {
        let (_log, mut leader) = open_kv(&leader_path).unwrap();
        leader
            .apply([set_entry(1, 1, "a", "1"), set_entry(1, 2, "b", "2")])
            .await
            .unwrap();
        leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap()
    });
    rt.block_on(async {
        let (_log, mut follower) = open_kv(&follower_path).unwrap();
        follower
            .apply([set_entry(1, 1, "stale", "x")])
            .await
            .unwrap();
        let mut changes = follower.subscribe();
        follower
            .install_snapshot(&snapshot.meta, snapshot.snapshot.clone())
            .await
            .unwrap();
        assert!(
            changes.has_changed().unwrap(),
            "watchers hear of the install"
        );
        assert_eq!(*changes.borrow_and_update(), Some(log_id(1, 2)));
    });
    rt.block_on(async {
        let (_log, mut follower) = open_kv(&follower_path).unwrap();
        assert_eq!(follower.state(), expected_map(&[("a", "1"), ("b", "2")]));
        assert_eq!(
            follower.applied_state().await.unwrap().0,
            Some(log_id(1, 2))
        );
        let current = follower.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snapshot.meta);
    });
}

#[test]
fn snapshot_contradicting_its_metadata_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let (_log, mut machine) = open_kv(&dir.path().join("raft.redb")).unwrap();
        machine.apply([set_entry(1, 1, "a", "1")]).await.unwrap();
        let mut snapshot = machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        snapshot.meta.last_log_id = Some(log_id(1, 9));
        let err = machine
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("disagree"), "{err}");
        let mut cut = machine.get_current_snapshot().await.unwrap().unwrap();
        cut.snapshot.get_mut().truncate(3);
        let err = machine
            .install_snapshot(&cut.meta, cut.snapshot)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("shorter than its header"), "{err}");
        assert_eq!(machine.state(), expected_map(&[("a", "1")]));
        assert_eq!(machine.last_applied(), Some(log_id(1, 1)));
    });
}

#[test]
fn applied_state_readers_and_watchers_see_each_batch() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let (_log, mut machine) = open_kv(&dir.path().join("raft.redb")).unwrap();
        let reader = machine.clone();
        let mut changes = reader.subscribe();
        assert_eq!(*changes.borrow(), None);
        let responses = machine
            .apply([set_entry(1, 1, "a", "1"), set_entry(1, 2, "a", "2")])
            .await
            .unwrap();
        assert_eq!(responses[1].previous.as_deref(), Some("1"));
        assert!(changes.has_changed().unwrap());
        assert_eq!(*changes.borrow_and_update(), Some(log_id(1, 2)));
        assert_eq!(
            reader.read(|state| state.map.get("a").cloned()),
            Some("2".to_string())
        );
    });
}

#[test]
fn second_open_of_the_same_file_is_refused_while_the_first_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raft.redb");
    let first = open_kv(&path).unwrap();
    let err = open_kv(&path).err().expect("second open refused");
    assert!(matches!(err, StoreError::InUse { .. }), "{err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    drop(first);
    open_kv(&path).expect("open again once the first handle is gone");
}
