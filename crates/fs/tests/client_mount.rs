//! A client-only mount (`FileSystem::mount_client`): a second mount of the same drives,
//! through its own drive handles, that owns nothing and sends every metadata request to the
//! mount that owns the file system, as a node that does not own it does over the cluster
//! transport. What either writes the other reads; fsync on the client is durable; what
//! only the owner can do is refused on the client with a message that says where to run it.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use common::*;
use tessera_fs::{FileSystem, FsError, FsResult, InProcessOwner, MetanodeChannel, ROOT_INO};

fn client_of(t: &TestDisks, owner: &Arc<FileSystem>) -> Arc<FileSystem> {
    // `reopen` opens the drive files again: the client's handles are its own.
    FileSystem::mount_client(t.reopen(), Box::new(InProcessOwner(Arc::downgrade(owner)))).unwrap()
}

#[test]
fn what_a_client_writes_the_owner_reads_and_the_other_way_round() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let client = client_of(&t, &owner);
    assert!(owner.is_owner() && !client.is_owner());
    assert_eq!(client.descriptor().name, owner.descriptor().name);

    // Files of every shape written through the client: inline, fragments, several blocks,
    // sparse; the owner reads them from the drives by the block maps it logged.
    let files = populate(&client, "c", 7);
    verify(&owner, &files);
    verify(&client, &files);

    // And the other way: the owner rewrites part of a file in place and grows another;
    // the client asks the owner for the block map on every read, so it sees both.
    let name = "c3";
    let a = owner.lookup(ROOT_INO, name.as_bytes()).unwrap();
    let patch = pattern(70_000, 99);
    owner.write(a.ino, 100_000, &patch, true).unwrap();
    let got = client.read(a.ino, 100_000, patch.len() as u32).unwrap();
    assert!(
        got == patch,
        "the client reads the owner's in-place rewrite"
    );

    // Namespace changes of one are the other's at once.
    let d = client
        .create_node(
            ROOT_INO,
            b"dir",
            tessera_fs::FileKind::Directory,
            0o755,
            0,
            tessera_fs::Caller { uid: 0, gid: 0 },
            None,
        )
        .unwrap();
    assert_eq!(owner.lookup(ROOT_INO, b"dir").unwrap().ino, d.ino);
    owner
        .rename(ROOT_INO, b"c0", d.ino, b"moved", false, false)
        .unwrap();
    assert!(client.lookup(ROOT_INO, b"c0").is_err());
    assert_eq!(
        client
            .read(client.lookup(d.ino, b"moved").unwrap().ino, 0, 200)
            .unwrap(),
        files["c0"]
    );
    client.remove(ROOT_INO, b"c1", false).unwrap();
    assert!(matches!(
        owner.lookup(ROOT_INO, b"c1"),
        Err(FsError::NotFound)
    ));

    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a client and its owner unmounted");
}

#[test]
fn a_clients_fsync_survives_the_owners_crash() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let (disks, faults) = with_faults(&t);
    let owner = FileSystem::mount(disks).unwrap();
    let client = client_of(&t, &owner);
    let a = create_file(&client, ROOT_INO, b"synced");
    let data = pattern(3 * BLOCK as usize + 1234, 5);
    client.write(a.ino, 0, &data, false).unwrap();
    client.fsync(a.ino).unwrap();
    // Written after the fsync: may be lost, must not damage what was synced.
    let b = create_file(&client, ROOT_INO, b"unsynced");
    client.write(b.ino, 0, &pattern(50_000, 6), false).unwrap();
    crash(owner, &faults);
    drop(client);
    assert_fsck_clean(&t, "after the owner's crash");
    let again = mount(&t);
    let a = again.lookup(ROOT_INO, b"synced").unwrap();
    assert_eq!(a.size, data.len() as u64);
    assert!(again.read(a.ino, 0, data.len() as u32).unwrap() == data);
    again.unmount().unwrap();
}

#[test]
fn what_only_the_owner_can_do_is_refused_on_a_client_with_where_to_run_it() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let client = client_of(&t, &owner);
    let stop = AtomicBool::new(false);
    let refusals: Vec<(&str, FsError)> = vec![
        ("checkpoint", client.checkpoint().unwrap_err()),
        ("df", client.df().unwrap_err()),
        (
            "restripe",
            client
                .restripe(
                    tessera_fs::restripe::RestripeMode::Balance,
                    &stop,
                    &mut |_| {},
                )
                .unwrap_err(),
        ),
        ("reclaim", client.reclaim_space(&mut |_, _| {}).unwrap_err()),
        ("policy", client.set_policy(None).unwrap_err()),
    ];
    let fs_name = owner.descriptor().name;
    for (what, e) in refusals {
        assert!(matches!(e, FsError::NotOwner { .. }), "{what}: {e}");
        let message = e.to_string();
        assert!(
            message.contains(&fs_name) && message.contains("run it on that node"),
            "{what}: {message}"
        );
    }
    // Statistics of what a client does not keep are empty, not a panic.
    assert_eq!(client.inode_cache_len(), (0, 0));
    assert!(client.allocation_map_rebuilt().is_none());
    client.maybe_checkpoint().unwrap();
    client.unmount().unwrap();
    owner.unmount().unwrap();
}

#[test]
fn a_client_mount_of_drives_without_a_file_system_says_so() {
    let t = make_disks(2, 64 << 20);
    let owner = Weak::new();
    let e = FileSystem::mount_client(t.reopen(), Box::new(InProcessOwner(owner))).unwrap_err();
    assert!(matches!(e, FsError::NoDescriptor(_)), "{e}");
}

#[test]
fn a_client_whose_owner_is_gone_gets_errors_not_a_hang() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let client = client_of(&t, &owner);
    owner.unmount().unwrap();
    drop(owner);
    let e = client.lookup(ROOT_INO, b"anything").unwrap_err();
    assert!(e.to_string().contains("unmounted"), "{e}");
    assert_eq!(e.errno(), libc::EIO);
}

/// What a client changes is told to the owner's kernel-cache hook before the client's call
/// returns: the inode of a write, the names and directories of a create, rename and
/// unlink, and the inodes those names named.
#[test]
fn the_owner_is_told_what_a_client_changed_before_the_client_returns() {
    use std::sync::Mutex;
    use tessera_fs::CacheChange::{Entry, Inode};
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let told: Arc<Mutex<Vec<tessera_fs::CacheChange>>> = Arc::default();
    let sink = Arc::clone(&told);
    owner.on_remote_change(Box::new(move |changes| {
        sink.lock().unwrap().extend(changes)
    }));
    let client = client_of(&t, &owner);
    let take = || std::mem::take(&mut *told.lock().unwrap());

    let a = create_file(&client, ROOT_INO, b"a");
    let got = take();
    assert!(
        got.contains(&Entry {
            parent: ROOT_INO,
            name: b"a".to_vec()
        }) && got.contains(&Inode(ROOT_INO)),
        "{got:?}"
    );
    client.write(a.ino, 0, &pattern(5000, 1), false).unwrap();
    assert!(take().contains(&Inode(a.ino)));
    let b = create_file(&client, ROOT_INO, b"b");
    take();
    // A rename over `b`: both names, the directory, the moved inode and the replaced one.
    client
        .rename(ROOT_INO, b"a", ROOT_INO, b"b", false, false)
        .unwrap();
    let got = take();
    for want in [
        Entry {
            parent: ROOT_INO,
            name: b"a".to_vec(),
        },
        Entry {
            parent: ROOT_INO,
            name: b"b".to_vec(),
        },
        Inode(a.ino),
        Inode(b.ino),
    ] {
        assert!(got.contains(&want), "rename: {want:?} missing from {got:?}");
    }
    client.remove(ROOT_INO, b"b", false).unwrap();
    let got = take();
    assert!(got.contains(&Inode(a.ino)), "unlink: {got:?}");
    // Reads tell nothing.
    client.getattr(ROOT_INO).unwrap();
    client.readdir(ROOT_INO, 0).unwrap();
    assert!(take().is_empty());
    client.unmount().unwrap();
    owner.unmount().unwrap();
}

/// A client's way to whichever mount owns the metadata now: the test moves it, as a new
/// owner's fence moves a node's channel after a takeover. It can hold the answer of one
/// chosen call, so that the client acts on it only after the owner changed.
struct Following {
    to: parking_lot::Mutex<Weak<FileSystem>>,
    /// Where the next announcement moves it.
    next: parking_lot::Mutex<Option<Weak<FileSystem>>>,
    moves: std::sync::atomic::AtomicU64,
    /// Calls made; the answer of call number `hold_at` waits for `release`.
    calls: std::sync::atomic::AtomicU64,
    hold_at: std::sync::atomic::AtomicU64,
    /// The answer of call number `lose_at` is lost (its owner dies): the call waits for
    /// `release`, then is sent again to where the channel points by then.
    lose_at: std::sync::atomic::AtomicU64,
    /// 0: nothing held yet, 1: holding, 2: released.
    held: parking_lot::Mutex<u8>,
    changed: parking_lot::Condvar,
}

impl Following {
    fn to(owner: &Arc<FileSystem>) -> Arc<Following> {
        Arc::new(Following {
            to: parking_lot::Mutex::new(Arc::downgrade(owner)),
            next: parking_lot::Mutex::new(None),
            moves: std::sync::atomic::AtomicU64::new(0),
            calls: std::sync::atomic::AtomicU64::new(0),
            hold_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            lose_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            held: parking_lot::Mutex::new(0),
            changed: parking_lot::Condvar::new(),
        })
    }

    /// Holds the answer of the `n`th call from now.
    fn hold_call(&self, n: u64) {
        use std::sync::atomic::Ordering;
        let at = self.calls.load(Ordering::SeqCst) + n;
        self.hold_at.store(at, Ordering::SeqCst);
    }

    /// Loses the answer of the `n`th call from now.
    fn lose_call(&self, n: u64) {
        use std::sync::atomic::Ordering;
        let at = self.calls.load(Ordering::SeqCst) + n;
        self.lose_at.store(at, Ordering::SeqCst);
    }

    /// Waits until a call is held or lost, or `done` says the operation ended without
    /// reaching the chosen call (then disarms it and says so).
    fn held_before(&self, done: &dyn Fn() -> bool) -> bool {
        let mut held = self.held.lock();
        loop {
            if *held == 1 {
                return true;
            }
            if done() {
                self.lose_at
                    .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
                return false;
            }
            self.changed
                .wait_for(&mut held, std::time::Duration::from_millis(20));
        }
    }

    fn wait_until_held(&self) {
        let mut held = self.held.lock();
        while *held == 0 {
            self.changed.wait(&mut held);
        }
    }

    fn release(&self) {
        *self.held.lock() = 2;
        self.changed.notify_all();
    }

    fn hold_here(&self) {
        let mut held = self.held.lock();
        *held = 1;
        self.changed.notify_all();
        while *held != 2 {
            self.changed.wait(&mut held);
        }
        *held = 0;
    }

    fn answer(&self, to: Weak<FileSystem>, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        use std::sync::atomic::Ordering;
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        // From node 2, as a node's transport marks another node's requests: the owner
        // answers its namespace changes before they are durable (`early_answer.rs`).
        let node = |owner| tessera_fs::InProcessNode {
            owner,
            origin: tessera_fs::locks::Origin {
                node: 2,
                incarnation: 1,
            },
        };
        let reply = node(to).call(request.clone());
        if n == self.hold_at.load(Ordering::SeqCst) {
            self.hold_here();
        }
        if n == self.lose_at.load(Ordering::SeqCst) {
            // Done there, and the answer died with that owner: sent again to the owner that
            // took over, as a node's channel does after a failure.
            drop(reply);
            self.hold_here();
            let to = self.to.lock().clone();
            return node(to).call(request);
        }
        reply
    }
}

struct FollowingHandle(Arc<Following>);

