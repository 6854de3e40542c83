//! `metadataSlots=yes` (experimental) on three nodes in network namespaces: a node that
//! mounts beside the file system manager takes an owner slot of its own, the directories it
//! makes in the manager's directories are made for its slot, and everything made in them is
//! served by that node; every node sees one namespace (names, attributes, data) and
//! removes what any other made; fsck is clean at the end. When a slot's holder is killed,
//! another node takes its slot over: the others see a pause, not an error, and lose no
//! fsynced byte. Regions a node emptied go back to the file system manager when it needs
//! them. The disk holding the slots' regions is deleted under their owners.
//!
//! Needs root and `ip netns`; without them the test says why and passes, except under
//! CI=true, where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::netns::{
    all_in_state, netns_usable, states, tessera_ok, wait_for, Cluster, SETTLE, TEST_TIMINGS,
};

#[test]
fn nodes_own_the_directories_they_make_and_all_see_one_namespace() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "m1");

    // Each node makes its directory in the root (the manager's) and files in it.
    let content = |k: u32, i: u32| format!("node {k} file {i}").repeat(50 + i as usize);
    for k in 1..=3u32 {
        let dir = mnt(k).join(format!("dir{k}"));
        std::fs::create_dir(&dir).unwrap();
        for i in 0..20 {
            std::fs::write(dir.join(format!("f{i}")), content(k, i)).unwrap();
        }
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/deep"), content(k, 99)).unwrap();
    }
    // The other nodes hold owner slots (`mount ls -L` says so).
    let listed = tessera_ok(&c, 1, &["mount", "ls", "m1", "-L"]);
    assert!(
        listed.contains("client, owner slot 1") && listed.contains("client, owner slot 2"),
        "{listed}"
    );
    // Every node sees every node's files, and a node writes into another's.
    let listing = |k: u32, d: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(mnt(k).join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    for owner in 1..=3u32 {
        let d = format!("dir{owner}");
        for k in 1..=3u32 {
            assert_eq!(listing(k, &d).len(), 21, "node {k} lists {d}");
            for i in [0u32, 7, 19] {
                let got = std::fs::read_to_string(mnt(k).join(&d).join(format!("f{i}"))).unwrap();
                assert_eq!(got, content(owner, i), "node {k} reads {d}/f{i}");
            }
            assert_eq!(
                std::fs::read_to_string(mnt(k).join(&d).join("sub/deep")).unwrap(),
                content(owner, 99)
            );
        }
    }
    std::fs::write(mnt(1).join("dir2/f0"), b"rewritten by node 1").unwrap();
    assert_eq!(
        std::fs::read(mnt(2).join("dir2/f0")).unwrap(),
        b"rewritten by node 1"
    );
    assert_eq!(
        std::fs::metadata(mnt(3).join("dir2/f0")).unwrap().len(),
        19,
        "node 3 sees the size node 1 wrote into node 2's file"
    );
    // A name removed on one node is gone on the others at once.
    std::fs::remove_file(mnt(3).join("dir2/f1")).unwrap();
    for k in 1..=3u32 {
        assert!(
            !mnt(k).join("dir2/f1").exists(),
            "node {k} still sees dir2/f1"
        );
    }
    // mdtest's hard pattern across owners: every node creates and removes files at once
    // in one directory node 2's slot serves, which each looked into first (so each kernel
    // keeps names of it). No node waits on its kernel to drop names (see
    // `netns_cluster.rs`, `creates_in_one_directory_from_every_node`).
    std::fs::create_dir(mnt(2).join("dir2/shared")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for k in 1..=3u32 {
        assert!(listing(k, "dir2/shared").is_empty());
    }
    let mnt_ref = &mnt;
    std::thread::scope(|scope| {
        for k in 1..=3u32 {
            let path = move |i: u32| mnt_ref(k).join(format!("dir2/shared/f.{k}.{i}"));
            scope.spawn(move || {
                for i in 0..100 {
                    std::fs::write(path(i), b"x").unwrap();
                }
                for i in 0..100 {
                    std::fs::remove_file(path(i)).unwrap();
                }
            });
        }
    });
    for k in 1..=3u32 {
        assert!(listing(k, "dir2/shared").is_empty(), "node {k}");
        let log = std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log")))
            .unwrap_or_default();
        assert!(
            !log.contains("the kernel took more than"),
            "node {k} waited for its kernel to drop names\n{}",
            log_tails(&c)
        );
    }
    // rename(2) and link(2) between directories different nodes' metanodes serve (node
    // 1's is the manager's, the others' their slots'), seen at once on every node.
    use std::os::unix::fs::MetadataExt;
    std::fs::rename(mnt(1).join("dir2/f2"), mnt(1).join("dir3/from-dir2")).unwrap();
    std::fs::rename(mnt(3).join("dir1/f3"), mnt(3).join("dir2/f4")).unwrap();
    std::fs::hard_link(mnt(2).join("dir3/f5"), mnt(2).join("dir1/link-to-3-5")).unwrap();
    for k in 1..=3u32 {
        let read = |p: &str| std::fs::read_to_string(mnt(k).join(p)).unwrap();
        assert!(!mnt(k).join("dir2/f2").exists() && !mnt(k).join("dir1/f3").exists());
        assert_eq!(read("dir3/from-dir2"), content(2, 2), "node {k}");
        assert_eq!(
            read("dir2/f4"),
            content(1, 3),
            "node {k}: the renamed file replaced f4"
        );
        let linked = std::fs::metadata(mnt(k).join("dir1/link-to-3-5")).unwrap();
        assert_eq!(linked.nlink(), 2, "node {k}");
    }
    // RENAME_EXCHANGE within node 2's directory of a name whose inode the manager serves
    // (f4, node 1's f3 before) and one of node 2's own, asked on node 3: node 2's slot
    // swaps the names, and every node reads each file under the other's name at once.
    let exchange = |k: u32, a: &str, b: &str| {
        tessera_testkit::renameat2(&mnt(k).join(a), &mnt(k).join(b), libc::RENAME_EXCHANGE)
    };
    for k in 1..=3u32 {
        assert_eq!(
            std::fs::read_to_string(mnt(k).join("dir2/f6")).unwrap(),
            content(2, 6)
        );
    }
    if let Err(e) = exchange(3, "dir2/f4", "dir2/f6") {
        panic!(
            "node 3 exchanging dir2/f4 and dir2/f6: {e}\n{}",
            log_tails(&c)
        );
    }
    for k in 1..=3u32 {
        let read = |p: &str| std::fs::read_to_string(mnt(k).join(p)).unwrap();
        assert_eq!(
            read("dir2/f4"),
            content(2, 6),
            "node {k}: dir2/f4 after the exchange"
        );
        assert_eq!(
            read("dir2/f6"),
            content(1, 3),
            "node {k}: dir2/f6 after the exchange"
        );
    }
    std::fs::remove_file(mnt(1).join("dir3/f5")).unwrap();
    for k in 1..=3u32 {
        let linked = mnt(k).join("dir1/link-to-3-5");
        assert_eq!(std::fs::read_to_string(&linked).unwrap(), content(3, 5));
        assert_eq!(std::fs::metadata(&linked).unwrap().nlink(), 1, "node {k}");
    }
    // A directory moves between them with what it holds (under the cluster's rename
    // lock), and never below itself.
    std::fs::rename(mnt(1).join("dir2/sub"), mnt(1).join("dir3/sub2")).unwrap();
    for k in 1..=3u32 {
        assert!(!mnt(k).join("dir2/sub").exists(), "node {k}");
        let deep = std::fs::read_to_string(mnt(k).join("dir3/sub2/deep")).unwrap();
        assert_eq!(deep, content(2, 99), "node {k}");
    }
    let looped = std::fs::rename(mnt(2).join("dir3"), mnt(2).join("dir3/sub2/dir3"));
    assert_eq!(looped.unwrap_err().raw_os_error(), Some(libc::EINVAL));
    // A node writes more into its directory than its slot's region holds (127 MiB: 32,512
    // sub-blocks of 4 KiB): its slot is given more regions by the manager, and another
    // node reads every byte back.
    if let Err((i, e)) = write_mib(&mnt(2).join("dir2/big"), 300, 0) {
        panic!("node 2 writing MiB {i} of dir2/big: {e}\n{}", log_tails(&c));
    }
    assert!(
        holds_mib(&mnt(3).join("dir2/big"), 300, 0),
        "node 3 reads dir2/big wrong"
    );
    let logs = all_logs(&c);
    assert!(
        logs.contains("whose regions were full"),
        "no region was given to node 2's slot\n{}",
        log_tails(&c)
    );
    // Every node removes another node's directory tree.
    for (k, owner) in [(1u32, 2u32), (2, 3), (3, 1)] {
        if let Err(e) = std::fs::remove_dir_all(mnt(k).join(format!("dir{owner}"))) {
            panic!("node {k} removing dir{owner}: {e}\n{}", log_tails(&c));
        }
    }
    for k in 1..=3u32 {
        assert!(
            listing(k, ".").is_empty(),
            "node {k}: {:?}",
            listing(k, ".")
        );
    }
    tessera_ok(&c, 3, &["umount", "m1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "m1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// Namespace changes racing on a few names from every node at once (two threads per
/// node: creates, mkdirs, `mkdir -p`, renames of files and directories within and between
/// the manager's and two slots' directories, unlinks, rmdirs, stats, listings) fail only
/// as POSIX says (EEXIST, ENOENT, ENOTEMPTY, EISDIR, ENOTDIR, EINVAL), none takes long,
/// and fsck is clean afterwards. It found three nodes making one directory at once
/// getting EIO (a shard asked about before its slot took it), a rename of a directory
/// over another owner's answering EXDEV, renames stalling two seconds a turn on the
/// manager's kernel's directory lock, and a directory moved to another directory while
/// removed by its old name, its new name left naming a freed inode (every rename of a
/// directory over that name answered EXDEV after; see `race_a_move_across_owners`).
#[test]
fn namespace_changes_racing_from_three_nodes_fail_only_as_posix_says() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "r1");
    for (k, d) in [(1u32, "m/a"), (1, "m/b"), (2, "s2"), (3, "s3")] {
        std::fs::create_dir_all(mnt(k).join(d)).unwrap();
    }
    const DIRS: [&str; 5] = ["m", "m/a", "m/b", "s2", "s3"];
    const NAMES: [&str; 5] = ["x", "y", "z", "d1", "d2"];
    // ESTALE too, rarely: a directory renamed on another node while this node's kernel
    // still has it under its old name (names are made invalid by epoch, not unhashed,
    // where unhashing would take a directory's lock that a request here may hold), and the
    // kernel could not move that name under the concurrent renames of this node: it
    // answers ESTALE after its one retry (`d_splice_alias`), as NFS clients do.
    let allowed = [
        libc::EEXIST,
        libc::ENOENT,
        libc::ENOTEMPTY,
        libc::EISDIR,
        libc::ENOTDIR,
        libc::EINVAL,
        libc::ESTALE,
    ];
    let until = Instant::now() + Duration::from_secs(12);
    let workers: Vec<_> = (0..6u64)
        .map(|t| {
            let root = mnt(t as u32 % 3 + 1);
            std::thread::spawn(move || {
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                let mut next = move |n: usize| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % n as u64) as usize
                };
                let (mut ops, mut slowest, mut wrong) = (0u32, Duration::ZERO, Vec::new());
                let mut stale = 0u32;
                while Instant::now() < until {
                    let path = root.join(DIRS[next(5)]).join(NAMES[next(5)]);
                    let other = root.join(DIRS[next(5)]).join(NAMES[next(5)]);
                    let op = next(8);
                    let started = Instant::now();
                    let done = match op {
                        0 => std::fs::create_dir(&path),
                        1 => std::fs::remove_dir(&path),
                        2 => std::fs::write(&path, b"racing"),
                        3 => std::fs::remove_file(&path),
                        4 => std::fs::rename(&path, &other),
                        5 => std::fs::metadata(&path).map(|_| ()),
                        6 => std::fs::read_dir(path.parent().unwrap()).map(|d| d.for_each(drop)),
                        _ => std::fs::create_dir_all(path.join("q/r")),
                    };
                    slowest = slowest.max(started.elapsed());
                    ops += 1;
                    if let Err(e) = done {
                        stale += u32::from(e.raw_os_error() == Some(libc::ESTALE));
                        if !e.raw_os_error().is_some_and(|n| allowed.contains(&n)) {
                            wrong.push(format!(
                                "op {op} on {} ({}): {e}",
                                path.display(),
                                other.display()
                            ));
                        }
                    }
                }
                (ops, slowest, wrong, stale)
            })
        })
        .collect();
    let (mut ops, mut slowest, mut wrong, mut stale) = (0, Duration::ZERO, Vec::new(), 0);
    for w in workers {
        let (n, s, mut bad, st) = w.join().unwrap();
        ops += n;
        slowest = slowest.max(s);
        wrong.append(&mut bad);
        stale += st;
    }
    eprintln!("{ops} racing namespace changes ({stale} ESTALE), the slowest {slowest:?}");
    assert!(stale * 100 <= ops, "{stale} of {ops} failed with ESTALE");
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", log_tails(&c));
    assert!(
        ops > 100,
        "only {ops} operations in 12 s\n{}",
        log_tails(&c)
    );
    assert!(
        slowest < Duration::from_secs(10),
        "an operation took {slowest:?}\n{}",
        log_tails(&c)
    );
    let started = Instant::now();
    tessera_ok(&c, 3, &["umount", "r1", "-a"]);
    eprintln!("umount -a took {:?}", started.elapsed());
    let fsck = tessera_ok(&c, 1, &["fsck", "r1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// A directory that one node moves between directories other owners serve while another
/// node removes it: one of the two wins as if they had come one after the other, never
/// both, and no name is left naming the removed directory (a move that put the new name
/// before a removal by the old name left it dangling: a rename of a directory over it
/// answered EXDEV from then on).
#[test]
fn a_directory_moved_across_owners_while_another_node_removes_it_leaves_no_name_behind() {
    race_a_move_across_owners("v1", Second::Rmdir);
}

/// A directory that one node moves between directories other owners serve while another
/// node renames it within its directory: one of the two wins, and the directory keeps one
/// name, the one its parent pointer names (a rename within a directory took no rename lock, so
/// the move's removal of the old name found it gone and left the directory named twice).
#[test]
fn a_directory_moved_across_owners_while_another_node_renames_it_keeps_one_name() {
    race_a_move_across_owners("v2", Second::RenameWithin);
}

/// What races node 2's move of `m/dN` to `s2/dN` in [`race_a_move_across_owners`].
#[derive(Clone, Copy, PartialEq)]
enum Second {
    /// Node 1 removes `m/dN`.
    Rmdir,
    /// Node 1 renames `m/dN` to `m/eN`.
    RenameWithin,
}

/// Node 2 moves directory `m/dN` (m the manager's) to `s2/dN` (s2 node 2's slot's) while
/// node 1 does `second` to it, 150 times, the second's start swept across the move (its
/// delay lengthened while the second wins, shortened while the move does). Node 3 makes
/// the directory in even rounds, so that three owners serve the source, the target and
/// the directory itself; node 1 in odd rounds, so that the source's owner serves it.
/// Exactly one of the two wins (the other finds the name gone), every node finds the
/// directory under one name, and fsck (which checks every directory's parent pointer
/// against its one name; the kernel answers `..` from its own dentries) is clean.
fn race_a_move_across_owners(fs: &str, second: Second) {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, fs);
    std::fs::create_dir(mnt(1).join("m")).unwrap();
    std::fs::create_dir(mnt(2).join("s2")).unwrap();
    const ROUNDS: u32 = 150;
    let (mut moved, mut seconds) = (0u32, 0u32);
    let mut delay_us = 0u64;
    for round in 0..ROUNDS {
        let name = format!("d{round}");
        let maker = if round % 2 == 0 { 3 } else { 1 };
        std::fs::create_dir(mnt(maker).join("m").join(&name)).unwrap();
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let at =
            |k: u32, dir: &str, prefix: &str| mnt(k).join(dir).join(format!("{prefix}{round}"));
        let mover = {
            let go = go.clone();
            let (from, to) = (at(2, "m", "d"), at(2, "s2", "d"));
            std::thread::spawn(move || {
                go.wait();
                std::fs::rename(from, to)
            })
        };
        go.wait();
        std::thread::sleep(Duration::from_micros(delay_us + u64::from(round % 7) * 50));
        let done = match second {
            Second::Rmdir => std::fs::remove_dir(at(1, "m", "d")),
            Second::RenameWithin => std::fs::rename(at(1, "m", "d"), at(1, "m", "e")),
        };
        let rename = mover.join().unwrap();
        let lost = |r: &std::io::Result<()>| {
            r.as_ref()
                .err()
                .is_some_and(|e| e.raw_os_error() == Some(libc::ENOENT))
        };
        let place = match (&rename, &done) {
            (Ok(()), r) if lost(r) => {
                moved += 1;
                delay_us = delay_us.saturating_sub(150);
                Some(("s2", "d"))
            }
            (r, Ok(())) if lost(r) => {
                seconds += 1;
                delay_us += 150;
                (second == Second::RenameWithin).then_some(("m", "e"))
            }
            _ => panic!(
                "round {round}: move {rename:?}, {:?} {done:?}\n{}",
                second as u8,
                log_tails(&c)
            ),
        };
        for k in 1..=3u32 {
            let named: Vec<_> = [("m", "d"), ("m", "e"), ("s2", "d")]
                .into_iter()
                .filter(|(dir, prefix)| at(k, dir, prefix).exists())
                .collect();
            assert_eq!(
                named,
                place.into_iter().collect::<Vec<_>>(),
                "round {round}: node {k} (move {rename:?}, second {done:?})\n{}",
                log_tails(&c)
            );
            // Every name in s2 and m names a directory any node can stat.
            for dir in ["s2", "m"] {
                for e in std::fs::read_dir(mnt(k).join(dir)).unwrap() {
                    let e = e.unwrap();
                    if let Err(err) = std::fs::metadata(e.path()) {
                        panic!(
                            "round {round}: node {k} lists {:?} but cannot stat it: {err}\n{}",
                            e.path(),
                            log_tails(&c)
                        );
                    }
                }
            }
        }
    }
    eprintln!("{ROUNDS} rounds: the move won {moved}, the other {seconds}");
    tessera_ok(&c, 3, &["umount", fs, "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", fs, "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// The checkpoint pattern of applications (write a temporary file, fsync it, rename it over
/// the current one) from three nodes at once into a directory one of them serves, with
/// readers on every node: rename(2) is atomic, so a reader always finds the name, and
/// reads a whole file of one writer's generation (also when a rename elsewhere unlinks it
/// while it is open), and never an older generation of a writer than one it already saw.
#[test]
fn files_replaced_by_rename_from_three_nodes_are_read_whole_everywhere() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "a1");
    std::fs::create_dir(mnt(2).join("ckpt")).unwrap();
    std::fs::write(mnt(1).join("ckpt/current"), checkpoint_body(0, 0, 4096)).unwrap();
    let until = Instant::now() + Duration::from_secs(12);
    let writers: Vec<_> = (1..=3u64)
        .map(|k| {
            let dir = mnt(k as u32).join("ckpt");
            std::thread::spawn(move || {
                use std::io::Write;
                let mut generation = 0u64;
                while Instant::now() < until {
                    generation += 1;
                    // 1 byte past a block to three blocks: inline, fragment and whole blocks.
                    let len = 24 + (generation * 7919 + k * 104_729) % (3 << 18);
                    let tmp = dir.join(format!(".tmp-{k}"));
                    let mut f = std::fs::File::create(&tmp).unwrap();
                    f.write_all(&checkpoint_body(k, generation, len)).unwrap();
                    f.sync_all().unwrap();
                    drop(f);
                    std::fs::rename(&tmp, dir.join("current")).unwrap();
                }
                generation
            })
        })
        .collect();
    let readers: Vec<_> = (1..=3u32)
        .map(|k| {
            let path = mnt(k).join("ckpt/current");
            std::thread::spawn(move || {
                let mut seen = [0u64; 4];
                let (mut reads, mut wrong, mut stale) = (0u32, Vec::new(), 0u32);
                while Instant::now() < until {
                    let data = match std::fs::read(&path) {
                        Ok(d) => d,
                        Err(e) if e.raw_os_error() == Some(libc::ESTALE) => {
                            stale += 1;
                            continue;
                        }
                        Err(e) => {
                            wrong.push(format!("node {k}: read: {e}"));
                            continue;
                        }
                    };
                    reads += 1;
                    if data.len() < 24 {
                        wrong.push(format!("node {k}: {} bytes, no header", data.len()));
                        continue;
                    }
                    let field = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
                    let (writer, generation, len) = (field(0), field(8), field(16));
                    if writer > 3 || data != checkpoint_body(writer, generation, len) {
                        wrong.push(format!(
                            "node {k}: {} bytes not those of writer {writer} generation \
                             {generation} ({len} bytes)",
                            data.len()
                        ));
                        continue;
                    }
                    let last = &mut seen[writer as usize];
                    if generation < *last {
                        wrong.push(format!(
                            "node {k}: writer {writer}'s generation {generation} after {last}"
                        ));
                    }
                    *last = generation;
                }
                (reads, wrong, stale)
            })
        })
        .collect();
    let written: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let (mut reads, mut wrong, mut stale) = (0, Vec::new(), Vec::new());
    for r in readers {
        let (n, mut bad, st) = r.join().unwrap();
        reads += n;
        wrong.append(&mut bad);
        stale.push(st);
    }
    eprintln!(
        "generations written {written:?}, whole files read {reads}, ESTALE by node {stale:?}"
    );
    let stale: u32 = stale.iter().sum();
    let mut kinds = std::collections::BTreeMap::new();
    for w in &wrong {
        *kinds
            .entry(w.split(" generation").next().unwrap_or(w))
            .or_insert(0) += 1;
    }
    eprintln!("{} wrong: {kinds:#?}", wrong.len());
    wrong.truncate(20);
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", log_tails(&c));
    // A file replaced between this kernel's lookup and its open is kept a moment for it
    // when the lookup came from another node than the replacing one; else it is ESTALE,
    // and the kernel looks the name up again once: only a second replacement in that
    // window reaches the application.
    assert!(
        stale * 100 <= reads,
        "{stale} reads of {reads} failed with ESTALE"
    );
    assert!(
        written.iter().all(|&g| g > 3) && reads > 30,
        "too little done in 12 s: {written:?}, {reads} reads\n{}",
        log_tails(&c)
    );
    tessera_ok(&c, 3, &["umount", "a1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "a1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// Generation `generation` of writer `k`'s checkpoint file, `len` bytes: a header naming
/// them, then bytes that follow from them.
fn checkpoint_body(k: u64, generation: u64, len: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len as usize);
    v.extend(k.to_le_bytes());
    v.extend(generation.to_le_bytes());
    v.extend(len.to_le_bytes());
    v.extend((24..len).map(|i| (i.wrapping_mul(31) ^ (k << 5) ^ generation) as u8));
    v
}

/// MiB `i` of the files `write_mib` writes with `seed`.
fn mib_of(seed: u32, i: u32) -> Vec<u8> {
    (0..1u32 << 20)
        .map(|j| (j.wrapping_mul(2_654_435_761).wrapping_add(i ^ seed) >> 11) as u8)
        .collect()
}

/// Writes `count` MiB to a new file at `path` and fsyncs it; on failure, which MiB.
fn write_mib(path: &Path, count: u32, seed: u32) -> Result<(), (u32, std::io::Error)> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| (0, e))?;
    for i in 0..count {
        f.write_all(&mib_of(seed, i)).map_err(|e| (i, e))?;
    }
    f.sync_all().map_err(|e| (count, e))
}

/// Whether the file at `path` holds what `write_mib` wrote with `seed`, `count` MiB.
fn holds_mib(path: &Path, count: u32, seed: u32) -> bool {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut got = vec![0u8; 1 << 20];
    (0..count).all(|i| f.read_exact(&mut got).is_ok() && got == mib_of(seed, i))
        && f.read(&mut got).unwrap() == 0
}

/// A node that wrote more into its directory than its slot's region holds, and deleted it,
/// gives an emptied region back when the file system manager's own are full (asked over the
/// node transport), and the manager's writer goes on instead of getting ENOSPC on a file
/// system mostly free; every node reads the manager's file, and fsck is clean.
#[test]
fn regions_a_node_emptied_go_back_to_the_file_system_manager() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    // 512 MiB with 256 KiB blocks: allocation regions 0 to 3 of 127 MiB and a sliver. The
    // slots of nodes 2 and 3 take one each; node 2 is given another when its first is full.
    let mnt = slots_fs_on(&c, "g1", "512M");
    std::fs::create_dir(mnt(2).join("dir2")).unwrap();
    if let Err((i, e)) = write_mib(&mnt(2).join("dir2/big"), 200, 1) {
        panic!("node 2 writing MiB {i} of dir2/big: {e}\n{}", log_tails(&c));
    }
    // Node 2's slot: the entry of the `ownerSlots` row of `fs ls` that names it.
    let node2_slot = || -> String {
        let listed = tessera_ok(&c, 1, &["fs", "ls", "g1", "-Y"]);
        let row = listed
            .lines()
            .find(|l| l.contains(":ownerSlots:"))
            .unwrap_or("");
        row.split(';')
            .find(|entry| entry.contains(" node2 "))
            .unwrap_or(row)
            .to_string()
    };
    assert!(node2_slot().contains("node2 2 regions"), "{}", node2_slot());
    std::fs::remove_file(mnt(2).join("dir2/big")).unwrap();
    std::fs::File::open(mnt(2).join("dir2"))
        .unwrap()
        .sync_all()
        .unwrap();
    // More than the manager's own region holds beside the logs and slots.
    if let Err((i, e)) = write_mib(&mnt(1).join("big1"), 200, 2) {
        panic!("node 1 writing MiB {i} of big1: {e}\n{}", log_tails(&c));
    }
    let logs = all_logs(&c);
    assert!(
        logs.contains("taken back from owner slot"),
        "no region came back to the manager\n{}",
        log_tails(&c)
    );
    assert!(node2_slot().contains("node2 1 region"), "{}", node2_slot());
    for k in 1..=3u32 {
        assert!(
            holds_mib(&mnt(k).join("big1"), 200, 2),
            "node {k} reads big1 wrong"
        );
    }
    tessera_ok(&c, 3, &["umount", "g1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "g1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// `disk delete` [mmdeldisk], typed on a client node, of the file system's first disk while
/// the two other nodes own directories: it holds the manager's log and descriptor and both
/// owner slots' regions (records and logs), which their owners write all the time. Each
/// owner moves its own region when the manager asks over the node transport (a forward
/// record in the old place commits it), the disk is deleted, every node reads every file,
/// the owners go on writing, and after every node unmounted and mounted again (the slots
/// read from their new regions, each node claiming its own again) everything still reads
/// and fsck is clean.
#[test]
fn the_disk_holding_the_slot_owners_regions_is_deleted_under_them() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs_with(&c, "g1", "1G", "2");
    let mut files = Vec::new();
    for k in 2..=3u32 {
        std::fs::create_dir(mnt(k).join(format!("dir{k}"))).unwrap();
        let name = format!("dir{k}/before");
        if let Err((i, e)) = write_mib(&mnt(k).join(&name), 16, k) {
            panic!("node {k} writing MiB {i} of {name}: {e}\n{}", log_tails(&c));
        }
        files.push((name, 16, k));
    }
    let listed = tessera_ok(&c, 1, &["mount", "ls", "g1", "-L"]);
    assert!(listed.contains("owner slot 2"), "{listed}");
    let stanza = c.nsd_stanza("g1b", "node1-d2.img", 2);
    let stanza = stanza.as_str();
    tessera_ok(&c, 1, &["nsd", "create", "-F", stanza]);
    tessera_ok(&c, 1, &["disk", "add", "g1", "-F", stanza]);

    tessera_ok(&c, 3, &["disk", "delete", "g1", "g1"]);
    let logs = all_logs(&c);
    assert_eq!(
        logs.matches("records and log moved from").count(),
        2,
        "both slot owners moved their regions\n{}",
        log_tails(&c)
    );
    let disks = tessera_ok(&c, 2, &["disk", "ls", "g1"]);
    assert!(
        !disks
            .lines()
            .any(|l| l.split_whitespace().next() == Some("g1")),
        "{disks}"
    );
    for k in 2..=3u32 {
        let name = format!("dir{k}/after");
        if let Err((i, e)) = write_mib(&mnt(k).join(&name), 8, 10 + k) {
            panic!("node {k} writing MiB {i} of {name}: {e}\n{}", log_tails(&c));
        }
        files.push((name, 8, 10 + k));
    }
    let all_read = |when: &str| {
        for (name, count, seed) in &files {
            for k in 1..=3u32 {
                assert!(
                    holds_mib(&mnt(k).join(name), *count, *seed),
                    "{when}: node {k} reads {name} wrong"
                );
            }
        }
    };
    all_read("after the delete");
    tessera_ok(&c, 2, &["umount", "g1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "g1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["mount", "g1", "-a"]);
    all_read("after every node mounted again");
    // Each node claimed the slot made for it again, none asked for another.
    let logs = all_logs(&c);
    assert_eq!(
        logs.matches("asking the manager for a new owner slot")
            .count(),
        2,
        "{}",
        log_tails(&c)
    );
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// Every node's daemon log, whole.
fn all_logs(c: &Cluster) -> String {
    (1..=3)
        .map(|k| {
            std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log")))
                .unwrap_or_default()
        })
        .collect()
}

/// The end of every node's daemon log, for a failure's message.
fn log_tails(c: &Cluster) -> String {
    (1..=3)
        .map(|k| {
            let log = std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(60)..].join("\n");
            format!("--- node{k}\n{tail}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The owner slot node `k` holds of file system `fs`, from its role in `mount ls -Y`.
fn slot_of(c: &Cluster, k: u32, fs: &str) -> u32 {
    let listed = tessera_ok(c, 1, &["mount", "ls", fs, "-Y"]);
    listed
        .lines()
        .find(|l| l.contains(&format!(":node{k}:")))
        .and_then(|l| l.split("owner slot ").nth(1))
        .and_then(|rest| rest.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("node {k} holds no owner slot of {fs}: {listed}"))
}

/// Three nodes with `metadataSlots=yes` mounting file system `fs` on node 1's drive (256
/// KiB blocks, so that the 1 GiB drive has free allocation regions for the slots);
/// returns where node `k` mounts it.
fn slots_fs(c: &Cluster, fs: &str) -> impl Fn(u32) -> PathBuf {
    slots_fs_on(c, fs, "1G")
}

/// [`slots_fs`] on a drive of `size`.
fn slots_fs_on(c: &Cluster, fs: &str, size: &str) -> impl Fn(u32) -> PathBuf {
    slots_fs_with(c, fs, size, "1")
}

/// [`slots_fs_on`] with `drives` drives on every node (the file system on node 1's first).
fn slots_fs_with(c: &Cluster, fs: &str, size: &str, drives: &str) -> impl Fn(u32) -> PathBuf {
    // Every node serves its metrics in its own namespace (see `metrics_of`).
    let config = format!("{TEST_TIMINGS},metadataSlots=yes,metricsAddress=0.0.0.0:9400");
    c.ok(&[
        "up", "3", "--drives", drives, "--size", size, "--config", &config,
    ]);
    let stanza = c.base.join(format!("{fs}.stanza"));
    std::fs::write(
        &stanza,
        format!(
            "%nsd: device={} nsd={fs} usage=dataAndMetadata failureGroup=1 pool=system\n",
            c.base.join("drives/node1-d1.img").display()
        ),
    )
    .unwrap();
    let base = c.base.clone();
    let name = fs.to_string();
    let mnt = move |k: u32| base.join(format!("node{k}/mnt/{name}"));
    tessera_ok(c, 1, &["nsd", "create", "-F", stanza.to_str().unwrap()]);
    tessera_ok(
        c,
        1,
        &[
            "fs",
            "create",
            fs,
            "-F",
            stanza.to_str().unwrap(),
            "-B",
            "256K",
            "-T",
            mnt(1).to_str().unwrap(),
        ],
    );
    tessera_ok(c, 1, &["mount", fs, "-N", "node1,node2,node3"]);
    mnt
}

/// Kills node `k`'s daemon (its stale FUSE mount at `mnt` detached) and waits until node 1
/// sees it expelled.
fn kill_and_wait_for_expel(c: &Cluster, k: u32, mnt: &Path) {
    c.ok(&["kill", &k.to_string()]);
    let _ = std::process::Command::new("umount")
        .args(["-l", mnt.to_str().unwrap()])
        .status();
    let node = format!("node{k}");
    wait_for(&format!("the expel of node {k}"), SETTLE, || {
        states(c, 1)
            .get(&node)
            .is_some_and(|(s, epoch)| s == "down" && epoch.is_empty())
    });
}

/// Starts node `k` again and waits until every node is active and `k`'s daemon has mounted
/// the file system at `mnt` again by itself.
fn restart_and_wait_for_mount(c: &Cluster, k: u32, mnt: &Path) {
    c.ok(&["start", &k.to_string()]);
    wait_for("all active after the restart", SETTLE, || {
        all_in_state(c, 1, &[1, 2, 3], "active")
    });
    let at = format!(" {} fuse", mnt.display());
    wait_for(&format!("node {k}'s mount"), SETTLE, || {
        std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| m.contains(&at))
    });
}

/// Node `k`'s Prometheus metrics, scraped inside its namespace.
fn metrics_of(c: &Cluster, k: u32) -> String {
    const GET: &str = "import sys, urllib.request; \
                       print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())";
    let out = c.sh(&[
        "run",
        &k.to_string(),
        "--",
        "python3",
        "-c",
        GET,
        "http://127.0.0.1:9400/metrics",
    ]);
    assert!(
        out.status.success(),
        "node {k}'s metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `content` to `path` and fsyncs it and its directory.
fn write_synced(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(content)?;
    f.sync_all()?;
    std::fs::File::open(path.parent().unwrap())?.sync_all()
}

/// Node 2 holds the owner slot that serves its directory; node 3 writes and fsyncs files
/// there without a pause, and reads each back, while node 2 is killed (kill -9). Another
/// node takes the slot over (replays its log, fences the others): node 3's writer sees a
/// pause of at most 10 s and no error, every file it fsynced reads back on every live node,
/// node 2 comes back, mounts again and is given its slot back, and fsck is clean.
#[test]
fn a_killed_slot_holders_directory_is_served_again_by_another_node() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "k1");
    let dir = |k: u32| mnt(k).join("dir2");
    std::fs::create_dir(dir(2)).unwrap();
    let content = |i: u32| format!("file {i} written on node 3 ").repeat(40 + (i % 50) as usize);
    for i in 0..10 {
        write_synced(&dir(2).join(format!("before{i}")), content(i).as_bytes()).unwrap();
    }
    let listed = tessera_ok(&c, 1, &["mount", "ls", "k1", "-L"]);
    assert!(listed.contains("client, owner slot 1"), "{listed}");
    // Node 2's slot: the end of its line ("client, owner slot N").
    let role_of_node2 = |listed: &str| -> String {
        let line = listed.lines().find(|l| l.contains(" node2 ")).unwrap_or("");
        line.split_whitespace()
            .skip(3)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let node2_role = role_of_node2(&listed);
    assert!(node2_role.starts_with("client, owner slot "), "{listed}");

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (acked, longest) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut acked = Vec::new();
            let mut longest = Duration::ZERO;
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let path = dir(3).join(format!("f{i}"));
                let started = Instant::now();
                if let Err(e) = write_synced(&path, content(i).as_bytes()) {
                    panic!("node 3 writing {}: {e}\n{}", path.display(), log_tails(&c));
                }
                let got = std::fs::read(&path).unwrap();
                assert!(got == content(i).as_bytes(), "node 3 reads back f{i}");
                longest = longest.max(started.elapsed());
                acked.push(i);
                i += 1;
            }
            (acked, longest)
        });
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        kill_and_wait_for_expel(&c, 2, &mnt(2));
        // The writer goes on well past the takeover.
        std::thread::sleep(Duration::from_secs(3));
        eprintln!("writer ran {:?} past node 2's kill", killed.elapsed());
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        writer.join().unwrap()
    });
    eprintln!(
        "node 3 fsynced {} files; its longest write-and-read took {longest:?}",
        acked.len()
    );
    assert!(acked.len() > 20, "node 3 went on writing: {}", acked.len());
    // Node 3's creates went to the holder of node 2's slot, and its metrics say so (a client's
    // scrape once failed: its free space is the manager's answer over the network).
    let made = |m: &str| {
        m.lines().any(|l| {
            l.starts_with("tessera_metanode_requests_total{")
                && l.contains("owner=\"slot ")
                && l.contains("request=\"Make\"")
        })
    };
    assert!(made(&metrics_of(&c, 3)), "{}", metrics_of(&c, 3));
    assert!(
        longest < Duration::from_secs(10),
        "a pause of {longest:?}\n{}",
        log_tails(&c)
    );
    let listed = tessera_ok(&c, 1, &["mount", "ls", "k1", "-L"]);
    assert!(
        listed.contains("owner slot 1") || listed.contains("owner slots 1,"),
        "slot 1 is served by a live node: {listed}"
    );
    for k in [1u32, 3] {
        for i in 0..10 {
            assert_eq!(
                std::fs::read(dir(k).join(format!("before{i}"))).unwrap(),
                content(i).as_bytes(),
                "node {k} reads before{i}"
            );
        }
        for &i in &acked {
            assert_eq!(
                std::fs::read(dir(k).join(format!("f{i}"))).unwrap(),
                content(i).as_bytes(),
                "node {k} reads f{i}"
            );
        }
    }
    // While node 3 serves node 2's slot, the disk holding everything is replaced: the slot
    // taken over is told that its disk is to be emptied, as node 2's mount would be, and
    // moves its own blocks and region off it (it once was not told, and the delete failed
    // with "owner slot N could not let go of the disks").
    let stanza = c.nsd_stanza("k1b", "node2-d1.img", 1);
    let stanza = stanza.as_str();
    tessera_ok(&c, 1, &["nsd", "create", "-F", stanza]);
    tessera_ok(&c, 1, &["disk", "add", "k1", "-F", stanza]);
    let deleted = tessera_ok(&c, 1, &["disk", "delete", "k1", "k1"]);
    assert!(deleted.contains("k1 deleted from k1"), "{deleted}");
    for k in [1u32, 3] {
        for &i in acked.iter().step_by(5) {
            assert_eq!(
                std::fs::read(dir(k).join(format!("f{i}"))).unwrap(),
                content(i).as_bytes(),
                "node {k} reads f{i} after the delete"
            );
        }
    }
    // A file of the manager's that nodes 1 and 3 hold (their kernels and daemons keep it
    // under read tokens): the node that gives node 2's slot back below keeps its own.
    std::fs::write(mnt(1).join("probe"), b"one").unwrap();
    for k in [1u32, 3] {
        assert_eq!(std::fs::read(mnt(k).join("probe")).unwrap(), b"one");
    }
    // Node 2 comes back and mounts again by itself (its daemon mounts what was mounted):
    // it sees everything.
    restart_and_wait_for_mount(&c, 2, &mnt(2));
    // Node 2 serves its own directory again: the node that took its slot over gave it
    // back when node 2 mounted (not a new, empty slot beside it).
    let listed = tessera_ok(&c, 1, &["mount", "ls", "k1", "-L"]);
    assert_eq!(
        role_of_node2(&listed),
        node2_role,
        "node 2 does not hold its slot again: {listed}\n{}",
        log_tails(&c)
    );
    assert!(!listed.contains("owner slots"), "{listed}");
    // What the nodes hold at the manager was not forgotten with the slot given back: a
    // change on node 2 is revoked from them and seen at once.
    std::fs::write(mnt(2).join("probe"), b"two").unwrap();
    for k in [1u32, 3] {
        assert_eq!(
            std::fs::read(mnt(k).join("probe")).unwrap(),
            b"two",
            "node {k} after the slot went back"
        );
    }
    for &i in acked.iter().step_by(7) {
        let path = dir(2).join(format!("f{i}"));
        let got = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), log_tails(&c)));
        assert!(
            got == content(i).as_bytes(),
            "node 2 reads f{i} after its restart"
        );
    }
    std::fs::write(dir(2).join("after-restart"), b"node 2 again").unwrap();
    assert_eq!(
        std::fs::read(dir(1).join("after-restart")).unwrap(),
        b"node 2 again"
    );
    tessera_ok(&c, 3, &["umount", "k1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "k1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// The crash loop of `netns_cluster.rs` with owner slots: every node has a directory its
/// slot serves, and the writers on the survivors write into all three, the dead node's
/// too, so that a kill of a slot holder is a takeover of its slot under their writes.
#[test]
fn a_crash_loop_of_node_kills_with_owner_slots_loses_nothing() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "l1");
    for k in 1..=3u32 {
        std::fs::create_dir(mnt(k).join(format!("d{k}"))).unwrap();
    }
    let listed = tessera_ok(&c, 1, &["mount", "ls", "l1", "-L"]);
    assert!(
        listed.contains("client, owner slot 1") && listed.contains("client, owner slot 2"),
        "{listed}"
    );
    common::crash_loop::run(&c, "l1", &mnt, &|_, name| {
        let spread = name
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31) + u32::from(b));
        format!("d{}/{name}", 1 + spread % 3)
    });
}

