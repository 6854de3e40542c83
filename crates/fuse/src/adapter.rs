//! The request handler: one short function per operation, translating a kernel request
//! into a `tessera_fs::FileSystem` call and its result into a reply.

use std::sync::Arc;
use std::time::Duration;

use tessera_fs::{Attr, Caller, FileKind, FileSystem, FsError, SetAttr, Timestamp};

use crate::kernel::abi::{self, fattr, init_flags, FuseAttr, Ttl};
use crate::kernel::reply::{DirBuf, EntryOut, Reply, StatfsOut};
use crate::kernel::request::{Op, Request, SetattrIn};
use crate::kernel::session::{Handler, InitParams};

/// How long the kernel may cache attributes and names. One node owns every shard and every
/// change passes through this mount, so the kernel's cache stays coherent however long it is
/// kept; when shards move between nodes, token revocation will invalidate it explicitly.
const TTL: Duration = Duration::from_secs(60);
/// Largest request the kernel sends; matches the 1 MiB I/O the file system is tuned for.
pub(crate) const MAX_REQUEST_BYTES: u32 = 1 << 20;
/// File-handle bits recording open flags that change write semantics.
const FH_SYNC: u64 = 1;
/// `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT` from renameat2(2).
const RENAME_NOREPLACE: u32 = 1 << 0;
const RENAME_EXCHANGE: u32 = 1 << 1;
const RENAME_WHITEOUT: u32 = 1 << 2;

pub(crate) struct TesseraFuse {
    fs: Arc<FileSystem>,
}

impl TesseraFuse {
    pub(crate) fn new(fs: Arc<FileSystem>) -> TesseraFuse {
        TesseraFuse { fs }
    }
}

fn errno(e: &FsError) -> Reply {
    if matches!(
        e,
        FsError::Checksum { .. } | FsError::Io(_) | FsError::Corrupt(_)
    ) {
        tracing::error!("{e}");
    }
    Reply::Error(e.errno())
}

/// (seconds, nanoseconds) for the kernel. Times before 1970 lose their nanoseconds, as
/// they did through `SystemTime` before.
fn time(t: Timestamp) -> (i64, u32) {
    if t.secs >= 0 {
        (t.secs, t.nsecs)
    } else {
        (t.secs, 0)
    }
}

fn timestamp((secs, nsecs): (i64, u32)) -> Timestamp {
    if secs >= 0 {
        let d = Duration::new(secs as u64, nsecs);
        Timestamp {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        }
    } else {
        Timestamp { secs, nsecs: 0 }
    }
}

/// `S_IF*` bits of a file kind.
fn kind_bits(kind: FileKind) -> u32 {
    match kind {
        FileKind::Regular => libc::S_IFREG,
        FileKind::Directory => libc::S_IFDIR,
        FileKind::Symlink => libc::S_IFLNK,
        FileKind::Fifo => libc::S_IFIFO,
        FileKind::Socket => libc::S_IFSOCK,
        FileKind::CharDevice => libc::S_IFCHR,
        FileKind::BlockDevice => libc::S_IFBLK,
    }
}