impl MetanodeChannel for FollowingHandle {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        let to = self.0.to.lock().clone();
        self.0.answer(to, request)
    }

    fn call_seen(&self, request: Vec<u8>, seen: u64) -> tessera_fs::FsResult<Vec<u8>> {
        let to = {
            let to = self.0.to.lock();
            if self.generation() != seen {
                return Err(FsError::OwnerMoved);
            }
            to.clone()
        };
        self.0.answer(to, request)
    }

    fn generation(&self) -> u64 {
        self.0.moves.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn owner_announced(&self, _owner: u32, _incarnation: u64) {
        let mut to = self.0.to.lock();
        if let Some(next) = self.0.next.lock().take() {
            *to = next;
            self.0
                .moves
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A formatted file system on `t`: its owner mounted on drives that can crash, and a
/// client whose way to the owner the test moves (see [`Following`]).
fn owner_and_following_client(
    t: &TestDisks,
) -> (
    Arc<FileSystem>,
    Arc<tessera_testkit::Faults>,
    Arc<Following>,
    Arc<FileSystem>,
) {
    format_fs(t, &small_opts());
    let (disks, faults) = with_faults(t);
    let owner = FileSystem::mount(disks).unwrap();
    let way = Following::to(&owner);
    let client =
        FileSystem::mount_client(t.reopen(), Box::new(FollowingHandle(Arc::clone(&way)))).unwrap();
    (owner, faults, way, client)
}

/// Writes files of `BLOCK`-sized pieces through `fs` until the file system is full;
/// returns name -> content of what was written.
fn fill(fs: &FileSystem) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for i in 0.. {
        let name = format!("fill{i}");
        let a = create_file(fs, ROOT_INO, name.as_bytes());
        let mut data = Vec::new();
        for j in 0..8u64 {
            let piece = pattern(BLOCK as usize, i * 8 + j);
            match fs.write(a.ino, j * BLOCK, &piece, false) {
                Ok(_) => data.extend_from_slice(&piece),
                Err(FsError::NoSpace { .. }) => {
                    files.insert(name, data);
                    fs.sync().unwrap();
                    return files;
                }
                Err(e) => panic!("filling: {e}"),
            }
        }
        files.insert(name, data);
    }
    unreachable!()
}

/// The owner dies while a client is in the middle of writing a new block: it holds space
/// the owner gave out, or a block map that shows that space mapped, which the owner never
/// made durable. Another mount replays the log and fences the client, which hands over
/// the updates the dead owner acknowledged (the new owner applies them), and a second
/// client fills every free block. Then the first client carries on from the old owner's
/// answer: nothing of it may land in the second client's blocks or map them twice. The
/// second client's files read back intact, the first client's write either finds its
/// block (handed over: it was mapped) or no space (only allocated: that died with the
/// owner), its fsync succeeds, and fsck finds the file system clean.
///
/// The call sequences (`data.rs`) of a whole-block write of a new block: 1 view (inline?),
/// 2 view, 3 view, 4 allocate (the previous block is where this mount put it), then the
/// data write, 5 the map with its checksums; of a write of half a new block: 1-4 as
/// before, 5 map unwritten, 6 view, the data write, 7 sectors. Held: the allocation's
/// answer, the whole block's map update's answer (the old owner logged it, the client
/// hears of it only after the fence: done again, not handed over), and the view after
/// the half block was mapped (handed over).
#[test]
fn a_clients_write_under_a_dead_owner_never_lands_in_space_the_new_owner_gives_out() {
    for (hold, len) in [(4, BLOCK), (5, BLOCK), (6, BLOCK / 2)] {
        let handed_over = hold == 6;
        let t = make_disks(4, 24 << 20);
        let (first, faults, way, writer) = owner_and_following_client(&t);
        let x = create_file(&writer, ROOT_INO, b"x");
        writer
            .write(x.ino, 0, &pattern(BLOCK as usize, 1), false)
            .unwrap();
        writer.fsync(x.ino).unwrap();
        way.hold_call(hold);
        let (second, other, files) = std::thread::scope(|s| {
            let w = s.spawn(|| writer.write(x.ino, BLOCK, &pattern(len as usize, 2), false));
            way.wait_until_held();
            crash(first, &faults);
            let second = mount(&t);
            let applied = fence_over(&writer, &way, &second);
            assert_eq!(
                applied,
                usize::from(handed_over),
                "hold {hold}: updates handed over"
            );
            let other = client_of(&t, &second);
            let files = fill(&other);
            way.release();
            // Written again at the new owner: into the block handed over, or nowhere (the
            // space the dead owner only gave out went to the second client).
            let again = w.join().unwrap();
            if handed_over {
                assert_eq!(again.unwrap(), len as usize, "hold {hold}");
            } else {
                assert!(
                    matches!(again, Err(FsError::NoSpace { .. })),
                    "hold {hold}: {again:?}"
                );
            }
            (second, other, files)
        });
        verify(&other, &files);
        verify(&second, &files);
        writer.fsync(x.ino).unwrap();
        let mut expected = pattern(BLOCK as usize, 1);
        if handed_over {
            expected.extend_from_slice(&pattern(len as usize, 2));
        }
        let got = second.read(x.ino, 0, 3 * BLOCK as u32).unwrap();
        assert!(got == expected, "hold {hold}: the writer's file");
        writer.unmount().unwrap();
        other.unmount().unwrap();
        second.unmount().unwrap();
        drop((writer, other, second));
        assert_fsck_clean(&t, &format!("hold {hold}: after a takeover under a write"));
    }
}

/// Takes the metadata of `writer`'s file system over at `second` as a node does after an
/// owner's death: fences the writer, applies what it hands over, tells it so.
fn fence_over(writer: &FileSystem, way: &Following, second: &Arc<FileSystem>) -> usize {
    *way.next.lock() = Some(Arc::downgrade(second));
    let handed = writer.serve_metanode_request(&tessera_fs::Fence::request(0, 2, 1));
    let applied = second.replay_fenced(&handed, None).unwrap();
    let settled = writer.serve_metanode_request(&tessera_fs::Fence::settled(0, true));
    tessera_fs::Fence::check(&settled).unwrap();
    applied
}

/// A client writes files of every shape and does not fsync; the owner dies before any of
/// it is durable. The new owner takes what the client hands over at its fence: the
/// client's fsync then succeeds, every file reads back whole from the new owner, and
/// after a second crash of the new owner (nothing else written) they are still there.
#[test]
fn a_clients_unsynced_writes_survive_the_owners_death_through_its_fence() {
    let t = make_disks(4, 64 << 20);
    let (first, faults, way, writer) = owner_and_following_client(&t);
    // `populate` ends with a sync: write more after it, unsynced.
    let synced = populate(&writer, "s", 3);
    let mut unsynced = BTreeMap::new();
    for (i, size) in [700usize, 20_000, 2 * BLOCK as usize + 77]
        .iter()
        .enumerate()
    {
        let name = format!("u{i}");
        let a = create_file(&writer, ROOT_INO, name.as_bytes());
        let data = pattern(*size, 40 + i as u64);
        writer.write(a.ino, 0, &data, false).unwrap();
        unsynced.insert(name, data);
    }
    // And an in-place rewrite of a synced file.
    let s3 = writer.lookup(ROOT_INO, b"s3").unwrap();
    let patch = pattern(5000, 77);
    writer.write(s3.ino, 4096, &patch, false).unwrap();
    let mut s3_data = synced["s3"].clone();
    s3_data[4096..4096 + patch.len()].copy_from_slice(&patch);
    crash(first, &faults);
    let (disks, faults) = with_faults(&t);
    let second = FileSystem::mount(disks).unwrap();
    assert!(
        fence_over(&writer, &way, &second) > 0,
        "updates handed over"
    );
    writer.fsync(s3.ino).unwrap();
    let mut all = synced.clone();
    all.extend(unsynced);
    all.insert("s3".into(), s3_data);
    verify(&second, &all);
    verify(&writer, &all);
    crash(second, &faults);
    drop(writer);
    assert_fsck_clean(&t, "after two owners' crashes");
    let third = mount(&t);
    verify(&third, &all);
    third.unmount().unwrap();
}

/// A create (with O_EXCL's semantics: it fails on an existing name) and an unlink whose
/// answers die with their owner, after it did them: the client sends them again to the
/// owner that took over, which knows from the log it replayed that they were done and
/// answers with their result: the create returns the file it made, not EEXIST, and the
/// unlink returns success, not ENOENT. Each of the first calls of the operation loses its
/// answer in turn (the permission check's, the change's), one takeover each.
#[test]
fn a_namespace_change_whose_answer_died_with_the_owner_is_not_done_twice() {
    let t = make_disks(4, 64 << 20);
    let (mut owner, mut faults, way, writer) = owner_and_following_client(&t);
    let me = tessera_fs::Caller { uid: 0, gid: 0 };
    let kind = tessera_fs::FileKind::Regular;
    for lose in 1..=3u64 {
        let name = format!("excl{lose}");
        for unlink in [false, true] {
            way.lose_call(lose);
            let (next, next_faults, result) = std::thread::scope(|s| {
                let op = s.spawn(|| {
                    if unlink {
                        writer
                            .remove(ROOT_INO, name.as_bytes(), false)
                            .map(|()| None)
                    } else {
                        writer
                            .create_node(ROOT_INO, name.as_bytes(), kind, 0o644, 0, me, None)
                            .map(Some)
                    }
                });
                if !way.held_before(&|| op.is_finished()) {
                    // The operation makes fewer calls than that: nothing lost.
                    return (owner, faults, op.join().unwrap());
                }
                crash(owner, &faults);
                let (disks, next_faults) = with_faults(&t);
                let next = FileSystem::mount(disks).unwrap();
                fence_over(&writer, &way, &next);
                way.release();
                (next, next_faults, op.join().unwrap())
            });
            let what = if unlink { "unlink" } else { "create" };
            let result = result.unwrap_or_else(|e| panic!("{what} losing answer {lose}: {e}"));
            owner = next;
            faults = next_faults;
            let found = owner.lookup(ROOT_INO, name.as_bytes());
            match result {
                Some(made) => assert_eq!(found.unwrap().ino, made.ino, "{name}"),
                None => assert!(matches!(found, Err(FsError::NotFound)), "{name}"),
            }
        }
    }
    writer.unmount().unwrap();
    owner.unmount().unwrap();
    drop((writer, owner));
    assert_fsck_clean(&t, "after six takeovers under namespace changes");
}

/// `fcntl` and `flock` locks of two mounts of one file system (the owner's and a
/// client's, as two nodes) exclude each other at the owner, each class by itself; a close
/// (`unlock_all`) frees one holder's locks only; a waiting lock is granted once the
/// holder lets go, or gives up with EINTR when interrupted; O_APPEND writes of both mounts
/// at once each land whole at an end of file of their own.
#[test]
fn locks_and_appends_of_two_mounts_exclude_each_other() {
    use tessera_fs::locks::{Lock, LockClass, LockKind, TO_END};
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let client = client_of(&t, &owner);
    let caller = tessera_fs::Caller { uid: 0, gid: 0 };
    let file = |name: &[u8]| {
        owner
            .create_node(
                ROOT_INO,
                name,
                tessera_fs::FileKind::Regular,
                0o644,
                0,
                caller,
                None,
            )
            .unwrap()
            .ino
    };
    let ino = file(b"locked");
    let lock = |fs: &FileSystem, owner: u64, class, start, end, kind| Lock {
        holder: fs.lock_holder(owner, class),
        start,
        end,
        kind,
        pid: 1,
    };

    // The owner's process 1 write-locks bytes 0..=99; the client's process 1 (another
    // node's process, the same lock owner number) cannot, but may lock 100.. and sees the
    // conflicting lock with F_GETLK.
    owner
        .lock_set(
            ino,
            lock(&owner, 1, LockClass::Posix, 0, 99, LockKind::Write),
            None,
        )
        .unwrap();
    let want = lock(&client, 1, LockClass::Posix, 50, 149, LockKind::Read);
    assert!(matches!(
        client.lock_set(ino, want, None),
        Err(FsError::WouldBlock)
    ));
    let seen = client.lock_test(ino, want).unwrap().expect("a conflict");
    assert_eq!((seen.start, seen.end, seen.kind), (0, 99, LockKind::Write));
    client
        .lock_set(
            ino,
            lock(&client, 1, LockClass::Posix, 100, TO_END, LockKind::Read),
            None,
        )
        .unwrap();
    // flock locks are another class: the client's exclusive flock is granted.
    client
        .lock_set(
            ino,
            lock(&client, 7, LockClass::Flock, 0, TO_END, LockKind::Write),
            None,
        )
        .unwrap();
    let theirs = lock(&owner, 8, LockClass::Flock, 0, TO_END, LockKind::Read);
    assert!(matches!(
        owner.lock_set(ino, theirs, None),
        Err(FsError::WouldBlock)
    ));

    // A waiting lock of the client is granted once the owner's process closes the file.
    let waiter = {
        let client = Arc::clone(&client);
        std::thread::spawn(move || {
            let w = lock(&client, 2, LockClass::Posix, 0, 9, LockKind::Write);
            client.lock_set(ino, w, Some(&|| false))
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !waiter.is_finished(),
        "granted while the owner's lock is held"
    );
    owner
        .unlock_all(ino, owner.lock_holder(1, LockClass::Posix))
        .unwrap();
    waiter.join().unwrap().unwrap();
    // An interrupted wait gives up with EINTR and leaves nothing behind.
    let w = lock(&owner, 3, LockClass::Posix, 0, 0, LockKind::Read);
    assert!(matches!(
        owner.lock_set(ino, w, Some(&|| true)),
        Err(FsError::Interrupted)
    ));
    assert!(owner
        .lock_test(
            ino,
            lock(&owner, 4, LockClass::Posix, 200, 300, LockKind::Read)
        )
        .unwrap()
        .is_none());
    // The client's flock goes with its last close; then the owner's is granted.
    client
        .unlock_all(ino, client.lock_holder(7, LockClass::Flock))
        .unwrap();
    owner.lock_set(ino, theirs, None).unwrap();

    // Appends from both mounts at once: every record whole, none over another.
    let log = file(b"appended");
    const RECORD: usize = 3000;
    let appenders: Vec<_> = [&owner, &client]
        .into_iter()
        .enumerate()
        .flat_map(|(m, fs)| (0..2).map(move |th| (m, th, Arc::clone(fs))))
        .map(|(m, th, fs)| {
            std::thread::spawn(move || {
                for i in 0..25u8 {
                    let tag = (m * 2 + th) as u8 * 32 + i;
                    fs.append(log, &[tag; RECORD], false).unwrap();
                }
            })
        })
        .collect();
    for a in appenders {
        a.join().unwrap();
    }
    let all = owner.read(log, 0, (RECORD * 200) as u32).unwrap();
    assert_records_whole_and_once(&all, RECORD, 100);

    client.unmount().unwrap();
    owner.unmount().unwrap();
}

/// `all`, a log of `count` appended records of `record` bytes each filled with its own
/// tag: every append landed past the others, none torn, overwritten or repeated.
fn assert_records_whole_and_once(all: &[u8], record: usize, count: usize) {
    assert_eq!(
        all.len(),
        record * count,
        "every append landed past the others"
    );
    let mut tags: Vec<u8> = all
        .chunks(record)
        .map(|r| {
            assert!(r.iter().all(|x| *x == r[0]), "a record torn or overwritten");
            r[0]
        })
        .collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), count, "each record once");
}

#[test]
fn a_lock_wait_that_would_deadlock_across_two_mounts_gets_edeadlk() {
    use tessera_fs::locks::{Lock, LockClass, LockKind};
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let client = client_of(&t, &owner);
    let ino = create_file(&owner, ROOT_INO, b"crossed").ino;
    let lock = |fs: &FileSystem, start, end, kind| Lock {
        holder: fs.lock_holder(1, LockClass::Posix),
        start,
        end,
        kind,
        pid: 1,
    };
    let never: &dyn Fn() -> bool = &|| false;
    // A process on each node holds one range, then the client's waits for the owner's.
    client
        .lock_set(ino, lock(&client, 0, 9, LockKind::Write), None)
        .unwrap();
    owner
        .lock_set(ino, lock(&owner, 20, 29, LockKind::Write), None)
        .unwrap();
    let waiter = {
        let client = client.clone();
        std::thread::spawn(move || {
            let never: &dyn Fn() -> bool = &|| false;
            client.lock_set(ino, lock(&client, 20, 29, LockKind::Write), Some(never))
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !waiter.is_finished(),
        "the client's wait ended while the owner holds the range"
    );
    // The owner's process waiting for the client's range would close the cycle.
    match owner.lock_set(ino, lock(&owner, 0, 9, LockKind::Write), Some(never)) {
        Err(e) => assert_eq!(e.errno(), libc::EDEADLK, "{e}"),
        Ok(()) => panic!("a wait that closes a cycle was granted"),
    }
    // The owner's process gives up its range: the client's wait is granted.
    owner
        .lock_set(
            ino,
            lock(&owner, 0, tessera_fs::locks::TO_END, LockKind::Unlock),
            None,
        )
        .unwrap();
    waiter
        .join()
        .unwrap()
        .expect("the client's wait is granted");
    // A wait that closes no cycle still waits and is granted.
    let waiter = {
        let owner = owner.clone();
        std::thread::spawn(move || {
            let never: &dyn Fn() -> bool = &|| false;
            owner.lock_set(ino, lock(&owner, 5, 5, LockKind::Read), Some(never))
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!waiter.is_finished());
    client
        .lock_set(
            ino,
            lock(&client, 0, tessera_fs::locks::TO_END, LockKind::Unlock),
            None,
        )
        .unwrap();
    waiter.join().unwrap().expect("a plain wait is granted");
}

/// The owner dies while a client's process holds a lock: the client hands its locks to
/// the node that takes over, at its fence, so the new owner refuses a conflicting lock
/// (two processes are never let into one locked range by a takeover), and the client's
/// close still frees it there.
#[test]
fn a_clients_locks_outlive_the_owners_death_through_its_fence() {
    use tessera_fs::locks::{Lock, LockClass, LockKind, TO_END};
    let t = make_disks(4, 64 << 20);
    let (first, faults, way, client) = owner_and_following_client(&t);
    let ino = create_file(&client, ROOT_INO, b"locked").ino;
    let mine = client.lock_holder(9, LockClass::Posix);
    let lock = |holder, kind| Lock {
        holder,
        start: 0,
        end: TO_END,
        kind,
        pid: 1,
    };
    client
        .lock_set(ino, lock(mine, LockKind::Write), None)
        .unwrap();
    crash(first, &faults);
    let (disks, _faults) = with_faults(&t);
    let second = FileSystem::mount(disks).unwrap();
    fence_over(&client, &way, &second);
    let other = second.lock_holder(1, LockClass::Posix);
    assert!(
        matches!(
            second.lock_set(ino, lock(other, LockKind::Read), None),
            Err(FsError::WouldBlock)
        ),
        "the new owner granted a lock over one the client holds"
    );
    client.unlock_all(ino, mine).unwrap();
    second
        .lock_set(ino, lock(other, LockKind::Read), None)
        .unwrap();
    client.unmount().unwrap();
    second.unmount().unwrap();
}

/// A file a client has open and unlinks outlives the owner's death: the new owner keeps
/// it until the client's fence has said it is open there, and frees it at the client's
/// last close. (A new owner that freed every inode unlinked while open, as a one-node
/// mount does, left the client reading a file that was gone.)
#[test]
fn a_file_unlinked_while_open_on_a_client_outlives_a_takeover() {
    let t = make_disks(4, 64 << 20);
    let (first, faults, way, client) = owner_and_following_client(&t);
    let a = create_file(&client, ROOT_INO, b"doomed");
    let data = pattern(300_000, 3);
    client.write(a.ino, 0, &data, false).unwrap();
    client.open(a.ino).unwrap();
    client.remove(ROOT_INO, b"doomed", false).unwrap();
    // Another file unlinked while open on the owner only: it goes with the owner.
    let b = create_file(&first, ROOT_INO, b"owners");
    first.open(b.ino).unwrap();
    first.remove(ROOT_INO, b"owners", false).unwrap();
    client.sync().unwrap();
    first.sync().unwrap();
    crash(first, &faults);
    let (disks, _faults) = with_faults(&t);
    let second = FileSystem::mount_keeping_orphans(disks).unwrap();
    fence_over(&client, &way, &second);
    second.reclaim_orphans().unwrap();
    assert!(
        matches!(second.getattr(b.ino), Err(FsError::NotFound)),
        "an inode unlinked while open on the dead owner alone stayed"
    );
    assert_eq!(second.getattr(a.ino).unwrap().nlink, 0);
    let back = client.read(a.ino, 0, data.len() as u32).unwrap();
    assert!(back == data, "the open file changed across the takeover");
    client.write(a.ino, 7, b"still writable", false).unwrap();
    client.release(a.ino).unwrap();
    assert!(
        matches!(second.getattr(a.ino), Err(FsError::NotFound)),
        "the file stayed after its last close"
    );
    client.unmount().unwrap();
    second.unmount().unwrap();
    assert_fsck_clean(&t, "after the takeover and the last close");
}

/// IOR's shared-file pattern from two mounts at once (the owner's and a client's, two
/// writers each): 47008-byte pieces interleaved by writer, so neighbours share blocks and
/// sectors. With data tokens each block is written by one node at a time: every piece
/// reads back whole, from either mount, and the file system checks clean. (Without them
/// the nodes' read-modify-writes and checksum records interleave: lost bytes and EIO.)
#[test]
fn writers_on_two_mounts_interleaving_one_file_lose_nothing() {
    // Twice: with a data token per write, and with the client keeping the file's token
    // until the owner's writers take it back.
    for keeping in [false, true] {
        writers_interleaving_one_file(keeping);
    }
}

fn writers_interleaving_one_file(keeping: bool) {
    const PIECE: usize = 47008;
    const WRITERS: usize = 4;
    const ROUNDS: usize = 40;
    let (t, owner, client) = two_shared_mounts(keeping);
    let ino = create_file(&owner, ROOT_INO, b"shared").ino;
    // The second pass overwrites what the first wrote: in-place writes of neighbouring
    // pieces from two mounts share a sector at each piece boundary.
    let piece = |w: usize, i: usize| pattern(PIECE, (ROUNDS * WRITERS + i * WRITERS + w) as u64);
    for pass in 0..2 {
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let fs = Arc::clone(if w % 2 == 0 { &owner } else { &client });
                std::thread::spawn(move || {
                    for i in 0..ROUNDS {
                        let at = ((i * WRITERS + w) * PIECE) as u64;
                        let seed = pass * ROUNDS * WRITERS + i * WRITERS + w;
                        fs.write(ino, at, &pattern(PIECE, seed as u64), false)
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
    }
    client.sync().unwrap();
    owner.sync().unwrap();
    for fs in [&owner, &client] {
        let all = fs.read(ino, 0, (PIECE * WRITERS * ROUNDS) as u32).unwrap();
        assert_eq!(all.len(), PIECE * WRITERS * ROUNDS);
        for (n, got) in all.chunks(PIECE).enumerate() {
            assert!(
                got == piece(n % WRITERS, n / WRITERS),
                "piece {n} lost or torn"
            );
        }
    }
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after interleaved writers on two mounts");
}

#[test]
fn holes_punched_on_one_mount_under_writes_on_another_leave_each_byte_whole() {
    // A hole punched into a block another node is writing: each byte ends up written or
    // zero, never garbage, and every sector verifies (the punch's zeroing writes and its
    // unmapping of whole blocks take the data tokens of what they cut). With tokens per
    // write and with the writer keeping the file's token.
    for keeping in [false, true] {
        holes_punched_under_writes(keeping);
    }
}

fn holes_punched_under_writes(keeping: bool) {
    const LEN: usize = 8 << 20;
    let (t, owner, client) = two_shared_mounts(keeping);
    let ino = create_file(&owner, ROOT_INO, b"punched").ino;
    let data = Arc::new(pattern(LEN, 77));
    client.write(ino, 0, &data, false).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, data, stop) = (Arc::clone(&client), Arc::clone(&data), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut at = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let len = 61_441.min(LEN - at);
                client
                    .write(ino, at as u64, &data[at..at + len], false)
                    .unwrap();
                at = (at + 196_613) % (LEN - 1);
            }
        })
    };
    let mut x = 12_345u64;
    for _ in 0..60 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let at = (x >> 20) % LEN as u64;
        let len = ((x >> 8) % (700 << 10)).max(1);
        let mode = tessera_fs::FALLOC_FL_PUNCH_HOLE | tessera_fs::FALLOC_FL_KEEP_SIZE;
        owner.fallocate(ino, at, len, mode).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    client.sync().unwrap();
    owner.sync().unwrap();
    for fs in [&owner, &client] {
        let got = fs.read(ino, 0, LEN as u32).unwrap();
        assert_eq!(got.len(), LEN);
        for (i, (g, d)) in got.iter().zip(data.iter()).enumerate() {
            assert!(
                *g == *d || *g == 0,
                "byte {i} is {g}, neither written ({d}) nor zero"
            );
        }
    }
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after holes punched under another mount's writes");
}

#[test]
fn small_files_written_from_two_mounts_at_once_keep_both_writes() {
    // Data small enough to live in the inode is rewritten whole by each write: two nodes
    // writing different bytes of one such file at once must not undo each other. With
    // tokens per write and with the client keeping a file's token.
    for keeping in [false, true] {
        small_files_from_two_mounts(keeping);
    }
}

fn small_files_from_two_mounts(keeping: bool) {
    let (t, owner, client) = two_shared_mounts(keeping);
    for round in 0..100u32 {
        let name = format!("small{round}");
        let ino = create_file(&owner, ROOT_INO, name.as_bytes()).ino;
        let writers: Vec<_> = [&owner, &client]
            .into_iter()
            .enumerate()
            .map(|(w, fs)| {
                let fs = Arc::clone(fs);
                std::thread::spawn(move || {
                    for k in 0..8u64 {
                        let at = (k * 2 + w as u64) * 100;
                        fs.write(ino, at, &[b'a' + w as u8; 100], false).unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let got = client.read(ino, 0, 4096).unwrap();
        assert_eq!(got.len(), 1600, "round {round}");
        for (piece, bytes) in got.chunks(100).enumerate() {
            let want = b'a' + (piece % 2) as u8;
            assert!(
                bytes.iter().all(|b| *b == want),
                "round {round}: piece {piece} lost its write"
            );
        }
    }
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after small files written from two mounts");
}

/// A fresh file system mounted by its owner and a client (shared mounts). With `keeping`
/// the owner takes the client for node 2 and can take back what it grants, so the client
/// keeps data tokens; without, every write of either takes a token of its own.
fn two_shared_mounts(keeping: bool) -> (TestDisks, Arc<FileSystem>, Arc<FileSystem>) {
    if keeping {
        let (t, owner, client, _, _) = owner_and_client_as_node_two();
        return (t, owner, client);
    }
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let client = client_of(&t, &owner);
    owner.set_shared(true);
    client.set_shared(true);
    (t, owner, client)
}

#[test]
fn a_client_keeps_a_files_data_token_until_another_mount_writes_it() {
    // A file one client writes costs it no token round trips after the first write; a
    // write on the owner's mount takes the token back before it starts, the client then
    // takes a token per write for a while, and both mounts read what a model says.
    use std::sync::atomic::Ordering::Relaxed;
    const PIECE: usize = 96 << 10;
    const PIECES: usize = 16;
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let ino = create_file(&owner, ROOT_INO, b"kept").ino;
    let mut model = vec![0u8; PIECE * PIECES];
    let write = |fs: &FileSystem, model: &mut Vec<u8>, at: usize, seed: u64| {
        let data = pattern(PIECE, seed);
        fs.write(ino, at as u64, &data, false).unwrap();
        model[at..at + PIECE].copy_from_slice(&data);
    };
    for i in 0..PIECES {
        write(&client, &mut model, i * PIECE, i as u64);
    }
    assert_eq!(
        client.kept_data_tokens(),
        1,
        "the client keeps the file's token"
    );
    // Overwrites in place: what each costs with the token kept.
    let before = calls.load(Relaxed);
    for i in 0..6 {
        write(&client, &mut model, i * PIECE, 100 + i as u64);
    }
    let with_kept = calls.load(Relaxed) - before;

    let revoked_before = revoked.load(Relaxed);
    write(&owner, &mut model, PIECE / 2, 200);
    assert!(
        revoked.load(Relaxed) > revoked_before,
        "the owner's write did not take the token back"
    );
    assert_eq!(client.kept_data_tokens(), 0, "the token was given back");
    // The same overwrites again, with a token per write (the client does not ask to keep
    // the token again for a second).
    let started = std::time::Instant::now();
    let before = calls.load(Relaxed);
    for i in 0..6 {
        write(&client, &mut model, i * PIECE, 300 + i as u64);
    }
    let per_write = calls.load(Relaxed) - before;
    if started.elapsed() < std::time::Duration::from_millis(500) {
        assert!(
            per_write >= with_kept + 2 * 6,
            "six writes under a kept token cost {with_kept} requests, with a token each \
             {per_write}: the kept token saved nothing"
        );
    }
    for fs in [&owner, &client] {
        assert!(fs.read(ino, 0, model.len() as u32).unwrap() == model);
    }
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a kept data token moved between mounts");
}

/// A client's way to an owner in this process that says which node the requests come
/// from (as the transport does), and counts them.
struct FromNode {
    owner: Weak<FileSystem>,
    origin: tessera_fs::locks::Origin,
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl MetanodeChannel for FromNode {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owner = self.owner.upgrade().expect("owner mounted");
        Ok(owner.serve_metanode_request_from(Some(self.origin), &request))
    }
}

/// A fresh file system mounted by its owner and by a client the owner takes for node 2
/// (shared mounts), with the count of the client's requests and of the inodes the owner
/// revoked from it (what it holds for reading, and the data tokens it keeps).
#[allow(clippy::type_complexity)]
fn owner_and_client_as_node_two() -> (
    TestDisks,
    Arc<FileSystem>,
    Arc<FileSystem>,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let origin = tessera_fs::locks::Origin {
        node: 2,
        incarnation: 1,
    };
    let channel = FromNode {
        owner: Arc::downgrade(&owner),
        origin,
        calls: Arc::clone(&calls),
    };
    let client = FileSystem::mount_client(t.reopen(), Box::new(channel)).unwrap();
    owner.set_shared(true);
    client.set_shared(true);
    let revoked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let (client, revoked) = (Arc::downgrade(&client), Arc::clone(&revoked));
        owner.on_read_revoke(Box::new(move |node, inos| {
            assert_eq!(node, origin);
            revoked.fetch_add(inos.len(), Relaxed);
            if let Some(client) = client.upgrade() {
                client.serve_metanode_request(&tessera_fs::Fence::drop_held(inos));
            }
        }));
    }
    {
        let (client, revoked) = (Arc::downgrade(&client), Arc::clone(&revoked));
        owner.on_data_revoke(Box::new(move |node, inos| {
            assert_eq!(node, origin);
            revoked.fetch_add(inos.len(), Relaxed);
            if let Some(client) = client.upgrade() {
                client.serve_metanode_request(&tessera_fs::Fence::give_back_data(inos));
            }
        }));
    }
    (t, owner, client, calls, revoked)
}

#[test]
fn a_client_keeps_views_until_the_owner_revokes_them_and_reads_every_completed_write() {
    // The client reads without asking the owner while nothing changed, and every read
    // after a write, truncate, punch or unlink and create on either mount returns what a
    // model of the file says.
    use std::sync::atomic::Ordering::Relaxed;
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let mut ino = create_file(&owner, ROOT_INO, b"f").ino;
    let mut model = pattern(3 << 20, 1);
    owner.write(ino, 0, &model, false).unwrap();
    let read_all =
        |fs: &FileSystem, ino: u64, len: usize| fs.read(ino, 0, len as u32 + 4096).unwrap();
    // The first read also sets the access time (relatime), which the next view shows.
    assert!(read_all(&client, ino, model.len()) == model);
    assert!(read_all(&client, ino, model.len()) == model);
    let before = calls.load(Relaxed);
    for _ in 0..10 {
        assert!(read_all(&client, ino, model.len()) == model);
    }
    assert_eq!(
        calls.load(Relaxed),
        before,
        "reads of an unchanged file asked the owner"
    );
    let mut x = 99u64;
    for step in 0..120u32 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1442695040888963407);
        let fs = if step % 2 == 0 { &owner } else { &client };
        match (x >> 60) % 8 {
            0..=3 => {
                let at = ((x >> 20) % (4 << 20)) as usize;
                let len = ((x >> 8) % 300_000 + 1) as usize;
                let data = pattern(len, u64::from(step) + 2);
                fs.write(ino, at as u64, &data, false).unwrap();
                if model.len() < at + len {
                    model.resize(at + len, 0);
                }
                model[at..at + len].copy_from_slice(&data);
            }
            4 => {
                let size = ((x >> 16) % (4 << 20)) as usize;
                fs.truncate(ino, size as u64).unwrap();
                model.resize(size, 0);
            }
            5 => {
                let at = ((x >> 20) % (4 << 20)) as usize;
                let len = ((x >> 8) % 600_000 + 1) as usize;
                let mode = tessera_fs::FALLOC_FL_PUNCH_HOLE | tessera_fs::FALLOC_FL_KEEP_SIZE;
                fs.fallocate(ino, at as u64, len as u64, mode).unwrap();
                let end = (at + len).min(model.len());
                if at < end {
                    model[at..end].fill(0);
                }
            }
            6 => {
                // The inode number may come back for the new file.
                fs.remove(ROOT_INO, b"f", false).unwrap();
                ino = create_file(fs, ROOT_INO, b"f").ino;
                model = pattern(200_000 + (x % 1000) as usize, u64::from(step) + 500);
                fs.write(ino, 0, &model, false).unwrap();
            }
            _ => {}
        }
        for (name, reader) in [("owner", &owner), ("client", &client)] {
            let got = read_all(reader, ino, model.len());
            assert!(
                got == model,
                "step {step}: the {name} read {} bytes that differ from the {} written",
                got.len(),
                model.len()
            );
        }
    }
    assert!(revoked.load(Relaxed) > 0, "the owner never revoked a view");
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a client held views");
}

#[test]
fn a_client_keeps_names_and_attributes_until_the_owner_revokes_them() {
    // Lookups, attributes and permission checks of a client come from what it holds while
    // nothing changed, and after every create, unlink, rename, chmod, chown, write and
    // truncate on either mount the client sees what the owner sees.
    use std::sync::atomic::Ordering::Relaxed;
    use tessera_fs::access::Credentials;
    use tessera_fs::{Caller, FileKind, SetAttr};
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let root = Caller { uid: 0, gid: 0 };
    let d = owner
        .create_node(ROOT_INO, b"d", FileKind::Directory, 0o755, 0, root, None)
        .unwrap()
        .ino;
    create_file(&owner, d, b"n0");
    let names: Vec<Vec<u8>> = (0..4).map(|i| format!("n{i}").into_bytes()).collect();
    let user = Credentials::new(1000, 1000, 1);
    // What a mount says of the directory: each name's inode, mode, owner and size, and
    // whether user 1000 may create in it.
    let look = |fs: &FileSystem| {
        let entries: Vec<Option<(u64, u32, u32, u64)>> = names
            .iter()
            .map(|n| {
                fs.lookup(d, n).ok().map(|a| {
                    let again = fs.getattr(a.ino).unwrap();
                    assert_eq!(again.size, a.size, "lookup and getattr disagree");
                    (a.ino, u32::from(again.perm), again.uid, again.size)
                })
            })
            .collect();
        let may = fs.may_use_dir(d, &user, 2 | 1).is_ok();
        (entries, may, fs.getattr(d).unwrap().nlink)
    };
    assert_eq!(look(&client), look(&owner));
    let before = calls.load(Relaxed);
    for _ in 0..10 {
        assert_eq!(look(&client), look(&owner));
    }
    assert_eq!(
        calls.load(Relaxed),
        before,
        "lookups, attributes and permission checks of an unchanged directory asked the owner"
    );
    // Past the window in which a just-revoked inode is not granted again.
    let quiet = || std::thread::sleep(std::time::Duration::from_millis(300));
    let mut x = 7u64;
    for step in 0..80u32 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1442695040888963407);
        let fs = if step % 3 == 0 { &owner } else { &client };
        let name = &names[((x >> 33) % 4) as usize];
        let other = &names[((x >> 40) % 4) as usize];
        let _ = match (x >> 60) % 7 {
            0 => fs
                .create_node(d, name, FileKind::Regular, 0o644, 0, root, None)
                .map(drop),
            1 => fs.remove(d, name, false),
            2 => fs.rename(d, name, d, other, false, false),
            3 => fs.lookup(d, name).and_then(|a| {
                let set = SetAttr {
                    mode: Some((x >> 8) as u32 & 0o777),
                    ..SetAttr::default()
                };
                fs.setattr(a.ino, set).map(drop)
            }),
            4 => fs.lookup(d, name).and_then(|a| {
                let data = pattern(((x >> 12) % 9000) as usize + 1, u64::from(step));
                fs.write(a.ino, (x >> 20) % 5000, &data, false).map(drop)
            }),
            5 => {
                let set = SetAttr {
                    mode: Some(if x & 1 == 0 { 0o755 } else { 0o777 }),
                    uid: Some(if x & 2 == 0 { 0 } else { 1000 }),
                    ..SetAttr::default()
                };
                fs.setattr(d, set).map(drop)
            }
            _ => fs
                .lookup(d, name)
                .and_then(|a| fs.truncate(a.ino, (x >> 24) % 3000)),
        };
        assert_eq!(look(&client), look(&owner), "step {step}");
        if step % 10 == 9 {
            quiet();
            assert_eq!(look(&client), look(&owner), "step {step}, quiet");
        }
    }
    assert!(
        revoked.load(Relaxed) > 0,
        "the owner never revoked anything"
    );
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a client held names and attributes");
}

#[test]
fn a_reader_holding_views_sees_every_completed_overwrite() {
    // An owner overwrites random ranges in place (logged intent, write, settle) while a
    // client that keeps its views reads: every word read is no older than the last write
    // covering it that returned before the read began. Read-ahead slots read before an
    // overwrite landed must not pass as current through a view kept from before it.
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const WORDS: usize = (3 << 20) / 8;
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let origin = tessera_fs::locks::Origin {
        node: 2,
        incarnation: 1,
    };
    let channel = FromNode {
        owner: Arc::downgrade(&owner),
        origin,
        calls: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    };
    let client = FileSystem::mount_client(t.reopen(), Box::new(channel)).unwrap();
    owner.set_shared(true);
    client.set_shared(true);
    {
        let client = Arc::downgrade(&client);
        owner.on_read_revoke(Box::new(move |_, inos| {
            if let Some(client) = client.upgrade() {
                client.serve_metanode_request(&tessera_fs::Fence::drop_held(inos));
            }
        }));
    }
    let word = |version: u64, index: usize| (version << 40 | index as u64).to_le_bytes();
    let ino = create_file(&owner, ROOT_INO, b"coherent").ino;
    let initial: Vec<u8> = (0..WORDS).flat_map(|i| word(0, i)).collect();
    owner.write(ino, 0, &initial, false).unwrap();
    let done = parking_lot::Mutex::new(vec![0u32; WORDS]);
    let started = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (done, started, stop, client) = (&done, &started, &stop, &client);
        let reader = scope.spawn(move || {
            let mut x = 7u64;
            let mut reads = 0;
            while !stop.load(Ordering::Acquire) {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let first = (x >> 33) as usize % WORDS;
                let count = ((x >> 13) as usize % 40_000 + 1).min(WORDS - first);
                let floor: Vec<u32> = done.lock()[first..first + count].to_vec();
                let got = client
                    .read(ino, first as u64 * 8, count as u32 * 8)
                    .unwrap();
                let ceiling = started.load(Ordering::Acquire);
                for (i, w) in got.chunks(8).enumerate() {
                    let v = u64::from_le_bytes(w.try_into().unwrap());
                    let (version, index) = (v >> 40, (v & ((1 << 40) - 1)) as usize);
                    assert_eq!(index, first + i, "a torn or misplaced word");
                    assert!(
                        version >= u64::from(floor[i]) && version <= ceiling,
                        "word {} has write {version}; writes {} to {ceiling} could be there",
                        first + i,
                        floor[i]
                    );
                }
                reads += 1;
            }
            reads
        });
        let mut x = 3u64;
        for n in 1..=1000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let first = (x >> 33) as usize % WORDS;
            let count = ((x >> 13) as usize % 20_000 + 1).min(WORDS - first);
            let data: Vec<u8> = (first..first + count).flat_map(|i| word(n, i)).collect();
            started.store(n, Ordering::Release);
            owner.write(ino, first as u64 * 8, &data, false).unwrap();
            done.lock()[first..first + count].fill(n as u32);
        }
        stop.store(true, Ordering::Release);
        assert!(reader.join().unwrap() > 10, "the reader hardly read");
    });
    client.unmount().unwrap();
    owner.unmount().unwrap();
}

#[test]
fn a_client_knows_every_name_of_a_directory_it_made() {
    // A directory a client made is empty, and the client's own creates and unlinks in it
    // say what each name became: looking up a new name there (what every create's lookup
    // does) asks the owner nothing, and what other mounts change is seen at once.
    use std::sync::atomic::Ordering::Relaxed;
    use tessera_fs::{Caller, FileKind};
    let root = Caller { uid: 0, gid: 0 };
    let (t, owner, client, calls, _) = owner_and_client_as_node_two();
    let dir = client
        .create_node(ROOT_INO, b"mine", FileKind::Directory, 0o755, 0, root, None)
        .unwrap()
        .ino;
    let asks = |what: &dyn Fn()| {
        let before = calls.load(Relaxed);
        what();
        calls.load(Relaxed) - before
    };
    for i in 0..20 {
        let name = format!("f{i}");
        let asked = asks(&|| {
            assert!(matches!(
                client.lookup(dir, name.as_bytes()),
                Err(FsError::NotFound)
            ))
        });
        assert_eq!(asked, 0, "the lookup of new name {name} asked the owner");
        create_file(&client, dir, name.as_bytes());
        let asked = asks(&|| assert!(client.lookup(dir, name.as_bytes()).is_ok()));
        assert_eq!(asked, 0, "the lookup of {name}, made here, asked the owner");
    }
    client.remove(dir, b"f3", false).unwrap();
    let asked = asks(&|| assert!(matches!(client.lookup(dir, b"f3"), Err(FsError::NotFound))));
    assert_eq!(
        asked, 0,
        "the lookup of a name unlinked here asked the owner"
    );
    // Another mount's changes revoke the directory: seen at once.
    create_file(&owner, dir, b"from-owner");
    assert!(client.lookup(dir, b"from-owner").is_ok());
    owner.remove(dir, b"f4", false).unwrap();
    assert!(matches!(client.lookup(dir, b"f4"), Err(FsError::NotFound)));
    // A rename here does not say whether it replaced a name: the directory is no longer
    // known whole, and a new name is asked for.
    client.rename(dir, b"f5", dir, b"g5", false, false).unwrap();
    assert!(client.lookup(dir, b"g5").is_ok());
    assert!(matches!(client.lookup(dir, b"f5"), Err(FsError::NotFound)));
    let asked = asks(&|| assert!(matches!(client.lookup(dir, b"new"), Err(FsError::NotFound))));
    assert!(
        asked > 0,
        "after a rename a new name was answered from the client's copy"
    );
    // Both mounts list the same names.
    let names = |fs: &FileSystem| {
        let mut n: Vec<Vec<u8>> = fs
            .readdir(dir, 0)
            .unwrap()
            .entries
            .into_iter()
            .map(|(_, _, _, name)| name)
            .filter(|n| n != b"." && n != b"..")
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&client), names(&owner));
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after creates and unlinks in a directory a client made");
}

#[test]
fn a_client_gives_back_its_kept_data_tokens_when_it_unmounts() {
    // Otherwise the owner would keep them recorded for a mount that is gone, and take each
    // back with a revocation the next time another mount writes the file. So with the read
    // tokens: the owner forgets what the node held (before, each stayed recorded until a
    // change revoked it, and a client that had read many files left the owner's bounded
    // table full).
    use std::sync::atomic::Ordering::Relaxed;
    let (t, owner, client, _, revoked) = owner_and_client_as_node_two();
    let inos: Vec<u64> = (0..5)
        .map(|i| {
            let ino = create_file(&client, ROOT_INO, format!("u{i}").as_bytes()).ino;
            client.write(ino, 0, &[i as u8; 5000], false).unwrap();
            ino
        })
        .collect();
    assert_eq!(owner.kept_data_tokens_granted(), 5);
    for ino in &inos {
        assert_eq!(client.read(*ino, 0, 5000).unwrap().len(), 5000);
        client.getattr(*ino).unwrap();
    }
    assert!(owner.read_tokens_granted() >= inos.len());
    client.unmount().unwrap();
    assert_eq!(client.kept_data_tokens(), 0);
    assert_eq!(
        owner.kept_data_tokens_granted(),
        0,
        "kept tokens outlived the mount"
    );
    assert_eq!(
        owner.read_tokens_granted(),
        0,
        "read tokens outlived the mount"
    );
    // The owner's writes meet no kept token and revoke nothing.
    let before = revoked.load(Relaxed);
    for ino in &inos {
        owner.write(*ino, 10, b"after", false).unwrap();
    }
    assert_eq!(owner.kept_data_tokens_granted(), 0);
    assert_eq!(
        revoked.load(Relaxed),
        before,
        "revocations sent to a mount that is gone"
    );
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a client unmounted with kept tokens");
}

#[test]
fn a_client_that_wrote_more_files_than_it_keeps_tokens_for_gives_some_back() {
    // At most 4,096 kept data tokens per mount: when the table is full, 256 that no write
    // is using go back to the owner in one request, and the new file's token still comes
    // with its create, so a long-running writer of many files keeps writing without token
    // round trips and the owner's table stays bounded.
    use std::sync::atomic::Ordering::Relaxed;
    const FILES: usize = 4_100;
    let (t, owner, client, _, revoked) = owner_and_client_as_node_two();
    let asked = |kind: &str| -> u64 {
        client
            .metanode_requests()
            .iter()
            .filter(|(_, k, _, _)| *k == kind)
            .map(|(_, _, n, _)| n)
            .sum()
    };
    // As the kernel creates a file for `open(O_CREAT)`: the token comes with the create.
    let create_and_write = |i: usize| {
        let name = format!("f{i}");
        let ino = client
            .create_open(
                ROOT_INO,
                name.as_bytes(),
                (0o644, 0),
                tessera_fs::Caller { uid: 0, gid: 0 },
            )
            .unwrap()
            .ino;
        client.write(ino, 0, &[i as u8; 100], false).unwrap();
        client.release(ino).unwrap();
        ino
    };
    let mut inos: Vec<u64> = (0..4_096).map(create_and_write).collect();
    assert_eq!(client.kept_data_tokens(), 4_096);
    let (locks, drops) = (asked("Lock"), asked("DropKept"));
    inos.extend((4_096..FILES).map(create_and_write));
    assert_eq!(client.kept_data_tokens(), 4_096 - 256 + 4);
    assert_eq!(
        (asked("Lock") - locks, asked("DropKept") - drops),
        (0, 1),
        "past the bound: one batch given back, no token asked per file"
    );
    assert_eq!(
        owner.kept_data_tokens_granted(),
        4_096 - 256 + 4,
        "the tokens given back are gone at the owner"
    );
    // Writes on the owner's mount to every file take back those still kept.
    let before = revoked.load(Relaxed);
    for (i, ino) in inos.iter().enumerate() {
        owner.write(*ino, 100, &[!(i as u8); 10], false).unwrap();
    }
    assert!(revoked.load(Relaxed) > before);
    assert_eq!(client.kept_data_tokens(), 0);
    assert_eq!(owner.kept_data_tokens_granted(), 0);
    for (i, ino) in inos.iter().enumerate().step_by(97) {
        let mut want = vec![i as u8; 100];
        want.extend_from_slice(&[!(i as u8); 10]);
        assert_eq!(client.read(*ino, 0, 4096).unwrap(), want, "file {i}");
    }
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a client gave kept tokens back");
}

/// Directory `d` in the root, made by `owner`, that everyone may write in.
fn open_directory(owner: &FileSystem) -> tessera_fs::Ino {
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    owner
        .create_node(
            ROOT_INO,
            b"d",
            tessera_fs::FileKind::Directory,
            0o777,
            0,
            root,
            None,
        )
        .unwrap()
        .ino
}

/// mdtest's hard pattern on a client: a create followed by a small write. The owner hands
/// the new file's view and its data token over with the create, so the write asks for
/// neither (it allocates and maps its block: two requests; the release tells the owner the
/// file is closed). The data token is the client's as if it had asked: a write by the
/// owner takes it back first, and each mount reads the other's write.
#[test]
fn a_clients_create_hands_it_the_new_files_view_and_data_token() {
    use std::sync::atomic::Ordering::Relaxed;
    use tessera_fs::Caller;
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let dir = open_directory(&owner);
    let data = pattern(3901, 5);
    let mut files = Vec::new();
    for i in 0..20 {
        let before = calls.load(Relaxed);
        let name = format!("f{i}");
        let a = client
            .create_open(dir, name.as_bytes(), (0o644, 0), Caller { uid: 0, gid: 0 })
            .unwrap();
        client.write(a.ino, 0, &data, false).unwrap();
        client.release(a.ino).unwrap();
        let asked = calls.load(Relaxed) - before;
        assert!(
            asked <= 4,
            "file {i}: {asked} requests (make, allocate, map, closed at most)"
        );
        files.push(a.ino);
    }
    assert_eq!(client.kept_data_tokens(), 20);
    assert_eq!(owner.kept_data_tokens_granted(), 20);
    for &ino in &files {
        assert!(owner.read(ino, 0, 4096).unwrap() == data);
    }
    let before = revoked.load(Relaxed);
    owner.write(files[3], 10, b"the owner", false).unwrap();
    assert!(
        revoked.load(Relaxed) > before,
        "the owner's write took the token back"
    );
    assert_eq!(&client.read(files[3], 10, 9).unwrap()[..], b"the owner");
    assert_eq!(client.kept_data_tokens(), 19);
    client.unmount().unwrap();
    assert_eq!(owner.kept_data_tokens_granted(), 0, "given back at unmount");
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after creates that kept their data tokens");
}

/// A directory's protection (kind, mode, owner, group, ACL) is held under a token of its
/// own: while the owner creates and removes names in the directory (which revokes its
/// names and attributes every time), a client's permission checks there ask the owner
/// nothing; a chmod and a chown revoke it, and the client's next check sees them.
#[test]
fn a_directorys_protection_is_held_while_its_names_change() {
    use std::sync::atomic::Ordering::Relaxed;
    use tessera_fs::access::{Credentials, MAY_EXEC, MAY_WRITE};
    use tessera_fs::SetAttr;
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let dir = open_directory(&owner);
    let user = Credentials::new(1000, 1000, 1);
    client
        .may_use_dir(dir, &user, MAY_WRITE | MAY_EXEC)
        .unwrap();
    let before = (calls.load(Relaxed), revoked.load(Relaxed));
    for i in 0..10 {
        let name = format!("f{i}");
        create_file(&owner, dir, name.as_bytes());
        client
            .may_use_dir(dir, &user, MAY_WRITE | MAY_EXEC)
            .unwrap();
        owner.remove(dir, name.as_bytes(), false).unwrap();
        client
            .may_use_dir(dir, &user, MAY_WRITE | MAY_EXEC)
            .unwrap();
    }
    assert_eq!(
        (calls.load(Relaxed), revoked.load(Relaxed)),
        before,
        "no request, no revocation for the checks between the owner's creates"
    );
    owner
        .setattr(
            dir,
            SetAttr {
                mode: Some(0o755),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert!(
        revoked.load(Relaxed) > before.1,
        "the chmod revoked the protection"
    );
    assert!(matches!(
        client.may_use_dir(dir, &user, MAY_WRITE | MAY_EXEC),
        Err(FsError::PermissionDenied)
    ));
    client.may_use_dir(dir, &user, MAY_EXEC).unwrap();
    owner
        .setattr(
            dir,
            SetAttr {
                uid: Some(1000),
                ..SetAttr::default()
            },
        )
        .unwrap();
    client
        .may_use_dir(dir, &user, MAY_WRITE | MAY_EXEC)
        .unwrap();
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after protection tokens");
}

/// IO500's mdtest hard from a client: it creates files in a directory the owner creates
/// in too, so the directory's names are never granted whole; each name the client made
/// (or found) is held under a token of its own, so its lookups of them ask nothing and its
/// kernel may keep them, while the owner's creates of other names revoke nothing. An
/// unlink, a rename or a new file under the name on the owner revokes it, and the
/// client's next lookup sees what the owner did.
#[test]
fn a_client_keeps_the_names_it_made_in_a_directory_others_create_in() {
    use std::sync::atomic::Ordering::Relaxed;
    use tessera_fs::Caller;
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let dir = open_directory(&owner);
    let root = Caller { uid: 0, gid: 0 };
    // The client looks into the directory (its token granted), then the owner creates
    // there: revoked, and not granted again while the owner goes on creating.
    assert!(matches!(client.lookup(dir, b"o0"), Err(FsError::NotFound)));
    let mut made = Vec::new();
    for i in 0..20 {
        create_file(&owner, dir, format!("o{i}").as_bytes());
        let a = client
            .create_open(dir, format!("f{i}").as_bytes(), (0o644, 0), root)
            .unwrap();
        client.write(a.ino, 0, &pattern(3901, i), false).unwrap();
        client.release(a.ino).unwrap();
        made.push(a.ino);
    }
    assert!(
        revoked.load(Relaxed) > 0,
        "the owner's creates revoked the directory"
    );
    let before = (calls.load(Relaxed), revoked.load(Relaxed));
    for round in 0..3 {
        for (i, &ino) in made.iter().enumerate() {
            let name = format!("f{i}");
            let a = client.lookup(dir, name.as_bytes()).unwrap();
            assert_eq!((a.ino, a.size), (ino, 3901), "{name}");
            assert!(
                client.kernel_may_keep_name(dir, name.as_bytes(), ino),
                "{name}"
            );
        }
        // The owner's creates of other names change the directory, not these names.
        create_file(&owner, dir, format!("p{round}").as_bytes());
    }
    assert_eq!(
        (calls.load(Relaxed), revoked.load(Relaxed)),
        before,
        "lookups of names the client made asked the owner, or other names' creates revoked them"
    );
    // The owner removes one, renames another and makes a new file under a third's name
    // after removing it: each revokes that name alone.
    owner.remove(dir, b"f3", false).unwrap();
    assert!(
        revoked.load(Relaxed) > before.1,
        "the unlink revoked the name"
    );
    assert!(matches!(client.lookup(dir, b"f3"), Err(FsError::NotFound)));
    assert!(!client.kernel_may_keep_name(dir, b"f3", made[3]));
    owner.rename(dir, b"f4", dir, b"g4", false, false).unwrap();
    assert!(matches!(client.lookup(dir, b"f4"), Err(FsError::NotFound)));
    assert_eq!(client.lookup(dir, b"g4").unwrap().ino, made[4]);
    owner.remove(dir, b"f5", false).unwrap();
    let again = create_file(&owner, dir, b"f5").ino;
    assert_ne!(again, made[5]);
    assert_eq!(client.lookup(dir, b"f5").unwrap().ino, again);
    // The client's own unlink leaves it nothing stale either.
    client.remove(dir, b"f6", false).unwrap();
    assert!(matches!(client.lookup(dir, b"f6"), Err(FsError::NotFound)));
    assert!(matches!(owner.lookup(dir, b"f6"), Err(FsError::NotFound)));
    // The names the owner did not touch are still the client's without asking.
    let before = calls.load(Relaxed);
    assert_eq!(client.lookup(dir, b"f7").unwrap().ino, made[7]);
    assert_eq!(calls.load(Relaxed), before);
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after names held under their own tokens");
}

/// The owner answers a client's creates, renames, links and unlinks as soon as they are
/// logged, before its log commits them (`early_answer.rs`), and dies before any commit:
/// the client hands them to the new owner at its fence, which does again each one the
/// dead owner's log lost, a create under the inode number the client was told. Every
/// name then names what the client was told, its data reads back, nothing it removed is
/// back, and all of it survives a crash of the new owner after the client's fsync. An
/// unlink of a name the owner's own process made and had not committed is answered only
/// after a commit (commit on share): the dead owner's process is gone, and the unlink
/// must not depend on what died with it.
#[test]
fn namespace_changes_answered_before_their_commit_survive_the_owners_death() {
    let t = make_disks(4, 64 << 20);
    let (first, faults, way, writer) = owner_and_following_client(&t);
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    let dir = writer
        .create_node(
            ROOT_INO,
            b"d",
            tessera_fs::FileKind::Directory,
            0o755,
            0,
            root,
            None,
        )
        .unwrap()
        .ino;
    writer.sync().unwrap();
    // The owner's own process makes a name the client then removes: answered after a
    // commit.
    create_file(&first, dir, b"local");
    writer.remove(dir, b"local", false).unwrap();
    let mut expected: BTreeMap<Vec<u8>, (u64, Vec<u8>)> = BTreeMap::new();
    for i in 0..8u64 {
        let name = format!("a{i}").into_bytes();
        let a = create_file(&writer, dir, &name);
        let data = pattern(3901 + i as usize * 100, i);
        writer.write(a.ino, 0, &data, false).unwrap();
        expected.insert(name, (a.ino, data));
    }
    writer.rename(dir, b"a1", dir, b"b1", false, false).unwrap();
    let moved = expected.remove(&b"a1"[..]).unwrap();
    expected.insert(b"b1".to_vec(), moved);
    let linked = expected[&b"a2"[..]].clone();
    writer.link(linked.0, dir, b"c2").unwrap();
    expected.insert(b"c2".to_vec(), linked);
    writer.remove(dir, b"a3", false).unwrap();
    expected.remove(&b"a3"[..]);
    let sub = writer
        .create_node(
            dir,
            b"sub",
            tessera_fs::FileKind::Directory,
            0o755,
            0,
            root,
            None,
        )
        .unwrap()
        .ino;
    let x = create_file(&writer, sub, b"x");
    writer.rename(sub, b"x", dir, b"x2", false, false).unwrap();
    expected.insert(b"x2".to_vec(), (x.ino, Vec::new()));
    // And a directory the client then makes a file in: answered after a commit too.
    let od = first
        .create_node(
            dir,
            b"od",
            tessera_fs::FileKind::Directory,
            0o755,
            0,
            root,
            None,
        )
        .unwrap()
        .ino;
    let in_od = create_file(&writer, od, b"f").ino;
    let look = |fs: &FileSystem| {
        for (name, (ino, data)) in &expected {
            let what = String::from_utf8_lossy(name);
            let a = fs
                .lookup(dir, name)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(a.ino, *ino, "{what}: another inode");
            let got = fs.read(a.ino, 0, data.len() as u32 + 10).unwrap();
            assert!(got == *data, "{what}: content differs");
        }
        for gone in [&b"a1"[..], b"a3", b"local"] {
            assert!(
                matches!(fs.lookup(dir, gone), Err(FsError::NotFound)),
                "{} is back",
                String::from_utf8_lossy(gone)
            );
        }
        assert_eq!(fs.lookup(od, b"f").unwrap().ino, in_od);
        assert_eq!(fs.getattr(sub).unwrap().nlink, 2);
        assert_eq!(fs.getattr(expected[&b"c2"[..]].0).unwrap().nlink, 2);
    };
    look(&writer);
    crash(first, &faults);
    let (disks, faults) = with_faults(&t);
    let second = FileSystem::mount(disks).unwrap();
    assert!(
        fence_over(&writer, &way, &second) >= 10,
        "the namespace changes were handed over"
    );
    look(&second);
    look(&writer);
    writer.fsync(ROOT_INO).unwrap();
    crash(second, &faults);
    drop(writer);
    assert_fsck_clean(&t, "after namespace changes done again by a new owner");
    let third = mount(&t);
    look(&third);
    third.unmount().unwrap();
}

/// A client reading a file in order asks the owner one view for many blocks (kept under
/// the file's token) instead of one per read, and still reads every completed write of
/// another mount: the owner's overwrite revokes the view first.
#[test]
fn a_sequential_reader_on_a_client_asks_one_view_for_many_blocks() {
    use std::sync::atomic::Ordering::Relaxed;
    let (t, owner, client, calls, revoked) = owner_and_client_as_node_two();
    let ino = create_file(&owner, ROOT_INO, b"big").ino;
    let mut data = pattern(40 * BLOCK as usize, 3);
    owner.write(ino, 0, &data, false).unwrap();
    owner.sync().unwrap();
    let len = data.len();
    let read_all = |fs: &FileSystem| {
        let mut got = Vec::new();
        for off in (0..len).step_by(100_000) {
            got.extend(fs.read(ino, off as u64, 100_000).unwrap());
        }
        got
    };
    let before = calls.load(Relaxed);
    assert!(read_all(&client) == data);
    let asked = calls.load(Relaxed) - before;
    assert!(
        asked <= 8,
        "{asked} requests to read 40 blocks in order, 100,000 bytes at a time"
    );
    let before = revoked.load(Relaxed);
    owner.write(ino, 20 * BLOCK + 7, b"changed", false).unwrap();
    data[20 * BLOCK as usize + 7..20 * BLOCK as usize + 14].copy_from_slice(b"changed");
    assert!(
        revoked.load(Relaxed) > before,
        "the overwrite revoked the view"
    );
    assert!(read_all(&client) == data);
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a sequential reader on a client");
}

/// Small new files written on a client take their fragments from a reserve the owner
/// gives sixteen at a time (one `AllocateFragments` per sixteen files, no `Allocate`),
/// read back whole on the owner, and what the client did not use goes back to the owner
/// when it unmounts.
#[test]
fn a_clients_small_files_take_fragments_from_a_reserve_it_gives_back_when_it_leaves() {
    let (t, owner, client, _calls, _revoked) = owner_and_client_as_node_two();
    let asked = |kind: &str| -> u64 {
        client
            .metanode_requests()
            .iter()
            .filter(|(_, k, _, _)| *k == kind)
            .map(|(_, _, n, _)| *n)
            .sum()
    };
    let mut files = BTreeMap::new();
    for i in 0..40u64 {
        let name = format!("small{i}");
        let a = create_file(&client, ROOT_INO, name.as_bytes());
        let data = pattern(5000, 100 + i);
        client.write(a.ino, 0, &data, false).unwrap();
        files.insert(name, data);
    }
    assert_eq!(asked("Allocate"), 0, "no fragment asked for alone");
    assert_eq!(
        asked("AllocateFragments"),
        3,
        "sixteen fragments per request for forty files"
    );
    client.sync().unwrap();
    verify(&owner, &files);
    let held = owner.statfs();
    client.unmount().unwrap();
    let freed = owner.statfs().fragments_free - held.fragments_free;
    assert_eq!(
        freed * held.fragment_bytes,
        8 * (BLOCK / 32),
        "the eight one-sub-block fragments the client did not use are free again"
    );
    verify(&owner, &files);
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after small files from a client's reserve");
}

/// A file grown one small fsynced append at a time from a client needs a larger fragment
/// at every sub-block it crosses; none of them comes from the client's reserve (asking
/// ahead for each size held fifteen spares of every size, many times the file, until the
/// drives were full: ENOSPC with most of the space free), and small files of many sizes
/// ask ahead only as far as the reserve's bound.
#[test]
fn a_file_grown_by_small_appends_on_a_client_holds_only_its_own_space() {
    let (t, owner, client, _calls, _revoked) = owner_and_client_as_node_two();
    let used = || used(&owner).iter().sum::<u64>();
    let before = used();
    let a = create_file(&client, ROOT_INO, b"log");
    let mut expect = Vec::new();
    for i in 0..(BLOCK / 1024 - 1) {
        let piece = pattern(1024, i);
        client.append(a.ino, &piece, true).unwrap();
        expect.extend_from_slice(&piece);
    }
    owner.sync().unwrap();
    let grown = used() - before;
    // The file's block and the metadata pages its updates dirtied.
    assert!(
        grown <= 2 * BLOCK,
        "a file of {} bytes holds {grown} bytes of space",
        expect.len()
    );
    assert!(owner.read(a.ino, 0, BLOCK as u32).unwrap() == expect);
    // One small file of each size: the reserve asks ahead for sixteen of the first sizes,
    // fewer as it fills, never more than its bound in all.
    let mut files = BTreeMap::new();
    for size in 1..32u64 {
        let name = format!("sized{size}");
        let f = create_file(&client, ROOT_INO, name.as_bytes());
        let data = pattern((size * (BLOCK / 32)) as usize - 100, size);
        client.write(f.ino, 0, &data, false).unwrap();
        files.insert(name, data);
    }
    client.sync().unwrap();
    owner.sync().unwrap();
    let written: u64 = (1..32u64).map(|size| size * (BLOCK / 32)).sum();
    let held = used() - before - grown - written;
    assert!(
        held <= 1024 * (BLOCK / 32),
        "the client's reserve holds {held} bytes beyond what its files use"
    );
    verify(&owner, &files);
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a file grown by appends from a client");
}

/// The owner dies while a client holds fragments it gave ahead: they were never logged,
/// so the new owner holds them free and gives them out itself. The client must not use
/// them after the fence. The new owner fills the file system with whole blocks, frees one
/// file's, and writes small files, which take the free fragments of partly used blocks
/// (those included) first; the client's next small files get fragments of the new owner
/// (or no space), and every file of both reads back whole.
#[test]
fn fragments_given_ahead_by_a_dead_owner_are_not_used_after_the_takeover() {
    let t = make_disks(4, 64 << 20);
    let (first, faults, way, writer) = owner_and_following_client(&t);
    let mut files = BTreeMap::new();
    let write_small = |fs: &FileSystem, name: &str, seed: u64| -> FsResult<Vec<u8>> {
        let root = tessera_fs::Caller { uid: 0, gid: 0 };
        let kind = tessera_fs::FileKind::Regular;
        let a = fs.create_node(ROOT_INO, name.as_bytes(), kind, 0o644, 0, root, None)?;
        let data = pattern(5000, seed);
        match fs.write(a.ino, 0, &data, false) {
            Ok(_) => Ok(data),
            Err(e) => {
                fs.remove(ROOT_INO, name.as_bytes(), false).unwrap();
                Err(e)
            }
        }
    };
    for i in 0..3 {
        let name = format!("before{i}");
        files.insert(name.clone(), write_small(&writer, &name, i).unwrap());
    }
    writer.sync().unwrap();
    crash(first, &faults);
    let (disks, faults) = with_faults(&t);
    let second = FileSystem::mount(disks).unwrap();
    fence_over(&writer, &way, &second);
    // Whole blocks everywhere, then one file's blocks free again for the checkpoints;
    // small files fill partly used blocks first: the dead owner's reserve among them.
    let mut filled = fill(&second);
    let (spared, _) = filled.pop_first().unwrap();
    second.remove(ROOT_INO, spared.as_bytes(), false).unwrap();
    files.extend(filled);
    for i in 0..64 {
        let name = format!("owner{i}");
        files.insert(name.clone(), write_small(&second, &name, 1000 + i).unwrap());
    }
    second.sync().unwrap();
    for i in 0..16 {
        let name = format!("after{i}");
        match write_small(&writer, &name, 100 + i) {
            Ok(data) => files.insert(name, data),
            Err(FsError::NoSpace { .. }) => break,
            Err(e) => panic!("small files on the client after the takeover: {e}"),
        };
    }
    writer.sync().unwrap();
    verify(&second, &files);
    verify(&writer, &files);
    writer.unmount().unwrap();
    crash(second, &faults);
    drop(writer);
    assert_fsck_clean(&t, "after a takeover with fragments given ahead");
    let third = mount(&t);
    verify(&third, &files);
    third.unmount().unwrap();
}

/// The owner's own small writes of a file it serves are gathered in its memory while no
/// other node holds anything of the file; another node's read, `stat` or write of it
/// makes the owner write them first, so that node sees every write that returned, and
/// its own writes land after them.
#[test]
fn the_owners_gathered_writes_are_seen_by_another_nodes_reads_stats_and_writes() {
    let (t, owner, client, _calls, _revoked) = owner_and_client_as_node_two();
    owner.set_write_behind_owned(true);
    let f = create_file(&owner, ROOT_INO, b"log").ino;
    let mut want: Vec<u8> = Vec::new();
    let mut gathered_once = false;
    for i in 0..3000usize {
        let line = format!("line {i:05} {}\n", "z".repeat(i % 50));
        owner
            .write(f, want.len() as u64, line.as_bytes(), false)
            .unwrap();
        want.extend_from_slice(line.as_bytes());
        gathered_once |= owner.gathered_bytes() > 0;
        if i % 250 == 249 {
            assert_eq!(
                client.getattr(f).unwrap().size,
                want.len() as u64,
                "line {i}"
            );
            assert!(
                client.read(f, 0, (want.len() + 1) as u32).unwrap() == want,
                "line {i}"
            );
        }
        if i == 1500 {
            // A second later nobody else asked for a while: gathering again.
            std::thread::sleep(std::time::Duration::from_millis(1100));
        }
    }
    assert!(gathered_once, "the owner gathered its small writes");
    // The owner gathers, then the other node writes over part of it: the owner's bytes
    // land first, the other node's over them.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let g = create_file(&owner, ROOT_INO, b"g").ino;
    owner.write(g, 0, &[1; 3000], false).unwrap();
    owner.write(g, 3000, &[2; 3000], false).unwrap();
    assert!(owner.gathered_bytes() > 0);
    client.write(g, 2000, &[3; 2000], false).unwrap();
    let mut expect = vec![1u8; 3000];
    expect.extend_from_slice(&[2; 3000]);
    expect[2000..4000].fill(3);
    assert!(owner.read(g, 0, 10_000).unwrap() == expect);
    assert!(client.read(g, 0, 10_000).unwrap() == expect);
    // While the other node keeps the file's data token, the owner's writes go through.
    client.write(g, 6000, &[4; 100], false).unwrap();
    owner.write(g, 6100, &[5; 100], false).unwrap();
    expect.extend_from_slice(&[4; 100]);
    expect.extend_from_slice(&[5; 100]);
    assert!(client.read(g, 0, 10_000).unwrap() == expect);
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    let fs = mount(&t);
    assert!(fs.read(f, 0, (want.len() + 1) as u32).unwrap() == want);
    assert!(fs.read(g, 0, 10_000).unwrap() == expect);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after the owner's gathered writes");
}

/// The owner (gathering what it may) and another node writing one file at once, the
/// owner's writes partly synchronous: neither waits for the other for long. A write of
/// the owner that goes straight through while the other node holds a data token waits
/// for that token; the other node's next request makes the owner write what it gathered,
/// which must not wait for that write.
#[test]
fn the_owner_and_another_node_writing_one_file_at_once_do_not_wait_for_each_other() {
    let (_t, owner, client, _calls, _revoked) = owner_and_client_as_node_two();
    owner.set_write_behind_owned(true);
    let f = create_file(&owner, ROOT_INO, b"both").ino;
    owner.write(f, 0, &vec![0; 1 << 20], false).unwrap();
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        let (owner, client) = (&owner, &client);
        s.spawn(move || {
            for i in 0..300u64 {
                client
                    .write(f, (i * 3001) % (1 << 20), &[1; 3000], false)
                    .unwrap();
            }
        });
        s.spawn(move || {
            for i in 0..300u64 {
                let at = (i * 2999 + 5000) % (1 << 20);
                owner.write(f, at, &[2; 2000], i % 3 == 0).unwrap();
            }
        });
    });
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?} for 600 writes",
        started.elapsed()
    );
    let seen = owner.read(f, 0, 2 << 20).unwrap();
    assert_eq!(seen.len(), 1 << 20);
    assert!(client.read(f, 0, 2 << 20).unwrap() == seen);
    client.unmount().unwrap();
    owner.unmount().unwrap();
}

