// POSIX behaviour through a real kernel mount: the conformance set Tessera holds itself to.
// Included by `posix.rs` (NSDs on file-backed drives), `posix_vdisk.rs` (NSDs on
// erasure-coded vdisks), `posix_client.rs` and `posix_shared.rs`, which set `BACKEND`, and by
// `crates/tessera/tests/netns_posix.rs` (a client node of a two-node cluster in network
// namespaces, with a harness of its own); every test mounts a fresh file system.

use tessera_testkit::pattern;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use harness::{can_mount, in_child, small_fs, Mounted};

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn regular_files_write_read_overwrite_truncate() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(4, 256 << 20, small_fs());
    let p = m.path("f");
    let data = pattern(3_000_001, 1);
    fs::write(&p, &data).unwrap();
    assert_eq!(fs::read(&p).unwrap(), data);
    // Overwrite an unaligned range in the middle.
    let mut f = OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(SeekFrom::Start(123_457)).unwrap();
    f.write_all(b"overwritten").unwrap();
    drop(f);
    let mut expect = data.clone();
    expect[123_457..123_468].copy_from_slice(b"overwritten");
    // Append.
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    expect.extend_from_slice(b"tail");
    assert_eq!(fs::read(&p).unwrap(), expect);
    // Shrink to an unaligned size, then grow: the bytes in between read as zeros.
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(1_000_003).unwrap();
    f.set_len(1_500_000).unwrap();
    drop(f);
    expect.truncate(1_000_003);
    expect.resize(1_500_000, 0);
    assert_eq!(fs::read(&p).unwrap(), expect);
    m.remount();
    assert_eq!(fs::read(&p).unwrap(), expect);
    // Rewriting a larger file with O_TRUNC leaves only the new bytes.
    fs::write(&p, b"short").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"short");
    m.remount();
    assert_eq!(fs::read(&p).unwrap(), b"short");
    m.unmount();
    assert!(m.fsck().is_clean());
}

#[test]
fn sparse_files_and_small_files() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("sparse");
    let mut f = File::create(&p).unwrap();
    f.seek(SeekFrom::Start(50 << 20)).unwrap();
    f.write_all(b"end").unwrap();
    drop(f);
    let md = fs::metadata(&p).unwrap();
    assert_eq!(md.len(), (50 << 20) + 3);
    // st_blocks counts what is allocated: one 256 KiB block, not 50 MiB.
    assert!(
        md.blocks() * 512 <= 256 << 10,
        "sparse file holds {} blocks",
        md.blocks()
    );
    let mut f = File::open(&p).unwrap();
    let mut buf = vec![1u8; 1 << 20];
    f.seek(SeekFrom::Start(10 << 20)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    drop(f);
    // Many small files: inline and fragment sizes.
    for (i, size) in [0usize, 1, 100, 3000, 3841, 5000, 70_000, 300_000]
        .iter()
        .enumerate()
    {
        let q = m.path(&format!("small{i}"));
        let d = pattern(*size, i as u64 + 7);
        fs::write(&q, &d).unwrap();
        assert_eq!(fs::read(&q).unwrap(), d, "size {size}");
    }
    m.remount();
    let md = fs::metadata(&p).unwrap();
    assert!(
        md.blocks() > 0 && md.blocks() * 512 <= 256 << 10,
        "after remount: {}",
        md.blocks()
    );
    let big = fs::metadata(m.path("small7")).unwrap();
    assert!(
        big.blocks() * 512 >= 300_000,
        "300 kB file holds {} blocks",
        big.blocks()
    );
    for (i, size) in [0usize, 1, 100, 3000, 3841, 5000, 70_000, 300_000]
        .iter()
        .enumerate()
    {
        let q = m.path(&format!("small{i}"));
        assert_eq!(
            fs::read(&q).unwrap(),
            pattern(*size, i as u64 + 7),
            "size {size}"
        );
    }
}

#[test]
fn directories_and_readdir() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    fs::create_dir_all(m.path("a/b/c")).unwrap();
    assert_eq!(fs::metadata(m.path("a")).unwrap().nlink(), 3);
    let e = fs::remove_dir(m.path("a/b")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(
        fs::create_dir(m.path("a")).unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    let big = m.path("big");
    fs::create_dir(&big).unwrap();
    for i in 0..5000 {
        File::create(big.join(format!("entry-{i:05}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&big)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 5000);
    assert_eq!(names[0], "entry-00000");
    assert_eq!(names[4999], "entry-04999");
    // Removing entries while listing returns every survivor exactly once.
    let mut seen = std::collections::HashSet::new();
    for (i, e) in fs::read_dir(&big).unwrap().enumerate() {
        let name = e.unwrap().file_name();
        assert!(seen.insert(name.clone()), "duplicate {name:?}");
        if i % 2 == 0 {
            let _ = fs::remove_file(big.join(&name));
        }
    }
    assert!(seen.len() >= 2500);
    fs::remove_dir_all(m.path("a")).unwrap();
    assert!(!m.path("a").exists());
    let name = "n".repeat(256);
    let e = File::create(m.path(&name)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
}

#[test]
fn rename_semantics() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    fs::write(m.path("src"), b"new").unwrap();
    fs::write(m.path("dst"), b"old").unwrap();
    fs::rename(m.path("src"), m.path("dst")).unwrap();
    assert_eq!(fs::read(m.path("dst")).unwrap(), b"new");
    assert!(!m.path("src").exists());
    fs::create_dir_all(m.path("d1/sub")).unwrap();
    fs::create_dir(m.path("d2")).unwrap();
    fs::rename(m.path("d1/sub"), m.path("d2/moved")).unwrap();
    assert_eq!(fs::metadata(m.path("d1")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(m.path("d2")).unwrap().nlink(), 3);
    let e = fs::rename(m.path("d2"), m.path("d2/moved/inside")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    fs::create_dir(m.path("full")).unwrap();
    fs::write(m.path("full/x"), b"x").unwrap();
    let e = fs::rename(m.path("d1"), m.path("full")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    fs::write(m.path("a"), b"A").unwrap();
    fs::write(m.path("b"), b"B").unwrap();
    let (a, b) = (m.path("a"), m.path("b"));
    let e = tessera_testkit::renameat2(&a, &b, libc::RENAME_NOREPLACE).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    tessera_testkit::renameat2(&a, &b, libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.path("b")).unwrap(), b"A");
    m.remount();
    assert_eq!(fs::read(m.path("dst")).unwrap(), b"new");
    assert!(m.path("d2/moved").is_dir());
    m.unmount();
    let report = m.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn links_and_unlink_of_open_files() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    fs::write(m.path("f"), b"data").unwrap();
    fs::hard_link(m.path("f"), m.path("g")).unwrap();
    assert_eq!(fs::metadata(m.path("f")).unwrap().nlink(), 2);
    fs::remove_file(m.path("f")).unwrap();
    assert_eq!(fs::read(m.path("g")).unwrap(), b"data");
    std::os::unix::fs::symlink("g", m.path("s")).unwrap();
    assert_eq!(fs::read_link(m.path("s")).unwrap(), Path::new("g"));
    assert_eq!(fs::read(m.path("s")).unwrap(), b"data");
    let e = fs::hard_link(m.path("."), m.path("dirlink")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    // An unlinked file stays usable through its open descriptor until closed.
    let before = free_bytes(&m.mnt());
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.path("o"))
        .unwrap();
    f.write_all(&pattern(4 << 20, 3)).unwrap();
    f.sync_all().unwrap();
    fs::remove_file(m.path("o")).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, pattern(4 << 20, 3));
    drop(f);
    // Freed blocks return once the unlink is durable.
    m.remount();
    let after = free_bytes(&m.mnt());
    assert!(
        after + (256 << 10) >= before,
        "space not returned: {before} -> {after}"
    );
}

fn free_bytes(p: &Path) -> u64 {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(p).as_ptr(), &mut s) }, 0);
    s.f_bavail * s.f_frsize
}

fn as_nobody(cmd: &str) -> std::process::Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            cmd,
        ])
        .output()
        .expect("setpriv runs")
}

