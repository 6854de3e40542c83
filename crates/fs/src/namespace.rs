//! The metanode's namespace operations (the owner's side of [`Namespace`]): lookups,
//! creation, removal, rename, links, attributes, extended attributes. Each is one logged
//! transaction under the metadata lock. The client's side, which the access layer calls,
//! is `client.rs`.

use serde::{Deserialize, Serialize};

use crate::access::Protection;
use crate::acl::{self, Acl, AclKind};
use crate::error::{FsError, FsResult};
use crate::fs::{FileSystem, Meta};
use crate::inode::{Attr, DirEntry, FileKind, Ino, Timestamp, ROOT_INO};
use crate::meta::Change;
use crate::metanode::{Namespace, NewNode, RenameHow, XattrHow};

/// Longest file name in bytes, as on every Linux file system.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symlink target (PATH_MAX less the terminating NUL).
pub const SYMLINK_BYTES_MAX: usize = 4095;
pub const LINKS_MAX: u32 = 65_000;
const XATTR_NAME_BYTES_MAX: usize = 255;
const XATTR_VALUE_BYTES_MAX: usize = 65_536;
/// Entries returned per readdir call at most; the kernel asks again with the last cookie.
const READDIR_BATCH_MAX: usize = 1024;

/// Attribute changes requested by `setattr`; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    pub ctime: Option<Timestamp>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DirListing {
    /// `(cookie, ino, kind, name)`; resume after the last cookie.
    pub entries: Vec<(u64, Ino, FileKind, Vec<u8>)>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct StatFs {
    pub block_bytes: u64,
    pub fragment_bytes: u64,
    pub fragments_total: u64,
    pub fragments_free: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
    pub name_bytes_max: u32,
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_BYTES_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid(format!(
            "bad file name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

fn check_xattr_name(name: &[u8]) -> FsResult<()> {
    if name.len() > XATTR_NAME_BYTES_MAX || name.is_empty() {
        return Err(FsError::Range {
            size: XATTR_NAME_BYTES_MAX,
        });
    }
    let supported = [&b"user."[..], b"trusted.", b"security."];
    if !supported.iter().any(|p| name.starts_with(p)) && acl::acl_xattr(name).is_none() {
        return Err(FsError::NotSupported(format!(
            "extended attribute namespace of {:?}; use user.* (of system.*, only the POSIX \
             ACLs system.posix_acl_access and system.posix_acl_default exist)",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// The identity of the caller creating an object.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

use crate::locks::{Lock, LockCall, LockClass, LockKind, Origin, Refused};

/// How long a directory sealed for its removal across owners refuses new names: the
/// removal's remaining two steps take a round trip each; a client that dies between them
/// must not leave the directory closed for ever.
const SEAL_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a file whose last link went stays when another node may have just looked its
/// name up: that node's kernel opens or stats the inode it was told of right after, and a
/// file freed in between answers ESTALE (the kernel looks the name up once more, and a
/// second replacement in that window reaches the application). A rename over a file
/// happens before such an open, as on a local file system, which holds the inode for the
/// dentry it found. Freed by the flusher when its time is up. Short, since the file's
/// blocks stay taken meanwhile.
const LINGER: std::time::Duration = std::time::Duration::from_millis(200);
/// Files kept so, at most; past it a file is freed at once, as before.
const LINGERING_MAX: usize = 4096;

/// An unlinked file kept for other nodes' lookups (`Meta::lingering`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lingering {
    pub(crate) ino: Ino,
    pub(crate) generation: u32,
    pub(crate) until: std::time::Instant,
}

impl Namespace for FileSystem {
    fn attr(&self, ino: Ino) -> FsResult<Attr> {
        let mut m = self.owner().meta.lock();
        m.state.attr(ino)
    }

    fn held_bytes(&self, ino: Ino) -> FsResult<u64> {
        let mut m = self.owner().meta.lock();
        let sub = self.geo.sub_block_bytes;
        Ok(m.state.held_sub_blocks(ino, sub)? * sub)
    }

    fn find(&self, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        if name.len() > NAME_BYTES_MAX {
            return Err(FsError::NameTooLong);
        }
        let mut m = self.owner().meta.lock();
        let target = match name {
            b"." => {
                m.state.dir_parent(parent)?;
                parent
            }
            b".." => m.state.dir_parent(parent)?,
            _ => m.state.lookup(parent, name)?.ok_or(FsError::NotFound)?.ino,
        };
        match m.state.attr(target) {
            // The name is here, the inode another owner's (a directory made for a slot):
            // the client asks that owner.
            Err(FsError::ShardElsewhere { .. }) => Err(FsError::InodeElsewhere { ino: target }),
            found => found,
        }
    }

    fn make(&self, parent: Ino, name: &[u8], node: NewNode) -> FsResult<Attr> {
        if let (Some(slot), FileKind::Directory) = (node.for_slot, node.kind) {
            // Only the file system manager gives shards; another owner makes it its own.
            if slot != 0 && self.owner_slot() == 0 {
                match self.make_directory_for_slot_node(parent, name, node.clone(), slot) {
                    // No empty shard left to give: the directory stays this owner's.
                    Err(FsError::NoSpace { .. }) => {}
                    made => return made,
                }
            }
        }
        let mut m = self.owner().meta.lock();
        self.make_locked(&mut m, parent, name, node, None)
    }

    fn link_target(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let mut m = self.owner().meta.lock();
        let kind = m.state.attr(ino)?.kind;
        match (kind, m.state.inline_data(ino)?) {
            (FileKind::Symlink, Some(t)) => Ok(t),
            _ => Err(FsError::Invalid("not a symbolic link".into())),
        }
    }

    fn drop_name(&self, parent: Ino, name: &[u8], dir: bool) -> FsResult<()> {
        check_name(name)?;
        let mut m = self.owner().meta.lock();
        let mut pattr = self.dir_attr(&mut m, parent)?;
        let entry = m.state.lookup(parent, name)?.ok_or(FsError::NotFound)?;
        let mut attr = match m.state.attr(entry.ino) {
            // A directory another slot serves (made for it): the client removes it in
            // steps with that owner (`FileSystem::remove_across_owners`).
            Err(FsError::ShardElsewhere { .. }) => {
                return match (dir, entry.kind == FileKind::Directory) {
                    (true, true) => Err(FsError::InodeElsewhere { ino: entry.ino }),
                    (true, false) => Err(FsError::NotDir),
                    (false, true) => Err(FsError::IsDir),
                    (false, false) => Err(FsError::InodeElsewhere { ino: entry.ino }),
                };
            }
            found => found?,
        };
        let is_dir = attr.kind == FileKind::Directory;
        if dir && !is_dir {
            return Err(FsError::NotDir);
        }
        if !dir && is_dir {
            return Err(FsError::IsDir);
        }
        // A directory whose parent is another already is being moved there across owners
        // (`across_owners.rs`: its parent changes first): the move came first, and this
        // name is about to go.
        if is_dir && m.state.dir_parent(entry.ino)? != parent {
            return Err(FsError::NotFound);
        }
        if is_dir && !m.state.dir_is_empty(entry.ino)? {
            return Err(FsError::NotEmpty);
        }
        let now = self.now();
        pattr.mtime = now;
        pattr.ctime = now;
        let mut changes = vec![Change::DirRemove {
            dir: parent,
            name: name.to_vec(),
        }];
        if is_dir {
            pattr.nlink -= 1;
            attr.nlink = 0;
        } else {
            attr.nlink -= 1;
        }
        attr.ctime = now;
        changes.push(Change::PutAttr(pattr));
        changes.push(self.release_or_keep(&mut m, attr, Some((parent, name))));
        self.log(&mut m, changes)?;
        Ok(())
    }

    fn seal_dir(&self, ino: Ino, named_in: Option<Ino>) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let Some(parent) = named_in else {
            m.sealed.remove(&ino);
            return Ok(());
        };
        self.dir_attr(&mut m, ino)?;
        if m.state.dir_parent(ino)? != parent {
            return Err(FsError::NotFound);
        }
        if !m.state.dir_is_empty(ino)? {
            return Err(FsError::NotEmpty);
        }
        m.sealed.insert(ino, std::time::Instant::now() + SEAL_BOUND);
        Ok(())
    }

    fn drop_entry_of(&self, parent: Ino, name: &[u8], ino: Ino) -> FsResult<()> {
        // Durable before the directory itself goes: a crash between the two leaves an
        // unreachable empty directory, never an entry naming a freed inode. Renamed or
        // removed meanwhile: NotFound, and the caller lifts the seal and says so.
        self.remove_entry_durably((parent, name), ino, true)
    }

    fn drop_sealed_dir(&self, ino: Ino) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        if m.sealed.remove(&ino).is_none() {
            return Err(FsError::Invalid(format!(
                "directory {ino} is not being removed (its seal lapsed or was lifted)"
            )));
        }
        let mut attr = self.dir_attr(&mut m, ino)?;
        if !m.state.dir_is_empty(ino)? {
            // Only a lapsed seal lets a name in; the directory, now unreachable, keeps it
            // for fsck to find rather than lose it.
            return Err(FsError::NotEmpty);
        }
        attr.nlink = 0;
        attr.ctime = self.now();
        let change = self.release_or_keep(&mut m, attr, None);
        let lsn = self.log(&mut m, vec![change])?;
        drop(m);
        self.commit(lsn)
    }

    fn put_entry(
        &self,
        dir: Ino,
        name: &[u8],
        (ino, kind): (Ino, FileKind),
        replace: Option<Ino>,
    ) -> FsResult<()> {
        check_name(name)?;
        let mut m = self.owner().meta.lock();
        let mut dattr = self.names_dir(&mut m, dir)?;
        let mut changes = Vec::new();
        match (m.state.lookup(dir, name)?, replace) {
            (None, None) => {}
            (Some(e), Some(r)) if e.ino == r => {
                if e.kind == FileKind::Directory || kind == FileKind::Directory {
                    return Err(FsError::AcrossOwners(
                        "replacing a directory, or a name with one,".into(),
                    ));
                }
                changes.push(Change::DirRemove {
                    dir,
                    name: name.to_vec(),
                });
            }
            // What the caller expected is no longer there: it looks again.
            (Some(_), _) => return Err(FsError::Exists),
            (None, Some(_)) => return Err(FsError::NotFound),
        }
        let cookie = m.state.new_cookie(dir, name)?;
        changes.push(Change::DirInsert {
            dir,
            name: name.to_vec(),
            entry: DirEntry { ino, kind, cookie },
        });
        let now = self.now();
        dattr.mtime = now;
        dattr.ctime = now;
        if kind == FileKind::Directory {
            dattr.nlink += 1; // its ".."
        }
        changes.push(Change::PutAttr(dattr));
        let lsn = self.log(&mut m, changes)?;
        drop(m);
        self.commit(lsn)
    }

    fn take_entry(&self, dir: Ino, name: &[u8], ino: Ino) -> FsResult<()> {
        self.remove_entry_durably((dir, name), ino, false)
    }

    fn count_link(&self, ino: Ino, up: bool) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let mut attr = m.state.attr(ino)?;
        if attr.kind == FileKind::Directory {
            return Err(FsError::IsDir);
        }
        if up && attr.nlink >= LINKS_MAX {
            return Err(FsError::TooManyLinks);
        }
        if !up && attr.nlink == 0 {
            return Err(FsError::Corrupt(format!(
                "inode {ino} has no link left to take away"
            )));
        }
        attr.ctime = self.now();
        let change = if up {
            attr.nlink += 1;
            Change::PutAttr(attr)
        } else {
            attr.nlink -= 1;
            self.release_or_keep(&mut m, attr, None)
        };
        let lsn = self.log(&mut m, vec![change])?;
        drop(m);
        self.commit(lsn)
    }

    fn reparent(&self, dir: Ino, from: Ino, to: Ino) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        // Being removed (sealed) by an rmdir that came first: the move finds it gone.
        let mut attr = self.names_dir(&mut m, dir)?;
        if m.state.dir_parent(dir)? != from {
            return Err(FsError::NotFound);
        }
        attr.ctime = self.now();
        let changes = vec![Change::SetParent { dir, parent: to }, Change::PutAttr(attr)];
        let lsn = self.log(&mut m, changes)?;
        drop(m);
        self.commit(lsn)
    }

    fn add_name(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        check_name(name)?;
        let mut m = self.owner().meta.lock();
        let mut pattr = self.names_dir(&mut m, parent)?;
        let mut attr = match m.state.attr(ino) {
            Err(FsError::ShardElsewhere { .. }) => {
                return Err(FsError::AcrossOwners(
                    "a hard link to an inode another node's owner slot serves".into(),
                ));
            }
            found => found?,
        };
        if attr.kind == FileKind::Directory {
            return Err(FsError::NotSupported("hard links to directories".into()));
        }
        if attr.nlink >= LINKS_MAX {
            return Err(FsError::TooManyLinks);
        }
        if m.state.lookup(parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        let cookie = m.state.new_cookie(parent, name)?;
        let now = self.now();
        attr.nlink += 1;
        attr.ctime = now;
        pattr.mtime = now;
        pattr.ctime = now;
        let entry = DirEntry {
            ino,
            kind: attr.kind,
            cookie,
        };
        let changes = vec![
            Change::DirInsert {
                dir: parent,
                name: name.to_vec(),
                entry,
            },
            Change::PutAttr(attr),
            Change::PutAttr(pattr),
        ];
        self.log(&mut m, changes)?;
        Ok(attr)
    }

    fn move_name(
        &self,
        (parent, name): (Ino, &[u8]),
        (new_parent, new_name): (Ino, &[u8]),
        how: RenameHow,
    ) -> FsResult<()> {
        check_name(name)?;
        check_name(new_name)?;
        let mut m = self.owner().meta.lock();
        let across = || {
            FsError::AcrossOwners(
                "a rename between directories, or of a directory, that different nodes' \
                 owner slots serve"
                    .into(),
            )
        };
        match self.dir_attr(&mut m, parent) {
            Err(FsError::ShardElsewhere { .. }) => return Err(across()),
            other => other?,
        };
        match self.names_dir(&mut m, new_parent) {
            Err(FsError::ShardElsewhere { .. }) => return Err(across()),
            other => other?,
        };
        let src = m.state.lookup(parent, name)?.ok_or(FsError::NotFound)?;
        // A name that moves within its directory changes nothing of the inode it names
        // (but its change time), so another owner's inode moves here all the same; two
        // names exchanged within one directory change nothing of either inode.
        let within = parent == new_parent;
        let src_here = match m.state.attr(src.ino) {
            Err(FsError::ShardElsewhere { .. }) if within => false,
            Err(FsError::ShardElsewhere { .. }) => return Err(across()),
            found => found.map(|_| true)?,
        };
        let dst = m.state.lookup(new_parent, new_name)?;
        if how.noreplace && dst.is_some() {
            return Err(FsError::Exists);
        }
        if let Some(d) = dst.filter(|d| d.ino != src.ino && !(within && how.exchange)) {
            // A replaced inode's link count goes down at its own owner.
            if let Err(FsError::ShardElsewhere { .. }) = m.state.attr(d.ino) {
                return Err(across());
            }
        }
        if how.exchange {
            let dst = dst.ok_or(FsError::NotFound)?;
            return self.exchange(&mut m, (parent, name, src), (new_parent, new_name, dst));
        }
        if let Some(d) = dst {
            if d.ino == src.ino {
                return Ok(()); // Two links to one inode: POSIX says do nothing.
            }
        }
        let src_is_dir = src.kind == FileKind::Directory;
        if src_is_dir && !how.dirs_may_move {
            return Err(FsError::AcrossOwners(
                "a directory that a rename without the cluster's rename lock found".into(),
            ));
        }
        // Within one directory no loop can form (and the chain above it may cross owners).
        if src_is_dir && parent != new_parent && self.is_ancestor(&mut m, src.ino, new_parent)? {
            return Err(FsError::Invalid(
                "cannot move a directory into itself".into(),
            ));
        }
        let now = self.now();
        let mut changes = Vec::new();
        let mut replaced = None;
        if let Some(d) = dst {
            let dattr = m.state.attr(d.ino)?;
            let d_is_dir = dattr.kind == FileKind::Directory;
            if src_is_dir && !d_is_dir {
                return Err(FsError::NotDir);
            }
            if !src_is_dir && d_is_dir {
                return Err(FsError::IsDir);
            }
            if d_is_dir && !m.state.dir_is_empty(d.ino)? {
                return Err(FsError::NotEmpty);
            }
            changes.push(Change::DirRemove {
                dir: new_parent,
                name: new_name.to_vec(),
            });
            replaced = Some(dattr);
        }
        changes.push(Change::DirRemove {
            dir: parent,
            name: name.to_vec(),
        });
        let cookie = m.state.new_cookie(new_parent, new_name)?;
        changes.push(Change::DirInsert {
            dir: new_parent,
            name: new_name.to_vec(),
            entry: DirEntry {
                ino: src.ino,
                kind: src.kind,
                cookie,
            },
        });
        // Link counts: a moved directory's ".." changes parents; a replaced directory goes.
        let same_dir = parent == new_parent;
        let mut pattr = m.state.attr(parent)?;
        pattr.mtime = now;
        pattr.ctime = now;
        let mut npattr = if same_dir {
            None
        } else {
            let mut a = m.state.attr(new_parent)?;
            a.mtime = now;
            a.ctime = now;
            Some(a)
        };
        if src_is_dir {
            if let Some(np) = npattr.as_mut() {
                pattr.nlink -= 1;
                np.nlink += 1;
                changes.push(Change::SetParent {
                    dir: src.ino,
                    parent: new_parent,
                });
            }
        }
        if let Some(mut r) = replaced {
            if r.kind == FileKind::Directory {
                npattr.as_mut().unwrap_or(&mut pattr).nlink -= 1;
                r.nlink = 0;
            } else {
                r.nlink -= 1;
            }
            r.ctime = now;
            changes.push(self.release_or_keep(&mut m, r, Some((new_parent, new_name))));
        }
        changes.push(Change::PutAttr(pattr));
        if let Some(np) = npattr {
            changes.push(Change::PutAttr(np));
        }
        if src_here {
            let mut sattr = m.state.attr(src.ino)?;
            sattr.ctime = now;
            changes.push(Change::PutAttr(sattr));
        }
        self.log(&mut m, changes)?;
        Ok(())
    }

    fn change_attr(&self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        if set.size.is_some() {
            return Err(FsError::Invalid(
                "a size change goes through the data path (truncate), not the metanode's \
                 attribute change"
                    .into(),
            ));
        }
        let mut m = self.owner().meta.lock();
        let mut attr = m.state.attr(ino)?;
        let now = self.now();
        if let Some(mode) = set.mode {
            attr.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = set.uid {
            attr.uid = uid;
        }
        if let Some(gid) = set.gid {
            attr.gid = gid;
        }
        if set.uid.is_some() || set.gid.is_some() {
            // chown clears setuid, and setgid of group-executable files (as the VFS would).
            if attr.kind != FileKind::Directory {
                attr.perm &= !0o4000;
                if attr.perm & 0o010 != 0 {
                    attr.perm &= !0o2000;
                }
            }
        }
        if let Some(t) = set.atime {
            attr.atime = t;
        }
        if let Some(t) = set.mtime {
            attr.mtime = t;
        }
        attr.ctime = set.ctime.unwrap_or(now);
        let mut changes = vec![Change::PutAttr(attr)];
        if let Some(mode) = set.mode {
            changes.extend(chmod_access_acl(&mut m, ino, mode)?);
        }
        self.log(&mut m, changes)?;
        Ok(attr)
    }

    fn opened(&self, ino: Ino) -> FsResult<Attr> {
        let mut m = self.owner().meta.lock();
        let attr = m.state.attr(ino)?;
        *m.open.entry(ino).or_insert(0) += 1;
        Ok(attr)
    }

    fn closed(&self, ino: Ino) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let left = match m.open.get_mut(&ino) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => return Ok(()),
        };
        if left == 0 {
            m.open.remove(&ino);
            // One kept for another node's lookup is freed when its time is up.
            let now = std::time::Instant::now();
            let lingers = m.lingering.iter().any(|l| l.ino == ino && l.until > now);
            if !lingers && m.state.find_attr(ino)?.is_some_and(|a| a.nlink == 0) {
                self.log(&mut m, vec![Change::FreeInode { ino }])?;
            }
        }
        Ok(())
    }

    fn entries(&self, ino: Ino, after: u64) -> FsResult<DirListing> {
        let mut m = self.owner().meta.lock();
        let parent = m.state.dir_parent(ino)?;
        let mut entries = Vec::new();
        if after < 1 {
            entries.push((1, ino, FileKind::Directory, b".".to_vec()));
        }
        if after < 2 {
            entries.push((2, parent, FileKind::Directory, b"..".to_vec()));
        }
        let room = READDIR_BATCH_MAX - entries.len();
        for (name, e) in m.state.dir_entries(ino, after.max(2), room)? {
            entries.push((e.cookie, e.ino, e.kind, name));
        }
        Ok(DirListing { entries })
    }

    fn space(&self) -> StatFs {
        let pools = self.owner().desc.lock().pools.len();
        let m = self.owner().meta.lock();
        // Every pool's data disks: placement rules may put files in any of them (`df` of
        // the mount is the whole file system; `tessera df` shows each pool).
        let space = (0..pools)
            .filter_map(|p| tessera_alloc::PoolId::try_from(p).ok())
            .map(|p| m.alloc.pool_space(p, tessera_alloc::AllocKind::Data))
            .fold(tessera_alloc::DiskSpace::default(), |a, s| {
                tessera_alloc::DiskSpace {
                    blocks_total: a.blocks_total + s.blocks_total,
                    blocks_free: a.blocks_free + s.blocks_free,
                    sub_blocks_free_in_fragments: a.sub_blocks_free_in_fragments
                        + s.sub_blocks_free_in_fragments,
                }
            });
        let per = u64::from(self.geo.sub_blocks_per_block);
        let used = m.state.inode_count();
        StatFs {
            block_bytes: self.geo.block_bytes,
            fragment_bytes: self.geo.sub_block_bytes,
            fragments_total: space.blocks_total * per,
            fragments_free: space.blocks_free * per + space.sub_blocks_free_in_fragments,
            inodes_total: self.geo.max_inodes,
            inodes_free: self.geo.max_inodes.saturating_sub(used),
            name_bytes_max: NAME_BYTES_MAX as u32,
        }
    }

    fn file_pool(&self, ino: Ino) -> FsResult<u16> {
        self.owner_here("naming a file's pool")?;
        let mut m = self.owner().meta.lock();
        self.file_pool(&mut m, ino)
    }

    fn migrate_file(&self, ino: Ino, pool: u16, move_data: bool) -> FsResult<u64> {
        self.owner_here("migrating a file")?;
        self.check_writable()?;
        self.migrate_file_here(ino, pool, move_data)
    }

    fn restripe_batch(
        &self,
        mode: crate::restripe::RestripeMode,
        shard: u32,
        cursor: &crate::restripe::RestripeCursor,
    ) -> FsResult<crate::restripe::RestripeBatch> {
        self.owner_here("restriping a shard")?;
        self.check_writable()?;
        if !self.owner().meta.lock().state.holds(shard as usize) {
            return Err(FsError::ShardElsewhere { shard });
        }
        self.restripe_shard_batch(
            mode,
            shard as usize,
            cursor,
            crate::restripe::REMOTE_BATCH_ITEMS,
            &std::sync::atomic::AtomicBool::new(false),
        )
    }

    fn drop_disks(&self, disks: &[u16]) -> FsResult<()> {
        self.owner_here("letting go of disks")?;
        self.check_writable()?;
        self.let_go_of_disks(disks)
    }

    fn hold_map_writes(&self, hold: bool, id: u64) -> FsResult<()> {
        self.hold_own_map_writes(hold, id)
    }

    fn move_slot_region(&self, to: &crate::slot::SlotRegion, give_up: bool) -> FsResult<bool> {
        self.move_own_region(to, give_up)
    }

    fn record_slot_log(&self, slot: u32, log_id: [u8; 16], behind: Option<u8>) -> FsResult<()> {
        self.record_slot_log_state(slot, log_id, behind)
    }

    fn restore_copies(&self, rewrite: bool) -> FsResult<(u64, u64)> {
        self.owner_here("checking metadata copies")?;
        self.check_writable()?;
        self.restore_own_copies(rewrite)
    }

    fn move_pages_off(&self, budget: u32) -> FsResult<u64> {
        self.owner_here("moving metadata pages")?;
        self.check_writable()?;
        self.move_pages_off_batch(budget as usize)
    }

    fn disk_free(&self) -> FsResult<Vec<(u32, u64, u64)>> {
        let disks: Vec<_> = self
            .owner()
            .desc
            .lock()
            .disks
            .iter()
            .map(|d| d.index)
            .collect();
        let m = self.owner().meta.lock();
        Ok(disks
            .into_iter()
            // A disk this slot let go of for a delete: nothing of it is the slot's.
            .filter(|d| m.alloc.knows(*d))
            .map(|d| {
                let space = m.alloc.disk_space(d);
                (
                    u32::from(d),
                    space.blocks_free,
                    space.sub_blocks_free_in_fragments,
                )
            })
            .collect())
    }

    fn put_xattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrHow) -> FsResult<()> {
        check_xattr_name(name)?;
        if let Some(kind) = acl::acl_xattr(name) {
            return self.put_acl(ino, kind, value, how, false);
        }
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(FsError::Range {
                size: XATTR_VALUE_BYTES_MAX,
            });
        }
        let mut m = self.owner().meta.lock();
        let mut attr = m.state.attr(ino)?;
        let exists = m.state.xattr(ino, name)?.is_some();
        if how.create && exists {
            return Err(FsError::Exists);
        }
        if how.replace && !exists {
            return Err(FsError::NoXattr);
        }
        attr.ctime = self.now();
        let changes = vec![
            Change::SetXattr {
                ino,
                name: name.to_vec(),
                value: value.to_vec(),
            },
            Change::PutAttr(attr),
        ];
        self.log(&mut m, changes)?;
        Ok(())
    }

    fn xattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        let mut m = self.owner().meta.lock();
        m.state.xattr(ino, name)?.ok_or(FsError::NoXattr)
    }

    /// Names as the kernel wants them: each followed by a NUL.
    fn xattr_names(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let mut m = self.owner().meta.lock();
        let mut out = Vec::new();
        for name in m.state.xattr_names(ino)? {
            out.extend_from_slice(&name);
            out.push(0);
        }
        Ok(out)
    }

    fn drop_xattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let mut attr = m.state.attr(ino)?;
        if m.state.xattr(ino, name)?.is_none() {
            return Err(FsError::NoXattr);
        }
        attr.ctime = self.now();
        let changes = vec![
            Change::RemoveXattr {
                ino,
                name: name.to_vec(),
            },
            Change::PutAttr(attr),
        ];
        self.log(&mut m, changes)?;
        Ok(())
    }

    fn put_acl(
        &self,
        ino: Ino,
        kind: AclKind,
        value: &[u8],
        how: XattrHow,
        drop_setgid: bool,
    ) -> FsResult<()> {
        let acl = Acl::decode(value)?;
        let name = match kind {
            AclKind::Access => acl::ACCESS_XATTR,
            AclKind::Default => acl::DEFAULT_XATTR,
        };
        let mut m = self.owner().meta.lock();
        let mut attr = m.state.attr(ino)?;
        let exists = m.state.xattr(ino, name)?.is_some();
        if how.create && exists {
            return Err(FsError::Exists);
        }
        if how.replace && !exists {
            return Err(FsError::NoXattr);
        }
        if kind == AclKind::Default && attr.kind != FileKind::Directory {
            return Err(FsError::PermissionDenied);
        }
        attr.ctime = self.now();
        let mut store = true;
        if kind == AclKind::Access {
            let keep = u32::from(attr.perm) & 0o7000 & if drop_setgid { !0o2000 } else { !0 };
            attr.perm = (keep | acl.mode_bits()) as u16;
            store = !acl.is_minimal();
        }
        let name = name.to_vec();
        let mut changes = vec![Change::PutAttr(attr)];
        if store {
            changes.push(Change::SetXattr {
                ino,
                name,
                value: acl.encode(),
            });
        } else if exists {
            changes.push(Change::RemoveXattr { ino, name });
        }
        self.log(&mut m, changes)?;
        Ok(())
    }

    fn protection(&self, ino: Ino) -> FsResult<Protection> {
        let mut m = self.owner().meta.lock();
        let attr = m.state.attr(ino)?;
        let acl = stored_acl(&mut m, ino, acl::ACCESS_XATTR)?;
        Ok(Protection { attr, acl })
    }

    fn gather(&self, ino: Ino, origin: Option<Origin>) -> FsResult<bool> {
        self.grant_gather(ino, origin)
    }

    fn lock(&self, ino: Ino, call: LockCall, origin: Option<Origin>) -> FsResult<Option<Lock>> {
        let owner = self.owner();
        let mut table = owner.locks.lock();
        let mut swept = false;
        // Data tokens and append locks are asked for by writes that wait anyway: they wait
        // here a little, woken by the give-back, rather than ask again from afar (`fcntl`
        // and `flock` calls carry no such promise: F_SETLK answers at once).
        let waits = !call.test
            && call.lock.kind != LockKind::Unlock
            && matches!(call.lock.holder.class, LockClass::Data | LockClass::Append);
        let deadline = std::time::Instant::now() + crate::locks::OWNER_WAIT;
        let revoke = owner.data_revoke.get();
        if crate::locks::is_kept_data(&call.lock) && call.lock.kind == LockKind::Write {
            // A node asks to keep the file's data token: granted only if it can be taken
            // back (another node, and a way to reach it), nobody else writes the file now,
            // and it was not taken back a moment ago. Never waited for: the node takes a
            // token for its write instead. A refusal names the conflicting lock, or the
            // request itself when the file is not kept now.
            if origin.is_none() || revoke.is_none() || call.test || !table.may_keep(ino) {
                return Ok(Some(call.lock));
            }
            return Ok(match table.set(ino, call.lock, origin) {
                Ok(()) => {
                    table.unmark_gathering(ino);
                    None
                }
                Err(Refused::Conflict(c)) => Some(c),
                Err(Refused::TooMany) => Some(call.lock),
            });
        }
        loop {
            let refused = if call.test {
                table.conflict(ino, &call.lock).map(Refused::Conflict)
            } else {
                table.set(ino, call.lock, origin).err()
            };
            let conflict = match refused {
                None => {
                    if call.lock.kind == LockKind::Unlock {
                        owner.lock_released.notify_all();
                    }
                    return Ok(None);
                }
                Some(Refused::TooMany) => {
                    return Err(FsError::Remote {
                        errno: libc::ENOLCK,
                        message: format!(
                            "{} locks are held in this file system, the most it keeps; \
                             release some",
                            crate::locks::LOCKS_MAX
                        ),
                    })
                }
                Some(Refused::Conflict(c)) => c,
            };
            // A data token another node keeps is taken back from it (it answers once its
            // writes under it are done), unless another request is doing that already.
            if crate::locks::is_kept_data(&conflict) && !call.test {
                let holder = conflict.holder;
                if let (Some(from), Some(revoke)) = (table.origin(holder.client), revoke) {
                    if table.start_revoking(ino) {
                        parking_lot::MutexGuard::unlocked(&mut table, || revoke(from, vec![ino]));
                        table.end_revoking(ino, holder);
                        owner.lock_released.notify_all();
                        continue;
                    }
                }
            }
            // A lock of a node the cluster gave up on frees itself at its first conflict.
            let gone = |o: Origin| self.holder_gone.get().is_some_and(|f| f(o));
            let holder_gone = table.origin(conflict.holder.client).is_some_and(gone);
            if swept || !holder_gone {
                if call.wait
                    && call.lock.holder.class == LockClass::Posix
                    && table.wait_closes_cycle(call.lock.holder, conflict.holder)
                {
                    return Err(FsError::Remote {
                        errno: libc::EDEADLK,
                        message: format!(
                            "waiting for the lock of bytes {}..={} of inode {ino} would \
                             deadlock: its holder waits for a lock this lock owner holds",
                            call.lock.start, call.lock.end
                        ),
                    });
                }
                if waits
                    && !owner
                        .lock_released
                        .wait_until(&mut table, deadline)
                        .timed_out()
                {
                    continue;
                }
                return Ok(Some(conflict));
            }
            let dropped = table.drop_dead(gone);
            owner.lock_released.notify_all();
            tracing::info!("dropped {dropped} locks of nodes no longer in the cluster");
            swept = true;
        }
    }
}

