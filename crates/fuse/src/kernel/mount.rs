//! Opening /dev/fuse and mounting it with mount(2); the daemon runs as root, so no
//! fusermount helper is involved.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `FUSE_DEV_IOC_CLONE` = `_IOR(229, 0, uint32_t)`: attach a new /dev/fuse file to an
/// existing connection, so each request thread reads and answers on its own file.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Opens a new /dev/fuse file (close-on-exec).
pub(crate) fn open_dev() -> io::Result<OwnedFd> {
    // SAFETY: the path is a NUL-terminated literal; the returned fd is checked.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("opening /dev/fuse: {e}")));
    }
    // SAFETY: fd is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new /dev/fuse file on the connection of `session`.
pub(crate) fn clone_dev(session: RawFd) -> io::Result<OwnedFd> {
    let fd = open_dev()?;
    let mut src = u32::try_from(session).expect("fd is non-negative");
    // SAFETY: the ioctl reads one u32 from a valid pointer.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut src) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// What mount(2) is told.
pub(crate) struct MountConfig<'a> {
    pub(crate) fs_name: &'a str,
    pub(crate) subtype: &'a str,
    pub(crate) allow_other: bool,
    pub(crate) max_read: u32,
}

/// The option string for the kernel. With `default_permissions` the kernel checks
/// permissions too: it opens FIFOs, sockets and device nodes without asking the file
/// system, so without its check a root-owned 0600 FIFO or disk node would open for anyone.
pub(crate) fn mount_options(fd: RawFd, cfg: &MountConfig<'_>) -> String {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut opts = format!(
        "fd={fd},rootmode=40000,user_id={uid},group_id={gid},max_read={},\
         subtype={},default_permissions",
        cfg.max_read, cfg.subtype
    );
    if cfg.allow_other {
        opts.push_str(",allow_other");
    }
    opts
}

/// Mounts the connection of `fd` at `mountpoint`.
pub(crate) fn mount(fd: RawFd, mountpoint: &Path, cfg: &MountConfig<'_>) -> io::Result<()> {
    let target = cstring(mountpoint)?;
    let source = CString::new(cfg.fs_name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "fs name contains NUL"))?;
    let opts = CString::new(mount_options(fd, cfg)).expect("no NUL in options");
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            c"fuse".as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mount({}) with {opts:?}: {e}", mountpoint.display()),
        ));
    }
    Ok(())
}

/// umount2(2) with `flags`.
pub(crate) fn unmount(mountpoint: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cstring(mountpoint)?;
    // SAFETY: target is a valid NUL-terminated string.
    if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Where the fusectl file system lists the FUSE connections.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Aborts the FUSE connection of the mount whose device number is `dev` through the fusectl
/// file system, which makes every pending request and every request thread finish. Used
/// only when a regular unmount failed. Machines without systemd (containers, minimal
/// installs) often do not mount fusectl: it is mounted here first, as systemd would.
pub(crate) fn abort_connection(dev: u64) -> io::Result<()> {
    let dir = format!("{FUSECTL}/{}", libc::minor(dev));
    if !Path::new(&dir).exists() {
        mount_fusectl()?;
    }
    let path = format!("{dir}/abort");
    std::fs::write(&path, b"1").map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// Requests the kernel holds for the connection of the mount whose device number is `dev`:
/// queued for the daemon or being served (fusectl's `waiting`). `None` when fusectl is not
/// mounted and cannot be.
pub(crate) fn waiting_requests(dev: u64) -> Option<u64> {
    let dir = format!("{FUSECTL}/{}", libc::minor(dev));
    if !Path::new(&dir).exists() {
        mount_fusectl().ok()?;
    }
    std::fs::read_to_string(format!("{dir}/waiting"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Mounts fusectl at its usual place; an already mounted one (EBUSY) is fine.
fn mount_fusectl() -> io::Result<()> {
    let target = CString::new(FUSECTL).expect("no NUL");
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            target.as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(io::Error::new(
                e.kind(),
                format!("fusectl is not mounted at {FUSECTL} and mounting it failed: {e}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_checks_permissions_too() {
        let cfg = MountConfig {
            fs_name: "t",
            subtype: "tessera",
            allow_other: true,
            max_read: 1 << 20,
        };
        let opts = mount_options(3, &cfg);
        assert!(opts.contains(",default_permissions"), "{opts}");
        assert!(opts.ends_with(",allow_other"), "{opts}");
        assert!(opts.starts_with("fd=3,"), "{opts}");
    }
}
