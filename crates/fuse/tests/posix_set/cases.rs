// POSIX behaviour through a real kernel mount: the conformance set Tessera holds itself to.
// Included by `posix.rs` (NSDs on file-backed drives) and `posix_vdisk.rs` (NSDs on
// erasure-coded vdisks), which set `BACKEND`; every test mounts a fresh file system.


use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use harness::{can_mount, small_fs, Mounted};

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
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
        let d = pattern(*size, i as u32 + 7);
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
            pattern(*size, i as u32 + 7),
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
    let (a, b) = (cstr(&m.path("a")), cstr(&m.path("b")));
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!((rc, errno()), (-1, libc::EEXIST));
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0);
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
    unsafe {
        use std::os::unix::io::AsRawFd;
        let addr = libc::mmap(
            std::ptr::null_mut(),
            1 << 20,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED);
        std::ptr::copy_nonoverlapping(b"mapped!".as_ptr(), addr.cast::<u8>().add(4096), 7);
        assert_eq!(libc::msync(addr, 1 << 20, libc::MS_SYNC), 0);
        libc::munmap(addr, 1 << 20);
    }
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