impl FileSystem {
    /// Removes `name` from `dir` if it names `ino` (a directory only, with `only_dir`),
    /// and makes that durable before returning: a step of an operation across owners,
    /// which goes on at another owner only once this cannot be undone by a crash. A
    /// directory's ".." leaves with it. No link count of `ino` changes here.
    fn remove_entry_durably(
        &self,
        (dir, name): (Ino, &[u8]),
        ino: Ino,
        only_dir: bool,
    ) -> FsResult<()> {
        check_name(name)?;
        let mut m = self.owner().meta.lock();
        let mut dattr = self.dir_attr(&mut m, dir)?;
        let entry = match m.state.lookup(dir, name)? {
            Some(e) if e.ino == ino && (!only_dir || e.kind == FileKind::Directory) => e,
            _ => return Err(FsError::NotFound),
        };
        let now = self.now();
        dattr.mtime = now;
        dattr.ctime = now;
        if entry.kind == FileKind::Directory {
            dattr.nlink -= 1;
        }
        let changes = vec![
            Change::DirRemove {
                dir,
                name: name.to_vec(),
            },
            Change::PutAttr(dattr),
        ];
        let lsn = self.log(&mut m, changes)?;
        drop(m);
        self.commit(lsn)
    }

    fn dir_attr(&self, m: &mut Meta, ino: Ino) -> FsResult<Attr> {
        let attr = m.state.attr(ino)?;
        if attr.kind != FileKind::Directory {
            return Err(FsError::NotDir);
        }
        Ok(attr)
    }