/// `DT_*` of a file kind, for directory entries.
fn dirent_type(kind: FileKind) -> u32 {
    kind_bits(kind) >> 12
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
fn file_attr(a: &Attr, allocated_bytes: u64) -> FuseAttr {
    FuseAttr {
        ino: a.ino,
        size: a.size,
        blocks: allocated_bytes.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        mode: kind_bits(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: MAX_REQUEST_BYTES,
    }
}

fn handle_flags(flags: u32) -> (u64, u32) {
    let f = flags as i32;
    let sync = f & (libc::O_SYNC | libc::O_DSYNC | libc::O_DIRECT) != 0;
    let open = if f & libc::O_DIRECT != 0 {
        // O_DIRECT bypasses the kernel page cache as it does on a local file system.
        abi::FOPEN_DIRECT_IO
    } else {
        abi::FOPEN_KEEP_CACHE
    };
    (if sync { FH_SYNC } else { 0 }, open)
}

fn empty(r: Result<(), FsError>) -> Reply {
    match r {
        Ok(()) => Reply::Empty,
        Err(e) => errno(&e),
    }
}

/// getxattr/listxattr: size 0 asks only for the size.
fn xattr(value: Vec<u8>, size: u32) -> Reply {
    if size == 0 {
        Reply::XattrSize(value.len() as u32)
    } else if value.len() > size as usize {
        Reply::Error(libc::ERANGE)
    } else {
        Reply::Data(value)
    }
}

fn set_attr(s: &SetattrIn) -> SetAttr {
    let valid = |bit: u32| s.valid & bit != 0;
    let time_or_now = |bit: u32, now_bit: u32, t: (i64, u32)| {
        valid(bit).then(|| {
            if valid(now_bit) {
                Timestamp::now()
            } else {
                timestamp(t)
            }
        })
    };
    SetAttr {
        mode: valid(fattr::MODE).then_some(s.mode),
        uid: valid(fattr::UID).then_some(s.uid),
        gid: valid(fattr::GID).then_some(s.gid),
        size: valid(fattr::SIZE).then_some(s.size),
        atime: time_or_now(fattr::ATIME, fattr::ATIME_NOW, s.atime),
        mtime: time_or_now(fattr::MTIME, fattr::MTIME_NOW, s.mtime),
        ctime: valid(fattr::CTIME).then(|| timestamp(s.ctime)),
    }
}

impl TesseraFuse {
    fn file_attr(&self, a: &Attr) -> FuseAttr {
        file_attr(a, self.fs.allocated_bytes(a.ino))
    }

    fn entry_out(&self, a: &Attr, generation: u64) -> EntryOut {
        EntryOut {
            nodeid: a.ino,
            generation,
            ttl: Ttl::from_duration(TTL),
            attr: self.file_attr(a),
        }
    }

    fn entry(&self, r: Result<Attr, FsError>) -> Reply {
        match r {
            Ok(a) => Reply::Entry(self.entry_out(&a, u64::from(a.generation))),
            Err(e) => errno(&e),
        }
    }

    fn attr(&self, r: Result<Attr, FsError>) -> Reply {
        match r {
            Ok(a) => Reply::Attr {
                ttl: Ttl::from_duration(TTL),
                attr: self.file_attr(&a),
            },
            Err(e) => errno(&e),
        }
    }

    fn create_node(
        &self,
        req: &Request<'_>,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr, FsError> {
        let caller = Caller {
            uid: req.header.uid,
            gid: req.header.gid,
        };
        self.fs
            .create_node(req.header.nodeid, name, kind, mode, rdev, caller, target)
    }

    fn open(&self, ino: u64, flags: u32) -> Reply {
        let f = flags as i32;
        // With FUSE_ATOMIC_O_TRUNC the kernel leaves O_TRUNC to us instead of sending a
        // separate setattr.
        if f & libc::O_TRUNC != 0 && f & libc::O_ACCMODE != libc::O_RDONLY {
            if let Err(e) = self.fs.truncate(ino, 0) {
                return errno(&e);
            }
        }
        match self.fs.open(ino) {
            Ok(_) => {
                let (fh, open_flags) = handle_flags(flags);
                Reply::Open { fh, open_flags }
            }
            Err(e) => errno(&e),
        }
    }

    fn create(&self, req: &Request<'_>, flags: u32, mode: u32, umask: u32, name: &[u8]) -> Reply {
        let r = self.create_node(req, name, FileKind::Regular, mode & !umask, 0, None);
        let attr = match r.and_then(|a| self.fs.open(a.ino)) {
            Ok(a) => a,
            Err(e) => return errno(&e),
        };
        let (fh, open_flags) = handle_flags(flags);
        Reply::Create {
            entry: self.entry_out(&attr, 0),
            fh,
            open_flags,
        }
    }

    fn rename(&self, parent: u64, flags: u32, names: (&[u8], u64, &[u8])) -> Reply {
        if flags & RENAME_WHITEOUT != 0 {
            return Reply::Error(libc::EINVAL);
        }
        let (name, newdir, newname) = names;
        empty(self.fs.rename(
            parent,
            name,
            newdir,
            newname,
            flags & RENAME_NOREPLACE != 0,
            flags & RENAME_EXCHANGE != 0,
        ))
    }

    fn readdir(&self, ino: u64, offset: u64, size: u32) -> Reply {
        match self.fs.readdir(ino, offset) {
            Ok(listing) => {
                let mut buf = DirBuf::new(size);
                for (cookie, child, kind, name) in listing.entries {
                    if buf.add(child, cookie, dirent_type(kind), &name) {
                        break;
                    }
                }
                buf.into_reply()
            }
            Err(e) => errno(&e),
        }
    }

    fn statfs(&self) -> Reply {
        let s = self.fs.statfs();
        Reply::Statfs(StatfsOut {
            blocks: s.fragments_total,
            bfree: s.fragments_free,
            bavail: s.fragments_free,
            files: s.inodes_total,
            ffree: s.inodes_free,
            bsize: s.fragment_bytes as u32,
            namelen: s.name_bytes_max,
            frsize: s.fragment_bytes as u32,
        })
    }
}

impl Handler for TesseraFuse {
    fn init_params(&self) -> InitParams {
        InitParams {
            flags: init_flags::ASYNC_READ
                | init_flags::WRITEBACK_CACHE
                | init_flags::PARALLEL_DIROPS
                | init_flags::ASYNC_DIO
                | init_flags::BIG_WRITES
                | init_flags::MAX_PAGES
                | init_flags::ATOMIC_O_TRUNC,
            max_write: MAX_REQUEST_BYTES,
            max_readahead: MAX_REQUEST_BYTES,
            max_background: 64,
            congestion_threshold: 48,
        }
    }

    fn destroy(&self) {
        if let Err(e) = self.fs.sync() {
            tracing::error!("final sync: {e}");
        }
    }

    fn handle(&self, req: &Request<'_>) -> Reply {
        let ino = req.header.nodeid;
        match req.op {
            Op::Lookup { name } => self.entry(self.fs.lookup(ino, name)),
            Op::Getattr => self.attr(self.fs.getattr(ino)),
            Op::Setattr(ref s) => self.attr(self.fs.setattr(ino, set_attr(s))),
            Op::Readlink => match self.fs.readlink(ino) {
                Ok(t) => Reply::Data(t),
                Err(e) => errno(&e),
            },
            Op::Mknod {
                mode,
                rdev,
                umask,
                name,
            } => match kind_of_mode(mode) {
                Some(kind) => {
                    self.entry(self.create_node(req, name, kind, mode & !umask, rdev, None))
                }
                None => Reply::Error(libc::EINVAL),
            },
            Op::Mkdir { mode, umask, name } => {
                let r = self.create_node(req, name, FileKind::Directory, mode & !umask, 0, None);
                self.entry(r)
            }
            Op::Symlink { name, target } => {
                let r = self.create_node(req, name, FileKind::Symlink, 0o777, 0, Some(target));
                self.entry(r)
            }
            Op::Unlink { name } => empty(self.fs.remove(ino, name, false)),
            Op::Rmdir { name } => empty(self.fs.remove(ino, name, true)),
            Op::Rename {
                newdir,
                flags,
                name,
                newname,
            } => self.rename(ino, flags, (name, newdir, newname)),
            Op::Link { oldnodeid, newname } => self.entry(self.fs.link(oldnodeid, ino, newname)),
            Op::Open { flags } => self.open(ino, flags),
            // Directories need no state of ours between opendir and releasedir.
            Op::Opendir => Reply::Open {
                fh: 0,
                open_flags: 0,
            },
            Op::Releasedir => Reply::Empty,
            Op::Read { offset, size } => match self.fs.read(ino, offset, size) {
                Ok(d) => Reply::Data(d),
                Err(e) => errno(&e),
            },
            Op::Write { fh, offset, data } => {
                match self.fs.write(ino, offset, data, fh & FH_SYNC != 0) {
                    Ok(n) => Reply::Write { size: n as u32 },
                    Err(e) => errno(&e),
                }
            }
            // close(2) does not promise durability (fsync does) and locks are the kernel's,
            // so there is nothing to do; ENOSYS tells the kernel to stop sending FLUSH at
            // all, which saves a round trip on every close.
            Op::Flush => Reply::Error(libc::ENOSYS),
            Op::Release => empty(self.fs.release(ino)),
            Op::Fsync | Op::Fsyncdir => empty(self.fs.fsync(ino)),
            Op::Readdir { offset, size } => self.readdir(ino, offset, size),
            Op::Statfs => self.statfs(),
            Op::Setxattr { name, value, flags } => {
                let create = flags as i32 & libc::XATTR_CREATE != 0;
                let replace = flags as i32 & libc::XATTR_REPLACE != 0;
                empty(self.fs.setxattr(ino, name, value, create, replace))
            }
            Op::Getxattr { name, size } => match self.fs.getxattr(ino, name) {
                Ok(v) => xattr(v, size),
                Err(e) => errno(&e),
            },
            Op::Listxattr { size } => match self.fs.listxattr(ino) {
                Ok(v) => xattr(v, size),
                Err(e) => errno(&e),
            },
            Op::Removexattr { name } => empty(self.fs.removexattr(ino, name)),
            Op::Create {
                flags,
                mode,
                umask,
                name,
            } => self.create(req, flags, mode, umask, name),
            Op::Fallocate {
                offset,
                length,
                mode,
            } => empty(self.fs.fallocate(ino, offset, length, mode as i32)),
            Op::Init(_)
            | Op::Destroy
            | Op::Forget
            | Op::BatchForget
            | Op::Interrupt
            | Op::Unsupported(_) => Reply::Error(libc::ENOSYS),
        }
    }
}
