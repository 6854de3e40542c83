//! Storage pools and placement rules: a policy puts new files' data in the pools its rules
//! name, the choice is recorded with the create (remounts, later policies and restripes
//! keep it), bad policies are refused with where and why, and a crash while files are
//! being placed loses nothing.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use common::*;
use tessera_fs::restripe::RestripeMode;
use tessera_fs::{DiskStatus, FileSystem, ROOT_INO};
use tessera_nsd::DiskUsage;

const POLICY: &str = "\
/* scratch files go to the slow pool */
RULE 'tmp' SET POOL 'slow' WHERE NAME LIKE '%.tmp' OR USER_ID = 4242;
RULE 'default' SET POOL 'system';
";

/// nsd0 and nsd1 in `system` (data and metadata, or metadata only), nsd2 and nsd3 in
/// `slow` (data only).
fn two_pools(system_holds_data: bool) -> TestDisks {
    let t = make_disks(4, 64 << 20);
    format_fs_with(&t, &small_opts(), |i| match (i < 2, system_holds_data) {
        (true, true) => (DiskUsage::DataAndMetadata, "system"),
        (true, false) => (DiskUsage::MetadataOnly, "system"),
        (false, _) => (DiskUsage::DataOnly, "slow"),
    });
    t
}

/// Writes a file of `size` bytes as `uid`; returns its content.
fn write_file(fs: &FileSystem, name: &str, size: usize, uid: u32, seed: u64) -> Vec<u8> {
    let a = fs
        .create_node(
            ROOT_INO,
            name.as_bytes(),
            tessera_fs::FileKind::Regular,
            0o644,
            0,
            tessera_fs::Caller { uid, gid: 0 },
            None,
        )
        .unwrap();
    let data = pattern(size, seed);
    fs.write(a.ino, 0, &data, false).unwrap();
    data
}

/// The NSDs that hold `name`'s data blocks.
fn disks_of(fs: &FileSystem, name: &str) -> Vec<String> {
    let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
    fs.file_blocks_per_disk(a.ino)
        .unwrap()
        .into_iter()
        .map(|(nsd, _)| nsd)
        .collect()
}

fn pool_of(fs: &FileSystem, name: &str) -> String {
    let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
    fs.file_pool_name(a.ino).unwrap()
}

fn assert_in_pool(fs: &FileSystem, name: &str, pool: &str) {
    let nsds: &[&str] = if pool == "slow" {
        &["nsd2", "nsd3"]
    } else {
        &["nsd0", "nsd1"]
    };
    let on = disks_of(fs, name);
    assert!(!on.is_empty(), "{name} has no blocks");
    assert!(
        on.iter().all(|d| nsds.contains(&d.as_str())),
        "{name} should be in pool {pool}, its blocks are on {on:?}"
    );
    assert_eq!(pool_of(fs, name), pool, "{name}");
}