    /// [`Self::dir_attr`] of a directory a name is to go into: one being removed (sealed,
    /// see [`Namespace::seal_dir`]) is as good as gone.
    fn names_dir(&self, m: &mut Meta, ino: Ino) -> FsResult<Attr> {
        let attr = self.dir_attr(m, ino)?;
        if let Some(until) = m.sealed.get(&ino) {
            if std::time::Instant::now() < *until {
                return Err(FsError::NotFound);
            }
            m.sealed.remove(&ino);
        }
        Ok(attr)
    }

    /// The change for an inode that lost a link (its last name `name`, when known): freed
    /// when unreferenced, else updated. A file another node may have just looked up is kept
    /// a moment as an orphan (see [`LINGER`]), also past the last close of an open one.
    fn release_or_keep(&self, m: &mut Meta, attr: Attr, name: Option<(Ino, &[u8])>) -> Change {
        if attr.nlink != 0 {
            return Change::PutAttr(attr);
        }
        let holders = &self.owner().meta.holders;
        let looked_up = holders.held_by_others(attr.ino)
            || name.is_some_and(|(dir, n)| {
                holders.found_lately(dir, n)
                    || holders.held_by_others(crate::read_tokens::name_key(dir, n))
            });
        if attr.kind != FileKind::Directory && looked_up && m.lingering.len() < LINGERING_MAX {
            m.lingering.push_back(Lingering {
                ino: attr.ino,
                generation: attr.generation,
                until: std::time::Instant::now() + LINGER,
            });
            if m.lingering.len() == 1 {
                self.wake_flusher();
            }
            return Change::PutAttr(attr);
        }
        if m.open.get(&attr.ino).is_some_and(|n| *n > 0) {
            return Change::PutAttr(attr);
        }
        Change::FreeInode { ino: attr.ino }
    }

