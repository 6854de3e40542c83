//! Journal behaviour on real files: roundtrip, replay point, wrap-around, Full, torn and
//! stale pages, group commit, and damaged regions.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use common::{assert_records, last_page_of, payload, Damage, Disk, DAMAGES, LOG_ID, PAGE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_drive::AlignedBuf;
use tessera_journal::{format, Journal, JournalError, JournalRegion, Lsn, Record};
use tessera_testkit::SimDrive;

fn append_all(journal: &Journal, records: &mut Vec<Record>, payloads: Vec<Vec<u8>>) {
    for p in payloads {
        let lsn = journal.append(&p).unwrap();
        records.push(Record { lsn, payload: p });
    }
}

fn after(records: &[Record], replay_from: Lsn) -> Vec<Record> {
    records
        .iter()
        .filter(|r| r.lsn > replay_from)
        .cloned()
        .collect()
}

#[test]
fn roundtrip_random_sizes_and_replay_point() {
    let disk = Disk::new(16 << 20);
    let mut rng = StdRng::seed_from_u64(1);
    let (journal, replayed) = disk.open(0);
    assert!(replayed.is_empty());
    assert!(journal.max_record_bytes() >= 300 << 10);
    let mut records = Vec::new();
    for i in 0..70u64 {
        let len = match i % 4 {
            0 => 0,
            1 => rng.gen_range(1..200),
            2 => rng.gen_range(3000..9000),
            _ => rng.gen_range(0..=300 << 10),
        };
        append_all(&journal, &mut records, vec![payload(i, len)]);
        if rng.gen_bool(0.3) {
            journal.commit(records.last().unwrap().lsn).unwrap();
        }
    }
    let end = journal.commit_all().unwrap();
    assert_eq!(end, records.last().unwrap().lsn);
    assert_eq!(journal.durable_lsn(), end);
    assert!(records.windows(2).all(|w| w[0].lsn < w[1].lsn));
    drop(journal);

    let (journal, replayed) = disk.open(0);
    assert_records(&replayed, &records, "replay");
    assert_eq!(journal.durable_lsn(), end);
    assert_eq!(journal.appended_lsn(), end);
    drop(journal);
    for k in [0, 1, 17, 42, 69] {
        let from = records[k].lsn;
        let (_, replayed) = disk.open(from);
        assert_records(
            &replayed,
            &after(&records, from),
            &format!("replay from record {k}"),
        );
    }
}

#[test]
fn appends_continue_after_reopen_on_a_fresh_page() {
    let disk = Disk::new(1 << 20);
    let (journal, _) = disk.open(0);
    let mut records = Vec::new();
    append_all(&journal, &mut records, vec![payload(1, 10), payload(2, 20)]);
    journal.commit_all().unwrap();
    // Appended but never committed: not written at all by this implementation.
    journal.append(&payload(3, 30)).unwrap();
    drop(journal);

    let (journal, replayed) = disk.open(0);
    assert_records(&replayed, &records, "replay");
    append_all(&journal, &mut records, vec![payload(4, 100)]);
    journal.commit_all().unwrap();
    // The new record went to the page after the last one written, never into it.
    assert_eq!(records[2].lsn / PAGE, records[1].lsn / PAGE + 1);
    drop(journal);
    let (_, replayed) = disk.open(0);
    assert_records(&replayed, &records, "replay");
}

#[test]
fn wraps_around_many_laps_with_set_tail() {
    let disk = Disk::new(1 << 20);
    let mut rng = StdRng::seed_from_u64(2);
    let (mut journal, _) = disk.open(0);
    let mut records: Vec<Record> = Vec::new();
    let mut tail: Lsn = 0;
    let mut written: u64 = 0;
    let mut tag = 0;
    while written < 12 * disk.region.bytes {
        let len = rng.gen_range(0..12_000);
        tag += 1;
        append_all(&journal, &mut records, vec![payload(tag, len)]);
        written += len as u64 + 8;
        if rng.gen_bool(0.5) {
            journal.commit_all().unwrap();
            // The checkpoint lags: keep the newest ~300 KiB of records live.
            let keep_from = journal.durable_lsn().saturating_sub(300 << 10);
            if let Some(r) = records.iter().rev().find(|r| r.lsn <= keep_from) {
                tail = tail.max(r.lsn);
                journal.set_tail(tail);
            }
            assert!(journal.used_bytes() <= journal.capacity_bytes());
        }
        if rng.gen_bool(0.02) {
            journal.commit_all().unwrap();
            drop(journal);
            let (j, replayed) = disk.open(tail);
            assert_records(&replayed, &after(&records, tail), "replay from tail");
            journal = j;
        }
    }
    journal.commit_all().unwrap();
    let laps = journal.durable_lsn() / journal.capacity_bytes();
    assert!(laps >= 10, "only {laps} laps");
    drop(journal);
    let (_, replayed) = disk.open(tail);
    assert_records(&replayed, &after(&records, tail), "replay from tail");
}

