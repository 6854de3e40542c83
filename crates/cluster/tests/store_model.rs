//! The log store against a reference model: random sequences of appends, truncations, purges,
//! votes and reopens, with the store's log state and entries compared to a `BTreeMap` after
//! every step.

mod store_support;

use std::collections::BTreeMap;
use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{Entry, LogId, RaftLogReader, Vote};
use proptest::prelude::*;
use store_support::{open_kv, runtime, set_entry, KvConfig, KvLog, KvMachine};

#[derive(Debug, Clone)]
enum Op {
    Append { count: u64, new_term: bool },
    Truncate { pick: usize },
    Purge { pick: usize },
    Vote { term: u64 },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..5, any::<bool>()).prop_map(|(count, new_term)| Op::Append { count, new_term }),
        1 => any::<usize>().prop_map(|pick| Op::Truncate { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Purge { pick }),
        1 => (0u64..50).prop_map(|term| Op::Vote { term }),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Default)]
struct Model {
    entries: BTreeMap<u64, Entry<KvConfig>>,
    purged: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
    term: u64,
}

impl Model {
    fn last_log_id(&self) -> Option<LogId<u64>> {
        self.entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(self.purged)
    }

    fn picked(&self, pick: usize) -> Option<LogId<u64>> {
        let count = self.entries.len();
        (count > 0).then(|| self.entries.values().nth(pick % count).unwrap().log_id)
    }
}

async fn step(log: &mut KvLog, model: &mut Model, op: &Op) {
    match *op {
        Op::Append { count, new_term } => {
            model.term += u64::from(new_term || model.term == 0);
            let first = model.last_log_id().map_or(1, |id| id.index + 1);
            let batch: Vec<_> = (first..first + count)
                .map(|i| set_entry(model.term, i, &i.to_string(), "v"))
                .collect();
            log.blocking_append(batch.clone()).await.unwrap();
            model
                .entries
                .extend(batch.into_iter().map(|e| (e.log_id.index, e)));
        }
        Op::Truncate { pick } => {
            if let Some(id) = model.picked(pick) {
                log.truncate(id).await.unwrap();
                model.entries.retain(|index, _| *index < id.index);
            }
        }
        Op::Purge { pick } => {
            if let Some(id) = model.picked(pick) {
                log.purge(id).await.unwrap();
                model.entries.retain(|index, _| *index > id.index);
                model.purged = Some(id);
            }
        }
        Op::Vote { term } => {
            let vote = Vote::new(term, 1);
            log.save_vote(&vote).await.unwrap();
            model.vote = Some(vote);
        }
        Op::Reopen => unreachable!("handled by the caller"),
    }
}

async fn check(log: &mut KvLog, model: &Model) {
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, model.purged);
    assert_eq!(state.last_log_id, model.last_log_id());
    let entries = log.try_get_log_entries(0..u64::MAX).await.unwrap();
    assert_eq!(entries, model.entries.values().cloned().collect::<Vec<_>>());
    assert_eq!(log.read_vote().await.unwrap(), model.vote);
    if let Some(first) = model.entries.keys().next() {
        let limited = log.limited_get_log_entries(*first, u64::MAX).await.unwrap();
        assert!(!limited.is_empty() && limited[0].log_id.index == *first);
    }
}

fn run(path: &Path, ops: &[Op]) {
    let rt = runtime();
    let mut model = Model::default();
    let mut store: Option<(KvLog, KvMachine)> = Some(open_kv(path).unwrap());
    for op in ops {
        if matches!(op, Op::Reopen) {
            drop(store.take());
            store = Some(open_kv(path).unwrap());
        } else {
            let (log, _) = store.as_mut().unwrap();
            rt.block_on(step(log, &mut model, op));
        }
        let (log, _) = store.as_mut().unwrap();
        rt.block_on(check(log, &model));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn log_store_matches_model(ops in proptest::collection::vec(op(), 1..24)) {
        let dir = tempfile::tempdir().unwrap();
        run(&dir.path().join("raft.redb"), &ops);
    }
}
