//! A client-only mount (`FileSystem::mount_client`): a second mount of the same drives,
//! through its own drive handles, that owns nothing and sends every metadata request to the
//! mount that owns the file system, as a node that does not own it does over the cluster
//! transport. What either writes the other reads; fsync on the client is durable; what
//! only the owner can do is refused on the client with a message that says where to run it.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use common::*;
use tessera_fs::{FileSystem, FsError, InProcessOwner, ROOT_INO};

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