#[test]
fn full_until_the_tail_moves() {
    let disk = Disk::new(1 << 20);
    let (journal, _) = disk.open(0);
    let mut records = Vec::new();
    let err = loop {
        match journal.append(&payload(records.len() as u64, 3000)) {
            Ok(lsn) => records.push(Record {
                lsn,
                payload: payload(records.len() as u64, 3000),
            }),
            Err(e) => break e,
        }
        if records.len() % 7 == 0 {
            journal.commit_all().unwrap();
        }
        assert!(records.len() < 1000, "never full");
    };
    let JournalError::Full { needed, free } = err else {
        panic!("expected Full, got {err}")
    };
    assert!(needed > free, "needed {needed} free {free}");
    assert!(journal.used_bytes() <= journal.capacity_bytes());
    assert!(journal.used_bytes() + PAGE >= journal.capacity_bytes() - needed);
    journal.commit_all().unwrap();
    // Still full, even after a commit, while the tail stays.
    assert!(matches!(
        journal.append(&[1; 3000]),
        Err(JournalError::Full { .. })
    ));
    drop(journal);

    // The ring was filled completely; everything is still there.
    let (journal, replayed) = disk.open(0);
    assert_records(&replayed, &records, "replay");
    assert!(matches!(
        journal.append(&[1; 3000]),
        Err(JournalError::Full { .. })
    ));
    let tail = records[records.len() / 2].lsn;
    journal.set_tail(tail);
    let lsn = journal.append(&payload(9999, 3000)).unwrap();
    records.push(Record {
        lsn,
        payload: payload(9999, 3000),
    });
    journal.commit_all().unwrap();
    drop(journal);
    let (_, replayed) = disk.open(tail);
    assert_records(&replayed, &after(&records, tail), "replay from tail");
}

#[test]
fn record_too_large_is_refused() {
    let disk = Disk::new(1 << 20);
    let (journal, _) = disk.open(0);
    let max = journal.max_record_bytes();
    assert!(max >= 64 << 10);
    let err = journal.append(&vec![0; max + 1]).unwrap_err();
    let JournalError::RecordTooLarge { bytes, max: limit } = err else {
        panic!("{err}")
    };
    assert_eq!((bytes, limit), (max + 1, max));
    let lsn = journal.append(&vec![7; max]).unwrap();
    journal.commit(lsn).unwrap();
    drop(journal);
    let (_, replayed) = disk.open(0);
    assert_eq!(
        replayed,
        vec![Record {
            lsn,
            payload: vec![7; max]
        }]
    );
}

/// Two commits; the second one's pages are damaged as a torn write would leave them.
/// Replay must return every record that ends before the damaged page and nothing after,
/// and a new session must not resurrect the stale pages behind the damage.
#[test]
fn torn_page_ends_replay_and_stale_pages_stay_dead() {
    let mut rng = StdRng::seed_from_u64(3);
    for (round, how) in DAMAGES.iter().cycle().take(14).enumerate() {
        let disk = Disk::new(1 << 20);
        let (journal, _) = disk.open(0);
        let mut records = Vec::new();
        let first: Vec<_> = (0..5).map(|i| payload(i, 2000)).collect();
        append_all(&journal, &mut records, first);
        journal.commit_all().unwrap();
        let durable = records.len();
        // In later rounds every record fills exactly one page, so the stale pages behind
        // the damage start with a record and only the session check can reject them.
        let len = |rng: &mut StdRng| {
            if round >= 6 {
                4096 - 64 - 8
            } else {
                rng.gen_range(0..3000)
            }
        };
        let second: Vec<_> = (0..20).map(|i| payload(100 + i, len(&mut rng))).collect();
        append_all(&journal, &mut records, second);
        journal.commit_all().unwrap();
        drop(journal);

        let first_page = last_page_of(records[durable - 1].lsn) + 1;
        let last_page = last_page_of(records.last().unwrap().lsn);
        let torn = if round % 2 == 0 {
            last_page
        } else {
            rng.gen_range(first_page..last_page)
        };
        disk.damage_page(torn, *how, &mut rng);
        let survivors: Vec<Record> = records
            .iter()
            .filter(|r| last_page_of(r.lsn) < torn)
            .cloned()
            .collect();
        assert!(survivors.len() >= durable);

        let (journal, replayed) = disk.open(0);
        assert_records(
            &replayed,
            &survivors,
            &format!("round {round} {how:?} torn page {torn}"),
        );
        let mut expected = survivors.clone();
        append_all(&journal, &mut expected, vec![payload(7777, 100)]);
        journal.commit_all().unwrap();
        assert_eq!(last_page_of(expected.last().unwrap().lsn), torn);
        drop(journal);
        let (_, replayed) = disk.open(0);
        assert_records(
            &replayed,
            &expected,
            &format!("round {round}: stale pages after {torn}"),
        );
    }
}