#[test]
fn permissions_are_enforced_for_other_users() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    fs::write(m.path("secret"), b"s").unwrap();
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(m.path("public"), b"p").unwrap();
    fs::set_permissions(m.path("public"), fs::Permissions::from_mode(0o644)).unwrap();
    let secret = m.path("secret").display().to_string();
    let public = m.path("public").display().to_string();
    assert!(!as_nobody(&format!("cat {secret}")).status.success());
    assert!(as_nobody(&format!("cat {public}")).status.success());
    assert!(!as_nobody(&format!("echo x >> {public}")).status.success());
    assert!(!as_nobody(&format!("touch {}/newfile", m.mnt().display()))
        .status
        .success());
    fs::create_dir(m.path("shared")).unwrap();
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o1777)).unwrap();
    let shared = m.path("shared").display().to_string();
    let out = as_nobody(&format!("echo mine > {shared}/n && cat {shared}/n"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::metadata(m.path("shared/n")).unwrap().uid(), 65534);
    // setgid directories pass their group on.
    fs::create_dir(m.path("grp")).unwrap();
    std::os::unix::fs::chown(m.path("grp"), Some(0), Some(4242)).unwrap();
    fs::set_permissions(m.path("grp"), fs::Permissions::from_mode(0o2777)).unwrap();
    fs::write(m.path("grp/f"), b"").unwrap();
    fs::create_dir(m.path("grp/sub")).unwrap();
    assert_eq!(fs::metadata(m.path("grp/f")).unwrap().gid(), 4242);
    assert_eq!(
        fs::metadata(m.path("grp/sub")).unwrap().mode() & 0o2000,
        0o2000
    );
}

#[test]
fn timestamps_xattrs_statfs() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("t");
    fs::write(&p, b"1").unwrap();
    let f = File::options().write(true).open(&p).unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_000_000_000, 123_456_789);
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
        .unwrap();
    drop(f);
    let md = fs::metadata(&p).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123_456_789));
    let c = cstr(&p);
    let name = CString::new("user.color").unwrap();
    let rc = unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), b"blue".as_ptr().cast(), 4, 0) };
    assert_eq!(rc, 0);
    let mut buf = [0u8; 16];
    let n = unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..n as usize], b"blue");
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..n as usize], b"user.color\0");
    let bad = CString::new("os2.x").unwrap();
    let rc = unsafe { libc::setxattr(c.as_ptr(), bad.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(rc, -1);
    m.remount();
    let n = unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..n as usize], b"blue");
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), name.as_ptr()) }, 0);
    let n = unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!((n, errno()), (-1, libc::ENODATA));
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(&m.mnt()).as_ptr(), &mut s) }, 0);
    assert!(s.f_blocks * s.f_frsize > 200 << 20);
    assert!(s.f_bfree > 0 && s.f_files > 0 && s.f_ffree > 0);
}