    /// True when `ancestor` is `dir` or one of its ancestors. Where the chain of parents passes through a directory another owner slot serves,
    /// this owner cannot tell: the move is refused as one across owners rather than risk
    /// a loop no owner sees whole.
    fn is_ancestor(&self, m: &mut Meta, ancestor: Ino, mut dir: Ino) -> FsResult<bool> {
        // The depth bound guards against a corrupt parent chain looping forever.
        for _ in 0..100_000 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            match m.state.dir_parent(dir) {
                Ok(parent) => dir = parent,
                Err(FsError::ShardElsewhere { .. }) => {
                    return Err(FsError::AcrossOwners(
                        "moving a directory below a directory another node's owner slot                          serves"
                            .into(),
                    ))
                }
                Err(_) => return Ok(false),
            }
        }
        Ok(false)
    }

    fn exchange(
        &self,
        m: &mut Meta,
        a: (Ino, &[u8], DirEntry),
        b: (Ino, &[u8], DirEntry),
    ) -> FsResult<()> {
        let (a_dir, a_name, a_entry) = a;
        let (b_dir, b_name, b_entry) = b;
        let moves = |e: &DirEntry| e.kind == FileKind::Directory && a_dir != b_dir;
        if moves(&a_entry) && self.is_ancestor(m, a_entry.ino, b_dir)? {
            return Err(FsError::Invalid(
                "cannot move a directory into itself".into(),
            ));
        }
        if moves(&b_entry) && self.is_ancestor(m, b_entry.ino, a_dir)? {
            return Err(FsError::Invalid(
                "cannot move a directory into itself".into(),
            ));
        }
        let now = self.now();
        let mut changes = vec![
            Change::DirInsert {
                dir: a_dir,
                name: a_name.to_vec(),
                entry: DirEntry {
                    ino: b_entry.ino,
                    kind: b_entry.kind,
                    cookie: a_entry.cookie,
                },
            },
            Change::DirInsert {
                dir: b_dir,
                name: b_name.to_vec(),
                entry: DirEntry {
                    ino: a_entry.ino,
                    kind: a_entry.kind,
                    cookie: b_entry.cookie,
                },
            },
        ];
        if a_dir != b_dir {
            let a_is_dir = a_entry.kind == FileKind::Directory;
            let b_is_dir = b_entry.kind == FileKind::Directory;
            let mut a_attr = m.state.attr(a_dir)?;
            let mut b_attr = m.state.attr(b_dir)?;
            if a_is_dir {
                changes.push(Change::SetParent {
                    dir: a_entry.ino,
                    parent: b_dir,
                });
                a_attr.nlink -= 1;
                b_attr.nlink += 1;
            }
            if b_is_dir {
                changes.push(Change::SetParent {
                    dir: b_entry.ino,
                    parent: a_dir,
                });
                b_attr.nlink -= 1;
                a_attr.nlink += 1;
            }
            for mut attr in [a_attr, b_attr] {
                attr.mtime = now;
                attr.ctime = now;
                changes.push(Change::PutAttr(attr));
            }
        } else {
            let mut attr = m.state.attr(a_dir)?;
            attr.mtime = now;
            attr.ctime = now;
            changes.push(Change::PutAttr(attr));
        }
        self.log(m, changes)?;
        Ok(())
    }
}