#[test]
fn placement_rules_put_new_files_in_their_pools_and_the_choice_stays() {
    let t = two_pools(true);
    let fs = mount(&t);
    let mut files = BTreeMap::new();
    // No policy: the default data pool.
    files.insert(
        "before.tmp".to_string(),
        write_file(&fs, "before.tmp", 5 * BLOCK as usize, 0, 1),
    );
    assert_in_pool(&fs, "before.tmp", "system");

    let summary = fs.set_policy(Some(POLICY)).unwrap();
    assert_eq!((summary.rules, summary.placement_rules), (2, 2));
    assert_eq!(fs.policy_text().as_deref(), Some(POLICY));
    for (name, uid) in [("a.tmp", 0), ("b.dat", 0), ("c.dat", 4242)] {
        files.insert(
            name.into(),
            write_file(&fs, name, 6 * BLOCK as usize + 100, uid, 2),
        );
    }
    assert_in_pool(&fs, "a.tmp", "slow");
    assert_in_pool(&fs, "b.dat", "system");
    assert_in_pool(&fs, "c.dat", "slow");
    // A file made before the policy keeps its pool when it grows.
    let before = fs.lookup(ROOT_INO, b"before.tmp").unwrap();
    let more = pattern(2 * BLOCK as usize, 9);
    fs.write(before.ino, 5 * BLOCK, &more, false).unwrap();
    files
        .get_mut("before.tmp")
        .unwrap()
        .extend_from_slice(&more);
    assert_in_pool(&fs, "before.tmp", "system");
    // `df` per pool sees the slow pool's bytes.
    let df = fs.df().unwrap();
    let slow = df.pools.iter().find(|p| p.pool == "slow").unwrap();
    assert!(slow.size_bytes - slow.free_full_block_bytes - slow.free_fragment_bytes >= 12 * BLOCK);
    fs.unmount().unwrap();
    drop(fs);

    // The policy and each file's pool survive a remount.
    let fs = mount(&t);
    assert_eq!(fs.policy_text().as_deref(), Some(POLICY));
    verify(&fs, &files);
    files.insert(
        "d.tmp".into(),
        write_file(&fs, "d.tmp", 3 * BLOCK as usize, 0, 3),
    );
    assert_in_pool(&fs, "d.tmp", "slow");
    let a = fs.lookup(ROOT_INO, b"a.tmp").unwrap();
    let tail = pattern(BLOCK as usize, 4);
    fs.write(a.ino, 6 * BLOCK + 100, &tail, false).unwrap();
    files.get_mut("a.tmp").unwrap().extend_from_slice(&tail);
    assert_in_pool(&fs, "a.tmp", "slow");

    // Removing the policy: new files go to the default pool, placed ones stay.
    assert_eq!(fs.set_policy(None).unwrap().rules, 0);
    assert_eq!(fs.policy_text(), None);
    files.insert(
        "e.tmp".into(),
        write_file(&fs, "e.tmp", 3 * BLOCK as usize, 0, 5),
    );
    assert_in_pool(&fs, "e.tmp", "system");
    assert_in_pool(&fs, "d.tmp", "slow");
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after placement");
    let fs = mount(&t);
    assert_eq!(fs.policy_text(), None);
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn restripe_moves_blocks_within_their_files_pools() {
    let t = two_pools(true);
    let fs = mount(&t);
    fs.set_policy(Some(POLICY)).unwrap();
    let mut files = BTreeMap::new();
    for i in 0..6 {
        let name = if i % 2 == 0 {
            format!("f{i}.tmp")
        } else {
            format!("f{i}.dat")
        };
        files.insert(
            name.clone(),
            write_file(&fs, &name, 7 * BLOCK as usize, 0, i),
        );
    }
    fs.sync().unwrap();
    fs.set_disk_status(&["nsd2".to_string()], DiskStatus::Suspended)
        .unwrap();
    let report = fs
        .restripe(RestripeMode::Migrate, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    for name in files.keys() {
        let on = disks_of(&fs, name);
        if name.ends_with(".tmp") {
            assert_eq!(
                on,
                vec!["nsd3".to_string()],
                "{name} left its pool or its disk"
            );
        } else {
            assert!(
                on.iter().all(|d| d == "nsd0" || d == "nsd1"),
                "{name}: {on:?}"
            );
        }
    }
    verify(&fs, &files);
    fs.set_disk_status(&["nsd2".to_string()], DiskStatus::Ready)
        .unwrap();
    // A balance evens the slow pool's two disks out again, and leaves system alone.
    let report = fs
        .restripe(RestripeMode::Balance, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    for name in files.keys().filter(|n| n.ends_with(".tmp")) {
        assert_in_pool(&fs, name, "slow");
    }
    let u = used(&fs);
    assert!(u[2] > 0 && u[3] > 0, "slow pool not balanced: {u:?}");
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after restripes of two pools");
}

#[test]
fn a_policy_that_cannot_work_is_refused_with_where_and_why() {
    let t = two_pools(false);
    let fs = mount(&t);
    let refused = |text: &str| fs.set_policy(Some(text)).unwrap_err().to_string();
    let e = refused("RULE 'a' SET POOL 'fast'");
    assert!(
        e.contains("line 1, column 19") && e.contains("pool 'fast' does not exist"),
        "{e}"
    );
    let e = refused("RULE 'a' SET POOL 'slow' WHERE FILE_SIZE > 0");
    assert!(e.contains("not known when a file is created"), "{e}");
    // The system pool has metadata disks only: no file data can go there.
    let e = refused("RULE 'a' SET POOL 'slow' WHERE NAME LIKE 'x%'\nRULE 'b' SET POOL 'system'");
    assert!(
        e.contains("line 2") && e.contains("no disk that holds data"),
        "{e}"
    );
    assert_eq!(fs.policy_text(), None, "nothing was installed");
    // Checking is not installing.
    assert_eq!(
        fs.check_policy(Some("RULE SET POOL 'slow'")).unwrap().rules,
        1
    );
    assert_eq!(fs.policy_text(), None);
    // Without a rule, data goes to the default data pool, which is `slow` here.
    let data = write_file(&fs, "x", 2 * BLOCK as usize, 0, 1);
    assert_in_pool(&fs, "x", "slow");
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    let a = fs.lookup(ROOT_INO, b"x").unwrap();
    assert_eq!(fs.read(a.ino, 0, data.len() as u32).unwrap(), data);
    fs.unmount().unwrap();
}

/// Crashes at every write of a workload that installs a policy and creates, writes and
/// fsyncs files it places: each time the file system mounts, every fsynced file reads back
/// whole from its pool, the policy is either installed or not, and fsck is clean.
#[test]
fn a_crash_at_any_write_while_files_are_placed_loses_nothing() {
    let workload =
        |fs: &FileSystem, synced: &mut BTreeMap<String, Vec<u8>>| -> tessera_fs::FsResult<()> {
            fs.set_policy(Some(POLICY))?;
            for i in 0..4u64 {
                let name = if i % 2 == 0 {
                    format!("p{i}.tmp")
                } else {
                    format!("p{i}.dat")
                };
                let a = fs.create_node(
                    ROOT_INO,
                    name.as_bytes(),
                    tessera_fs::FileKind::Regular,
                    0o644,
                    0,
                    tessera_fs::Caller { uid: 0, gid: 0 },
                    None,
                )?;
                let data = pattern(2 * BLOCK as usize + 7, i);
                fs.write(a.ino, 0, &data, true)?;
                fs.fsync(a.ino)?;
                synced.insert(name, data);
            }
            Ok(())
        };
    let mut crashed = 0;
    for at in 1.. {
        let t = two_pools(true);
        let (disks, faults) = with_faults(&t);
        let fs = FileSystem::mount(disks).unwrap();
        faults
            .writes_until_failure
            .store(at, std::sync::atomic::Ordering::SeqCst);
        let mut synced = BTreeMap::new();
        let result = workload(&fs, &mut synced);
        let hit = crash(fs, &faults);
        if let Err(e) = &result {
            assert!(hit, "write {at}: failed without a crash: {e}");
        }
        let fs = mount(&t);
        for (name, data) in &synced {
            let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
            assert_eq!(
                fs.read(a.ino, 0, data.len() as u32).unwrap(),
                *data,
                "write {at}: {name}"
            );
            let pool = if name.ends_with(".tmp") {
                "slow"
            } else {
                "system"
            };
            assert_in_pool(&fs, name, pool);
        }
        if !synced.is_empty() {
            assert_eq!(fs.policy_text().as_deref(), Some(POLICY), "write {at}");
        }
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&t, &format!("crash at write {at}"));
        if !hit {
            break;
        }
        crashed += 1;
    }
    assert!(crashed > 8, "the workload took only {crashed} writes");
}

fn mkdir(fs: &FileSystem, name: &str) -> tessera_fs::Ino {
    fs.create_node(
        ROOT_INO,
        name.as_bytes(),
        tessera_fs::FileKind::Directory,
        0o755,
        0,
        tessera_fs::Caller { uid: 0, gid: 0 },
        None,
    )
    .unwrap()
    .ino
}

/// Files of three kinds, in the root and in `sub`: `bigN.dat` (several blocks, sizes
/// growing with N), `smallN.dat` (a fragment) and `oldN.log`; all in the system pool.
fn tree(fs: &FileSystem) -> BTreeMap<String, (tessera_fs::Ino, Vec<u8>)> {
    let sub = mkdir(fs, "sub");
    let mut files = BTreeMap::new();
    for i in 0..6u64 {
        let dir = if i % 2 == 0 { ROOT_INO } else { sub };
        let prefix = if dir == ROOT_INO { "" } else { "sub/" };
        for (name, size) in [
            (
                format!("big{i}.dat"),
                (i as usize + 2) * BLOCK as usize + 333,
            ),
            (format!("small{i}.dat"), 9_000),
            (format!("old{i}.log"), 20_000),
        ] {
            let a = fs
                .create_node(
                    dir,
                    name.as_bytes(),
                    tessera_fs::FileKind::Regular,
                    0o644,
                    0,
                    tessera_fs::Caller { uid: 0, gid: 0 },
                    None,
                )
                .unwrap();
            let data = pattern(size, i * 7 + size as u64);
            fs.write(a.ino, 0, &data, false).unwrap();
            files.insert(format!("{prefix}{name}"), (a.ino, data));
        }
    }
    fs.sync().unwrap();
    files
}

fn nsds_of(fs: &FileSystem, ino: tessera_fs::Ino) -> Vec<String> {
    fs.file_blocks_per_disk(ino)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

fn apply(
    fs: &FileSystem,
    text: &str,
    mode: tessera_fs::policy_run::ApplyMode,
) -> tessera_fs::policy_run::ApplyReport {
    fs.apply_policy(text, mode, &AtomicBool::new(false), &mut |_| {})
        .unwrap()
}

const MANAGE: &str = "\
RULE EXTERNAL LIST 'small' EXEC '';
RULE 'cold' MIGRATE FROM POOL 'system' WEIGHT(FILE_SIZE) TO POOL 'slow'
     WHERE NAME LIKE 'big%' AND FILE_SIZE > 600000;
RULE 'clean' DELETE WHERE NAME LIKE 'old%' AND PATH_NAME LIKE '/sub/%';
RULE 'l' LIST 'small' WHERE NAME LIKE 'small%';
";

#[test]
fn migrate_delete_and_list_rules_run_over_every_file() {
    use tessera_fs::policy_run::ApplyMode;
    let t = two_pools(true);
    let fs = mount(&t);
    let files = tree(&fs);
    let migrating = |name: &str| name.contains("big") && files[name].1.len() > 600_000;
    let deleted = |name: &str| name.starts_with("sub/old");

    // -I test: chosen, reported, nothing changed.
    let report = apply(&fs, MANAGE, ApplyMode::Test);
    assert_eq!(report.files_scanned, 18);
    let counts: Vec<(String, u64)> = report
        .rules
        .iter()
        .map(|r| (r.action.clone(), r.files))
        .collect();
    let want_migrate = files.keys().filter(|n| migrating(n)).count() as u64;
    assert_eq!(
        counts,
        vec![
            ("MIGRATE".into(), want_migrate),
            ("DELETE".into(), 3),
            ("LIST".into(), 6)
        ]
    );
    assert_eq!(report.lists.len(), 1);
    let mut listed = report.lists[0].1.clone();
    listed.sort();
    assert_eq!(listed[0], "/small0.dat");
    assert!(
        listed.contains(&"/sub/small1.dat".to_string()),
        "{listed:?}"
    );
    assert_eq!((report.migrated, report.deleted), (0, 0));
    for (name, (ino, _)) in &files {
        assert!(
            nsds_of(&fs, *ino)
                .iter()
                .all(|d| d == "nsd0" || d == "nsd1"),
            "{name} moved in a test"
        );
    }
    assert!(fs.lookup(ROOT_INO, b"sub").is_ok());

    // -I yes: migrated, deleted.
    let report = apply(&fs, MANAGE, ApplyMode::Yes);
    assert_eq!(
        (report.migrated, report.deleted),
        (want_migrate, 3),
        "{report:?}"
    );
    assert!(report.bytes_moved > 0);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let sub = fs.lookup(ROOT_INO, b"sub").unwrap().ino;
    for (name, (ino, data)) in &files {
        let (dir, leaf) = match name.strip_prefix("sub/") {
            Some(leaf) => (sub, leaf),
            None => (ROOT_INO, name.as_str()),
        };
        if deleted(name) {
            assert!(
                fs.lookup(dir, leaf.as_bytes()).is_err(),
                "{name} not deleted"
            );
            continue;
        }
        assert_eq!(
            fs.read(*ino, 0, data.len() as u32).unwrap(),
            *data,
            "{name}"
        );
        let on = nsds_of(&fs, *ino);
        if migrating(name) {
            assert!(
                on.iter().all(|d| d == "nsd2" || d == "nsd3"),
                "{name}: {on:?}"
            );
            assert_eq!(fs.file_pool_name(*ino).unwrap(), "slow");
        } else {
            assert!(
                on.iter().all(|d| d == "nsd0" || d == "nsd1"),
                "{name}: {on:?}"
            );
        }
    }
    // Run again: nothing left to migrate or delete.
    let again = apply(&fs, MANAGE, ApplyMode::Yes);
    assert_eq!((again.migrated, again.deleted), (0, 0), "{again:?}");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after policy apply");
}

#[test]
fn a_threshold_takes_the_heaviest_files_and_only_above_its_high_mark() {
    use tessera_fs::policy_run::ApplyMode;
    let t = two_pools(true);
    let fs = mount(&t);
    let files = tree(&fs);
    let df = fs.df().unwrap();
    let system = df.pools.iter().find(|p| p.pool == "system").unwrap();
    let used = system.size_bytes - system.free_full_block_bytes - system.free_fragment_bytes;
    let pct = used * 100 / system.size_bytes;
    assert!(pct >= 2, "{pct}%");

    let rule = |high: u64, low: u64| {
        format!(
            "RULE 'cold' MIGRATE FROM POOL 'system' THRESHOLD({high},{low}) WEIGHT(FILE_SIZE) \
             TO POOL 'slow' WHERE NAME LIKE 'big%'"
        )
    };
    let report = apply(&fs, &rule(pct + 1, 0), ApplyMode::Yes);
    assert_eq!(report.rules[0].files, 0);
    let note = report.rules[0].note.as_deref().unwrap();
    assert!(note.contains("below THRESHOLD"), "{note}");

    // Down by about one percent of the pool: some big files move, the heaviest first.
    let report = apply(&fs, &rule(pct, pct - 1), ApplyMode::Yes);
    assert!(report.migrated >= 1, "{report:?}");
    let bigs: Vec<(usize, bool)> = files
        .iter()
        .filter(|(n, _)| n.contains("big"))
        .map(|(_, (ino, data))| (data.len(), fs.file_pool_name(*ino).unwrap() == "slow"))
        .collect();
    let smallest_moved = bigs.iter().filter(|b| b.1).map(|b| b.0).min().unwrap();
    let largest_kept = bigs.iter().filter(|b| !b.1).map(|b| b.0).max().unwrap_or(0);
    assert!(
        (report.migrated as usize) < bigs.len() && smallest_moved > largest_kept,
        "not the heaviest first: {bigs:?}"
    );
    fs.unmount().unwrap();
}

#[test]
fn a_migrate_limit_keeps_the_target_pool_below_it() {
    use tessera_fs::policy_run::ApplyMode;
    let t = two_pools(true);
    let fs = mount(&t);
    let files = tree(&fs);
    let slow_pct = |fs: &tessera_fs::FileSystem| {
        let df = fs.df().unwrap();
        let p = df.pools.iter().find(|p| p.pool == "slow").unwrap();
        let used = p.size_bytes - p.free_full_block_bytes - p.free_fragment_bytes;
        (used * 100 / p.size_bytes, used, p.size_bytes)
    };
    let (pct, used, size) = slow_pct(&fs);
    let bigs: Vec<(tessera_fs::Ino, usize)> = files
        .iter()
        .filter(|(n, _)| n.contains("big"))
        .map(|(_, (ino, data))| (*ino, data.len()))
        .collect();
    let all_kb: u64 = bigs.iter().map(|(_, n)| *n as u64 / 1024).sum();
    // A limit with room for some of the big files but not all of them.
    let limit = (used + all_kb * 1024 / 2) * 100 / size + 1;
    assert!(
        (used + all_kb * 1024) * 100 / size > limit,
        "the pool is too big for this test: {pct}%, limit {limit}"
    );
    let rule = format!(
        "RULE 'cold' MIGRATE FROM POOL 'system' WEIGHT(FILE_SIZE) TO POOL 'slow' \
         LIMIT({limit}) WHERE NAME LIKE 'big%'"
    );
    let test = apply(&fs, &rule, ApplyMode::Test);
    let note = test.rules[0].note.as_deref().unwrap();
    assert!(note.contains(&format!("LIMIT({limit})")), "{note}");
    assert!(test.rules[0].files >= 1 && (test.rules[0].files as usize) < bigs.len());

    let report = apply(&fs, &rule, ApplyMode::Yes);
    assert_eq!(report.migrated, test.rules[0].files, "{report:?}");
    let (after, _, _) = slow_pct(&fs);
    assert!(after <= limit, "slow is {after}% full past LIMIT({limit})");
    // The heaviest went first.
    let moved: Vec<(usize, bool)> = bigs
        .iter()
        .map(|(ino, n)| (*n, fs.file_pool_name(*ino).unwrap() == "slow"))
        .collect();
    let smallest_moved = moved.iter().filter(|b| b.1).map(|b| b.0).min().unwrap();
    let largest_kept = moved.iter().filter(|b| !b.1).map(|b| b.0).max().unwrap();
    assert!(smallest_moved >= largest_kept, "{moved:?}");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a limited migration");
}

/// `-I defer` changes pools only; `restripe -p` then moves the data. A crash at any write
/// of a migration leaves every file whole, and `restripe -p` finishes what it left.
#[test]
fn deferred_and_interrupted_migrations_are_finished_by_restripe_p() {
    use tessera_fs::policy_run::ApplyMode;
    let policy = "RULE 'cold' MIGRATE FROM POOL 'system' TO POOL 'slow' WHERE NAME LIKE 'big%'";
    let t = two_pools(true);
    let fs = mount(&t);
    let files = tree(&fs);
    let report = apply(&fs, policy, ApplyMode::Defer);
    assert_eq!(report.migrated, 6);
    assert_eq!(report.bytes_moved, 0);
    for (name, (ino, _)) in files.iter().filter(|(n, _)| n.contains("big")) {
        assert_eq!(fs.file_pool_name(*ino).unwrap(), "slow", "{name}");
        assert!(
            nsds_of(&fs, *ino)
                .iter()
                .all(|d| d == "nsd0" || d == "nsd1"),
            "{name} moved"
        );
    }
    let report = fs
        .restripe(
            RestripeMode::Placement,
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap();
    assert!(report.progress.blocks_moved >= 6 * 2, "{report:?}");
    for (name, (ino, data)) in &files {
        let on = nsds_of(&fs, *ino);
        let slow = on.iter().all(|d| d == "nsd2" || d == "nsd3");
        assert_eq!(slow, name.contains("big"), "{name}: {on:?}");
        assert_eq!(
            fs.read(*ino, 0, data.len() as u32).unwrap(),
            *data,
            "{name}"
        );
    }
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a deferred migration");

    let mut crashed = 0;
    for at in 1.. {
        let t = two_pools(true);
        let fs = mount(&t);
        let files = tree(&fs);
        fs.unmount().unwrap();
        drop(fs);
        let (disks, faults) = with_faults(&t);
        let fs = FileSystem::mount(disks).unwrap();
        faults
            .writes_until_failure
            .store(at, std::sync::atomic::Ordering::SeqCst);
        let result = fs.apply_policy(policy, ApplyMode::Yes, &AtomicBool::new(false), &mut |_| {});
        let hit = crash(fs, &faults);
        if let Err(e) = &result {
            assert!(hit, "write {at}: failed without a crash: {e}");
        }
        let fs = mount(&t);
        for (name, (ino, data)) in &files {
            assert_eq!(
                fs.read(*ino, 0, data.len() as u32).unwrap(),
                *data,
                "write {at}: {name}"
            );
        }
        fs.restripe(
            RestripeMode::Placement,
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap();
        // Rerun the policy: files whose pool change was lost are migrated now.
        apply(&fs, policy, ApplyMode::Yes);
        for (name, (ino, data)) in &files {
            let on = nsds_of(&fs, *ino);
            let slow = on.iter().all(|d| d == "nsd2" || d == "nsd3");
            assert_eq!(slow, name.contains("big"), "write {at}: {name}: {on:?}");
            assert_eq!(
                fs.read(*ino, 0, data.len() as u32).unwrap(),
                *data,
                "write {at}: {name}"
            );
        }
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&t, &format!("migration crashed at write {at}"));
        if !hit {
            break;
        }
        crashed += 1;
    }
    assert!(crashed > 10, "the migration took only {crashed} writes");
}
