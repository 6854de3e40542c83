//! Permission checks of the POSIX namespace (owner, group, other bits and POSIX ACLs;
//! sticky directories; who may change attributes), done by the file system itself.
//!
//! The FUSE mount also lets the kernel check (`default_permissions`, see `tessera-fuse`):
//! the kernel opens FIFOs and device nodes without asking the file system, so only its own
//! check can refuse them. These checks stay the file system's authority for every request
//! that reaches it. The rules are those of the kernel's `generic_permission` (with
//! `posix_acl_permission`), `may_delete`, `setattr_prepare` and `xattr_permission`, so a
//! non-root user sees the same answers as on ext4 or XFS.
//!
//! The checks are the client's: each asks the metanode of the objects it checks for their
//! protection (attributes and access ACL) and is made before the operation is sent. A
//! `chmod` that lands between the two is therefore ordered after the operation, exactly as
//! a process that passed the kernel's path walk just before a `chmod` is.

use std::sync::OnceLock;

use crate::acl::{self, Acl};
use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, FileKind, Ino, Timestamp};

/// Read, write and execute/search, as in the kernel's `MAY_*` masks and access(2).
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;
const S_IXGRP: u32 = 0o010;
/// Execute or search for owner, group and others.
const S_IXUGO: u32 = 0o111;

/// Supplementary groups kept at most; `NGROUPS_MAX` on Linux is 65536.
const GROUPS_MAX: usize = 65_536;

/// Who asks: the uid, gid and pid of the calling thread as the kernel reports them, with
/// its supplementary groups read from `/proc` only when a check needs them.
#[derive(Debug)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    groups: OnceLock<Vec<u32>>,
}

impl Credentials {
    pub fn new(uid: u32, gid: u32, pid: u32) -> Credentials {
        Credentials {
            uid,
            gid,
            pid,
            groups: OnceLock::new(),
        }
    }

    /// Credentials with known supplementary groups (tests, or callers that know them).
    pub fn with_groups(uid: u32, gid: u32, groups: Vec<u32>) -> Credentials {
        let c = Credentials::new(uid, gid, 0);
        c.groups.set(groups).expect("fresh OnceLock");
        c
    }

    /// uid 0 holds `CAP_DAC_OVERRIDE`, `CAP_FOWNER` and `CAP_CHOWN`.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is the caller's primary group or one of its supplementary groups.
    /// The supplementary groups come from the `Groups:` line of `/proc/<pid>/status`, read
    /// once; a caller whose `/proc` entry cannot be read (it exited, or the request came
    /// from the kernel with pid 0) is in no supplementary group, which can only deny.
    pub fn in_group(&self, gid: u32) -> bool {
        if gid == self.gid {
            return true;
        }
        self.groups
            .get_or_init(|| read_groups(self.pid))
            .contains(&gid)
    }
}

fn read_groups(pid: u32) -> Vec<u32> {
    if pid == 0 {
        return Vec::new();
    }
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => parse_groups(&status),
        Err(_) => Vec::new(),
    }
}

/// The supplementary groups of a `/proc/<pid>/status` text.
fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .take(GROUPS_MAX)
                .collect()
        })
        .unwrap_or_default()
}

/// What guards an inode: its attributes and its access ACL, if it has one.
#[derive(Clone, Debug)]
pub struct Protection {
    pub attr: Attr,
    pub acl: Option<Acl>,
}

impl From<Attr> for Protection {
    fn from(attr: Attr) -> Protection {
        Protection { attr, acl: None }
    }
}

/// The kernel's `generic_permission`: may `cred` do `mask` (`MAY_*` bits) to `p`?
/// The owner gets the owner bits; others are judged by the access ACL if there is one,
/// else a member of the file's group gets the group bits and everyone else the other
/// bits. Root may always read and write, and execute a directory (search) or a file with
/// at least one execute bit.
pub fn permitted(p: &Protection, cred: &Credentials, mask: u32) -> bool {
    let attr = &p.attr;
    let mask = mask & (MAY_READ | MAY_WRITE | MAY_EXEC);
    let mode = u32::from(attr.perm);
    if cred.is_root() {
        return mask & MAY_EXEC == 0 || attr.kind == FileKind::Directory || mode & S_IXUGO != 0;
    }
    if let Some(acl) = p.acl.as_ref().filter(|_| cred.uid != attr.uid) {
        return acl.permits(cred.uid, attr.gid, |g| cred.in_group(g), mask);
    }
    let bits = if cred.uid == attr.uid {
        mode >> 6
    } else if ((mode >> 3) ^ mode) & mask != 0 && cred.in_group(attr.gid) {
        // Group membership matters only when the group bits differ from the others' for
        // this mask (as in the kernel), which spares most checks a read of /proc.
        mode >> 3
    } else {
        mode
    };
    mask & !bits & 7 == 0
}

