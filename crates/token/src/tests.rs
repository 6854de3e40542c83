//! The table against a model that keeps every holder's mode per unit.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const UNITS: u64 = 24;
const HOLDERS: u32 = 3;
const KEYS: u8 = 2;

/// The rule, written out again rather than taken from the code under test.
fn conflicts(a: Mode, b: Mode) -> bool {
    !(a == Mode::Read && b == Mode::Read)
}

/// Per (key, holder), the mode held on each unit.
#[derive(Default)]
struct Model {
    units: BTreeMap<(u8, u32), [Option<Mode>; UNITS as usize]>,
}

impl Model {
    fn get(&self, key: u8, holder: u32, unit: u64) -> Option<Mode> {
        self.units
            .get(&(key, holder))
            .and_then(|u| u[unit as usize])
    }

    fn put(&mut self, key: u8, holder: u32, unit: u64, mode: Option<Mode>) {
        self.units
            .entry((key, holder))
            .or_insert([None; UNITS as usize])[unit as usize] = mode;
    }

    /// Some other holder's token on `unit` conflicts with `mode`.
    fn conflict(&self, key: u8, holder: u32, unit: u64, mode: Mode) -> bool {
        (0..HOLDERS)
            .any(|h| h != holder && self.get(key, h, unit).is_some_and(|m| conflicts(m, mode)))
    }
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        holder: u32,
        key: u8,
        required: Range<u64>,
        desired: Range<u64>,
        mode: Mode,
    },
    Release(u32, u8, Range<u64>),
    Downgrade(u32, u8, Range<u64>),
    Drop(u32),
}

fn range() -> impl Strategy<Value = Range<u64>> {
    (0..UNITS, 1..=8u64).prop_map(|(s, n)| s..(s + n).min(UNITS))
}

fn op() -> impl Strategy<Value = Op> {
    let mode = prop_oneof![Just(Mode::Read), Just(Mode::Write)];
    prop_oneof![
        6 => (0..HOLDERS, 0..KEYS, range(), 0..UNITS, 0..UNITS, mode, any::<bool>()).prop_map(
            |(holder, key, required, before, after, mode, whole)| {
                let desired = if whole {
                    0..u64::MAX
                } else {
                    required.start.saturating_sub(before)..(required.end + after).min(UNITS)
                };
                Op::Acquire { holder, key, required, desired, mode }
            }
        ),
        2 => (0..HOLDERS, 0..KEYS, range()).prop_map(|(h, k, r)| Op::Release(h, k, r)),
        1 => (0..HOLDERS, 0..KEYS, range()).prop_map(|(h, k, r)| Op::Downgrade(h, k, r)),
        1 => (0..HOLDERS).prop_map(Op::Drop),
    ]
}

/// The table says what the model says, no two holders conflict anywhere, and each
/// holder's ranges are sorted, disjoint and merged.
fn check(table: &TokenTable<u8, u32>, model: &Model) {
    for key in 0..KEYS {
        let held = table.holders(&key);
        for w in held.windows(2) {
            if w[0].holder == w[1].holder {
                assert!(w[0].range.end <= w[1].range.start, "{held:?}");
                assert!(
                    w[0].range.end < w[1].range.start || w[0].mode != w[1].mode,
                    "unmerged neighbours in {held:?}"
                );
            } else {
                assert!(w[0].holder < w[1].holder, "unsorted {held:?}");
            }
        }
        for holder in 0..HOLDERS {
            for unit in 0..UNITS {
                let got = held
                    .iter()
                    .find(|h| h.holder == holder && h.range.contains(&unit))
                    .map(|h| h.mode);
                assert_eq!(
                    got,
                    model.get(key, holder, unit),
                    "key {key} holder {holder} unit {unit}: {held:?}"
                );
                if let Some(m) = got {
                    assert!(
                        !model.conflict(key, holder, unit, m),
                        "conflict at {unit}: {held:?}"
                    );
                }
            }
        }
        assert!(held
            .iter()
            .all(|h| h.range.end <= UNITS || h.range.end == u64::MAX));
    }
}

