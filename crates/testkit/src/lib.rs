//! Helpers shared by the test suites of Tessera's crates (a dev-dependency only).

mod drive;

pub use drive::{Faults, SimDrive};

/// Deterministic pseudo-random bytes (xorshift), so a test can write data and later check
/// every byte by regenerating it from the seed instead of keeping a copy.
/// Opens a file drive, waiting out a claim that is only passing through: a test binary
/// runs several crash loops as threads of one process, and a child one thread forks while
/// another has the drive open holds the drive's lock until its exec closes the descriptor,
/// which on a loaded machine can take a moment. Other errors return at once.
pub fn open_drive_waiting(path: &std::path::Path) -> std::io::Result<tessera_drive::FileDrive> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match tessera_drive::FileDrive::open(path) {
            Err(e)
                if e.kind() == std::io::ErrorKind::ResourceBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// How many rounds a crash or power-loss loop runs: the number in environment variable
/// `var` (e.g. `TESSERA_POWERLOSS_ITERATIONS=500` for a long run by hand), else `default`.
/// A value that is not a number stops the test rather than silently running the default.
pub fn iterations(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v}: expected a number of rounds")),
        Err(_) => default,
    }
}

/// Counts panics in every thread of the process from now on (a server's threads included,
/// whose panics would not fail a test by themselves), still printing them as usual.
pub fn count_panics() -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let panics = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&panics);
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        counter.fetch_add(1, Ordering::SeqCst);
        default(info);
    }));
    panics
}

/// renameat2(2) of `from` to `to` with `flags` (`libc::RENAME_NOREPLACE`,
/// `libc::RENAME_EXCHANGE`), which the standard library does not offer.
pub fn renameat2(from: &std::path::Path, to: &std::path::Path, flags: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &std::path::Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that live across the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A temporary directory the unprivileged user of the permission cases can reach (0755),
/// removed on drop.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// Runs a Python 3 `script` in a child process with `args` and returns what it printed,
/// failing the test with its error output when it fails. The mapped-file cases of the POSIX
/// set touch mapped files only through this (Python's `mmap` module is mmap(2), msync(2)
/// and munmap(2)): a page fault on a file of a mount this process serves would hold its
/// address-space lock until the file system answers (see the FUSE test harness).
pub fn in_child(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 runs (the mapped-file cases need it: apt-get install python3)");
    assert!(
        out.status.success(),
        "child process failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the child prints text")
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_repeat_by_seed_and_differ_between_seeds() {
        assert_eq!(super::pattern(4096, 7), super::pattern(4096, 7));
        assert_ne!(super::pattern(4096, 7), super::pattern(4096, 8));
        assert_eq!(super::pattern(100, 1).len(), 100);
    }
}