fn require(p: &Protection, cred: &Credentials, mask: u32) -> FsResult<()> {
    if permitted(p, cred, mask) {
        Ok(())
    } else {
        Err(FsError::PermissionDenied)
    }
}

fn owner_or_root(attr: &Attr, cred: &Credentials) -> bool {
    cred.is_root() || cred.uid == attr.uid
}

/// The kernel's `may_delete` minus existence: search and write on the directory, and in a
/// sticky directory ownership of the file or the directory.
fn may_delete(dir: &Protection, victim: Option<&Attr>, cred: &Credentials) -> FsResult<()> {
    require(dir, cred, MAY_WRITE | MAY_EXEC)?;
    let Some(victim) = victim else {
        return Ok(());
    };
    let dir = &dir.attr;
    let sticky = u32::from(dir.perm) & S_ISVTX != 0;
    if sticky && !cred.is_root() && cred.uid != victim.uid && cred.uid != dir.uid {
        return Err(FsError::NotPermitted(
            "the directory is sticky: only the owner of the file or the directory may \
             remove or rename it"
                .into(),
        ));
    }
    Ok(())
}

/// How a setattr sets a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeChange {
    /// To the current time (`utimensat` with `UTIME_NOW` or no times).
    Now,
    /// To this time.
    Explicit(Timestamp),
}

/// What a setattr asks to change, for its permission check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrChange {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: bool,
    pub atime: Option<TimeChange>,
    pub mtime: Option<TimeChange>,
    /// The status-change time; only the kernel sends one (no system call sets it).
    pub ctime: Option<Timestamp>,
    /// The request names a handle open for writing. The kernel names one only for
    /// ftruncate (the VFS checked the file is open for writing), open with O_TRUNC, and the
    /// time flushes of written files, so it stands for write permission checked at open.
    pub open_for_write: bool,
}

/// How far back a modification or status-change time written back by the kernel may lie.
/// With the writeback cache the kernel stamps mtime and ctime itself when a file is
/// written or touched and sends them later as explicit times (`fuse_flush_times`), from
/// whichever process triggers the writeback: at close, fsync, syncfs, or the flusher after
/// `dirty_expire_centisecs` (30 s by default). Such a time is now or a little in the past.
pub const FLUSHED_TIME_WINDOW_SECS: i64 = 600;
/// Clock skew allowed above now (the kernel's and our clock are the same clock, read at
/// different moments).
const FLUSHED_TIME_SLACK_SECS: i64 = 1;

/// Whether `t` may be a time the kernel stamped and now writes back.
fn recent(t: Timestamp, now: Timestamp) -> bool {
    t.secs >= now.secs - FLUSHED_TIME_WINDOW_SECS && t.secs <= now.secs + FLUSHED_TIME_SLACK_SECS
}

/// Whether a non-owner's chmod only clears setuid or setgid bits. The kernel sends such a
/// chmod itself, from the writing process, when a non-owner writes to or truncates a
/// setuid or setgid file (`file_remove_privs`); any writer may have it, as any writer
/// clears these bits on a local file system.
fn only_clears_suid_sgid(old: u32, new: u32) -> bool {
    let (old, new) = (old & 0o7777, new & 0o7777);
    new != old && new & !old == 0 && (old ^ new) & !(S_ISUID | S_ISGID) == 0
}

fn eperm<T>(what: &str) -> FsResult<T> {
    Err(FsError::NotPermitted(format!(
        "only the owner or root may {what}"
    )))
}