fn apply_revocation(
    table: &mut TokenTable<u8, u32>,
    model: &mut Model,
    key: u8,
    r: &Revocation<u32>,
) {
    match r.keep {
        None => table.release(r.holder, &key, r.range.clone()),
        Some(_) => table.downgrade(r.holder, &key, r.range.clone()),
    }
    for unit in r.range.clone() {
        let old = model.get(key, r.holder, unit);
        model.put(key, r.holder, unit, old.and(r.keep));
    }
}

/// Units past `UNITS` exist only in "whole object" grants; the model tracks the first
/// `UNITS` and the table's check above accepts an end of `u64::MAX`.
fn units_of(r: &Range<u64>) -> Range<u64> {
    r.start.min(UNITS)..r.end.min(UNITS)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_table_keeps_every_holder_out_of_every_conflicting_range(ops in proptest::collection::vec(op(), 1..60)) {
        let mut table: TokenTable<u8, u32> = TokenTable::new();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Acquire { holder, key, required, desired, mode } => {
                    let mut answer = table.acquire(holder, &key, required.clone(), desired.clone(), mode).unwrap();
                    if let Acquired::Conflicts(revocations) = &answer {
                        // Exactly the conflicting units of `required`, each once.
                        let mut listed = Vec::new();
                        for r in revocations {
                            prop_assert!(r.holder != holder);
                            prop_assert_eq!(r.keep, (mode == Mode::Read).then_some(Mode::Read));
                            for unit in r.range.clone() {
                                prop_assert!(required.contains(&unit));
                                listed.push((r.holder, unit));
                            }
                        }
                        listed.sort();
                        let mut want = Vec::new();
                        for h in 0..HOLDERS {
                            for unit in required.clone() {
                                if h != holder && model.get(key, h, unit).is_some_and(|m| conflicts(m, mode)) {
                                    want.push((h, unit));
                                }
                            }
                        }
                        prop_assert_eq!(listed, want);
                        check(&table, &model);
                        for r in revocations {
                            apply_revocation(&mut table, &mut model, key, r);
                        }
                        answer = table.acquire(holder, &key, required.clone(), desired.clone(), mode).unwrap();
                    }
                    let Acquired::Granted(granted) = answer else {
                        panic!("still conflicts after the revocations: {answer:?}");
                    };
                    prop_assert!(granted.start <= required.start && granted.end >= required.end);
                    prop_assert!(granted.start >= desired.start && granted.end <= desired.end);
                    // As large as it can be: one more unit on either side would conflict.
                    if granted.start > desired.start {
                        prop_assert!(model.conflict(key, holder, granted.start - 1, mode));
                    }
                    if granted.end < desired.end && granted.end < UNITS {
                        prop_assert!(model.conflict(key, holder, granted.end, mode));
                    }
                    for unit in units_of(&granted) {
                        prop_assert!(!model.conflict(key, holder, unit, mode));
                        let old = model.get(key, holder, unit);
                        model.put(key, holder, unit, Some(old.map_or(mode, |o| o.max(mode))));
                    }
                    prop_assert_eq!(table.held_mode(holder, &key, required.clone()).map(|m| m >= mode), Some(true));
                }
                Op::Release(holder, key, range) => {
                    table.release(holder, &key, range.clone());
                    for unit in range {
                        model.put(key, holder, unit, None);
                    }
                }
                Op::Downgrade(holder, key, range) => {
                    table.downgrade(holder, &key, range.clone());
                    for unit in range {
                        let old = model.get(key, holder, unit);
                        model.put(key, holder, unit, old.map(|_| Mode::Read));
                    }
                }
                Op::Drop(holder) => {
                    table.drop_holder(holder);
                    for key in 0..KEYS {
                        for unit in 0..UNITS {
                            model.put(key, holder, unit, None);
                        }
                    }
                }
            }
            check(&table, &model);
        }
    }
}