/// A fresh file system mounted by its owner (node 1) and by two clients it takes for nodes
/// 2 and 3 (shared mounts that gather small writes as a cluster node's mount does), with
/// revocations delivered to the node they name.
fn owner_and_two_gathering_clients() -> (TestDisks, Arc<FileSystem>, [Arc<FileSystem>; 2]) {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let owner = mount(&t);
    let node = |n: u32| tessera_fs::locks::Origin {
        node: n,
        incarnation: 1,
    };
    let clients = [2, 3].map(|n| {
        let channel = FromNode {
            owner: Arc::downgrade(&owner),
            origin: node(n),
            calls: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        };
        FileSystem::mount_client(t.reopen(), Box::new(channel)).unwrap()
    });
    for fs in std::iter::once(&owner).chain(&clients) {
        fs.set_shared(true);
        fs.set_write_behind_owned(true);
    }
    let weak: Vec<Weak<FileSystem>> = clients.iter().map(Arc::downgrade).collect();
    revocations_to(&owner, move |origin| {
        weak[origin.node as usize - 2].upgrade()
    });
    (t, owner, clients)
}

/// Has `owner` deliver its revocations (read tokens, kept data tokens) to the mount `to`
/// names for the node they are for, as the daemon's transport does.
fn revocations_to(
    owner: &FileSystem,
    to: impl Fn(tessera_fs::locks::Origin) -> Option<Arc<FileSystem>> + Clone + Send + Sync + 'static,
) {
    let to2 = to.clone();
    owner.on_read_revoke(Box::new(move |origin, inos| {
        if let Some(c) = to(origin) {
            c.serve_metanode_request(&tessera_fs::Fence::drop_held(inos));
        }
    }));
    owner.on_data_revoke(Box::new(move |origin, inos| {
        if let Some(c) = to2(origin) {
            c.serve_metanode_request(&tessera_fs::Fence::give_back_data(inos));
        }
    }));
}

