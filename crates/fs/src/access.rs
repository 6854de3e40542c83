//! Permission checks of the POSIX namespace (owner, group, other bits; sticky directories;
//! who may change attributes), done by the file system itself rather than the kernel.
//!
//! The mount does not use the kernel's `default_permissions`: with it, the kernel refreshes a
//! directory's attributes with a GETATTR round trip after every create and unlink before it
//! can check them, which costs a quarter of the create rate. The rules here are those of the
//! kernel's `generic_permission`, `may_delete`, `setattr_prepare` and `xattr_permission`, so
//! a non-root user sees the same answers as on ext4 or XFS.
//!
//! Every check takes the metadata lock briefly and is made before the operation, which takes
//! it again. A `chmod` that lands between the two is therefore ordered after the operation,
//! exactly as a process that passed the kernel's path walk just before a `chmod` is.

use std::sync::OnceLock;

use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, FileKind, Ino};

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

/// The kernel's `generic_permission`: may `cred` do `mask` (`MAY_*` bits) to `attr`?
/// The owner gets the owner bits, a member of the file's group the group bits, everyone
/// else the other bits. Root may always read and write, and execute a directory (search)
/// or a file with at least one execute bit.
pub fn permitted(attr: &Attr, cred: &Credentials, mask: u32) -> bool {
    let mask = mask & (MAY_READ | MAY_WRITE | MAY_EXEC);
    let mode = u32::from(attr.perm);
    if cred.is_root() {
        return mask & MAY_EXEC == 0 || attr.kind == FileKind::Directory || mode & S_IXUGO != 0;
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

fn require(attr: &Attr, cred: &Credentials, mask: u32) -> FsResult<()> {
    if permitted(attr, cred, mask) {
        Ok(())
    } else {
        Err(FsError::PermissionDenied)
    }
}

fn owner_or_root(attr: &Attr, cred: &Credentials) -> bool {
    cred.is_root() || cred.uid == attr.uid
}

/// Whether every user may search the directory: then a name cached by the kernel may skip
/// our LOOKUP without skipping a check.
pub fn searchable_by_all(attr: &Attr) -> bool {
    attr.kind == FileKind::Directory && u32::from(attr.perm) & S_IXUGO == S_IXUGO
}

/// The kernel's `may_delete` minus existence: search and write on the directory, and in a
/// sticky directory ownership of the file or the directory.
fn may_delete(dir: &Attr, victim: Option<&Attr>, cred: &Credentials) -> FsResult<()> {
    require(dir, cred, MAY_WRITE | MAY_EXEC)?;
    let Some(victim) = victim else {
        return Ok(());
    };
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
    /// To a time the caller chose.
    Explicit,
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
    pub ctime: bool,
    /// The request names a handle open for writing. The kernel names one only for
    /// ftruncate (the VFS checked the file is open for writing), open with O_TRUNC, and the
    /// time flushes of written files, so it stands for write permission checked at open.
    pub open_for_write: bool,
}

/// Whether a non-owner's chmod only clears setuid or setgid bits. The kernel sends such a
/// chmod itself, from the writing process, when a non-owner writes to or truncates a
/// setuid or setgid file (`file_remove_privs`); any writer may have it, as any writer
/// clears these bits on a local file system.
fn only_clears_suid_sgid(old: u32, new: u32) -> bool {
    let (old, new) = (old & 0o7777, new & 0o7777);
    new != old && new & !old == 0 && (old ^ new) & !(S_ISUID | S_ISGID) == 0
}

/// The kernel's `setattr_prepare` (and the write check of truncate and `touch`) for one
/// setattr of `attr` by `cred`. Returns the mode to store, if the request changes it:
/// a non-root caller outside the file's (new) group cannot keep `S_ISGID`, as in the
/// kernel. EPERM where only the owner may act, EACCES where write permission would do.
pub fn check_setattr(attr: &Attr, cred: &Credentials, c: &AttrChange) -> FsResult<Option<u32>> {
    let root = cred.is_root();
    let owner = cred.uid == attr.uid;
    let writer = || c.open_for_write || permitted(attr, cred, MAY_WRITE);
    let eperm = |what: &str| {
        Err(FsError::NotPermitted(format!(
            "only the owner or root may {what}"
        )))
    };
    if c.size && !c.open_for_write && !permitted(attr, cred, MAY_WRITE) {
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
        if c.atime == Some(TimeChange::Explicit) {
            return eperm("set the access time to a chosen value");
        }
        // With the writeback cache the kernel sends `touch` and its own flushes of the
        // modification time as an explicit mtime (and ctime) without MTIME_NOW, from
        // whichever process caused them. So an explicit mtime, like one set to now, is
        // allowed to anyone who may write the file: a writer can change the contents, and
        // with them the modification time, anyway.
        let times = c.atime.is_some() || c.mtime.is_some() || c.ctime;
        if times && !writer() {
            return Err(FsError::PermissionDenied);
        }
    }
    Ok(mode)
}

/// The namespaces of extended attributes, as they are guarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum XattrSpace {
    User,
    Trusted,
    Security,
    Other,
}

fn xattr_space(name: &[u8]) -> XattrSpace {
    if name.starts_with(b"user.") {
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
/// root's; `security.*` anyone may read and only root may write.
pub fn check_xattr(attr: &Attr, cred: &Credentials, name: &[u8], write: bool) -> FsResult<()> {
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
            require(attr, cred, if write { MAY_WRITE } else { MAY_READ })
        }
        XattrSpace::Trusted if !cred.is_root() => denied("trusted.* attributes are root's"),
        XattrSpace::Security if write && !cred.is_root() => {
            denied("only root may set security.* attributes")
        }
        XattrSpace::Trusted | XattrSpace::Security | XattrSpace::Other => Ok(()),
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
fn may_link_source(attr: &Attr, cred: &Credentials) -> FsResult<()> {
    if owner_or_root(attr, cred) {
        return Ok(());
    }
    let mode = u32::from(attr.perm);
    let safe = attr.kind == FileKind::Regular
        && mode & S_ISUID == 0
        && mode & (S_ISGID | S_IXGRP) != S_ISGID | S_IXGRP
        && permitted(attr, cred, MAY_READ | MAY_WRITE);
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
    fn attr_of(&self, ino: Ino) -> FsResult<Attr> {
        let m = self.meta.lock();
        Ok(m.state.get(ino).ok_or(FsError::NotFound)?.attr)
    }

    /// EACCES unless `cred` may do `mask` (`MAY_*`) to `ino`; `mask` 0 checks existence.
    pub fn may_access(&self, ino: Ino, cred: &Credentials, mask: u32) -> FsResult<()> {
        require(&self.attr_of(ino)?, cred, mask)
    }

    /// Checks `mask` on the directory `dir` (search for a lookup, write and search for a
    /// create) and returns whether every user may search it (see [`searchable_by_all`]).
    /// A non-directory passes, so that the operation itself answers ENOTDIR.
    pub fn may_use_dir(&self, dir: Ino, cred: &Credentials, mask: u32) -> FsResult<bool> {
        let attr = self.attr_of(dir)?;
        if attr.kind == FileKind::Directory {
            require(&attr, cred, mask)?;
        }
        Ok(searchable_by_all(&attr))
    }

    /// The entry `name` of `dir` and its attributes, if both exist.
    fn child_attr(m: &crate::fs::Meta, dir: Ino, name: &[u8]) -> Option<Attr> {
        let entry = m.state.get(dir)?.dir()?.entries.get(name)?;
        Some(m.state.get(entry.ino)?.attr)
    }

    /// unlink and rmdir: write and search on `dir`, and the sticky-directory rule.
    pub fn may_remove(&self, dir: Ino, name: &[u8], cred: &Credentials) -> FsResult<()> {
        let m = self.meta.lock();
        let dattr = m.state.get(dir).ok_or(FsError::NotFound)?.attr;
        if dattr.kind != FileKind::Directory {
            return Ok(());
        }
        let victim = Self::child_attr(&m, dir, name);
        may_delete(&dattr, victim.as_ref(), cred)
    }

    /// rename and renameat2: removal from the old directory, removal of a replaced
    /// target or creation in the new one, and write permission on a directory whose `..`
    /// changes. `exchange` applies the rules to both sides. Returns whether every user may
    /// search the old and the new directory.
    pub fn may_rename(
        &self,
        (dir, name): (Ino, &[u8]),
        (new_dir, new_name): (Ino, &[u8]),
        exchange: bool,
        cred: &Credentials,
    ) -> FsResult<(bool, bool)> {
        let m = self.meta.lock();
        let dattr = m.state.get(dir).ok_or(FsError::NotFound)?.attr;
        let nattr = m.state.get(new_dir).ok_or(FsError::NotFound)?.attr;
        let public = (searchable_by_all(&dattr), searchable_by_all(&nattr));
        if dattr.kind != FileKind::Directory || nattr.kind != FileKind::Directory {
            return Ok(public);
        }
        let source = Self::child_attr(&m, dir, name);
        let target = Self::child_attr(&m, new_dir, new_name);
        may_delete(&dattr, source.as_ref(), cred)?;
        // Without a target this is the create check: write and search.
        may_delete(&nattr, target.as_ref(), cred)?;
        if dir != new_dir {
            for moved in [source, exchange.then_some(target).flatten()]
                .into_iter()
                .flatten()
            {
                // A directory that changes parents has its `..` rewritten.
                if moved.kind == FileKind::Directory {
                    require(&moved, cred, MAY_WRITE)?;
                }
            }
        }
        Ok(public)
    }

    /// link: write and search on the new directory, and `protected_hardlinks` on the
    /// source. Returns whether every user may search the new directory.
    pub fn may_link(&self, ino: Ino, new_dir: Ino, cred: &Credentials) -> FsResult<bool> {
        let m = self.meta.lock();
        let nattr = m.state.get(new_dir).ok_or(FsError::NotFound)?.attr;
        let attr = m.state.get(ino).ok_or(FsError::NotFound)?.attr;
        if nattr.kind == FileKind::Directory {
            require(&nattr, cred, MAY_WRITE | MAY_EXEC)?;
        }
        may_link_source(&attr, cred)?;
        Ok(searchable_by_all(&nattr))
    }

    /// setattr: see [`check_setattr`].
    pub fn may_setattr(
        &self,
        ino: Ino,
        cred: &Credentials,
        change: &AttrChange,
    ) -> FsResult<SetattrPermit> {
        let attr = self.attr_of(ino)?;
        Ok(SetattrPermit {
            mode: check_setattr(&attr, cred, change)?,
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
        check_xattr(&self.attr_of(ino)?, cred, name, write)
    }

    /// Every name in the directory `dir` (none if it is not one), for invalidating the
    /// kernel's cached entries when the directory stops being searchable by everyone.
    pub fn child_names(&self, dir: Ino) -> Vec<Vec<u8>> {
        let m = self.meta.lock();
        m.state
            .get(dir)
            .and_then(|i| i.dir())
            .map(|d| d.entries.keys().cloned().collect())
            .unwrap_or_default()
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

    fn file(perm: u16) -> Attr {
        attr(FileKind::Regular, perm, 1000, 100)
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
        let dir = attr(FileKind::Directory, 0o000, 1000, 100);
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
        let dir = attr(FileKind::Directory, 0o1777, 0, 0);
        let theirs = file(0o644);
        let mine = attr(FileKind::Regular, 0o644, 65534, 65534);
        let nobody = user(65534, 65534, &[]);
        assert!(matches!(
            may_delete(&dir, Some(&theirs), &nobody),
            Err(FsError::NotPermitted(_))
        ));
        assert!(may_delete(&dir, Some(&mine), &nobody).is_ok());
        assert!(may_delete(&dir, Some(&theirs), &user(0, 0, &[])).is_ok());
        // The directory's owner may remove anything in it.
        let own_dir = attr(FileKind::Directory, 0o1777, 65534, 0);
        assert!(may_delete(&own_dir, Some(&theirs), &nobody).is_ok());
        // Without write permission the answer is EACCES before the sticky rule.
        let closed = attr(FileKind::Directory, 0o1755, 0, 0);
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
        assert!(check_setattr(&f, &root, &to_uid(5)).is_ok());
        assert!(matches!(
            check_setattr(&f, &owner, &to_uid(5)),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_setattr(&f, &owner, &to_uid(1000)).is_ok());
        assert!(check_setattr(&f, &other, &to_uid(3000)).is_err());
        assert!(check_setattr(&f, &owner, &to_gid(200)).is_ok());
        assert!(check_setattr(&f, &owner, &to_gid(100)).is_ok());
        assert!(matches!(
            check_setattr(&f, &owner, &to_gid(300)),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_setattr(&f, &other, &to_gid(100)).is_err());
        assert!(check_setattr(&f, &root, &to_gid(300)).is_ok());
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
            check_setattr(&f, &owner_in_group, &mode(0o2755)).unwrap(),
            Some(0o2755)
        );
        assert_eq!(
            check_setattr(&f, &owner_outside, &mode(0o2755)).unwrap(),
            Some(0o755)
        );
        assert_eq!(
            check_setattr(&f, &user(0, 0, &[]), &mode(0o2755)).unwrap(),
            Some(0o2755)
        );
        let other = user(3000, 3000, &[]);
        assert!(matches!(
            check_setattr(&file(0o666), &other, &mode(0o777)),
            Err(FsError::NotPermitted(_))
        ));
        // The kernel's own chmod after a non-owner's write to a setuid file.
        let suid = file(0o4766);
        assert_eq!(
            check_setattr(&suid, &other, &mode(0o766)).unwrap(),
            Some(0o766)
        );
        assert!(check_setattr(&file(0o4755), &other, &mode(0o755)).is_err());
        assert!(check_setattr(&suid, &other, &mode(0o4766)).is_err());
        assert!(check_setattr(&suid, &other, &mode(0o4777)).is_err());
    }

    #[test]
    fn times_and_size() {
        let other = user(3000, 3000, &[]);
        let owner = user(1000, 100, &[]);
        let explicit_atime = AttrChange {
            atime: Some(TimeChange::Explicit),
            mtime: Some(TimeChange::Explicit),
            ctime: true,
            ..change()
        };
        // `touch -d` on someone else's file, even a writable one.
        assert!(matches!(
            check_setattr(&file(0o666), &other, &explicit_atime),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_setattr(&file(0o600), &owner, &explicit_atime).is_ok());
        // `touch` through the writeback cache: atime now, explicit mtime and ctime.
        let touch = AttrChange {
            atime: Some(TimeChange::Now),
            mtime: Some(TimeChange::Explicit),
            ctime: true,
            ..change()
        };
        assert!(check_setattr(&file(0o666), &other, &touch).is_ok());
        assert!(matches!(
            check_setattr(&file(0o644), &other, &touch),
            Err(FsError::PermissionDenied)
        ));
        assert!(check_setattr(&file(0o444), &owner, &touch).is_ok());
        // The kernel's mtime flush of a file written through a handle.
        let flush = AttrChange {
            mtime: Some(TimeChange::Explicit),
            ctime: true,
            open_for_write: true,
            ..change()
        };
        assert!(check_setattr(&file(0o644), &other, &flush).is_ok());
        let truncate = AttrChange {
            size: true,
            ..change()
        };
        assert!(check_setattr(&file(0o666), &other, &truncate).is_ok());
        assert!(matches!(
            check_setattr(&file(0o644), &other, &truncate),
            Err(FsError::PermissionDenied)
        ));
        let ftruncate = AttrChange {
            size: true,
            open_for_write: true,
            ..change()
        };
        assert!(check_setattr(&file(0o644), &other, &ftruncate).is_ok());
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
        let link = attr(FileKind::Symlink, 0o777, 3000, 3000);
        assert!(check_xattr(&link, &other, b"user.a", true).is_err());
        let sticky = attr(FileKind::Directory, 0o1777, 0, 0);
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

    #[test]
    fn searchable_by_everyone() {
        assert!(searchable_by_all(&attr(FileKind::Directory, 0o755, 0, 0)));
        assert!(searchable_by_all(&attr(FileKind::Directory, 0o711, 0, 0)));
        assert!(!searchable_by_all(&attr(FileKind::Directory, 0o750, 0, 0)));
        assert!(!searchable_by_all(&attr(FileKind::Directory, 0o700, 0, 0)));
        assert!(!searchable_by_all(&file(0o777)));
    }
}
