//! The `fuser::Filesystem` implementation: one short method per request.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tessera_fs::{Attr, Caller, FileKind, FileSystem, FsError, SetAttr, Timestamp};

/// How long the kernel may cache attributes and names. One node owns every shard and every
/// change passes through this mount, so the kernel's cache stays coherent however long it is
/// kept; when shards move between nodes, token revocation will invalidate it explicitly.
const TTL: Duration = Duration::from_secs(60);
/// Largest request the kernel sends; matches the 1 MiB I/O the file system is tuned for.
const MAX_REQUEST_BYTES: u32 = 1 << 20;
/// File-handle bits recording open flags that change write semantics.
const FH_SYNC: u64 = 1;

pub(crate) struct TesseraFuse {
    fs: Arc<FileSystem>,
}

impl TesseraFuse {
    pub(crate) fn new(fs: Arc<FileSystem>) -> TesseraFuse {
        TesseraFuse { fs }
    }
}

fn errno(e: &FsError) -> Errno {
    if matches!(
        e,
        FsError::Checksum { .. } | FsError::Io(_) | FsError::Corrupt(_)
    ) {
        tracing::error!("{e}");
    }
    Errno::from_i32(e.errno())
}

fn time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nsecs)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        },
        Err(e) => Timestamp {
            secs: -(e.duration().as_secs() as i64),
            nsecs: 0,
        },
    }
}

fn time_or_now(t: TimeOrNow) -> Timestamp {
    match t {
        TimeOrNow::SpecificTime(t) => timestamp(t),
        TimeOrNow::Now => Timestamp::now(),
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn kind_of_mode(mode: u32) -> Option<FileKind> {
    match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => Some(FileKind::Regular),
        libc::S_IFIFO => Some(FileKind::Fifo),
        libc::S_IFSOCK => Some(FileKind::Socket),
        libc::S_IFCHR => Some(FileKind::CharDevice),
        libc::S_IFBLK => Some(FileKind::BlockDevice),
        _ => None,
    }
}

/// `allocated_bytes` is what the file holds on the NSDs, so `du` sees sparse files and
/// inline data as they are.
fn file_attr(a: &Attr, allocated_bytes: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: allocated_bytes.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.crtime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: MAX_REQUEST_BYTES,
        flags: 0,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn handle_flags(flags: OpenFlags) -> (u64, FopenFlags) {
    let f = flags.0;
    let sync = f & (libc::O_SYNC | libc::O_DSYNC | libc::O_DIRECT) != 0;
    let mut open = FopenFlags::empty();
    if f & libc::O_DIRECT != 0 {
        // O_DIRECT bypasses the kernel page cache as it does on a local file system.
        open |= FopenFlags::FOPEN_DIRECT_IO;
    } else {
        open |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    (if sync { FH_SYNC } else { 0 }, open)
}

impl TesseraFuse {
    fn file_attr(&self, a: &Attr) -> FileAttr {
        file_attr(a, self.fs.allocated_bytes(a.ino))
    }

    fn reply_entry(&self, r: Result<Attr, FsError>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(
                &TTL,
                &self.file_attr(&a),
                Generation(u64::from(a.generation)),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn reply_empty(r: Result<(), FsError>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl fuser::Filesystem for TesseraFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let wanted = InitFlags::FUSE_WRITEBACK_CACHE
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_ATOMIC_O_TRUNC;
        let supported = wanted & config.capabilities();
        let _ = config.add_capabilities(supported);
        let _ = config.set_max_write(MAX_REQUEST_BYTES);
        let _ = config.set_max_readahead(MAX_REQUEST_BYTES);
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.sync() {
            tracing::error!("final sync: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.reply_entry(self.fs.lookup(parent.0, name.as_bytes()), reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &self.file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(timestamp),
        };
        match self.fs.setattr(ino.0, set) {
            Ok(a) => reply.attr(&TTL, &self.file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = kind_of_mode(mode) else {
            return reply.error(Errno::from_i32(libc::EINVAL));
        };
        let r = self.fs.create_node(
            parent.0,
            name.as_bytes(),
            kind,
            mode & !umask,
            rdev,
            caller(req),
            None,
        );
        self.reply_entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.fs.create_node(
            parent.0,
            name.as_bytes(),
            FileKind::Directory,
            mode & !umask,
            0,
            caller(req),
            None,
        );
        self.reply_entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::reply_empty(self.fs.remove(parent.0, name.as_bytes(), false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::reply_empty(self.fs.remove(parent.0, name.as_bytes(), true), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.create_node(
            parent.0,
            link_name.as_bytes(),
            FileKind::Symlink,
            0o777,
            0,
            caller(req),
            Some(target.as_os_str().as_bytes()),
        );
        self.reply_entry(r, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let r = self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
            flags.contains(RenameFlags::RENAME_EXCHANGE),
        );
        Self::reply_empty(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.reply_entry(self.fs.link(ino.0, newparent.0, newname.as_bytes()), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        // With FUSE_ATOMIC_O_TRUNC the kernel leaves O_TRUNC to us instead of sending a
        // separate setattr.
        if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            if let Err(e) = self.fs.truncate(ino.0, 0) {
                return reply.error(errno(&e));
            }
        }
        match self.fs.open(ino.0) {
            Ok(_) => {
                let (fh, open) = handle_flags(flags);
                reply.opened(FileHandle(fh), open);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(ino.0, offset, data, fh.0 & FH_SYNC != 0) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) does not promise durability (fsync does) and locks are the kernel's, so
        // there is nothing to do; ENOSYS tells the kernel to stop sending FLUSH at all, which
        // saves a round trip on every close.
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        Self::reply_empty(self.fs.release(ino.0), reply);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        Self::reply_empty(self.fs.fsync(ino.0), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.fs.readdir(ino.0, offset) {
            Ok(listing) => {
                for (cookie, child, kind, name) in listing.entries {
                    if reply.add(
                        INodeNo(child),
                        cookie,
                        file_type(kind),
                        OsStr::from_bytes(&name),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        Self::reply_empty(self.fs.fsync(ino.0), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.fragments_total,
            s.fragments_free,
            s.fragments_free,
            s.inodes_total,
            s.inodes_free,
            s.fragment_bytes as u32,
            s.name_bytes_max,
            s.fragment_bytes as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let create = flags & libc::XATTR_CREATE != 0;
        let replace = flags & libc::XATTR_REPLACE != 0;
        Self::reply_empty(
            self.fs
                .setxattr(ino.0, name.as_bytes(), value, create, replace),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.getxattr(ino.0, name.as_bytes()) {
            Ok(v) => reply_xattr(v, size, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(ino.0) {
            Ok(v) => reply_xattr(v, size, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::reply_empty(self.fs.removexattr(ino.0, name.as_bytes()), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.fs.create_node(
            parent.0,
            name.as_bytes(),
            FileKind::Regular,
            mode & !umask,
            0,
            caller(req),
            None,
        );
        let attr = match r.and_then(|a| self.fs.open(a.ino)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        let (fh, open) = handle_flags(OpenFlags(flags));
        reply.created(
            &TTL,
            &self.file_attr(&attr),
            Generation(0),
            FileHandle(fh),
            open,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        Self::reply_empty(self.fs.fallocate(ino.0, offset, length, mode), reply);
    }
}

fn reply_xattr(value: Vec<u8>, size: u32, reply: ReplyXattr) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(&value);
    }
}