/// A node writing small pieces of a file another node serves gathers them under its kept
/// data token, and every read, `stat` and lookup elsewhere (the owner's own, another
/// client's) that starts after a write returned sees it: the owner takes the token back
/// first, and the gathering node writes what it gathered before it gives it back. The
/// times stamped are those of the writes, not of their landing.
#[test]
fn a_clients_gathered_writes_are_seen_by_the_owner_and_other_nodes_at_once() {
    let (t, owner, [b, c]) = owner_and_two_gathering_clients();
    let f = create_file(&b, ROOT_INO, b"log").ino;
    let mut want: Vec<u8> = Vec::new();
    let mut gathered = 0;
    for i in 0..3000usize {
        let line = format!("line {i:05} {}\n", "y".repeat(i % 50));
        b.write(f, want.len() as u64, line.as_bytes(), false)
            .unwrap();
        want.extend_from_slice(line.as_bytes());
        if b.gathered_bytes() > 0 {
            gathered += 1;
        }
        let len = want.len() as u64;
        match i % 500 {
            100 => {
                // The gathering node's own stat includes what it gathered, and the time the
                // owner stamps when it lands is the write's.
                let mine = b.getattr(f).unwrap();
                assert_eq!(mine.size, len, "line {i}");
                let theirs = owner.getattr(f).unwrap();
                assert_eq!(theirs.size, len, "line {i}: the owner's stat");
                assert_eq!(theirs.mtime, mine.mtime, "line {i}: the write's time");
            }
            200 => assert!(
                owner.read(f, 0, (want.len() + 1) as u32).unwrap() == want,
                "line {i}: the owner's read"
            ),
            300 => assert_eq!(c.getattr(f).unwrap().size, len, "line {i}: node 3's stat"),
            400 => assert!(
                c.read(f, 0, (want.len() + 1) as u32).unwrap() == want,
                "line {i}: node 3's read"
            ),
            499 => {
                assert_eq!(c.lookup(ROOT_INO, b"log").unwrap().size, len, "line {i}");
                // The token comes back to the writer a second later.
                std::thread::sleep(std::time::Duration::from_millis(1100));
            }
            _ => {}
        }
    }
    // Each 500 lines: gathered from the third until the owner's stat at 100 takes the
    // token back (the writer keeps none again for a second).
    assert!(
        gathered > 400,
        "node 2 gathered its small writes ({gathered} times)"
    );
    // Node 3 writes over bytes node 2 gathered: node 2's land first, node 3's over them.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let g = create_file(&b, ROOT_INO, b"g").ino;
    for k in 0..4u8 {
        b.write(g, u64::from(k) * 1500, &[k + 1; 1500], false)
            .unwrap();
    }
    assert!(b.gathered_bytes() > 0, "node 2 gathers g");
    c.write(g, 2000, &[9; 2000], false).unwrap();
    let mut expect: Vec<u8> = (0..4u8).flat_map(|k| [k + 1; 1500]).collect();
    expect[2000..4000].fill(9);
    assert!(owner.read(g, 0, 10_000).unwrap() == expect);
    assert!(b.read(g, 0, 10_000).unwrap() == expect);
    // A truncate on the owner while node 2 gathers again cuts what it gathered too.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    for k in 0..3u64 {
        b.write(g, 6000 + k * 100, &[7; 100], false).unwrap();
    }
    owner
        .setattr(
            g,
            tessera_fs::SetAttr {
                size: Some(6100),
                ..Default::default()
            },
        )
        .unwrap();
    expect.extend_from_slice(&[7; 100]);
    assert!(b.read(g, 0, 10_000).unwrap() == expect);
    assert!(c.read(g, 0, 10_000).unwrap() == expect);
    b.fsync(f).unwrap();
    for fs in [&b, &c, &owner] {
        fs.unmount().unwrap();
    }
    drop((b, c, owner));
    let fs = mount(&t);
    assert!(fs.read(f, 0, (want.len() + 1) as u32).unwrap() == want);
    assert!(fs.read(g, 0, 10_000).unwrap() == expect);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after a client's gathered writes");
}