#[test]
fn large_files_read_only_stream_and_stay_coherent_with_writers_and_mappings() {
    if !can_mount() {
        return;
    }
    // Read-only opens of files of 64 MiB and more bypass the page cache (streaming); every
    // other open uses it. Whatever mix of the two, each sees the others' bytes.
    let m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("large");
    let len = 72 << 20;
    let data = pattern(len, 21);
    fs::write(&p, &data).unwrap();
    // A plain sequential read through a buffer that is not page aligned.
    let mut f = File::open(&p).unwrap();
    let mut raw = vec![0u8; (1 << 20) + 64];
    let buf = &mut raw[16..16 + (1 << 20)];
    let mut got = Vec::with_capacity(len);
    loop {
        let n = f.read(buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == data, "streamed bytes differ");
    // A writer's bytes still in its page cache, and a shared mapping's store, are seen by
    // a streaming reader and by a read-only mapping.
    let w = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    use std::os::unix::fs::FileExt;
    w.write_at(b"WRITER", 70 << 20).unwrap();
    let r = File::open(&p).unwrap();
    let mut four = [0u8; 6];
    r.read_exact_at(&mut four, 70 << 20).unwrap();
    assert_eq!(&four, b"WRITER");
    // The mappings are made and touched by a child process (`in_child`): the stores through
    // a shared writable mapping, then this process's streaming read, then a read-only
    // mapping of a streaming open.
    let head = m.dir.path().join("head-through-mapping");
    let seen = in_child(
        r#"
import mmap, os, sys
path, length, head = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = os.open(path, os.O_RDWR)
shared = mmap.mmap(w, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
shared[71 << 20:(71 << 20) + 6] = b"MAPPED"
r = os.open(path, os.O_RDONLY)
assert os.pread(r, 6, 71 << 20) == b"MAPPED", "a streaming read missed the mapping's store"
ro = mmap.mmap(r, length, mmap.MAP_SHARED, mmap.PROT_READ)
with open(head, "wb") as f:
    f.write(ro[:1 << 20])
print(ro[70 << 20:(70 << 20) + 6].decode(), ro[71 << 20:(71 << 20) + 6].decode())
ro.close()
shared.close()
"#,
        &[p.as_os_str(), len.to_string().as_ref(), head.as_os_str()],
    );
    assert_eq!(seen.trim(), "WRITER MAPPED", "a streaming open can still be mapped");
    assert!(fs::read(&head).unwrap()[..] == data[..1 << 20], "mapped bytes differ");
    r.read_exact_at(&mut four, 71 << 20).unwrap();
    assert_eq!(&four, b"MAPPED");
    drop(w);
    drop(r);
    let mut expect = data;
    expect[70 << 20..(70 << 20) + 6].copy_from_slice(b"WRITER");
    expect[71 << 20..(71 << 20) + 6].copy_from_slice(b"MAPPED");
    assert!(fs::read(&p).unwrap() == expect, "final bytes differ");
}

#[test]
fn a_reader_sees_each_write_through_another_descriptor_at_once() {
    if !can_mount() {
        return;
    }
    // The reader's pages are cached; the writer's writes may go past the page cache (a
    // shared mount's writable opens do): the reader must never see its stale copy.
    use std::os::unix::fs::FileExt;
    let m = Mounted::new(2, 64 << 20, small_fs());
    let p = m.path("two-views");
    fs::write(&p, pattern(300_000, 5)).unwrap();
    let r = File::open(&p).unwrap();
    let w = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let mut expect = pattern(300_000, 5);
    let mut got = vec![0u8; expect.len()];
    for round in 0..20u64 {
        r.read_exact_at(&mut got, 0).unwrap();
        assert!(got == expect, "round {round}: the reader saw a stale copy");
        let at = (round * 14_011) % 290_000;
        let piece = pattern(5_003, 100 + round);
        w.write_at(&piece, at).unwrap();
        expect[at as usize..at as usize + piece.len()].copy_from_slice(&piece);
    }
    r.read_exact_at(&mut got, 0).unwrap();
    assert!(got == expect, "the reader saw a stale copy at the end");
    // A shared writable mapping of a writable open sees and makes the same bytes (made and
    // touched by a child process: `in_child`).
    let seen_file = m.dir.path().join("seen-through-mapping");
    in_child(
        r#"
import mmap, os, sys
path, length, seen = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = os.open(path, os.O_RDWR)
m = mmap.mmap(w, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
with open(seen, "wb") as f:
    f.write(m[:])
m[1000:1006] = b"MAPPED"
m.flush()
m.close()
"#,
        &[
            p.as_os_str(),
            expect.len().to_string().as_ref(),
            seen_file.as_os_str(),
        ],
    );
    assert!(fs::read(&seen_file).unwrap() == expect, "the mapping differs");
    expect[1000..1006].copy_from_slice(b"MAPPED");
    r.read_exact_at(&mut got, 0).unwrap();
    assert!(got == expect, "the reader missed the mapping's store");
}

#[test]
fn o_direct_fsync_mmap_fallocate() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("direct");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    let block = tessera_drive::AlignedBuf::from_slice(&pattern(1 << 20, 9));
    f.write_all(&block).unwrap();
    let mut back = tessera_drive::AlignedBuf::zeroed(1 << 20);
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert_eq!(&back[..], &block[..]);
    drop(f);
    // mmap write, msync, read back through read(2) after a remount.
    let q = m.path("mapped");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&q)
        .unwrap();
    f.set_len(1 << 20).unwrap();
    // Mapped, stored and synced by a child process (`in_child`).
    in_child(
        r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 1 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[4096:4103] = b"mapped!"
m.flush()
m.close()
"#,
        &[q.as_os_str()],
    );
    f.sync_all().unwrap();
    drop(f);
    // fallocate, then punch a hole.
    let r = m.path("prealloc");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&r)
        .unwrap();
    use std::os::unix::io::AsRawFd;
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 2 << 20) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 2 << 20);
    (&f).write_all(&vec![7u8; 2 << 20]).unwrap();
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(
        unsafe { libc::fallocate(f.as_raw_fd(), mode, 100_000, 600_000) },
        0
    );
    drop(f);
    m.remount();
    let d = fs::read(&q).unwrap();
    assert_eq!(&d[4096..4103], b"mapped!");
    let d = fs::read(&r).unwrap();
    assert_eq!(d.len(), 2 << 20);
    assert!(d[..100_000].iter().all(|b| *b == 7));
    assert!(d[100_000..700_000].iter().all(|b| *b == 0));
    assert!(d[700_000..].iter().all(|b| *b == 7));
    assert_eq!(fs::read(&p).unwrap(), pattern(1 << 20, 9));
}

#[test]
fn full_file_system_gives_enospc_and_recovers() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 48 << 20, small_fs());
    let chunk = vec![0xabu8; 1 << 20];
    let mut f = File::create(m.path("fill")).unwrap();
    let mut written = 0u64;
    let err = loop {
        match f.write_all(&chunk).and_then(|()| f.sync_data()) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(written < 200 << 20, "never ran out of space");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(f);
    fs::remove_file(m.path("fill")).unwrap();
    m.remount();
    fs::write(m.path("after"), &chunk).unwrap();
    assert_eq!(fs::read(m.path("after")).unwrap(), chunk);
    m.unmount();
    let report = m.fsck();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Runs `cmd` with `sh -c` as uid and gid 65534 with the supplementary groups `groups`
/// (`--clear-groups` or `--groups=...` of setpriv).
fn as_nobody_with(groups: &str, cmd: &str) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", groups, "sh", "-c", cmd])
        .output()
        .expect("setpriv runs")
}

/// The stderr of a command that must fail as nobody without supplementary groups.
fn nobody_fails(cmd: &str) -> String {
    let out = as_nobody(cmd);
    assert!(!out.status.success(), "`{cmd}` succeeded as nobody");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn nobody_succeeds(cmd: &str) -> String {
    let out = as_nobody(cmd);
    assert!(
        out.status.success(),
        "`{cmd}` failed as nobody: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const EACCES_TEXT: &str = "Permission denied";
const EPERM_TEXT: &str = "Operation not permitted";

/// Runs `f` on a new thread that has dropped to the uid, gid and supplementary groups given,
/// and returns the errno it reports (0 for success). The raw system calls change only the
/// calling thread's credentials (glibc's wrappers would change every thread's), and a thread
/// rather than a forked child holds no copies of other tests' open files, which would keep
/// their mounts busy.
fn errno_as(uid: u32, gid: u32, groups: &[libc::gid_t], f: impl FnOnce() -> i32 + Send) -> i32 {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: plain system calls on this thread's credentials.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                    0
                );
                assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
            }
            f()
        })
        .join()
        .unwrap()
    })
}

fn rc_errno(rc: libc::c_int) -> i32 {
    if rc == 0 {
        0
    } else {
        errno()
    }
}