#[test]
fn garbage_and_old_pages_after_the_end_are_not_replayed() {
    let disk = Disk::new(1 << 20);
    let mut rng = StdRng::seed_from_u64(4);
    let (journal, _) = disk.open(0);
    let mut records = Vec::new();
    // About one and a half laps, so the slots after the end hold pages of the first lap.
    let mut tag = 0;
    while journal.appended_lsn() < journal.capacity_bytes() * 3 / 2 {
        tag += 1;
        append_all(
            &journal,
            &mut records,
            vec![payload(tag, rng.gen_range(0..6000))],
        );
        journal.commit_all().unwrap();
        journal.set_tail(records[records.len().saturating_sub(20)].lsn);
    }
    let tail = records[records.len() - 20].lsn;
    drop(journal);
    let end_page = last_page_of(records.last().unwrap().lsn);
    // An old-lap page right after the end is rejected by its sequence.
    assert!(disk.read_page(end_page + 1)[..4] == *b"TJLP");
    let (_, replayed) = disk.open(tail);
    assert_records(&replayed, &after(&records, tail), "replay from tail");

    // A copy of a valid page in the next slot, then random garbage: still nothing more.
    let copy = disk.read_page(end_page);
    disk.write_page(end_page + 1, &copy);
    let (_, replayed) = disk.open(tail);
    assert_records(&replayed, &after(&records, tail), "replay from tail");
    let mut garbage = vec![0; PAGE as usize];
    rng.fill(&mut garbage[..]);
    disk.write_page(end_page + 1, &garbage);
    let (_, replayed) = disk.open(tail);
    assert_records(&replayed, &after(&records, tail), "replay from tail");
}

#[test]
fn format_errors_and_reformat() {
    let disk = Disk::new(2 << 20);
    let (journal, _) = disk.open(0);
    journal.append(b"before reformat").unwrap();
    journal.commit_all().unwrap();
    drop(journal);

    let err = Journal::open(disk.dev.clone(), disk.region, [9; 16], 0).unwrap_err();
    assert!(matches!(err, JournalError::WrongLog { .. }), "{err}");
    let other = JournalRegion {
        offset: disk.region.offset,
        bytes: disk.region.bytes - PAGE,
    };
    let err = Journal::open(disk.dev.clone(), other, LOG_ID, 0).unwrap_err();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
    let bad = JournalRegion {
        offset: 100,
        bytes: 1 << 20,
    };
    let err = format(&*disk.dev, bad, LOG_ID).unwrap_err();
    assert!(matches!(err, JournalError::InvalidRegion { .. }), "{err}");
    let small = JournalRegion {
        offset: 0,
        bytes: 64 << 10,
    };
    assert!(matches!(
        format(&*disk.dev, small, LOG_ID),
        Err(JournalError::InvalidRegion { .. })
    ));
    let past = JournalRegion {
        offset: 4 * PAGE,
        bytes: disk.region.bytes,
    };
    let err = format(&*disk.dev, past, LOG_ID).unwrap_err();
    assert!(
        err.to_string().contains(&disk.path.display().to_string()),
        "{err}"
    );

    // Same log id, formatted again: the old record must not come back.
    format(&*disk.dev, disk.region, LOG_ID).unwrap();
    let (journal, replayed) = disk.open(0);
    assert!(replayed.is_empty());
    let lsn = journal.append(b"after reformat").unwrap();
    journal.commit(lsn).unwrap();
    drop(journal);
    let (_, replayed) = disk.open(0);
    assert_eq!(
        replayed,
        vec![Record {
            lsn,
            payload: b"after reformat".to_vec()
        }]
    );

    // An unformatted region is corrupt, not an empty log.
    let blank = Disk::new(1 << 20);
    blank
        .dev
        .write_at(&AlignedBuf::zeroed(PAGE as usize), blank.region.offset)
        .unwrap();
    let err = Journal::open(blank.dev.clone(), blank.region, LOG_ID, 0).unwrap_err();
    assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("drive"), "names the device: {err}");
}