/// A client gathering small writes under its kept data token when its owner dies: the
/// new owner learns from the fence's handover that the client may hold gathered bytes,
/// and takes its token back before its own `stat` and read, which then include them.
#[test]
fn a_clients_gathering_is_known_to_the_owner_that_takes_over() {
    let t = make_disks(4, 64 << 20);
    let (first, faults, way, writer) = owner_and_following_client(&t);
    let node2 = tessera_fs::locks::Origin {
        node: 2,
        incarnation: 1,
    };
    let revocations_to_writer = |owner: &FileSystem| {
        owner.set_shared(true);
        let w = Arc::downgrade(&writer);
        revocations_to(owner, move |_| w.upgrade());
    };
    revocations_to_writer(&first);
    writer.set_shared(true);
    writer.set_write_behind_owned(true);
    let f = create_file(&writer, ROOT_INO, b"log").ino;
    let mut want = Vec::new();
    for i in 0..50u8 {
        let piece = [i; 100];
        writer.write(f, want.len() as u64, &piece, false).unwrap();
        want.extend_from_slice(&piece);
    }
    assert!(writer.gathered_bytes() > 0, "the client gathers");
    crash(first, &faults);
    let (disks, _faults) = with_faults(&t);
    let second = FileSystem::mount(disks).unwrap();
    revocations_to_writer(&second);
    *way.next.lock() = Some(Arc::downgrade(&second));
    let handed = writer.serve_metanode_request(&tessera_fs::Fence::request(0, 2, 1));
    second.replay_fenced(&handed, Some(node2)).unwrap();
    let settled = writer.serve_metanode_request(&tessera_fs::Fence::settled(0, true));
    tessera_fs::Fence::check(&settled).unwrap();
    assert!(
        writer.gathered_bytes() > 0,
        "still gathered after the fence"
    );
    assert_eq!(second.getattr(f).unwrap().size, want.len() as u64);
    assert!(second.read(f, 0, 10_000).unwrap() == want);
    assert_eq!(
        writer.gathered_bytes(),
        0,
        "written when the new owner asked"
    );
    writer.fsync(f).unwrap();
    writer.unmount().unwrap();
    second.unmount().unwrap();
    drop((writer, second));
    let fs = mount(&t);
    assert!(fs.read(f, 0, 10_000).unwrap() == want);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after a takeover under a client's gathered writes");
}