/// A file system with two metadata copies (`-m 2 -r 2`: node 1's two drives in two failure
/// groups): the nodes that mount beside the manager own slots of their own, whose logs
/// have a copy in each group, and a killed holder's slot is taken over by another node
/// (its log replayed from both copies) with nothing lost; then the first group's disk is
/// deleted under the live slots, which move both copies of their regions.
#[test]
fn a_replicated_file_systems_slots_are_owned_and_taken_over() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let config = format!("{TEST_TIMINGS},metadataSlots=yes");
    c.ok(&[
        "up", "3", "--drives", "2", "--size", "1G", "--config", &config,
    ]);
    let stanza = c.base.join("m2.stanza");
    std::fs::write(
        &stanza,
        format!(
            "%nsd: device={} nsd=m2a usage=dataAndMetadata failureGroup=1 pool=system\n\
             %nsd: device={} nsd=m2b usage=dataAndMetadata failureGroup=2 pool=system\n",
            c.base.join("drives/node1-d1.img").display(),
            c.base.join("drives/node1-d2.img").display()
        ),
    )
    .unwrap();
    let stanza = stanza.to_str().unwrap();
    let mnt = |k: u32| c.base.join(format!("node{k}/mnt/m2"));
    tessera_ok(&c, 1, &["nsd", "create", "-F", stanza]);
    tessera_ok(
        &c,
        1,
        &[
            "fs",
            "create",
            "m2",
            "-F",
            stanza,
            "-B",
            "256K",
            "-m",
            "2",
            "-r",
            "2",
            "-T",
            mnt(1).to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 1, &["mount", "m2", "-N", "node1,node2,node3"]);
    let listed = tessera_ok(&c, 1, &["mount", "ls", "m2", "-L"]);
    for k in 2..=3u32 {
        let line = listed
            .lines()
            .find(|l| l.contains(&format!(" node{k} ")))
            .unwrap_or("");
        assert!(
            line.contains("client, owner slot "),
            "node {k} owns no slot of a -m 2 file system: {listed}\n{}",
            log_tails(&c)
        );
    }
    let dir = |k: u32| mnt(k).join("dir2");
    std::fs::create_dir(dir(2)).unwrap();
    let content = |i: u32| format!("file {i} of node 2 ").repeat(60 + (i % 40) as usize);
    for i in 0..20 {
        write_synced(&dir(2).join(format!("f{i}")), content(i).as_bytes()).unwrap();
    }
    // Node 2 dies with its slot's last changes only in its log.
    kill_and_wait_for_expel(&c, 2, &mnt(2));
    // Node 3 reads them through whoever took the slot over, and writes there.
    for i in 0..20 {
        let path = dir(3).join(format!("f{i}"));
        let got = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), log_tails(&c)));
        assert!(got == content(i).as_bytes(), "node 3 reads f{i}");
    }
    write_synced(&dir(3).join("after"), b"written after the takeover").unwrap();
    let logs = all_logs(&c);
    assert!(
        !logs.contains("mounts m2 as a client of the manager only"),
        "a node fell back to a client's mount\n{}",
        log_tails(&c)
    );
    restart_and_wait_for_mount(&c, 2, &mnt(2));
    assert_eq!(
        std::fs::read(dir(2).join("after")).unwrap(),
        b"written after the takeover"
    );
    for i in (0..20).step_by(3) {
        assert!(std::fs::read(dir(2).join(format!("f{i}"))).unwrap() == content(i).as_bytes());
    }
    // The first group's only disk deleted under the live slots, each of whose regions has
    // a copy there: each owner moves both copies of its region (a new disk takes the
    // first group's place), and every node reads every file after.
    let add = c.base.join("m2-add.stanza");
    std::fs::write(
        &add,
        format!(
            "%nsd: device={} nsd=m2c usage=dataAndMetadata failureGroup=1 pool=system\n",
            c.base.join("drives/node2-d1.img").display()
        ),
    )
    .unwrap();
    let add = add.to_str().unwrap();
    tessera_ok(&c, 1, &["nsd", "create", "-F", add]);
    tessera_ok(&c, 1, &["disk", "add", "m2", "-F", add]);
    tessera_ok(&c, 3, &["disk", "delete", "m2", "m2a"]);
    assert_eq!(
        all_logs(&c).matches("records and log moved from").count(),
        2,
        "both slot owners moved their regions\n{}",
        log_tails(&c)
    );
    for k in 1..=3u32 {
        for i in (0..20).step_by(4) {
            let got = std::fs::read(dir(k).join(format!("f{i}"))).unwrap();
            assert!(
                got == content(i).as_bytes(),
                "node {k} reads f{i} after the delete"
            );
        }
    }
    write_synced(&dir(2).join("after-delete"), b"written after the delete").unwrap();
    assert_eq!(
        std::fs::read(dir(3).join("after-delete")).unwrap(),
        b"written after the delete"
    );
    tessera_ok(&c, 3, &["umount", "m2", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "m2", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// The journal pages on drive file `drive`: (device offset, page sequence, page bytes'
/// hash), for every 4 KiB page that starts with the log page magic.
fn log_pages(drive: &Path) -> Vec<(u64, u64, u64)> {
    use std::hash::{Hash, Hasher};
    let bytes = std::fs::read(drive).unwrap();
    bytes
        .chunks_exact(4096)
        .enumerate()
        .filter(|(_, page)| page[..4] == *b"TJLP")
        .map(|(i, page)| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            page.hash(&mut h);
            let seq = u64::from_le_bytes(page[32..40].try_into().unwrap());
            (i as u64 * 4096, seq, h.finish())
        })
        .collect()
}

/// Of the log pages written between `before` and `after`, the device offset of one that
/// is six pages before the end of the log that took most of them: committed records, with
/// commits of the same session after it.
fn page_inside_the_busiest_log(before: &[(u64, u64, u64)], after: &[(u64, u64, u64)]) -> u64 {
    let old: std::collections::HashSet<_> = before.iter().collect();
    // A log's page `seq` lies at `start + 4096 * (1 + seq % pages)`: pages of one log
    // written without wrapping around share `offset - 4096 * seq`.
    let mut logs: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for page in after.iter().filter(|p| !old.contains(p)) {
        let base = page.0.wrapping_sub(4096 * page.1);
        logs.entry(base).or_default().push((page.1, page.0));
    }
    let (_, mut pages) = logs
        .into_iter()
        .max_by_key(|(_, pages)| pages.len())
        .expect("log pages written");
    assert!(pages.len() >= 20, "only {} new log pages", pages.len());
    pages.sort();
    pages[pages.len() - 7].1
}

/// Writes and fsyncs 30 files `f0`..`f29` of `content` in `dir`, then flips a bit of the
/// log that took their records on `drive`, six pages before that log's end.
fn fsync_files_and_damage_their_log(drive: &Path, dir: &Path, content: &dyn Fn(u32) -> String) {
    use std::os::unix::fs::FileExt;
    let before = log_pages(drive);
    for i in 0..30 {
        write_synced(&dir.join(format!("f{i}")), content(i).as_bytes()).unwrap();
    }
    let damaged = page_inside_the_busiest_log(&before, &log_pages(drive));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(drive)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, damaged + 3000).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], damaged + 3000)
        .unwrap();
    file.sync_all().unwrap();
}