#[test]
fn concurrent_appenders_share_commits() {
    let disk = Disk::new(8 << 20);
    let (journal, _) = disk.open(0);
    let journal = Arc::new(journal);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let journal = journal.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(10 + t);
                let mut mine = Vec::new();
                for i in 0..150u64 {
                    let mut p = payload(t * 1000 + i, rng.gen_range(0..5000));
                    p.splice(0..0, (t * 1000 + i).to_le_bytes());
                    let lsn = journal.append(&p).unwrap();
                    journal.commit(lsn).unwrap();
                    assert!(journal.durable_lsn() >= lsn);
                    mine.push(Record { lsn, payload: p });
                }
                mine
            })
        })
        .collect();
    let mut all: Vec<Record> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    all.sort_by_key(|r| r.lsn);
    drop(journal);
    let (_, replayed) = disk.open(0);
    assert_eq!(replayed.len(), 600);
    assert_records(&replayed, &all, "replay");
}

#[test]
fn appends_proceed_during_a_commit_and_waiters_share_the_next_flush() {
    let disk = Disk::new(1 << 20);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    // Every flush announces itself and waits to be released.
    let gated = Arc::new(SimDrive::new(disk.dev.clone(), Arc::default()));
    let flushes = Arc::new(AtomicU32::new(0));
    let (counted, entered_tx) = (flushes.clone(), Mutex::new(entered_tx));
    let release_rx = Mutex::new(release_rx);
    gated.set_flush_hook(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        entered_tx.lock().unwrap().send(()).unwrap();
        release_rx.lock().unwrap().recv().unwrap();
    });
    release.send(()).unwrap(); // Let the flush in open pass.
    let (journal, _) = Journal::open(gated.clone(), disk.region, LOG_ID, 0).unwrap();
    entered.recv().unwrap();
    let journal = Arc::new(journal);
    let a = journal.append(b"first").unwrap();
    let j = journal.clone();
    let committer = std::thread::spawn(move || j.commit(a).unwrap());
    entered.recv().unwrap(); // The committer is inside flush, without the append lock.
    let b: Vec<Lsn> = (0..50)
        .map(|i| journal.append(&payload(i, 100)).unwrap())
        .collect();
    assert_eq!(journal.durable_lsn(), 0);
    let waiters: Vec<_> = b
        .iter()
        .map(|&lsn| {
            let j = journal.clone();
            std::thread::spawn(move || j.commit(lsn).unwrap())
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    release.send(()).unwrap();
    committer.join().unwrap();
    assert_eq!(journal.durable_lsn(), a);
    entered.recv().unwrap(); // One of the waiters writes the other 50 records.
    release.send(()).unwrap();
    for w in waiters {
        w.join().unwrap();
    }
    assert_eq!(journal.durable_lsn(), *b.last().unwrap());
    assert_eq!(
        flushes.load(Ordering::SeqCst),
        3,
        "open, first commit, one group commit"
    );
    journal.commit(a).unwrap(); // Already durable: no I/O, so no flush to release.
    assert_eq!(flushes.load(Ordering::SeqCst), 3);
}

#[test]
fn random_region_contents_never_panic() {
    let mut rng = StdRng::seed_from_u64(5);
    let disk = Disk::new(1 << 20);
    let pages = disk.region.bytes / PAGE;
    for round in 0..40 {
        // Fill the region with random bytes; every other round keep a valid header.
        let mut bytes = vec![0; disk.region.bytes as usize];
        rng.fill(&mut bytes[..]);
        if round % 2 == 1 {
            format(&*disk.dev, disk.region, LOG_ID).unwrap();
            let mut header = AlignedBuf::zeroed(PAGE as usize);
            disk.dev.read_at(&mut header, disk.region.offset).unwrap();
            bytes[..PAGE as usize].copy_from_slice(&header);
        }
        disk.dev
            .write_at(&AlignedBuf::from_slice(&bytes), disk.region.offset)
            .unwrap();
        let replay_from = match round % 3 {
            0 => 0,
            1 => rng.gen_range(0..pages * PAGE),
            _ => rng.gen(),
        };
        let result = Journal::open(disk.dev.clone(), disk.region, LOG_ID, replay_from);
        if let Ok((journal, replayed)) = result {
            assert!(replayed.is_empty());
            let _ = journal.append(b"x");
        }
    }
    let _ = Damage::Zero;
}

/// A log that continues another's LSNs (the recovery log moved to another disk): a fresh
/// log opened at `page_start_at_or_after(end of the old one)` replays nothing, appends LSNs
/// above every old one, and after a reopen from the same point replays exactly its own.
#[test]
fn a_new_log_continues_the_lsns_of_an_old_one() {
    let old = Disk::new(1 << 20);
    let (journal, _) = old.open(0);
    let mut records = Vec::new();
    append_all(
        &journal,
        &mut records,
        vec![payload(1, 100), payload(2, 3000)],
    );
    let end = journal.commit_all().unwrap();
    drop(journal);
    let start = tessera_journal::page_start_at_or_after(end);
    assert!(start >= end, "{start} < {end}");
    assert_eq!(tessera_journal::page_start_at_or_after(start), start);

    let new = Disk::new(1 << 20);
    let (journal, replayed) = new.open(start);
    assert!(replayed.is_empty());
    assert_eq!(journal.appended_lsn(), start);
    let mut moved = Vec::new();
    append_all(&journal, &mut moved, vec![payload(3, 50), payload(4, 9000)]);
    journal.commit_all().unwrap();
    assert!(moved[0].lsn > end);
    drop(journal);
    let (_, replayed) = new.open(start);
    assert_records(&replayed, &moved, "replay of the new log");
}

/// A page inside the log, one a later commit of the same session follows, that no longer
/// reads back (bit rot, a stray write, a lost sector run) held records the journal
/// acknowledged as durable: replaying only what precedes it would drop them and every
/// later record silently, so the open refuses and names the page. fsck's repair opens the
/// log accepting the loss; its next commit writes over the damaged page as the first page
/// of a new session, and the log opens normally from then on.
#[test]
fn damage_inside_the_log_is_refused_and_a_repair_can_accept_the_loss() {
    let mut rng = StdRng::seed_from_u64(11);
    for (round, how) in DAMAGES.iter().cycle().take(12).enumerate() {
        let disk = Disk::new(1 << 20);
        let (journal, _) = disk.open(0);
        let mut records = Vec::new();
        // Eight commits of a few records each: several commit ends lie beyond the damage.
        let mut commit_ends = Vec::new();
        for c in 0..8u64 {
            let batch = (0..rng.gen_range(1..6))
                .map(|i| payload(c * 100 + i, rng.gen_range(0..7000)))
                .collect();
            append_all(&journal, &mut records, batch);
            journal.commit_all().unwrap();
            commit_ends.push(last_page_of(records.last().unwrap().lsn));
        }
        drop(journal);
        // The first page of the scan (no page before it), or a page of the first five
        // commits, so that at least two commit ends follow it.
        let damaged = if round % 3 == 0 {
            0
        } else {
            rng.gen_range(1..=commit_ends[4])
        };
        disk.damage_page(damaged, *how, &mut rng);
        let context = format!("round {round} {how:?} page {damaged}");

        let err = Journal::open(disk.dev.clone(), disk.region, LOG_ID, 0).unwrap_err();
        let JournalError::Corrupt { detail, .. } = &err else {
            panic!("{context}: {err}");
        };
        assert!(
            detail.contains(&format!("page {damaged} ")),
            "{context}: {err}"
        );
        assert!(detail.contains("committed records"), "{context}: {err}");

        let survivors: Vec<Record> = records
            .iter()
            .filter(|r| last_page_of(r.lsn) < damaged)
            .cloned()
            .collect();
        let (journal, replayed, lost) =
            Journal::open_accepting_loss(disk.dev.clone(), disk.region, LOG_ID, 0).unwrap();
        assert_records(&replayed, &survivors, &context);
        assert!(
            lost.is_some_and(|l| l.contains(&format!("page {damaged} "))),
            "{context}"
        );
        let mut expected = survivors;
        append_all(&journal, &mut expected, vec![payload(7777, 100)]);
        journal.commit_all().unwrap();
        drop(journal);
        let (journal, replayed) = disk.open(0);
        assert_records(
            &replayed,
            &expected,
            &format!("{context}: after the repair"),
        );
        append_all(&journal, &mut expected, vec![payload(8888, 5000)]);
        journal.commit_all().unwrap();
        drop(journal);
        let (_, replayed) = disk.open(0);
        assert_records(&replayed, &expected, &format!("{context}: a session later"));
    }
}

/// The pages of the last commit that landed after one of them tore are no evidence of
/// damage: the crash stopped that commit, and only its last page is sealed short. Nor are
/// the pages of an older session that a newer one's torn tail leaves behind.
#[test]
fn torn_tails_with_whole_pages_after_them_open_without_complaint() {
    let mut rng = StdRng::seed_from_u64(12);
    for round in 0..12u64 {
        let disk = Disk::new(1 << 20);
        let (journal, _) = disk.open(0);
        let mut records = Vec::new();
        for c in 0..3u64 {
            append_all(
                &journal,
                &mut records,
                vec![payload(c, rng.gen_range(0..3000))],
            );
            journal.commit_all().unwrap();
        }
        let durable = records.len();
        // The last commit: many pages, torn anywhere but at its end.
        let last: Vec<_> = (0..12)
            .map(|i| payload(50 + i, rng.gen_range(1000..6000)))
            .collect();
        append_all(&journal, &mut records, last);
        journal.commit_all().unwrap();
        drop(journal);
        let first = last_page_of(records[durable - 1].lsn) + 1;
        let end = last_page_of(records.last().unwrap().lsn);
        let torn = rng.gen_range(first..end);
        disk.damage_page(torn, DAMAGES[round as usize % 4], &mut rng);
        let survivors: Vec<Record> = records
            .iter()
            .filter(|r| last_page_of(r.lsn) < torn)
            .cloned()
            .collect();
        let (journal, replayed) = disk.open(0);
        assert_records(&replayed, &survivors, &format!("round {round} torn {torn}"));
        // A newer session writes two commits over the torn page and tears its own last
        // one: the older session's whole pages beyond it, with its commit end, stay
        // evidence of nothing.
        let mut expected = survivors;
        append_all(&journal, &mut expected, vec![payload(900, 10)]);
        journal.commit_all().unwrap();
        append_all(&journal, &mut expected, vec![payload(901, 5000)]);
        journal.commit_all().unwrap();
        drop(journal);
        let newest = last_page_of(expected.last().unwrap().lsn);
        if newest < end {
            disk.damage_page(newest, Damage::Zero, &mut rng);
            expected.retain(|r| last_page_of(r.lsn) < newest);
        }
        let (_, replayed) = disk.open(0);
        assert_records(
            &replayed,
            &expected,
            &format!("round {round}: newer torn tail"),
        );
    }
}

/// The page holding the replay point is damaged (the checkpoint says records up to inside
/// it were durable): refused; accepting the loss replays nothing and appends from the next
/// page, so that every later LSN stays above the replay point.
#[test]
fn a_damaged_replay_point_page_is_refused_and_a_repair_appends_past_it() {
    let mut rng = StdRng::seed_from_u64(13);
    for how in DAMAGES {
        let disk = Disk::new(1 << 20);
        let (journal, _) = disk.open(0);
        let mut records = Vec::new();
        for c in 0..6u64 {
            append_all(
                &journal,
                &mut records,
                vec![payload(c, 1000 + 700 * c as usize)],
            );
            journal.commit_all().unwrap();
        }
        drop(journal);
        let replay_from = records
            .iter()
            .map(|r| r.lsn)
            .find(|&lsn| lsn % PAGE > 64 && lsn / PAGE > 0)
            .unwrap();
        disk.damage_page(replay_from / PAGE, how, &mut rng);
        let err = Journal::open(disk.dev.clone(), disk.region, LOG_ID, replay_from).unwrap_err();
        assert!(
            matches!(&err, JournalError::Corrupt { detail, .. } if detail.contains("replay point")),
            "{how:?}: {err}"
        );
        let (journal, replayed, lost) =
            Journal::open_accepting_loss(disk.dev.clone(), disk.region, LOG_ID, replay_from)
                .unwrap();
        assert!(replayed.is_empty() && lost.is_some(), "{how:?}");
        let mut expected = Vec::new();
        append_all(&journal, &mut expected, vec![payload(99, 300)]);
        journal.commit_all().unwrap();
        assert_eq!(
            last_page_of(expected[0].lsn),
            replay_from / PAGE + 1,
            "{how:?}: appended on the page after the damaged one"
        );
        drop(journal);
        // The repair's checkpoint names a replay point past the damaged page.
        let (_, replayed) = disk.open(tessera_journal::page_start_at_or_after(replay_from));
        assert_records(&replayed, &expected, &format!("{how:?}: after the repair"));
    }
}