/// O_APPEND writes gathered like any small write: on the node that serves the file and on
/// a node gathering under its kept data token, each append lands past the bytes the node
/// gathered.
#[test]
fn appends_are_gathered_on_the_owner_and_on_a_client() {
    let (t, owner, [b, c]) = owner_and_two_gathering_clients();
    for (fs, name) in [(&owner, &b"by-owner"[..]), (&b, &b"by-client"[..])] {
        let f = create_file(fs, ROOT_INO, name).ino;
        let mut want = Vec::new();
        let mut most = 0;
        for i in 0..300u32 {
            let line = format!("{i:04} {}\n", "a".repeat(i as usize % 40));
            let at = fs.append(f, line.as_bytes(), false).unwrap();
            assert_eq!(at, want.len() as u64, "append {i} lands at the end");
            want.extend_from_slice(line.as_bytes());
            most = most.max(fs.gathered_bytes());
        }
        // Many appends held together, not each written by the next.
        assert!(
            most > 2000,
            "{}: appends gathered ({most} bytes at most)",
            String::from_utf8_lossy(name)
        );
        assert_eq!(c.getattr(f).unwrap().size, want.len() as u64);
        assert!(c.read(f, 0, 100_000).unwrap() == want);
    }
    for fs in [&b, &c, &owner] {
        fs.unmount().unwrap();
    }
    drop((b, c, owner));
    assert_fsck_clean(&t, "after appends gathered on an owner and a client");
}