/// Listing directory `dir(k)` on each node `k` of `nodes` fails with EIO within 10 s.
fn assert_eio_at_once(c: &Cluster, nodes: &[u32], dir: &dyn Fn(u32) -> PathBuf) {
    for &k in nodes {
        let asked = Instant::now();
        let err = std::fs::read_dir(dir(k)).map(|_| ()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "node {k}: {err}");
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "node {k} waited {:?} for its EIO\n{}",
            asked.elapsed(),
            log_tails(c)
        );
    }
}

/// After fsck's repair of a damaged log: the files of [`fsync_files_and_damage_their_log`]
/// in `dir` that are kept form a prefix, each read back whole, and only some are lost.
fn assert_a_prefix_is_kept(dir: &Path, content: &dyn Fn(u32) -> String) {
    let kept: Vec<u32> = (0..30)
        .filter(|i| match std::fs::read(dir.join(format!("f{i}"))) {
            Ok(data) => {
                assert_eq!(data, content(*i).as_bytes(), "f{i} read back torn");
                true
            }
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "f{i}: {e}");
                false
            }
        })
        .collect();
    assert!(
        kept.len() >= 15 && kept.len() < 30,
        "{} files kept",
        kept.len()
    );
    assert_eq!(
        kept,
        (0..kept.len() as u32).collect::<Vec<_>>(),
        "a prefix is kept"
    );
}

