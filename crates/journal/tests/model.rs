//! Model-based test: random interleavings of append, commit, checkpoint (set_tail) and
//! crash (drop and reopen, sometimes with the page after the durable point damaged),
//! checked against a model that only knows which records were acknowledged as durable.

mod common;

use common::{assert_records, last_page_of, Disk, DAMAGES};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tessera_journal::{JournalError, Lsn, Record};

#[derive(Clone, Debug)]
enum Op {
    Append {
        len: usize,
        tag: u8,
    },
    CommitAll,
    /// Commit up to the n-th (modulo) pending record.
    CommitSome(usize),
    /// Checkpoint up to the n-th (modulo) durable record.
    SetTail(usize),
    Crash {
        damage: Option<usize>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (prop_oneof![0..64usize, 0..5000usize, 0..20_000usize, 0..60_000usize], any::<u8>())
            .prop_map(|(len, tag)| Op::Append { len, tag }),
        3 => Just(Op::CommitAll),
        2 => any::<usize>().prop_map(Op::CommitSome),
        1 => any::<usize>().prop_map(Op::SetTail),
        1 => proptest::option::of(0..DAMAGES.len()).prop_map(|damage| Op::Crash { damage }),
    ]
}

/// What the journal promises: `durable` records (end LSN above the replay point) come
/// back after a crash; `pending` ones may come back, as an intact prefix.
struct Model {
    durable: Vec<Record>,
    pending: Vec<Record>,
    replay_from: Lsn,
}

fn run(ops: Vec<Op>, seed: u64) {
    let disk = Disk::new(1 << 20);
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut journal, _) = disk.open(0);
    let mut model = Model {
        durable: Vec::new(),
        pending: Vec::new(),
        replay_from: 0,
    };
    for op in ops {
        match op {
            Op::Append { len, tag } => match journal.append(&vec![tag; len]) {
                Ok(lsn) => model.pending.push(Record {
                    lsn,
                    payload: vec![tag; len],
                }),
                Err(JournalError::Full { needed, free }) => {
                    assert!(needed > free);
                    assert!(journal.used_bytes() + needed > journal.capacity_bytes());
                }
                Err(e) => panic!("append: {e}"),
            },
            Op::CommitAll => {
                let lsn = journal.commit_all().unwrap();
                assert_eq!(lsn, journal.appended_lsn());
                model.durable.append(&mut model.pending);
            }
            Op::CommitSome(n) if !model.pending.is_empty() => {
                let n = n % model.pending.len();
                journal.commit(model.pending[n].lsn).unwrap();
                assert!(journal.durable_lsn() >= model.pending[n].lsn);
                model.durable.extend(model.pending.drain(..=n));
            }
            Op::CommitSome(_) => {}
            Op::SetTail(n) if !model.durable.is_empty() => {
                let lsn = model.durable[n % model.durable.len()].lsn;
                journal.set_tail(lsn);
                model.replay_from = model.replay_from.max(lsn);
                model.durable.retain(|r| r.lsn > model.replay_from);
            }
            Op::SetTail(_) => {}
            Op::Crash { damage } => {
                let durable_lsn = journal.durable_lsn();
                let capacity_pages = journal.capacity_bytes() / common::PAGE;
                drop(journal);
                if let Some(how) = damage {
                    // The page after the durable point was never written in this lap: it
                    // holds an older lap's page or nothing. Damage it, unless its slot
                    // still holds live records (a full ring).
                    let next = if durable_lsn == 0 {
                        0
                    } else {
                        last_page_of(durable_lsn) + 1
                    };
                    if next < model.replay_from / common::PAGE + capacity_pages {
                        disk.damage_page(next, DAMAGES[how], &mut rng);
                    }
                }
                let (reopened, replayed) = disk.open(model.replay_from);
                let n = model.durable.len();
                assert!(replayed.len() >= n, "lost durable records");
                assert_records(
                    &replayed[..n],
                    &model.durable,
                    "durable records after crash",
                );
                let extra = &replayed[n..];
                let pending: Vec<Record> = model
                    .pending
                    .iter()
                    .filter(|r| r.lsn > model.replay_from)
                    .cloned()
                    .collect();
                assert!(extra.len() <= pending.len());
                assert_records(
                    extra,
                    &pending[..extra.len()],
                    "uncommitted records after crash",
                );
                model.durable = replayed;
                model.pending.clear();
                journal = reopened;
            }
        }
        assert!(journal.durable_lsn() <= journal.appended_lsn());
        assert!(journal.used_bytes() <= journal.capacity_bytes());
    }
    // A final clean shutdown: exactly the durable records come back.
    journal.commit_all().unwrap();
    model.durable.append(&mut model.pending);
    drop(journal);
    let (_, replayed) = disk.open(model.replay_from);
    assert_records(&replayed, &model.durable, "final replay");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn journal_matches_model(ops in proptest::collection::vec(op(), 1..400), seed: u64) {
        run(ops, seed);
    }
}