/// Appends from three mounts at once (two threads each, every mount gathering what it
/// may) keep every record whole and once, seen at once by the other mounts. It caught the
/// owner's own append reading the size without taking back a client's gathered appends
/// first (one record in about nine runs overwritten, early, when a client had just been
/// let to gather).
#[test]
fn appends_from_three_mounts_at_once_lose_nothing() {
    let (t, owner, [b, c]) = owner_and_two_gathering_clients();
    // Everyone at once, two threads per mount.
    let log = create_file(&owner, ROOT_INO, b"shared").ino;
    const RECORD: usize = 300;
    std::thread::scope(|s| {
        for (m, fs) in [&owner, &b, &c].into_iter().enumerate() {
            for th in 0..2usize {
                s.spawn(move || {
                    for i in 0..40u8 {
                        let tag = (m * 2 + th) as u8 * 40 + i;
                        fs.append(log, &[tag; RECORD], false).unwrap();
                    }
                });
            }
        }
    });
    for fs in [&owner, &b, &c] {
        let all = fs.read(log, 0, (RECORD * 400) as u32).unwrap();
        assert_records_whole_and_once(&all, RECORD, 240);
    }
    for fs in [&b, &c, &owner] {
        fs.unmount().unwrap();
    }
    drop((b, c, owner));
    assert_fsck_clean(&t, "after gathered appends");
}