/// What `tessera fsck FS -n` on node `k` says (its output and errors); it must fail.
fn fsck_finds_problems(c: &Cluster, k: u32, fs: &str) -> String {
    let check = c.sh(&["run", &k.to_string(), "--", "tessera", "fsck", fs, "-n"]);
    let said = String::from_utf8_lossy(&check.stdout).into_owned()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "fsck -n found nothing: {said}");
    said
}

/// Node 2 holds the owner slot of its directory and fsyncs 30 files there; a bit of its
/// log, a few commits before the end, is flipped on the drive and node 2 is killed. The
/// takeover finds the log damaged: every node's access to node 2's directory fails with
/// EIO at once (not after the minute a request waits for an owner that may come), the
/// rest of the file system stays in service, and the daemon log names the slot and the
/// repair. `umount -a`, `fsck -n` (names the loss), `fsck -y` and `mount -a`: the files
/// whose records came before the damaged page read back whole, the slot is served again,
/// and fsck is clean.
#[test]
fn a_slot_whose_log_is_damaged_answers_eio_at_once_and_fsck_repairs_it() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "g1");
    let dir = |k: u32| mnt(k).join("dir2");
    std::fs::create_dir(dir(2)).unwrap();
    let content = |i: u32| format!("file {i} fsynced on node 2 ").repeat(20 + i as usize);
    // Slots are numbered in the order nodes mount: node 2's is not always slot 2.
    let slot = slot_of(&c, 2, "g1");
    fsync_files_and_damage_their_log(&c.base.join("drives/node1-d1.img"), &dir(2), &content);
    kill_and_wait_for_expel(&c, 2, &mnt(2));

    assert_eio_at_once(&c, &[1, 3, 1], &dir);
    // The rest of the file system is in service.
    std::fs::write(mnt(3).join("root-file"), b"written beside the damaged slot").unwrap();
    assert_eq!(
        std::fs::read(mnt(1).join("root-file")).unwrap(),
        b"written beside the damaged slot"
    );
    let logs = all_logs(&c);
    assert!(
        logs.contains(&format!("owner slot {slot} cannot be taken over"))
            && logs.contains("tessera fsck g1 -y"),
        "{}",
        log_tails(&c)
    );

    restart_and_wait_for_mount(&c, 2, &mnt(2));
    tessera_ok(&c, 1, &["umount", "g1", "-a"]);
    let said = fsck_finds_problems(&c, 1, "g1");
    assert!(
        said.contains(&format!("owner slot {slot}")) && said.contains("tessera fsck g1 -y"),
        "{said}"
    );
    let repaired = tessera_ok(&c, 1, &["fsck", "g1", "-y"]);
    assert!(repaired.contains("File system g1 is clean"), "{repaired}");
    tessera_ok(&c, 1, &["mount", "g1", "-a"]);

    assert_a_prefix_is_kept(&dir(1), &content);
    write_synced(&dir(3).join("after"), b"the slot is served again").unwrap();
    assert_eq!(
        std::fs::read(dir(2).join("after")).unwrap(),
        b"the slot is served again"
    );
    tessera_ok(&c, 1, &["umount", "g1", "-a"]);
    let clean = tessera_ok(&c, 1, &["fsck", "g1", "-n"]);
    assert!(clean.contains("File system g1 is clean"), "{clean}");
}