#[test]
fn a_single_writer_gets_the_whole_file_and_a_second_splits_it_at_the_block_it_needs() {
    let mut t: TokenTable<u64, u32> = TokenTable::new();
    let all = 0..u64::MAX;
    assert_eq!(
        t.acquire(1, &7, 0..1, all.clone(), Mode::Write).unwrap(),
        Acquired::Granted(all.clone())
    );
    // A second writer of block 10: node 1 gives up block 10 only.
    let Acquired::Conflicts(r) = t.acquire(2, &7, 10..11, all.clone(), Mode::Write).unwrap() else {
        panic!("no conflict");
    };
    assert_eq!(
        r,
        vec![Revocation {
            holder: 1,
            range: 10..11,
            keep: None
        }]
    );
    t.release(1, &7, 10..11);
    // Node 2 gets everything node 1 no longer holds around block 10: just block 10.
    assert_eq!(
        t.acquire(2, &7, 10..11, all.clone(), Mode::Write).unwrap(),
        Acquired::Granted(10..11)
    );
    assert_eq!(t.held_mode(1, &7, 0..10), Some(Mode::Write));
    assert_eq!(t.held_mode(1, &7, 9..11), None);
    // A reader of block 3 downgrades node 1 there; then both read it.
    let Acquired::Conflicts(r) = t.acquire(3, &7, 3..4, 3..4, Mode::Read).unwrap() else {
        panic!("no conflict");
    };
    assert_eq!(r[0].keep, Some(Mode::Read));
    t.downgrade(1, &7, 3..4);
    assert_eq!(
        t.acquire(3, &7, 3..4, 3..4, Mode::Read).unwrap(),
        Acquired::Granted(3..4)
    );
    assert_eq!(t.held_mode(1, &7, 3..4), Some(Mode::Read));
    // Node 1 dies: everything it held goes, and node 2 may have the whole file.
    t.drop_holder(1);
    let Acquired::Conflicts(r) = t
        .acquire(2, &7, 0..u64::MAX, all.clone(), Mode::Write)
        .unwrap()
    else {
        panic!("node 3 still reads block 3");
    };
    assert_eq!(r.len(), 1);
    t.release(3, &7, 0..u64::MAX);
    assert_eq!(
        t.acquire(2, &7, 0..1, all.clone(), Mode::Write).unwrap(),
        Acquired::Granted(all)
    );
    assert_eq!(t.object_count(), 1);
}

#[test]
fn bad_requests_are_refused_not_asserted() {
    let mut t: TokenTable<u64, u32> = TokenTable::new();
    assert!(t.acquire(1, &1, 5..5, 0..9, Mode::Read).is_err());
    assert!(t.acquire(1, &1, 2..6, 3..9, Mode::Read).is_err());
    assert!(t.acquire(1, &1, 2..6, 0..5, Mode::Read).is_err());
    // Interleaved single blocks with another writer: the ranges do not merge, and past the
    // bound the request is refused with a reason.
    for b in 0..RANGES_PER_HOLDER_MAX as u64 {
        assert!(matches!(
            t.acquire(1, &1, 2 * b..2 * b + 1, 2 * b..2 * b + 1, Mode::Write),
            Ok(Acquired::Granted(_))
        ));
        assert!(matches!(
            t.acquire(
                2,
                &1,
                2 * b + 1..2 * b + 2,
                2 * b + 1..2 * b + 2,
                Mode::Write
            ),
            Ok(Acquired::Granted(_))
        ));
    }
    let n = RANGES_PER_HOLDER_MAX as u64;
    let e = t
        .acquire(1, &1, 2 * n..2 * n + 1, 2 * n..2 * n + 1, Mode::Write)
        .unwrap_err();
    assert!(e.to_string().contains("give back"), "{e}");
}