/// The ACL stored under `name` for `ino`; a stored value that no longer parses is
/// corruption, since every value was checked when it was set.
pub(crate) fn stored_acl(m: &mut Meta, ino: Ino, name: &[u8]) -> FsResult<Option<Acl>> {
    match m.state.xattr(ino, name)? {
        None => Ok(None),
        Some(v) => Acl::decode(&v)
            .map(Some)
            .map_err(|e| FsError::Corrupt(format!("inode {ino}: {e}"))),
    }
}

/// A chmod keeps the owner, mask (or owning group) and other entries of the access ACL in
/// step with the new mode.
fn chmod_access_acl(m: &mut Meta, ino: Ino, mode: u32) -> FsResult<Option<Change>> {
    let Some(mut acl) = stored_acl(m, ino, acl::ACCESS_XATTR)? else {
        return Ok(None);
    };
    acl.chmod(mode);
    Ok(Some(Change::SetXattr {
        ino,
        name: acl::ACCESS_XATTR.to_vec(),
        value: acl.encode(),
    }))
}

/// What a new node inherits from the default ACL of `parent`: the ACL records to log and
/// the mode to create it with. Without a default ACL the umask applies; symlinks take
/// neither, as on Linux.
fn inherited_acls(
    m: &mut Meta,
    parent: Ino,
    ino: Ino,
    kind: FileKind,
    mode: u32,
    umask: u32,
) -> FsResult<(Vec<Change>, u32)> {
    if kind == FileKind::Symlink {
        return Ok((Vec::new(), mode));
    }
    let Some(default) = stored_acl(m, parent, acl::DEFAULT_XATTR)? else {
        return Ok((Vec::new(), mode & !umask));
    };
    let mut changes = Vec::new();
    if kind == FileKind::Directory {
        changes.push(Change::SetXattr {
            ino,
            name: acl::DEFAULT_XATTR.to_vec(),
            value: default.encode(),
        });
    }
    let (access, mode) = Acl::inherit(&default, mode);
    if let Some(access) = access {
        changes.push(Change::SetXattr {
            ino,
            name: acl::ACCESS_XATTR.to_vec(),
            value: access.encode(),
        });
    }
    Ok((changes, mode))
}