/// The file system manager's log damaged, and its node killed: the takeover finds the
/// damage, gives its claim back, and every node answers EIO at once (the file system's
/// root is the manager's); restarted, the old manager cannot mount it either. `umount -a`
/// still reaches the nodes that have it mounted, and after `fsck -y` a prefix of the files
/// fsynced in the root reads back whole.
#[test]
fn a_damaged_manager_log_answers_eio_at_once_and_fsck_repairs_it() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let mnt = slots_fs(&c, "h1");
    let content = |i: u32| format!("file {i} fsynced on node 1 ").repeat(20 + i as usize);
    fsync_files_and_damage_their_log(&c.base.join("drives/node1-d1.img"), &mnt(1), &content);
    kill_and_wait_for_expel(&c, 1, &mnt(1));

    // The first asker replays the log once (a few milliseconds); nobody waits for an
    // owner that cannot come.
    assert_eio_at_once(&c, &[2, 3, 2], &mnt);
    assert!(
        all_logs(&c).contains("its file system manager's metadata cannot be taken over"),
        "{}",
        log_tails(&c)
    );

    c.ok(&["start", "1"]);
    wait_for("all active after the restart", SETTLE, || {
        all_in_state(&c, 2, &[1, 2, 3], "active")
    });
    // The clients' final commits cannot reach a manager, but their mounts go.
    let _ = c.sh(&["run", "2", "--", "tessera", "umount", "h1", "-a"]);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains("/mnt/h1 fuse"), "{mounts}");
    let said = fsck_finds_problems(&c, 2, "h1");
    assert!(said.contains("lost committed records"), "{said}");
    let repaired = tessera_ok(&c, 2, &["fsck", "h1", "-y"]);
    assert!(repaired.contains("File system h1 is clean"), "{repaired}");
    tessera_ok(&c, 2, &["mount", "h1", "-a"]);
    assert_a_prefix_is_kept(&mnt(3), &content);
    tessera_ok(&c, 2, &["umount", "h1", "-a"]);
    let clean = tessera_ok(&c, 2, &["fsck", "h1", "-n"]);
    assert!(clean.contains("File system h1 is clean"), "{clean}");
}