/// The kernel's `setattr_prepare` (and the write check of truncate and `touch`) for one
/// setattr of `p` by `cred` at `now`. Returns the mode to store, if the request changes it:
/// a non-root caller outside the file's (new) group cannot keep `S_ISGID`, as in the
/// kernel. EPERM where only the owner may act, EACCES where write permission would do.
pub fn check_setattr(
    p: &Protection,
    cred: &Credentials,
    c: &AttrChange,
    now: Timestamp,
) -> FsResult<Option<u32>> {
    let attr = &p.attr;
    let root = cred.is_root();
    let owner = cred.uid == attr.uid;
    let writer = || c.open_for_write || permitted(p, cred, MAY_WRITE);
    if c.size && !c.open_for_write && !permitted(p, cred, MAY_WRITE) {
        return Err(FsError::PermissionDenied);
    }
    if let Some(uid) = c.uid {
        // The owner may "change" the owner to himself; only root gives a file away.
        let allowed = root || (owner && uid == attr.uid);
        if !allowed {
            return Err(FsError::NotPermitted(
                "only root may change the owner of a file".into(),
            ));
        }
    }
    if let Some(gid) = c.gid {
        let allowed = root || (owner && (gid == attr.gid || cred.in_group(gid)));
        if !allowed {
            return Err(FsError::NotPermitted(
                "only root, or the owner changing to a group he is in, may change the group".into(),
            ));
        }
    }
    let mut mode = c.mode;
    if let Some(m) = c.mode {
        if !root && !owner {
            if !(only_clears_suid_sgid(u32::from(attr.perm), m) && writer()) {
                return eperm("change the mode of a file");
            }
        } else if !root && !cred.in_group(c.gid.unwrap_or(attr.gid)) {
            mode = Some(m & !S_ISGID);
        }
    }
    if !(root || owner) {
        check_times_of_non_owner(c, now, writer)?;
    }
    Ok(mode)
}

/// A non-owner may set times only to now, with write permission (EACCES), never to a
/// chosen time (EPERM). The one exception is what the kernel writes back itself (see
/// [`FLUSHED_TIME_WINDOW_SECS`]): an explicit mtime or ctime within the window, from
/// whoever triggered the writeback, which need not be a writer (`syncfs` of a file system
/// holding another user's written files). Such a time cannot back-date or forward-date a
/// file by more than the window; ctime alone is also what `chown(f, -1, -1)` sends.
fn check_times_of_non_owner(
    c: &AttrChange,
    now: Timestamp,
    writer: impl Fn() -> bool,
) -> FsResult<()> {
    if matches!(c.atime, Some(TimeChange::Explicit(_))) {
        return eperm("set the access time to a chosen value");
    }
    if let Some(TimeChange::Explicit(t)) = c.mtime {
        if !recent(t, now) {
            return eperm("set the modification time to a chosen value");
        }
    }
    if c.ctime.is_some_and(|t| !recent(t, now)) {
        return eperm("set the status change time");
    }
    let to_now = c.atime == Some(TimeChange::Now) || c.mtime == Some(TimeChange::Now);
    if to_now && !writer() {
        return Err(FsError::PermissionDenied);
    }
    Ok(())
}

/// The namespaces of extended attributes, as they are guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum XattrSpace {
    User,
    Trusted,
    Security,
    PosixAcl,
    Other,
}

fn xattr_space(name: &[u8]) -> XattrSpace {
    if acl::acl_xattr(name).is_some() {
        XattrSpace::PosixAcl
    } else if name.starts_with(b"user.") {
        XattrSpace::User
    } else if name.starts_with(b"trusted.") {
        XattrSpace::Trusted
    } else if name.starts_with(b"security.") {
        XattrSpace::Security
    } else {
        XattrSpace::Other
    }
}