impl FileSystem {
    /// Makes a node under the metadata lock the caller holds; `shard`: the shard its inode
    /// goes to, where the caller chose it (a directory made for an owner slot).
    pub(crate) fn make_locked(
        &self,
        m: &mut crate::fs::Meta,
        parent: Ino,
        name: &[u8],
        node: NewNode,
        shard: Option<usize>,
    ) -> FsResult<Attr> {
        let NewNode {
            kind,
            mode,
            umask,
            rdev,
            caller,
            symlink_target,
            open,
            for_slot: _,
            keep_data: _,
        } = node;
        check_name(name)?;
        self.check_inode_limit(m)?;
        let pattr = self.names_dir(m, parent)?;
        if pattr.nlink == 0 {
            return Err(FsError::NotFound);
        }
        if m.state.lookup(parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        if kind == FileKind::Directory && pattr.nlink >= LINKS_MAX {
            return Err(FsError::TooManyLinks);
        }
        // Files live in their directory's shard; directories spread over the shards this
        // owner holds, so the namespace, and its metanodes, balance.
        let shard = if let Some(shard) = shard {
            shard
        } else if kind == FileKind::Directory {
            m.state.shard_for_new_directory()
        } else {
            m.state.shard_of(parent)
        };
        let ino = match crate::early_answer::MAKE_AS.take() {
            Some(ino) => m.state.allocate_ino_as(shard, ino)?,
            None => m.state.allocate_ino(shard),
        };
        let now = self.now();
        // BSD group semantics of a setgid directory, as ext4 and XFS implement them.
        let setgid_dir = pattr.perm & 0o2000 != 0;
        let gid = if setgid_dir { pattr.gid } else { caller.gid };
        let (acl_changes, mode) = inherited_acls(m, parent, ino, kind, mode, umask)?;
        let mut perm = (mode & 0o7777) as u16;
        if setgid_dir && kind == FileKind::Directory {
            perm |= 0o2000;
        }
        let attr = Attr {
            ino,
            kind,
            perm,
            uid: caller.uid,
            gid,
            nlink: if kind == FileKind::Directory { 2 } else { 1 },
            size: symlink_target.as_ref().map_or(0, |t| t.len() as u64),
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            generation: 0,
        };
        let cookie = m.state.new_cookie(parent, name)?;
        let mut pattr = pattr;
        pattr.mtime = now;
        pattr.ctime = now;
        if kind == FileKind::Directory {
            pattr.nlink += 1;
        }
        let mut changes = vec![Change::PutAttr(attr)];
        if kind == FileKind::Regular {
            if let Some((pool, rule)) = self.place(m, name, &attr) {
                tracing::trace!("inode {ino} placed in pool {pool} by {rule}");
                changes.push(Change::SetPool { ino, pool });
            }
            let copies = self.owner().replication.read().data;
            if copies > 1 {
                changes.push(Change::SetReplicas { ino, copies });
            }
        }
        changes.extend(acl_changes);
        if kind == FileKind::Directory {
            changes.push(Change::SetParent { dir: ino, parent });
        }
        if let Some(target) = &symlink_target {
            if target.len() > SYMLINK_BYTES_MAX || target.is_empty() {
                return Err(FsError::NameTooLong);
            }
            changes.push(Change::Inline {
                ino,
                data: target.to_vec(),
            });
        }
        changes.push(Change::DirInsert {
            dir: parent,
            name: name.to_vec(),
            entry: DirEntry { ino, kind, cookie },
        });
        changes.push(Change::PutAttr(pattr));
        self.log(m, changes)?;
        if open {
            *m.open.entry(ino).or_insert(0) += 1;
        }
        Ok(attr)
    }
}