/// A file replaced by a rename right after another node looked its name up stays a moment
/// for that node to open (its kernel opens the inode it was told of right after): the open
/// reads the old file whole, as the open of a name replaced after its lookup does on a
/// local file system; a moment later the file is freed. A file whose remover looked it up
/// itself goes at once. (Every replaced file went at once, and such an open failed:
/// ENOENT, then ESTALE.)
#[test]
fn a_file_replaced_right_after_another_nodes_lookup_is_kept_for_its_open() {
    let (t, owner, client, _calls, _revoked) = owner_and_client_as_node_two();
    let old = create_file(&owner, ROOT_INO, b"current");
    let data = pattern(100_000, 5);
    owner.write(old.ino, 0, &data, false).unwrap();
    let new = create_file(&owner, ROOT_INO, b"tmp");
    owner.write(new.ino, 0, b"new", false).unwrap();
    assert_eq!(client.lookup(ROOT_INO, b"current").unwrap().ino, old.ino);
    owner
        .rename(ROOT_INO, b"tmp", ROOT_INO, b"current", false, false)
        .unwrap();
    client.open(old.ino).unwrap();
    assert!(client.read(old.ino, 0, 200_000).unwrap() == data);
    client.release(old.ino).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !matches!(owner.getattr(old.ino), Err(FsError::NotFound)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the replaced file was never freed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // The client looks up and removes a file itself: nothing to keep it for.
    let gone = create_file(&owner, ROOT_INO, b"gone");
    assert_eq!(client.lookup(ROOT_INO, b"gone").unwrap().ino, gone.ino);
    client.remove(ROOT_INO, b"gone", false).unwrap();
    assert!(matches!(owner.getattr(gone.ino), Err(FsError::NotFound)));
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after files replaced under another node's lookups");
}

/// A file kept a moment for another node's lookup gives its space to a writer that needs
/// it: the file system filled by one file, another node looks it up, the owner removes it
/// and at once writes half as much again, with no ENOSPC.
#[test]
fn a_file_kept_for_another_nodes_lookup_gives_its_space_to_a_writer() {
    let (t, owner, client, _calls, _revoked) = owner_and_client_as_node_two();
    let big = create_file(&owner, ROOT_INO, b"big");
    let chunk = pattern(1 << 20, 7);
    let mut size = 0u64;
    while owner.write(big.ino, size, &chunk, false).is_ok() {
        size += chunk.len() as u64;
    }
    assert!(size >= 32 << 20, "only {size} bytes fit");
    assert_eq!(client.lookup(ROOT_INO, b"big").unwrap().ino, big.ino);
    owner.remove(ROOT_INO, b"big", false).unwrap();
    let again = create_file(&owner, ROOT_INO, b"again");
    let mut written = 0u64;
    while written < size / 2 {
        owner
            .write(again.ino, written, &chunk, false)
            .unwrap_or_else(|e| panic!("after {written} bytes of {}: {e}", size / 2));
        written += chunk.len() as u64;
    }
    client.unmount().unwrap();
    owner.unmount().unwrap();
    drop((client, owner));
    assert_fsck_clean(&t, "after a kept file's space went to a writer");
}