/// The kernel's `xattr_permission` plus the capability checks of `security.*`:
/// `user.*` needs read or write permission and exists only on regular files and
/// directories (in a sticky directory only its owner may write them); `trusted.*` is
/// root's; `security.*` anyone may read and only root may write; POSIX ACLs anyone may
/// read and only the owner or root may set (the kernel's `posix_acl_xattr_set`).
pub fn check_xattr(p: &Protection, cred: &Credentials, name: &[u8], write: bool) -> FsResult<()> {
    let attr = &p.attr;
    let denied = |what: &str| {
        if write {
            Err(FsError::NotPermitted(what.to_string()))
        } else {
            Err(FsError::NoXattr)
        }
    };
    match xattr_space(name) {
        XattrSpace::User => {
            if !matches!(attr.kind, FileKind::Regular | FileKind::Directory) {
                return denied("user.* attributes exist only on files and directories");
            }
            let sticky_dir =
                attr.kind == FileKind::Directory && u32::from(attr.perm) & S_ISVTX != 0;
            if write && sticky_dir && !owner_or_root(attr, cred) {
                return denied("only the owner may set attributes of a sticky directory");
            }
            require(p, cred, if write { MAY_WRITE } else { MAY_READ })
        }
        XattrSpace::PosixAcl if write && !owner_or_root(attr, cred) => {
            eperm("set the ACL of a file")
        }
        XattrSpace::Trusted if !cred.is_root() => denied("trusted.* attributes are root's"),
        XattrSpace::Security if write && !cred.is_root() => {
            denied("only root may set security.* attributes")
        }
        XattrSpace::Trusted | XattrSpace::Security | XattrSpace::PosixAcl | XattrSpace::Other => {
            Ok(())
        }
    }
}