fn write_mode(p: &Path, data: &[u8], mode: u32) {
    fs::write(p, data).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn mkdir_mode(p: &Path, mode: u32) {
    fs::create_dir(p).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn mode_bits_and_owner_rules_are_enforced_by_the_file_system() {
    //! Every answer below must be what ext4 gives an unprivileged user. The kernel checks
    //! first (`default_permissions`) and the file system again; the unit tests of
    //! `tessera_fs::access` hold the file system's own answers to the same rules.
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    let p = |rel: &str| m.path(rel).display().to_string();
    write_mode(&m.path("secret"), b"s", 0o600);
    write_mode(&m.path("public"), b"p", 0o644);
    write_mode(&m.path("open"), b"o", 0o666);
    mkdir_mode(&m.path("rootdir"), 0o755);
    assert!(nobody_fails(&format!("cat {}", p("secret"))).contains(EACCES_TEXT));
    assert_eq!(nobody_succeeds(&format!("cat {}", p("public"))), "p");
    assert!(nobody_fails(&format!("echo x >> {}", p("public"))).contains(EACCES_TEXT));
    assert!(nobody_fails(&format!("truncate -s 0 {}", p("public"))).contains(EACCES_TEXT));
    nobody_succeeds(&format!("echo x >> {}", p("open")));
    // No create, mkdir, symlink, link, rename or unlink in a directory nobody cannot write.
    for cmd in [
        format!("touch {}/new", p("rootdir")),
        format!("mkdir {}/d", p("rootdir")),
        format!("ln -s x {}/l", p("rootdir")),
        format!("mv {} {}/moved", p("open"), p("rootdir")),
        format!("rm -f {}", p("public")),
    ] {
        assert!(nobody_fails(&cmd).contains(EACCES_TEXT), "{cmd}");
    }
    assert!(m.path("public").exists() && m.path("open").exists());
    // Sticky directories: only one's own files go.
    mkdir_mode(&m.path("tmp"), 0o1777);
    fs::write(m.path("tmp/theirs"), b"").unwrap();
    nobody_succeeds(&format!("echo mine > {}", p("tmp/mine")));
    assert!(nobody_fails(&format!("rm -f {}", p("tmp/theirs"))).contains(EPERM_TEXT));
    assert!(nobody_fails(&format!("mv {} {}", p("tmp/theirs"), p("tmp/x"))).contains(EPERM_TEXT));
    nobody_succeeds(&format!(
        "mv {} {} && rm {}",
        p("tmp/mine"),
        p("tmp/m2"),
        p("tmp/m2")
    ));
    assert!(m.path("tmp/theirs").exists() && !m.path("tmp/m2").exists());
    // Hard links to files one may not read and write (protected_hardlinks).
    assert!(nobody_fails(&format!("ln {} {}", p("public"), p("tmp/l"))).contains(EPERM_TEXT));
    nobody_succeeds(&format!("ln {} {}", p("open"), p("tmp/l")));
    // Only the owner changes modes, owners and chosen times; writers may touch.
    for cmd in [
        format!("chmod 777 {}", p("public")),
        format!("chown 65534 {}", p("open")),
        format!("chgrp 65534 {}", p("open")),
        format!("touch -d 2001-01-01 {}", p("open")),
    ] {
        assert!(nobody_fails(&cmd).contains(EPERM_TEXT), "{cmd}");
    }
    assert_eq!(fs::metadata(m.path("open")).unwrap().uid(), 0);
    let before = fs::metadata(m.path("open")).unwrap().mtime();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    nobody_succeeds(&format!("touch {}", p("open")));
    assert!(fs::metadata(m.path("open")).unwrap().mtime() > before);
    assert!(nobody_fails(&format!("touch {}", p("public"))).contains(EACCES_TEXT));
    // Execution needs an execute bit for the caller; reading a script needs only read.
    write_mode(&m.path("s744"), b"#!/bin/sh\necho ran\n", 0o744);
    write_mode(&m.path("s755"), b"#!/bin/sh\necho ran\n", 0o755);
    assert!(nobody_fails(&p("s744")).contains(EACCES_TEXT));
    assert_eq!(nobody_succeeds(&p("s755")), "ran\n");
    assert_eq!(nobody_succeeds(&format!("sh {}", p("s744"))), "ran\n");
    // access(2), through the shell's test and directly.
    nobody_succeeds(&format!(
        "test -r {} && ! test -w {} && ! test -r {} && test -x {} && ! test -x {}",
        p("public"),
        p("public"),
        p("secret"),
        p("s755"),
        p("s744")
    ));
    let (secret, s744) = (cstr(&m.path("secret")), cstr(&m.path("s744")));
    let access = |path: &CString, mode| {
        errno_as(65534, 65534, &[], || {
            rc_errno(unsafe { libc::access(path.as_ptr(), mode) })
        })
    };
    assert_eq!(access(&secret, libc::F_OK), 0);
    assert_eq!(access(&secret, libc::R_OK), libc::EACCES);
    assert_eq!(access(&s744, libc::R_OK), 0);
    assert_eq!(access(&s744, libc::X_OK), libc::EACCES);
    // Root is not bound by the mode bits, except for execution.
    assert_eq!(fs::read(m.path("secret")).unwrap(), b"s");
    assert_eq!(unsafe { libc::access(s744.as_ptr(), libc::X_OK) }, 0);
    let c = cstr(&m.path("public"));
    assert_eq!(unsafe { libc::access(c.as_ptr(), libc::X_OK) }, -1);
    // A creator may open his new read-only file for writing (open(O_CREAT|O_RDWR, 0444)).
    nobody_succeeds(&format!("umask 222 && echo fresh > {}", p("tmp/ro")));
    assert_eq!(
        fs::metadata(m.path("tmp/ro")).unwrap().mode() & 0o777,
        0o444
    );
    assert_eq!(fs::read(m.path("tmp/ro")).unwrap(), b"fresh\n");
}

#[test]
fn search_permission_holds_for_names_the_kernel_has_cached() {
    //! A cached name skips our LOOKUP, so only the kernel's check of search permission
    //! (`default_permissions`) guards it. Root's lookups must not open a way through a
    //! directory nobody may not search, nor may a chmod or a rename that closes a
    //! directory leave such a way behind.
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    let p = |rel: &str| m.path(rel).display().to_string();
    mkdir_mode(&m.path("private"), 0o700);
    write_mode(&m.path("private/f"), b"f", 0o644);
    fs::metadata(m.path("private/f")).unwrap();
    assert!(nobody_fails(&format!("stat {}", p("private/f"))).contains(EACCES_TEXT));
    assert!(nobody_fails(&format!("cat {}", p("private/f"))).contains(EACCES_TEXT));
    // dash says only "can't cd"; chdir(2) asked us through FUSE_ACCESS.
    nobody_fails(&format!("cd {}", p("private")));
    assert!(nobody_fails(&format!("ls {}", p("private"))).contains(EACCES_TEXT));
    // Closing a directory whose names are cached.
    mkdir_mode(&m.path("closing"), 0o755);
    write_mode(&m.path("closing/g"), b"g", 0o644);
    fs::metadata(m.path("closing/g")).unwrap();
    assert_eq!(nobody_succeeds(&format!("cat {}", p("closing/g"))), "g");
    fs::set_permissions(m.path("closing"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::metadata(m.path("closing/g")).unwrap();
    assert!(nobody_fails(&format!("stat {}", p("closing/g"))).contains(EACCES_TEXT));
    // Moving a cached name into a closed directory.
    mkdir_mode(&m.path("pub"), 0o755);
    write_mode(&m.path("pub/h"), b"h", 0o644);
    assert_eq!(nobody_succeeds(&format!("cat {}", p("pub/h"))), "h");
    fs::rename(m.path("pub/h"), m.path("private/h")).unwrap();
    fs::metadata(m.path("private/h")).unwrap();
    assert!(nobody_fails(&format!("stat {}", p("private/h"))).contains(EACCES_TEXT));
    // Opening the directory again lets nobody back in.
    fs::set_permissions(m.path("closing"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(nobody_succeeds(&format!("cat {}", p("closing/g"))), "g");
    // A directory only its group may search: membership decides at every walk.
    fs::create_dir(m.path("team")).unwrap();
    std::os::unix::fs::chown(m.path("team"), Some(0), Some(4242)).unwrap();
    fs::set_permissions(m.path("team"), fs::Permissions::from_mode(0o750)).unwrap();
    write_mode(&m.path("team/plan"), b"plan", 0o644);
    let member = as_nobody_with("--groups=4242", &format!("cat {}", p("team/plan")));
    assert!(member.status.success());
    assert_eq!(member.stdout, b"plan");
    assert!(nobody_fails(&format!("cat {}", p("team/plan"))).contains(EACCES_TEXT));
}

#[test]
fn supplementary_groups_and_extended_attribute_permissions() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    let p = |rel: &str| m.path(rel).display().to_string();
    write_mode(&m.path("g"), b"group", 0o640);
    std::os::unix::fs::chown(m.path("g"), Some(0), Some(4242)).unwrap();
    let member = as_nobody_with("--groups=4242", &format!("cat {}", p("g")));
    assert!(member.status.success());
    assert_eq!(member.stdout, b"group");
    assert!(nobody_fails(&format!("cat {}", p("g"))).contains(EACCES_TEXT));
    // chgrp of one's own file: only to a group one is in.
    mkdir_mode(&m.path("tmp"), 0o1777);
    nobody_succeeds(&format!("touch {}", p("tmp/own")));
    assert!(nobody_fails(&format!("chgrp 4242 {}", p("tmp/own"))).contains(EPERM_TEXT));
    let out = as_nobody_with("--groups=4242", &format!("chgrp 4242 {}", p("tmp/own")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::metadata(m.path("tmp/own")).unwrap().gid(), 4242);
    // Extended attributes.
    write_mode(&m.path("theirs"), b"", 0o644);
    let (own, theirs) = (cstr(&m.path("tmp/own")), cstr(&m.path("theirs")));
    let (user, trusted) = (
        CString::new("user.k").unwrap(),
        CString::new("trusted.k").unwrap(),
    );
    let set = |path: &CString, name: &CString| {
        errno_as(65534, 65534, &[], || {
            let v = b"v".as_ptr().cast();
            rc_errno(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), v, 1, 0) })
        })
    };
    assert_eq!(set(&own, &user), 0);
    assert_eq!(set(&theirs, &user), libc::EACCES);
    assert_eq!(set(&own, &trusted), libc::EPERM);
    // Root's trusted.* attributes are invisible to others.
    let rc = unsafe {
        libc::setxattr(
            theirs.as_ptr(),
            trusted.as_ptr(),
            b"t".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(rc, 0);
    let rc = unsafe { libc::setxattr(theirs.as_ptr(), user.as_ptr(), b"u".as_ptr().cast(), 1, 0) };
    assert_eq!(rc, 0);
    let list_len = |uid| {
        errno_as(uid, uid, &[], || {
            let mut buf = [0u8; 64];
            let n = unsafe { libc::listxattr(theirs.as_ptr(), buf.as_mut_ptr().cast(), 64) };
            n as i32
        })
    };
    assert_eq!(list_len(65534), "user.k\0".len() as i32);
    assert_eq!(list_len(0), "user.k\0trusted.k\0".len() as i32);
    let get = |uid, name: &CString| {
        errno_as(uid, uid, &[], || {
            let mut buf = [0u8; 8];
            let (path, name) = (theirs.as_ptr(), name.as_ptr());
            let n = unsafe { libc::getxattr(path, name, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                errno()
            } else {
                0
            }
        })
    };
    assert_eq!(get(65534, &user), 0);
    assert_eq!(get(65534, &trusted), libc::ENODATA);
    assert_eq!(get(0, &trusted), 0);
    fs::set_permissions(m.path("theirs"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(get(65534, &user), libc::EACCES);
}

/// open(2) of `path` with `flags` as nobody (no supplementary groups); 0 or the errno.
fn open_as_nobody(path: &CString, flags: i32) -> i32 {
    errno_as(65534, 65534, &[], || {
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return errno();
        }
        unsafe { libc::close(fd) };
        0
    })
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) {
    let rc = unsafe { libc::mknod(cstr(p).as_ptr(), mode, dev) };
    assert_eq!(rc, 0, "mknod {}: {}", p.display(), std::io::Error::last_os_error());
    fs::set_permissions(p, fs::Permissions::from_mode(mode & 0o7777)).unwrap();
}

#[test]
fn fifos_and_device_nodes_open_only_with_permission() {
    //! The kernel opens FIFOs, sockets and device nodes itself, without asking the file
    //! system: a root-owned 0600 FIFO or block device node must still refuse nobody.
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    mknod(&m.path("fifo600"), libc::S_IFIFO | 0o600, 0);
    mknod(&m.path("fifo666"), libc::S_IFIFO | 0o666, 0);
    mknod(&m.path("null600"), libc::S_IFCHR | 0o600, libc::makedev(1, 3));
    mknod(&m.path("null666"), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    mknod(&m.path("loop600"), libc::S_IFBLK | 0o600, libc::makedev(7, 0));
    let (fifo, open_fifo) = (cstr(&m.path("fifo600")), cstr(&m.path("fifo666")));
    let nonblock_read = libc::O_RDONLY | libc::O_NONBLOCK;
    assert_eq!(open_as_nobody(&fifo, libc::O_RDWR), libc::EACCES);
    assert_eq!(open_as_nobody(&fifo, nonblock_read), libc::EACCES);
    assert_eq!(open_as_nobody(&open_fifo, nonblock_read), 0);
    assert_eq!(open_as_nobody(&open_fifo, libc::O_RDWR), 0);
    let null = cstr(&m.path("null600"));
    assert_eq!(open_as_nobody(&null, libc::O_RDWR), libc::EACCES);
    assert_eq!(open_as_nobody(&null, libc::O_RDONLY), libc::EACCES);
    assert_eq!(open_as_nobody(&cstr(&m.path("null666")), libc::O_RDWR), 0);
    let disk = cstr(&m.path("loop600"));
    assert_eq!(open_as_nobody(&disk, libc::O_RDONLY), libc::EACCES);
    // A socket: connecting needs write permission.
    let _listener = std::os::unix::net::UnixListener::bind(m.path("sock")).unwrap();
    fs::set_permissions(m.path("sock"), fs::Permissions::from_mode(0o600)).unwrap();
    let sock = m.path("sock");
    let connect = errno_as(65534, 65534, &[], || {
        match std::os::unix::net::UnixStream::connect(&sock) {
            Ok(_) => 0,
            Err(e) => e.raw_os_error().unwrap(),
        }
    });
    assert_eq!(connect, libc::EACCES);
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
    // Root still may.
    let fd = unsafe { libc::open(fifo.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    unsafe { libc::close(fd) };
}

/// utimensat(2) of `path` as nobody with `times` ([atime, mtime]); 0 or the errno.
fn utimens_as_nobody(path: &CString, times: Option<[libc::timespec; 2]>) -> i32 {
    errno_as(65534, 65534, &[], || {
        let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
        rc_errno(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), ptr, 0) })
    })
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

#[test]
fn only_the_owner_sets_chosen_times_writers_only_now() {
    //! utimensat with an explicit time needs ownership (EPERM), with "now" write
    //! permission (EACCES); a writer of a 0666 file can neither back-date nor forward-date
    //! it, neither through utimensat nor through the time flushes of the writeback cache.
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    write_mode(&m.path("open"), b"o", 0o666);
    write_mode(&m.path("public"), b"p", 0o644);
    let (open, public) = (cstr(&m.path("open")), cstr(&m.path("public")));
    let omit = ts(0, libc::UTIME_OMIT);
    let now = ts(0, libc::UTIME_NOW);
    let past = ts(946_684_800, 0);
    let future = ts(4_102_444_800, 0);
    let before = fs::metadata(m.path("open")).unwrap().mtime();
    for t in [past, future] {
        assert_eq!(utimens_as_nobody(&open, Some([omit, t])), libc::EPERM);
        assert_eq!(utimens_as_nobody(&open, Some([t, omit])), libc::EPERM);
        assert_eq!(utimens_as_nobody(&public, Some([omit, t])), libc::EPERM);
    }
    assert_eq!(utimens_as_nobody(&public, None), libc::EACCES);
    assert_eq!(utimens_as_nobody(&public, Some([now, now])), libc::EACCES);
    // Linux counts one time set to now and the other omitted as a chosen time, as XFS does.
    assert_eq!(utimens_as_nobody(&open, Some([omit, now])), libc::EPERM);
    // Writing and then asking for a chosen time through the open file changes nothing.
    let back_dated = errno_as(65534, 65534, &[], || {
        let fd = unsafe { libc::open(open.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        assert!(fd >= 0);
        assert_eq!(unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) }, 1);
        let rc = rc_errno(unsafe { libc::futimens(fd, [omit, past].as_ptr()) });
        unsafe { libc::close(fd) };
        rc
    });
    assert_eq!(back_dated, libc::EPERM);
    m.remount();
    let after = fs::metadata(m.path("open")).unwrap().mtime();
    assert!(
        after >= before && after < future.tv_sec,
        "mtime {after} (was {before})"
    );
    // "Now" is what write permission allows.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(utimens_as_nobody(&open, Some([now, now])), 0);
    assert_eq!(utimens_as_nobody(&open, None), 0);
    assert!(fs::metadata(m.path("open")).unwrap().mtime() > after);
    // The owner may set any time.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, public.as_ptr(), [omit, past].as_ptr(), 0) };
    assert_eq!(rc, 0);
    m.remount();
    assert_eq!(fs::metadata(m.path("public")).unwrap().mtime(), past.tv_sec);
}

#[test]
fn chown_to_the_same_owner_and_group_is_allowed_to_anyone() {
    //! chown(path, -1, -1) changes nothing and succeeds for every user, as on XFS.
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    write_mode(&m.path("f"), b"f", 0o644);
    write_mode(&m.path("open"), b"f", 0o666);
    mkdir_mode(&m.path("d"), 0o755);
    std::os::unix::fs::symlink("f", m.path("l")).unwrap();
    for name in ["f", "open", "d", "l"] {
        let path = cstr(&m.path(name));
        let rc = errno_as(65534, 65534, &[], || {
            let none = u32::MAX;
            let c = rc_errno(unsafe { libc::chown(path.as_ptr(), none, none) });
            let l = rc_errno(unsafe { libc::lchown(path.as_ptr(), none, none) });
            c.max(l)
        });
        assert_eq!(rc, 0, "{name}");
    }
    assert_eq!(fs::metadata(m.path("f")).unwrap().uid(), 0);
    assert_eq!(fs::metadata(m.path("f")).unwrap().mode() & 0o7777, 0o644);
}

fn syncfs(dir: &Path) -> i32 {
    let d = File::open(dir).unwrap();
    rc_errno(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) })
}

#[test]
fn syncfs_succeeds_after_unlink_and_rename_over_written_files() {
    //! The kernel writes back the times of a dead inode after its name is gone; that must
    //! not make syncfs (or `sync -f`) fail.
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    for round in 0..5 {
        let a = m.path(&format!("a{round}"));
        let b = m.path(&format!("b{round}"));
        fs::write(&a, b"old").unwrap();
        fs::write(&b, b"new").unwrap();
        fs::rename(&b, &a).unwrap();
        assert_eq!(syncfs(&m.mnt()), 0, "syncfs after rename, round {round}");
        fs::write(&b, b"gone").unwrap();
        fs::remove_file(&b).unwrap();
        assert_eq!(syncfs(&m.mnt()), 0, "syncfs after unlink, round {round}");
        fs::write(&b, b"gone").unwrap();
        fs::remove_file(&b).unwrap();
        let out = Command::new("sync").arg("-f").arg(m.mnt()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Runs `cmd` with `sh -c` as root and returns its stdout; panics if it fails.
fn root_succeeds(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ACL of `path` as `getfacl -cn` prints it (numeric ids, no header), one entry a line.
fn acl_of(path: &str) -> Vec<String> {
    root_succeeds(&format!("getfacl -cnp {path}"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect()
}

fn has(acl: &[String], entry: &str) -> bool {
    acl.iter().any(|e| e == entry)
}

#[test]
fn posix_acls_named_users_groups_mask_and_chmod() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    let secret = m.path("secret").display().to_string();
    let p = |rel: &str| m.path(rel).display().to_string();
    write_mode(&m.path("secret"), b"s", 0o600);
    assert!(nobody_fails(&format!("cat {}", p("secret"))).contains(EACCES_TEXT));
    // A named user: read only.
    root_succeeds(&format!("setfacl -m u:65534:r {}", p("secret")));
    let acl = acl_of(&p("secret"));
    assert!(has(&acl, "user:65534:r--") && has(&acl, "mask::r--"), "{acl:?}");
    assert_eq!(fs::metadata(m.path("secret")).unwrap().mode() & 0o777, 0o640);
    assert_eq!(nobody_succeeds(&format!("cat {}", p("secret"))), "s");
    assert!(nobody_fails(&format!("echo x >> {}", p("secret"))).contains(EACCES_TEXT));
    // The mask limits the named user: rw- granted, r-- effective.
    root_succeeds(&format!("setfacl -m u:65534:rw,m::r {}", p("secret")));
    assert!(nobody_fails(&format!("echo x >> {}", p("secret"))).contains(EACCES_TEXT));
    root_succeeds(&format!("setfacl -m m::rw {}", p("secret")));
    nobody_succeeds(&format!("echo x >> {}", p("secret")));
    // chmod sets the mask from the group bits, and leaves the named entry alone.
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let acl = acl_of(&p("secret"));
    assert!(has(&acl, "mask::---") && has(&acl, "user:65534:rw-"), "{acl:?}");
    assert!(nobody_fails(&format!("cat {}", p("secret"))).contains(EACCES_TEXT));
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(nobody_succeeds(&format!("cat {}", p("secret"))), "sx\n");
    // A named group.
    write_mode(&m.path("team"), b"t", 0o600);
    root_succeeds(&format!("setfacl -m g:4242:rw {}", p("team")));
    let member = as_nobody_with("--groups=4242", &format!("echo m >> {}", p("team")));
    assert!(member.status.success(), "{}", String::from_utf8_lossy(&member.stderr));
    assert!(nobody_fails(&format!("cat {}", p("team"))).contains(EACCES_TEXT));
    // Only the owner sets ACLs; a non-root owner may.
    assert!(nobody_fails(&format!("setfacl -m u:65534:rw {}", p("team"))).contains(EPERM_TEXT));
    mkdir_mode(&m.path("tmp"), 0o1777);
    nobody_succeeds(&format!("echo own > {}", p("tmp/own")));
    nobody_succeeds(&format!("chmod 600 {0} && setfacl -m u:4343:r {0}", p("tmp/own")));
    assert!(nobody_succeeds(&format!("getfacl -cn {}", p("tmp/own"))).contains("user:4343:r--"));
    let read_as_4343 = errno_as(4343, 4343, &[], || {
        rc_errno(unsafe { libc::access(cstr(&m.path("tmp/own")).as_ptr(), libc::R_OK) })
    });
    assert_eq!(read_as_4343, 0);
    let write_as_4343 = errno_as(4343, 4343, &[], || {
        rc_errno(unsafe { libc::access(cstr(&m.path("tmp/own")).as_ptr(), libc::W_OK) })
    });
    assert_eq!(write_as_4343, libc::EACCES);
    // An ACL that says no more than the mode is kept as the mode alone.
    root_succeeds(&format!("setfacl --set u::rw,g::r,o::- {}", p("team")));
    assert_eq!(fs::metadata(m.path("team")).unwrap().mode() & 0o777, 0o640);
    let (path, name) = (cstr(&m.path("team")), CString::new("system.posix_acl_access").unwrap());
    let listed = unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(listed, 0, "no attribute stored");
    // Malformed values are refused (EINVAL; another version is EOPNOTSUPP, as on XFS).
    let entry = |tag: u16, perm: u16| {
        [&tag.to_le_bytes()[..], &perm.to_le_bytes(), &u32::MAX.to_le_bytes()].concat()
    };
    let acl = |version: u32, entries: &[(u16, u16)]| {
        let mut v = version.to_le_bytes().to_vec();
        entries.iter().for_each(|&(t, p)| v.extend(entry(t, p)));
        v
    };
    let set = |value: &[u8]| {
        let v = value.as_ptr().cast();
        rc_errno(unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), v, value.len(), 0) })
    };
    let good = acl(2, &[(1, 6), (4, 4), (0x20, 0)]);
    assert_eq!(set(&good[..good.len() - 2]), libc::EINVAL, "torn entry");
    assert_eq!(set(&acl(2, &[(1, 0o10), (4, 4), (0x20, 0)])), libc::EINVAL, "perm");
    assert_eq!(set(&acl(2, &[(1, 6), (4, 4)])), libc::EINVAL, "no other entry");
    assert_eq!(set(&acl(2, &[(1, 6), (0x40, 4), (0x20, 0)])), libc::EINVAL, "tag");
    assert_eq!(set(&acl(1, &[(1, 6), (4, 4), (0x20, 0)])), libc::EOPNOTSUPP);
    assert_eq!(set(&good), 0);
    // ACLs survive a remount.
    m.remount();
    assert!(has(&acl_of(&secret), "user:65534:rw-"));
    assert_eq!(nobody_succeeds(&format!("cat {secret}")), "sx\n");
}

#[test]
fn default_acls_are_inherited_in_place_of_the_umask() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    let p = |rel: &str| m.path(rel).display().to_string();
    mkdir_mode(&m.path("proj"), 0o750);
    root_succeeds(&format!(
        "setfacl -m u:65534:rwx {0} && setfacl -d -m u:65534:rwx,g:4242:rx,o::- {0}",
        p("proj")
    ));
    // nobody creates with umask 077; the default ACL decides instead of the umask.
    nobody_succeeds(&format!(
        "umask 077 && echo n > {0}/f && mkdir {0}/sub && mkfifo {0}/fifo && ln -s f {0}/l",
        p("proj")
    ));
    let f = acl_of(&p("proj/f"));
    assert!(has(&f, "user:65534:rwx") && has(&f, "mask::rw-"), "{f:?}");
    assert!(has(&f, "group:4242:r-x") && has(&f, "other::---"), "{f:?}");
    assert_eq!(fs::metadata(m.path("proj/f")).unwrap().mode() & 0o777, 0o660);
    let sub = acl_of(&p("proj/sub"));
    assert!(has(&sub, "default:user:65534:rwx"), "{sub:?}");
    assert!(has(&sub, "user:65534:rwx") && has(&sub, "mask::rwx"), "{sub:?}");
    assert_eq!(fs::metadata(m.path("proj/sub")).unwrap().mode() & 0o777, 0o770);
    assert_eq!(fs::metadata(m.path("proj/fifo")).unwrap().mode() & 0o777, 0o660);
    assert!(has(&acl_of(&p("proj/fifo")), "group:4242:r-x"));
    // The inherited entries grant what they say: a member of 4242 reads, others do not.
    let member = as_nobody_with("--groups=4242", &format!("cat {}", p("proj/f")));
    let read_as = |uid, groups: &[libc::gid_t]| {
        errno_as(uid, uid, groups, || {
            rc_errno(unsafe { libc::access(cstr(&m.path("proj/f")).as_ptr(), libc::R_OK) })
        })
    };
    assert!(member.status.success());
    assert_eq!(read_as(4343, &[4242]), libc::EACCES, "no search permission on proj");
    root_succeeds(&format!("setfacl -m g:4242:rx {}", p("proj")));
    assert_eq!(read_as(4343, &[4242]), 0);
    assert_eq!(read_as(4343, &[]), libc::EACCES);
    // Grandchildren inherit through the new directory's default ACL.
    nobody_succeeds(&format!("umask 077 && touch {}", p("proj/sub/g")));
    assert!(has(&acl_of(&p("proj/sub/g")), "user:65534:rwx"));
    // Without a default ACL the umask applies.
    mkdir_mode(&m.path("tmp"), 0o1777);
    nobody_succeeds(&format!("umask 027 && touch {0}/u && mkdir {0}/d", p("tmp")));
    assert_eq!(fs::metadata(m.path("tmp/u")).unwrap().mode() & 0o777, 0o640);
    assert_eq!(fs::metadata(m.path("tmp/d")).unwrap().mode() & 0o777, 0o750);
    // A default ACL exists only on directories.
    let out = Command::new("setfacl")
        .args(["-d", "-m", "u:1:r", &p("proj/f")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // Removing the default ACL stops inheritance.
    root_succeeds(&format!("setfacl -k {}", p("proj")));
    nobody_succeeds(&format!("umask 077 && touch {}", p("proj/late")));
    assert_eq!(fs::metadata(m.path("proj/late")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(acl_of(&p("proj/late")).len(), 3);
}

/// A process holding `how` ("lockf" with `args`, or "flock") exclusively on `path` until
/// its stdin closes; returns once it holds the lock.
fn lock_holder(path: &Path, how: &str) -> std::process::Child {
    use std::io::BufRead;
    let script = format!(
        "import fcntl, sys\nf = open(sys.argv[1], 'r+')\nfcntl.{how}\nprint('locked', flush=True)\nsys.stdin.read()\n"
    );
    let mut child = Command::new("python3")
        .args(["-c", &script, path.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked", "the lock holder did not lock: {how}");
    child
}

/// `fcntl(F_SETLK)` of `start..start+len` from this process: the errno, 0 when granted.
fn try_lock(f: &File, typ: i32, start: i64, len: i64) -> i32 {
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = len;
    let fd = std::os::fd::AsRawFd::as_raw_fd(f);
    rc_errno(unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) })
}

#[test]
fn record_locks_flock_and_appends_between_processes() {
    if !can_mount() {
        return;
    }
    let m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("locked");
    fs::write(&p, vec![0u8; 100]).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();

    // Another process write-locks bytes 0..10: this one gets 10..20 but not 5..15, and
    // F_GETLK names the holder, its range and its pid.
    let mut holder = lock_holder(&p, "lockf(f, fcntl.LOCK_EX, 10, 0)");
    assert_eq!(try_lock(&f, libc::F_WRLCK, 10, 10), 0);
    assert_eq!(try_lock(&f, libc::F_RDLCK, 5, 10), libc::EAGAIN);
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    assert_eq!(rc_errno(unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) }), 0);
    assert_eq!(
        (i32::from(fl.l_type), fl.l_start, fl.l_len, fl.l_pid as u32),
        (libc::F_WRLCK, 0, 10, holder.id()),
        "F_GETLK"
    );
    // The holder is killed: its locks go with it.
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(try_lock(&f, libc::F_WRLCK, 0, 10), 0, "a dead process's lock stayed");
    // Unlocking is per range of this process's own locks.
    assert_eq!(try_lock(&f, libc::F_UNLCK, 0, 0), 0);

    // flock: exclusive against another open file, independent of record locks.
    let mut holder = lock_holder(&p, "flock(f, fcntl.LOCK_EX)");
    assert_eq!(try_lock(&f, libc::F_WRLCK, 0, 0), 0, "flock and fcntl locks interfered");
    assert_eq!(try_lock(&f, libc::F_UNLCK, 0, 0), 0);
    let busy = Command::new("flock").args(["-n"]).arg(&p).arg("true").status().unwrap();
    assert_eq!(busy.code(), Some(1), "flock -n got a lock another process holds");
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let free = Command::new("flock").args(["-n"]).arg(&p).arg("true").status().unwrap();
    assert!(free.success(), "the flock stayed after its holder closed the file");

    // Open file description locks (F_OFD_SETLK) belong to the open file: they conflict
    // with another open file's in the same process, stay while a duplicate of the
    // descriptor is open, and go with the open file's last close (which the kernel reports
    // after close(2) returns, so the last check waits a little for it).
    let ofd_lock = |f: &File, typ: i32| -> i32 {
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = typ as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        let fd = std::os::fd::AsRawFd::as_raw_fd(f);
        rc_errno(unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) })
    };
    let a = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let b = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    assert_eq!(ofd_lock(&a, libc::F_WRLCK), 0);
    assert_eq!(ofd_lock(&b, libc::F_WRLCK), libc::EAGAIN, "two open files' locks agreed");
    let a_dup = a.try_clone().unwrap();
    drop(a);
    assert_eq!(ofd_lock(&b, libc::F_WRLCK), libc::EAGAIN, "the lock went with a duplicate");
    drop(a_dup);
    let freed = (0..200).any(|_| {
        let granted = ofd_lock(&b, libc::F_WRLCK) == 0;
        if !granted {
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        granted
    });
    assert!(freed, "an open file's lock stayed after its last close");
    assert_eq!(ofd_lock(&b, libc::F_UNLCK), 0);
    drop(b);

    // O_APPEND writers in several processes: every line lands, whole.
    let log = m.path("appended");
    fs::write(&log, b"").unwrap();
    let writers: Vec<_> = (0..3)
        .map(|k| {
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "for i in $(seq 1 100); do printf '%-31s\\n' \"writer{k} $i\" >> {}; done",
                    log.display()
                ))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in writers {
        assert!(w.wait().unwrap().success());
    }
    let text = fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 300, "appends lost or torn:\n{text}");
    assert!(lines.iter().all(|l| l.len() == 31 && l.starts_with("writer")));
    lines.sort();
    lines.dedup();
    assert_eq!(lines.len(), 300);
}

/// Small writes (a logger's lines, `O_APPEND` records, a writer of 4 KiB pieces) through
/// one open file, and after each a second open file and `stat` on the same node: they see
/// every byte written so far, whether the mount gathers small writes in its daemon or not.
/// The writer's close, fsync and a remount keep them all.
#[test]
fn small_writes_seen_at_once_by_other_opens_and_stat() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("log");
    let mut expect = Vec::new();
    let mut w = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .unwrap();
    let mut r = File::open(&p).unwrap();
    for i in 0..2000usize {
        let line = format!("record {i:05} {}\n", "y".repeat(i % 300));
        w.write_all(line.as_bytes()).unwrap();
        expect.extend_from_slice(line.as_bytes());
        if i % 97 == 0 {
            assert_eq!(fs::metadata(&p).unwrap().len(), expect.len() as u64, "record {i}");
            let mut got = Vec::new();
            r.seek(SeekFrom::Start(0)).unwrap();
            r.read_to_end(&mut got).unwrap();
            assert!(got == expect, "record {i}: a reader's view differs");
        }
    }
    // 4 KiB pieces at increasing offsets through a plain (not O_APPEND) open, then fsync.
    let mut f = OpenOptions::new().write(true).open(&p).unwrap();
    let base = expect.len();
    f.seek(SeekFrom::Start(base as u64)).unwrap();
    let pieces = pattern(300 * 4096, 9);
    for piece in pieces.chunks(4096) {
        f.write_all(piece).unwrap();
    }
    expect.extend_from_slice(&pieces);
    assert_eq!(w.metadata().unwrap().len(), expect.len() as u64);
    f.sync_all().unwrap();
    drop((f, w, r));
    assert!(fs::read(&p).unwrap() == expect);
    m.remount();
    assert!(fs::read(&p).unwrap() == expect);
    m.unmount();
    assert!(m.fsck().is_clean());
}

/// `du` of a file written in small pieces and looked at while they were being written:
/// once it is closed, its block count covers its bytes (the kernel kept no count from
/// before the pieces were written).
#[test]
fn block_count_after_small_writes_and_a_stat_between() {
    if !can_mount() {
        return;
    }
    let mut m = Mounted::new(2, 128 << 20, small_fs());
    let p = m.path("small");
    let mut f = File::create(&p).unwrap();
    for _ in 0..50 {
        f.write_all(&[7u8; 1000]).unwrap();
    }
    let during = fs::metadata(&p).unwrap();
    assert_eq!(during.len(), 50_000);
    drop(f);
    let after = fs::metadata(&p).unwrap();
    assert_eq!(after.len(), 50_000);
    assert!(
        after.blocks() * 512 >= 50_000,
        "{} blocks of 512 bytes for 50,000 bytes written",
        after.blocks()
    );
    m.unmount();
    assert!(m.fsck().is_clean());
}