/// A listxattr answer (NUL-terminated names) as `cred` may see it: `trusted.*` names are
/// hidden from everyone but root, as ext4 and XFS do.
pub fn visible_xattr_names(names: Vec<u8>, cred: &Credentials) -> Vec<u8> {
    if cred.is_root() {
        return names;
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names.split_inclusive(|&c| c == 0) {
        if xattr_space(name) != XattrSpace::Trusted {
            out.extend_from_slice(name);
        }
    }
    out
}

/// The kernel's `may_linkat` with `fs.protected_hardlinks` on (every distribution's
/// default): a non-owner may link only a regular file that is not setuid, not setgid and
/// group-executable, and that he may read and write.
fn may_link_source(p: &Protection, cred: &Credentials) -> FsResult<()> {
    let attr = &p.attr;
    if owner_or_root(attr, cred) {
        return Ok(());
    }
    let mode = u32::from(attr.perm);
    let safe = attr.kind == FileKind::Regular
        && mode & S_ISUID == 0
        && mode & (S_ISGID | S_IXGRP) != S_ISGID | S_IXGRP
        && permitted(p, cred, MAY_READ | MAY_WRITE);
    if safe {
        Ok(())
    } else {
        Err(FsError::NotPermitted(
            "only the owner may hard-link a file he cannot read and write".into(),
        ))
    }
}

/// What [`FileSystem::may_setattr`] found.
#[derive(Clone, Copy, Debug)]
pub struct SetattrPermit {
    /// The mode to store, when the request changes it (see [`check_setattr`]).
    pub mode: Option<u32>,
}

impl FileSystem {
    /// The protection of `ino`, from its metanode.
    fn protection_of(&self, ino: Ino) -> FsResult<Protection> {
        self.routed(ino, |ns| ns.protection(ino))
    }

    /// EACCES unless `cred` may do `mask` (`MAY_*`) to `ino`; `mask` 0 checks existence.
    pub fn may_access(&self, ino: Ino, cred: &Credentials, mask: u32) -> FsResult<()> {
        require(&self.protection_of(ino)?, cred, mask)
    }

    /// Checks `mask` on the directory `dir` (search for a lookup, write and search for a
    /// create).
    /// A non-directory passes, so that the operation itself answers ENOTDIR.
    pub fn may_use_dir(&self, dir: Ino, cred: &Credentials, mask: u32) -> FsResult<()> {
        let p = self.protection_of(dir)?;
        if p.attr.kind == FileKind::Directory {
            require(&p, cred, mask)?;
        }
        Ok(())
    }

    /// The attributes of what `name` in `dir` names, if it exists (a name the operation
    /// itself will refuse counts as absent here, so that the operation gives its own error).
    fn child_attr(&self, dir: Ino, name: &[u8]) -> FsResult<Option<Attr>> {
        match self.lookup(dir, name) {
            Ok(attr) => Ok(Some(attr)),
            Err(FsError::NotFound | FsError::NotDir | FsError::NameTooLong) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// unlink and rmdir: write and search on `dir`, and the sticky-directory rule.
    pub fn may_remove(&self, dir: Ino, name: &[u8], cred: &Credentials) -> FsResult<()> {
        let d = self.protection_of(dir)?;
        if d.attr.kind != FileKind::Directory {
            return Ok(());
        }
        // The victim matters only to the sticky-directory rule: its lookup (a round trip
        // on a client, where another node changes the directory) only when that applies.
        let sticky = u32::from(d.attr.perm) & S_ISVTX != 0;
        if !sticky || cred.is_root() || cred.uid == d.attr.uid {
            return may_delete(&d, None, cred);
        }
        let victim = self.child_attr(dir, name)?;
        may_delete(&d, victim.as_ref(), cred)
    }

    /// rename and renameat2: removal from the old directory, removal of a replaced
    /// target or creation in the new one, and write permission on a directory whose `..`
    /// changes. `exchange` applies the rules to both sides.
    pub fn may_rename(
        &self,
        (dir, name): (Ino, &[u8]),
        (new_dir, new_name): (Ino, &[u8]),
        exchange: bool,
        cred: &Credentials,
    ) -> FsResult<()> {
        let d = self.protection_of(dir)?;
        let n = self.protection_of(new_dir)?;
        if d.attr.kind != FileKind::Directory || n.attr.kind != FileKind::Directory {
            return Ok(());
        }
        let source = self.child_attr(dir, name)?;
        let target = self.child_attr(new_dir, new_name)?;
        may_delete(&d, source.as_ref(), cred)?;
        // Without a target this is the create check: write and search.
        may_delete(&n, target.as_ref(), cred)?;
        if dir != new_dir {
            for moved in [source, exchange.then_some(target).flatten()]
                .into_iter()
                .flatten()
            {
                // A directory that changes parents has its `..` rewritten.
                if moved.kind == FileKind::Directory {
                    require(&self.protection_of(moved.ino)?, cred, MAY_WRITE)?;
                }
            }
        }
        Ok(())
    }

    /// link: write and search on the new directory, and `protected_hardlinks` on the
    /// source.
    pub fn may_link(&self, ino: Ino, new_dir: Ino, cred: &Credentials) -> FsResult<()> {
        let n = self.protection_of(new_dir)?;
        if n.attr.kind == FileKind::Directory {
            require(&n, cred, MAY_WRITE | MAY_EXEC)?;
        }
        may_link_source(&self.protection_of(ino)?, cred)?;
        Ok(())
    }

    /// setattr: see [`check_setattr`].
    pub fn may_setattr(
        &self,
        ino: Ino,
        cred: &Credentials,
        change: &AttrChange,
    ) -> FsResult<SetattrPermit> {
        let p = self.protection_of(ino)?;
        Ok(SetattrPermit {
            mode: check_setattr(&p, cred, change, self.now())?,
        })
    }

    /// getxattr, setxattr and removexattr: see [`check_xattr`].
    pub fn may_xattr(
        &self,
        ino: Ino,
        cred: &Credentials,
        name: &[u8],
        write: bool,
    ) -> FsResult<()> {
        check_xattr(&self.protection_of(ino)?, cred, name, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::Timestamp;

    fn attr(kind: FileKind, perm: u16, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: 7,
            kind,
            perm,
            uid,
            gid,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            crtime: Timestamp::default(),
            generation: 0,
        }
    }

    fn file(perm: u16) -> Protection {
        attr(FileKind::Regular, perm, 1000, 100).into()
    }

    fn now() -> Timestamp {
        Timestamp::now()
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
        Credentials::with_groups(uid, gid, groups.to_vec())
    }

    const R: u32 = MAY_READ;
    const W: u32 = MAY_WRITE;
    const X: u32 = MAY_EXEC;

    #[test]
    fn owner_group_other_bits() {
        let f = file(0o640);
        let owner = user(1000, 5, &[]);
        let member = user(2000, 5, &[100]);
        let other = user(3000, 5, &[]);
        assert!(permitted(&f, &owner, R | W));
        assert!(!permitted(&f, &owner, X));
        assert!(permitted(&f, &member, R));
        assert!(!permitted(&f, &member, W));
        assert!(!permitted(&f, &other, R));
        // The primary group counts as well.
        assert!(permitted(&f, &user(2000, 100, &[]), R));
        // The owner gets the owner bits even when the group or others would grant more.
        assert!(!permitted(&file(0o077), &owner, R));
        // A member gets the group bits even when others would grant more.
        assert!(!permitted(&file(0o607), &member, R));
        assert!(permitted(&f, &other, 0));
    }

    #[test]
    fn root_reads_and_writes_but_executes_only_with_an_x_bit() {
        let root = user(0, 0, &[]);
        assert!(permitted(&file(0o000), &root, R | W));
        assert!(!permitted(&file(0o644), &root, X));
        assert!(permitted(&file(0o744), &root, X));
        assert!(permitted(&file(0o001), &root, X));
        let dir = Protection::from(attr(FileKind::Directory, 0o000, 1000, 100));
        assert!(permitted(&dir, &root, R | W | X));
    }

    #[test]
    fn groups_come_from_proc_status() {
        let status = "Name:\tsh\nUid:\t0\t0\t0\t0\nGroups:\t4 24 4242 \nNgid:\t0\n";
        assert_eq!(parse_groups(status), vec![4, 24, 4242]);
        assert_eq!(parse_groups("Groups:\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
        // This process: its own primary group is in, a made-up group is not.
        let me = Credentials::new(1, 2, std::process::id());
        assert!(me.in_group(2));
        assert!(!me.in_group(4_000_000_000));
        // A vanished process has no supplementary groups.
        assert!(!Credentials::new(1, 2, 0).in_group(3));
    }

    #[test]
    fn sticky_directories_protect_other_users_files() {
        let dir = Protection::from(attr(FileKind::Directory, 0o1777, 0, 0));
        let theirs = file(0o644);
        let mine = attr(FileKind::Regular, 0o644, 65534, 65534);
        let nobody = user(65534, 65534, &[]);
        assert!(matches!(
            may_delete(&dir, Some(&theirs.attr), &nobody),
            Err(FsError::NotPermitted(_))
        ));
        assert!(may_delete(&dir, Some(&mine), &nobody).is_ok());
        assert!(may_delete(&dir, Some(&theirs.attr), &user(0, 0, &[])).is_ok());
        // The directory's owner may remove anything in it.
        let own_dir = Protection::from(attr(FileKind::Directory, 0o1777, 65534, 0));
        assert!(may_delete(&own_dir, Some(&theirs.attr), &nobody).is_ok());
        // Without write permission the answer is EACCES before the sticky rule.
        let closed = Protection::from(attr(FileKind::Directory, 0o1755, 0, 0));
        assert!(matches!(
            may_delete(&closed, Some(&mine), &nobody),
            Err(FsError::PermissionDenied)
        ));
    }

    fn change() -> AttrChange {
        AttrChange::default()
    }

    #[test]
    fn chown_and_chgrp() {
        let f = file(0o644);
        let owner = user(1000, 100, &[200]);
        let other = user(3000, 100, &[]);
        let root = user(0, 0, &[]);
        let to_uid = |uid| AttrChange {
            uid: Some(uid),
            ..change()
        };
        let to_gid = |gid| AttrChange {
            gid: Some(gid),
            ..change()
        };
        assert!(check_setattr(&f, &root, &to_uid(5), now()).is_ok());
        assert!(matches!(
            check_setattr(&f, &owner, &to_uid(5), now()),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_setattr(&f, &owner, &to_uid(1000), now()).is_ok());
        assert!(check_setattr(&f, &other, &to_uid(3000), now()).is_err());
        assert!(check_setattr(&f, &owner, &to_gid(200), now()).is_ok());
        assert!(check_setattr(&f, &owner, &to_gid(100), now()).is_ok());
        assert!(matches!(
            check_setattr(&f, &owner, &to_gid(300), now()),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_setattr(&f, &other, &to_gid(100), now()).is_err());
        assert!(check_setattr(&f, &root, &to_gid(300), now()).is_ok());
    }

    #[test]
    fn chmod_by_owner_only_and_setgid_needs_the_group() {
        let f = file(0o644);
        let mode = |m| AttrChange {
            mode: Some(m),
            ..change()
        };
        let owner_in_group = user(1000, 100, &[]);
        let owner_outside = user(1000, 5, &[]);
        assert_eq!(
            check_setattr(&f, &owner_in_group, &mode(0o2755), now()).unwrap(),
            Some(0o2755)
        );
        assert_eq!(
            check_setattr(&f, &owner_outside, &mode(0o2755), now()).unwrap(),
            Some(0o755)
        );
        assert_eq!(
            check_setattr(&f, &user(0, 0, &[]), &mode(0o2755), now()).unwrap(),
            Some(0o2755)
        );
        let other = user(3000, 3000, &[]);
        assert!(matches!(
            check_setattr(&file(0o666), &other, &mode(0o777), now()),
            Err(FsError::NotPermitted(_))
        ));
        // The kernel's own chmod after a non-owner's write to a setuid file.
        let suid = file(0o4766);
        assert_eq!(
            check_setattr(&suid, &other, &mode(0o766), now()).unwrap(),
            Some(0o766)
        );
        assert!(check_setattr(&file(0o4755), &other, &mode(0o755), now()).is_err());
        assert!(check_setattr(&suid, &other, &mode(0o4766), now()).is_err());
        assert!(check_setattr(&suid, &other, &mode(0o4777), now()).is_err());
    }

    #[test]
    fn times_and_size() {
        let other = user(3000, 3000, &[]);
        let owner = user(1000, 100, &[]);
        let t = |secs: i64| Timestamp { secs, nsecs: 0 };
        let now = now();
        let long_ago = t(946_684_800);
        let far_ahead = t(now.secs + 365 * 86_400);
        let chosen = |atime, mtime| AttrChange {
            atime,
            mtime,
            ctime: Some(now),
            ..change()
        };
        // `touch -d` and utimensat with a chosen mtime on someone else's file, even a
        // writable one: EPERM, whether or not he may write (POSIX).
        for f in [file(0o666), file(0o644)] {
            for when in [long_ago, far_ahead] {
                let explicit = Some(TimeChange::Explicit(when));
                for c in [chosen(explicit, explicit), chosen(None, explicit)] {
                    assert!(matches!(
                        check_setattr(&f, &other, &c, now),
                        Err(FsError::NotPermitted(_))
                    ));
                }
            }
        }
        let explicit = Some(TimeChange::Explicit(long_ago));
        assert!(check_setattr(&file(0o600), &owner, &chosen(explicit, explicit), now).is_ok());
        // `touch` through the writeback cache: atime now, explicit mtime and ctime of now.
        let touch = chosen(Some(TimeChange::Now), Some(TimeChange::Explicit(now)));
        assert!(check_setattr(&file(0o666), &other, &touch, now).is_ok());
        assert!(matches!(
            check_setattr(&file(0o644), &other, &touch, now),
            Err(FsError::PermissionDenied)
        ));
        assert!(check_setattr(&file(0o444), &owner, &touch, now).is_ok());
        // The kernel's writeback of times it stamped a little earlier, triggered by anyone
        // (syncfs); and ctime alone, which chown(f, -1, -1) sends.
        let flush = AttrChange {
            mtime: Some(TimeChange::Explicit(t(now.secs - 40))),
            ctime: Some(t(now.secs - 40)),
            ..change()
        };
        assert!(check_setattr(&file(0o600), &other, &flush, now).is_ok());
        let stale = AttrChange {
            mtime: Some(TimeChange::Explicit(t(
                now.secs - 2 * FLUSHED_TIME_WINDOW_SECS
            ))),
            ..flush
        };
        assert!(check_setattr(&file(0o666), &other, &stale, now).is_err());
        let ctime_only = AttrChange {
            ctime: Some(now),
            ..change()
        };
        assert!(check_setattr(&file(0o600), &other, &ctime_only, now).is_ok());
        let old_ctime = AttrChange {
            ctime: Some(long_ago),
            ..change()
        };
        assert!(check_setattr(&file(0o666), &other, &old_ctime, now).is_err());
        let truncate = AttrChange {
            size: true,
            ..change()
        };
        assert!(check_setattr(&file(0o666), &other, &truncate, now).is_ok());
        assert!(matches!(
            check_setattr(&file(0o644), &other, &truncate, now),
            Err(FsError::PermissionDenied)
        ));
        let ftruncate = AttrChange {
            size: true,
            open_for_write: true,
            ..change()
        };
        assert!(check_setattr(&file(0o644), &other, &ftruncate, now).is_ok());
    }

    #[test]
    fn acls_decide_for_everyone_but_the_owner() {
        use crate::acl::{Entry, Tag};
        let e = |tag, perm, id| Entry { tag, perm, id };
        let acl = Acl::new(vec![
            e(Tag::UserObj, 6, u32::MAX),
            e(Tag::User, 6, 3000),
            e(Tag::GroupObj, 0, u32::MAX),
            e(Tag::Group, 4, 50),
            e(Tag::Mask, 6, u32::MAX),
            e(Tag::Other, 0, u32::MAX),
        ])
        .unwrap();
        let p = Protection {
            attr: attr(FileKind::Regular, 0o660, 1000, 100),
            acl: Some(acl),
        };
        assert!(permitted(&p, &user(3000, 3000, &[]), R | W));
        assert!(permitted(&p, &user(4000, 4000, &[50]), R));
        assert!(!permitted(&p, &user(4000, 4000, &[50]), W));
        // A member of the owning group gets the group entry (---), not the mask (rw-).
        assert!(!permitted(&p, &user(4000, 100, &[]), R));
        assert!(!permitted(&p, &user(4000, 4000, &[]), R));
        assert!(permitted(&p, &user(1000, 1, &[]), R | W));
        assert!(permitted(&p, &user(0, 0, &[]), R | W));
        // The named user may write, so he may touch; setting a chosen time stays EPERM.
        let named = user(3000, 3000, &[]);
        let touch = AttrChange {
            mtime: Some(TimeChange::Now),
            ..change()
        };
        assert!(check_setattr(&p, &named, &touch, now()).is_ok());
        assert!(check_setattr(&p, &user(4000, 4000, &[]), &touch, now()).is_err());
        // Only the owner sets ACLs; anyone reads them.
        let name = acl::ACCESS_XATTR;
        assert!(matches!(
            check_xattr(&p, &named, name, true),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_xattr(&p, &named, name, false).is_ok());
        assert!(check_xattr(&p, &user(1000, 1, &[]), name, true).is_ok());
    }

    #[test]
    fn xattr_namespaces() {
        let other = user(3000, 3000, &[]);
        let root = user(0, 0, &[]);
        let ro = file(0o644);
        let rw = file(0o666);
        assert!(check_xattr(&ro, &other, b"user.a", false).is_ok());
        assert!(matches!(
            check_xattr(&ro, &other, b"user.a", true),
            Err(FsError::PermissionDenied)
        ));
        assert!(check_xattr(&rw, &other, b"user.a", true).is_ok());
        assert!(matches!(
            check_xattr(&rw, &other, b"trusted.a", true),
            Err(FsError::NotPermitted(_))
        ));
        assert!(matches!(
            check_xattr(&rw, &other, b"trusted.a", false),
            Err(FsError::NoXattr)
        ));
        assert!(check_xattr(&ro, &root, b"trusted.a", true).is_ok());
        assert!(check_xattr(&rw, &other, b"security.a", true).is_err());
        assert!(check_xattr(&ro, &other, b"security.a", false).is_ok());
        let link = Protection::from(attr(FileKind::Symlink, 0o777, 3000, 3000));
        assert!(check_xattr(&link, &other, b"user.a", true).is_err());
        let sticky = Protection::from(attr(FileKind::Directory, 0o1777, 0, 0));
        assert!(check_xattr(&sticky, &other, b"user.a", true).is_err());
        assert!(check_xattr(&sticky, &other, b"user.a", false).is_ok());
        let names = b"user.a\0trusted.b\0security.c\0".to_vec();
        assert_eq!(
            visible_xattr_names(names.clone(), &other),
            b"user.a\0security.c\0"
        );
        assert_eq!(visible_xattr_names(names.clone(), &root), names);
    }

    #[test]
    fn hard_links_to_files_of_others() {
        let other = user(3000, 3000, &[]);
        assert!(may_link_source(&file(0o666), &other).is_ok());
        assert!(may_link_source(&file(0o644), &other).is_err());
        assert!(may_link_source(&file(0o4777), &other).is_err());
        assert!(may_link_source(&file(0o2777), &other).is_err());
        assert!(may_link_source(&file(0o600), &user(1000, 1, &[])).is_ok());
    }
}
