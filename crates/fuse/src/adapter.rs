//! The request handler: one short function per operation, translating a kernel request
//! into a `tessera_fs::FileSystem` call and its result into a reply.
//!
//! Permissions are checked twice. The kernel checks them (`default_permissions`, and POSIX
//! ACLs with FUSE_POSIX_ACL): on every path walk, cached names included, and on every open,
//! including opens of FIFOs, sockets and device nodes, which never reach us. Here, before
//! each operation, the file system checks them again by the same rules
//! (`tessera_fs::access`) with the caller's credentials from the request header: it stays
//! the authority for what it stores (ACL inheritance, which times a non-owner may write),
//! and for every caller of the file system that is not this kernel mount. A check and its
//! operation take the metadata lock separately, so a concurrent chmod between them orders
//! the operation before the chmod.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera_fs::access::{
    self, AttrChange, Credentials, TimeChange, MAY_EXEC, MAY_READ, MAY_WRITE,
};
use tessera_fs::acl::{self as posix_acl, AclKind};
use tessera_fs::locks::{self, Lock, LockClass, LockKind};
use tessera_fs::{Attr, Caller, FileKind, FileSystem, FsError, SetAttr, Timestamp};

use crate::kernel::abi::{self, fattr, init_flags, FuseAttr, Ttl};
use crate::kernel::reply::{DirBuf, EntryOut, Reply, StatfsOut};
use crate::kernel::request::{Op, Request, SetattrIn};
use crate::kernel::session::{Handler, InitParams};

/// How long the kernel may cache attributes and names it may cache at all: those of inodes
/// this node's metanode serves (every change passes through this node, its own through
/// this mount and other nodes' through its metanode, which drops what they change from the
/// kernel's caches), and those this mount holds under another owner's read token (its
/// revocation drops them first); see `tessera_fs::CacheChange`. Coherent however long
/// it is kept.
const TTL: Duration = Duration::from_secs(60);
/// Largest request the kernel sends; matches the 1 MiB I/O the file system is tuned for.
pub(crate) const MAX_REQUEST_BYTES: u32 = 1 << 20;
/// File-handle bits recording open flags that change write semantics.
const FH_SYNC: u64 = 1;
/// `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT` from renameat2(2).
const RENAME_NOREPLACE: u32 = 1 << 0;
const RENAME_EXCHANGE: u32 = 1 << 1;
const RENAME_WHITEOUT: u32 = 1 << 2;
/// Read-only opens of files at least this large stream past the page cache (`streams`).
const STREAM_BYTES_MIN: u64 = 64 << 20;
/// `__FMODE_EXEC` in the open flags: the kernel opens the file to execute it.
const OPEN_FLAG_EXEC: u32 = 0x20;

pub(crate) struct TesseraFuse {
    fs: Arc<FileSystem>,
    /// No other node mounts the file system (`KernelCache::Private`): its small writes are
    /// gathered, by the daemon (`tessera_fs` write-behind, writable opens direct) where
    /// the kernel lets direct-I/O files be mmapped, by the kernel's writeback cache where
    /// it does not.
    private: bool,
    /// Writable opens pass their writes straight to the daemon, which gathers the small
    /// ones (a private mount whose kernel granted `DIRECT_IO_ALLOW_MMAP`).
    gathers: AtomicBool,
    /// The kernel granted `DIRECT_IO_ALLOW_MMAP`, so large read-only opens may stream.
    streaming: AtomicBool,
    /// The kernel knows `FUSE_NOTIFY_INC_EPOCH` (protocol 7.44), so names of other
    /// owners' directories may be cached (see `name_ttl`).
    epochs: AtomicBool,
    /// The kernel granted `POSIX_ACL`, so it checks the ACLs we store; without it an ACL
    /// would be obeyed by us and ignored by the kernel's check, so none may be set.
    acls: AtomicBool,
    /// Other nodes may mount the file system too (any cache but `Private`): locks go to
    /// the owner, not the kernel, and O_APPEND writes take the file's append lock.
    shared: bool,
    /// Lock requests waiting (`F_SETLKW`), by request id, and interrupts the kernel sent
    /// (one may come before its request is registered here).
    waiting: parking_lot::Mutex<HashMap<u64, Wait>>,
    /// The next open's number: file handles are `number << 1 | FH_SYNC`, one per open file
    /// (open file description), so that RELEASE names which one closed.
    next_open: AtomicU64,
    /// Record-lock owners that took a lock through an open file, by inode: `(fh, owner)`.
    /// An open file description lock (`F_OFD_SETLK`) is owned by its open file, and the
    /// kernel tells the file system of its end only by the RELEASE of that file (its
    /// unlock at the last close is left to a FLUSH that names the process, not the file);
    /// so a RELEASE drops the locks of the owners recorded for its handle. A FLUSH drops
    /// every lock of the closing process on the inode and forgets it here, so a process's
    /// record locks never go with the RELEASE of some other open file it locked through.
    lock_owners: parking_lot::Mutex<HashMap<u64, Vec<(u64, u64)>>>,
}

/// Interrupts remembered for requests not (or no longer) waiting: enough for every
/// request thread, bounded against interrupts of requests that finished meanwhile.
const EARLY_INTERRUPTS_MAX: usize = 1024;

#[derive(Clone, Copy, Default)]
struct Wait {
    /// A lock request of this id is waiting.
    registered: bool,
    interrupted: bool,
}

impl TesseraFuse {
    /// Whether the kernel knows `FUSE_NOTIFY_INC_EPOCH` (known once INIT is answered).
    pub(crate) fn knows_epochs(&self) -> bool {
        self.epochs.load(Ordering::Relaxed)
    }

    pub(crate) fn new(fs: Arc<FileSystem>, cache: crate::KernelCache) -> TesseraFuse {
        // Writes of a shared file system take data tokens, appends the append lock.
        fs.set_shared(cache != crate::KernelCache::Private);
        TesseraFuse {
            fs,
            private: cache == crate::KernelCache::Private,
            gathers: AtomicBool::new(false),
            streaming: AtomicBool::new(false),
            epochs: AtomicBool::new(false),
            acls: AtomicBool::new(false),
            shared: cache != crate::KernelCache::Private,
            waiting: parking_lot::Mutex::new(HashMap::new()),
            next_open: AtomicU64::new(1),
            lock_owners: parking_lot::Mutex::new(HashMap::new()),
        }
    }
}

/// The value of a permission check, or its errno as the reply.
macro_rules! check {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return errno(&e),
        }
    };
}

fn credentials(req: &Request<'_>) -> Credentials {
    Credentials::new(req.header.uid, req.header.gid, req.header.pid)
}

/// The permission an open needs: its access mode, write to truncate, execute to exec.
fn open_mask(flags: u32) -> u32 {
    let f = flags as i32;
    if flags & OPEN_FLAG_EXEC != 0 {
        // execve(2) opens read-only but needs only execute permission, as on any local
        // file system: a mode 0711 binary runs for everyone.
        return MAY_EXEC;
    }
    let mut mask = match f & libc::O_ACCMODE {
        libc::O_RDONLY => MAY_READ,
        libc::O_WRONLY => MAY_WRITE,
        _ => MAY_READ | MAY_WRITE,
    };
    if f & libc::O_TRUNC != 0 {
        mask |= MAY_WRITE;
    }
    mask
}

/// What a setattr asks, for its permission check.
fn attr_change(s: &SetattrIn) -> AttrChange {
    let valid = |bit: u32| s.valid & bit != 0;
    let time = |bit: u32, now_bit: u32, t| {
        valid(bit).then_some(if valid(now_bit) {
            TimeChange::Now
        } else {
            TimeChange::Explicit(timestamp(t))
        })
    };
    AttrChange {
        mode: valid(fattr::MODE).then_some(s.mode),
        uid: valid(fattr::UID).then_some(s.uid),
        gid: valid(fattr::GID).then_some(s.gid),
        size: valid(fattr::SIZE),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, s.atime),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, s.mtime),
        ctime: valid(fattr::CTIME).then(|| timestamp(s.ctime)),
        open_for_write: valid(fattr::FH),
    }
}

fn errno(e: &FsError) -> Reply {
    if matches!(
        e,
        FsError::Checksum { .. } | FsError::Io(_) | FsError::Corrupt(_)
    ) {
        tracing::error!("{e}");
    } else if e.errno() == libc::EIO {
        // Every other EIO too: an application sees only the number.
        tracing::warn!("I/O error to the application: {e}");
    } else if e.errno() == libc::EXDEV {
        // Within one file system EXDEV is rare (`mv` copies instead): say why.
        tracing::warn!("EXDEV to the application: {e}");
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
    kind.type_bits()
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

/// The file-handle bits of an open's flags (`FH_SYNC`), and the kernel's open flags.
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

/// Whether an open streams its reads past the kernel page cache: read-only opens of
/// regular files of at least `STREAM_BYTES_MIN`, when the kernel lets such files still be
/// mmapped. Their sequential reads are served from the file system's own read-ahead
/// (whole blocks, see `tessera_fs` prefetch), copied once, by the kernel, into the
/// reader's buffer; through the page cache every byte was copied in by us and out by the
/// reader, which on two CPUs held 1 MiB sequential reads to 1.1-1.3 GB/s against
/// 2.8-3.1 GB/s streamed. Small files, and every open that may write, keep the page cache
/// (re-reads and small reads stay memory-fast; writes are gathered by writeback). The
/// kernel writes back dirty pages of the range before a direct read, so a streaming reader
/// sees what a cached writer wrote.
fn streams(flags: u32, attr: &Attr, allowed: bool) -> bool {
    let f = flags as i32;
    allowed
        && attr.kind == FileKind::Regular
        && f & libc::O_ACCMODE == libc::O_RDONLY
        && f & libc::O_TRUNC == 0
        && attr.size >= STREAM_BYTES_MIN
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

    fn ttl_if(keep: bool) -> Ttl {
        Ttl::from_duration(if keep { TTL } else { Duration::ZERO })
    }

    /// How long the kernel may keep `ino`'s attributes given in a reply other than to its
    /// `GETATTR` (a lookup or create may bring the inode in new, and the kernel would keep
    /// attributes a revocation overtook): the mount's time when this node's own metanode
    /// serves the inode, since that metanode drops from the kernel whatever other nodes
    /// change; none when another node serves it, or while writes of it are gathered.
    fn ttl_for(&self, ino: u64) -> Ttl {
        Self::ttl_if(self.fs.serves(ino) && !self.fs.has_gathered(ino))
    }

    /// How long the kernel may keep `ino`'s attributes in the answer to its `GETATTR`: as
    /// [`Self::ttl_for`], and also while this mount holds them under the read token of
    /// another node's owner, whose revocation drops them from the kernel first
    /// (`FileSystem::kernel_may_keep_attr`). Not while the daemon holds gathered writes of
    /// the file: their blocks are not allocated yet, and the kernel would keep a block count
    /// (`du`) that their write changes without telling it.
    fn getattr_ttl(&self, ino: u64) -> Ttl {
        Self::ttl_if(self.fs.kernel_may_keep_attr(ino) && !self.fs.has_gathered(ino))
    }

    /// How long the kernel may keep `name` in `parent` (naming `ino`): while this node's
    /// metanode serves `parent`, or, when the kernel can make its names invalid without a
    /// directory's lock (`FUSE_NOTIFY_INC_EPOCH`), while this mount holds the name under
    /// `parent`'s read token (`FileSystem::kernel_may_keep_name`).
    fn name_ttl(&self, parent: u64, name: &[u8], ino: u64) -> Ttl {
        Self::ttl_if(
            self.fs.serves(parent)
                || (self.epochs.load(Ordering::Relaxed)
                    && self.fs.kernel_may_keep_name(parent, name, ino)),
        )
    }

    /// Every name may be cached: the kernel checks search permission on cached walks. The
    /// name as [`Self::name_ttl`] says, the attributes as [`Self::ttl_for`].
    fn entry_out(&self, parent: u64, name: &[u8], a: &Attr, generation: u64) -> EntryOut {
        EntryOut {
            nodeid: a.ino,
            generation,
            entry_ttl: self.name_ttl(parent, name, a.ino),
            attr_ttl: self.ttl_for(a.ino),
            attr: self.file_attr(a),
        }
    }

    fn entry(&self, parent: u64, name: &[u8], r: Result<Attr, FsError>) -> Reply {
        match r {
            Ok(a) => Reply::Entry(self.entry_out(parent, name, &a, u64::from(a.generation))),
            Err(e) => errno(&e),
        }
    }

    /// The attributes `r` gives, kept by the kernel as long as `ttl` says for the inode.
    fn attr(&self, r: Result<Attr, FsError>, ttl: fn(&Self, u64) -> Ttl) -> Reply {
        match r {
            Ok(a) => Reply::Attr {
                ttl: ttl(self, a.ino),
                attr: self.file_attr(&a),
            },
            Err(e) => errno(&e),
        }
    }

    /// Whether the kernel's page cache may hold `ino`'s data: as for [`Self::ttl_for`].
    fn page_cache_for(&self, ino: u64) -> bool {
        self.fs.serves(ino)
    }

    /// Creates a node with the creator's mode and umask: the file system applies the
    /// umask, or the directory's default ACL in its place (the kernel leaves both to us,
    /// FUSE_DONT_MASK).
    fn create_node(
        &self,
        req: &Request<'_>,
        name: &[u8],
        (kind, mode, umask): (FileKind, u32, u32),
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr, FsError> {
        let caller = Caller {
            uid: req.header.uid,
            gid: req.header.gid,
        };
        self.fs.create_node_umask(
            req.header.nodeid,
            name,
            kind,
            (mode, umask),
            rdev,
            caller,
            target,
        )
    }

    /// mknod, mkdir, symlink: write and search on the directory, then create.
    fn make_node(
        &self,
        req: &Request<'_>,
        name: &[u8],
        (kind, mode, umask, rdev): (FileKind, u32, u32, u32),
        target: Option<&[u8]>,
    ) -> Reply {
        let cred = credentials(req);
        check!(self
            .fs
            .may_use_dir(req.header.nodeid, &cred, MAY_WRITE | MAY_EXEC));
        let parent = req.header.nodeid;
        self.entry(
            parent,
            name,
            self.create_node(req, name, (kind, mode, umask), rdev, target),
        )
    }

    fn lookup(&self, parent: u64, name: &[u8], cred: &Credentials) -> Reply {
        check!(self.fs.may_use_dir(parent, cred, MAY_EXEC));
        self.entry(parent, name, self.fs.lookup(parent, name))
    }

    fn setattr(&self, ino: u64, s: &SetattrIn, cred: &Credentials) -> Reply {
        if let Some(reply) = self.dead_inode_times(ino, s) {
            return reply;
        }
        let permit = check!(self.fs.may_setattr(ino, cred, &attr_change(s)));
        let mut set = set_attr(s);
        set.mode = permit.mode;
        self.attr(self.fs.setattr(ino, set), Self::ttl_for)
    }

    /// The kernel writes back the times it stamped on a regular file (writeback cache)
    /// after the file may be gone: closed, then unlinked or replaced by a rename, while the
    /// kernel still holds its inode. There is nothing left to update, and failing would fail
    /// the `syncfs` or `sync -f` that triggered the writeback. Only a setattr of times alone
    /// is answered so; the attributes are those of a dead regular file with those times.
    fn dead_inode_times(&self, ino: u64, s: &SetattrIn) -> Option<Reply> {
        let times_only = fattr::MTIME | fattr::CTIME | fattr::FH;
        if s.valid & !times_only != 0 || s.valid & (fattr::MTIME | fattr::CTIME) == 0 {
            return None;
        }
        if !matches!(self.fs.getattr(ino), Err(FsError::NotFound)) {
            return None;
        }
        let mtime = timestamp(s.mtime);
        let attr = Attr {
            ino,
            kind: FileKind::Regular,
            perm: 0,
            uid: 0,
            gid: 0,
            nlink: 0,
            size: 0,
            rdev: 0,
            atime: mtime,
            mtime,
            ctime: timestamp(s.ctime),
            crtime: mtime,
            generation: 0,
        };
        Some(Reply::Attr {
            ttl: Ttl::from_duration(Duration::ZERO),
            attr: file_attr(&attr, 0),
        })
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
            Ok(attr) => {
                let (fh, mut open_flags) = self.handle(flags);
                if !self.page_cache_for(ino)
                    || self.writes_shared(flags)
                    || streams(flags, &attr, self.streaming.load(Ordering::Relaxed))
                {
                    open_flags = abi::FOPEN_DIRECT_IO;
                }
                let open_flags = self.open_flags_gathering(flags, open_flags);
                Reply::Open { fh, open_flags }
            }
            Err(e) => errno(&e),
        }
    }

    /// A new file needs write and search on its directory, and nothing on itself: its
    /// creator may open it as asked whatever its mode (open(O_CREAT | O_RDWR, 0444)).
    fn create(&self, req: &Request<'_>, flags: u32, mode: u32, umask: u32, name: &[u8]) -> Reply {
        let cred = credentials(req);
        check!(self
            .fs
            .may_use_dir(req.header.nodeid, &cred, MAY_WRITE | MAY_EXEC));
        let caller = Caller {
            uid: req.header.uid,
            gid: req.header.gid,
        };
        let r = self
            .fs
            .create_open(req.header.nodeid, name, (mode, umask), caller);
        let attr = match r {
            // The kernel asks to create because it found no name; another node (or a
            // request retried after a metanode's takeover) made it meanwhile. Without
            // O_EXCL, open(2) then opens what is there, as on a local file system.
            Err(FsError::Exists) if flags as i32 & libc::O_EXCL == 0 => {
                return self.open_existing(req.header.nodeid, name, flags, &cred);
            }
            Ok(a) => a,
            Err(e) => return errno(&e),
        };
        self.created(req.header.nodeid, name, &attr, 0, flags)
    }

    /// A writable open of a shared file system: its data must not go through the page
    /// cache. A write there holds its pages locked while it waits for data tokens, which
    /// another node may hold; that node's write drops this kernel's pages of the file
    /// before it returns (`on_remote_change`), and so waited for the very page locks its
    /// token kept locked: a deadlock only the 2 s bound of that wait broke, every time
    /// (IOR's shared file from three nodes ran at 0-3 MiB/s). And an O_APPEND write lands
    /// where the append lock says, not where the kernel's cached size says. Read-only
    /// opens keep the page cache: reads wait for no token.
    fn writes_shared(&self, flags: u32) -> bool {
        self.shared && flags as i32 & libc::O_ACCMODE != libc::O_RDONLY
    }

    /// A writable open of a mount whose daemon gathers small writes: writes go to it
    /// straight from the writer's buffer (one copy, where the page cache made two), and
    /// its closes send `FUSE_FLUSH`, which writes what was gathered and reports a failure
    /// as close's error. Other opens of such a mount send no `FUSE_FLUSH`.
    fn open_flags_gathering(&self, flags: u32, open_flags: u32) -> u32 {
        if !self.gathers.load(Ordering::Relaxed) {
            return open_flags;
        }
        if flags as i32 & libc::O_ACCMODE == libc::O_RDONLY {
            open_flags | abi::FOPEN_NOFLUSH
        } else {
            (open_flags & !abi::FOPEN_KEEP_CACHE) | abi::FOPEN_DIRECT_IO
        }
    }

    /// F_GETLK, F_SETLK and F_SETLKW of a shared file system, at the file's owner.
    fn lock(
        &self,
        req: &Request<'_>,
        fh: u64,
        owner: u64,
        lock: abi::FileLock,
        how: (bool, bool, bool),
    ) -> Reply {
        let (flock, test, sleep) = how;
        let ino = req.header.nodeid;
        let kind = match lock.typ as i32 {
            libc::F_RDLCK => LockKind::Read,
            libc::F_WRLCK => LockKind::Write,
            libc::F_UNLCK => LockKind::Unlock,
            _ => return Reply::Error(libc::EINVAL),
        };
        if lock.start > lock.end || lock.end > locks::TO_END {
            return Reply::Error(libc::EINVAL);
        }
        let class = if flock {
            LockClass::Flock
        } else {
            LockClass::Posix
        };
        let want = Lock {
            holder: self.fs.lock_holder(owner, class),
            start: lock.start,
            end: lock.end,
            kind,
            pid: lock.pid,
        };
        if test {
            return match self.fs.lock_test(ino, want) {
                Ok(None) => Reply::Lock(abi::FileLock {
                    typ: libc::F_UNLCK as u32,
                    ..lock
                }),
                Ok(Some(c)) => Reply::Lock(abi::FileLock {
                    start: c.start,
                    end: c.end,
                    typ: if c.kind == LockKind::Read {
                        libc::F_RDLCK
                    } else {
                        libc::F_WRLCK
                    } as u32,
                    // A process of another node has no number here.
                    pid: if c.holder.client == want.holder.client {
                        c.pid
                    } else {
                        0
                    },
                }),
                Err(e) => errno(&e),
            };
        }
        if class == LockClass::Posix && kind != LockKind::Unlock {
            // Recorded before it is asked: a lock granted and then missed at the RELEASE
            // would outlive its open file.
            self.locked_through(ino, fh, owner);
        }
        if !sleep {
            return empty(self.fs.lock_set(ino, want, None));
        }
        let unique = req.header.unique;
        self.waiting.lock().entry(unique).or_default().registered = true;
        let interrupted = || {
            self.waiting
                .lock()
                .get(&unique)
                .is_some_and(|w| w.interrupted)
        };
        let r = self.fs.lock_set(ino, want, Some(&interrupted));
        self.waiting.lock().remove(&unique);
        empty(r)
    }

    /// A new open file's handle (its own number and `FH_SYNC`) and the kernel's open flags.
    fn handle(&self, flags: u32) -> (u64, u32) {
        let (bits, open_flags) = handle_flags(flags);
        let number = self.next_open.fetch_add(1, Ordering::Relaxed);
        (number << 1 | bits, open_flags)
    }

    /// Remembers that `owner` locked through the open file `fh` of `ino`.
    fn locked_through(&self, ino: u64, fh: u64, owner: u64) {
        let mut owners = self.lock_owners.lock();
        let of_ino = owners.entry(ino).or_default();
        if !of_ino.contains(&(fh, owner)) {
            of_ino.push((fh, owner));
        }
    }

    /// Forgets `owner`'s record of `ino` (its locks there were dropped by its close).
    fn flushed(&self, ino: u64, owner: u64) {
        let mut owners = self.lock_owners.lock();
        if let Some(of_ino) = owners.get_mut(&ino) {
            of_ino.retain(|&(_, o)| o != owner);
            if of_ino.is_empty() {
                owners.remove(&ino);
            }
        }
    }

    /// The owners recorded for the open file `fh` of `ino`, forgotten: it is closed.
    fn released(&self, ino: u64, fh: u64) -> Vec<u64> {
        let mut owners = self.lock_owners.lock();
        let Some(of_ino) = owners.get_mut(&ino) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        of_ino.retain(|&(f, o)| {
            if f == fh {
                gone.push(o);
            }
            f != fh
        });
        if of_ino.is_empty() {
            owners.remove(&ino);
        }
        gone
    }

    /// The answer to a create: the entry and the open handle.
    fn created(&self, parent: u64, name: &[u8], attr: &Attr, generation: u64, flags: u32) -> Reply {
        let (fh, mut open_flags) = self.handle(flags);
        if !self.page_cache_for(attr.ino) || self.writes_shared(flags) {
            open_flags = abi::FOPEN_DIRECT_IO;
        }
        let open_flags = self.open_flags_gathering(flags, open_flags);
        Reply::Create {
            entry: self.entry_out(parent, name, attr, generation),
            fh,
            open_flags,
        }
    }

    /// `create` found `name` made meanwhile: open it as an open(2) without O_CREAT would,
    /// with the permission checks the kernel did not make (it expected a new file).
    fn open_existing(&self, parent: u64, name: &[u8], flags: u32, cred: &Credentials) -> Reply {
        let attr = match self.fs.lookup(parent, name) {
            Ok(a) => a,
            Err(e) => return errno(&e),
        };
        match attr.kind {
            FileKind::Regular => {}
            FileKind::Directory => return Reply::Error(libc::EISDIR),
            // A FIFO, device or symlink in the way: what O_CREAT over it would meet is not
            // a file this request can open here.
            _ => return Reply::Error(libc::EEXIST),
        }
        check!(self.fs.may_access(attr.ino, cred, open_mask(flags)));
        let f = flags as i32;
        if f & libc::O_TRUNC != 0 && f & libc::O_ACCMODE != libc::O_RDONLY {
            if let Err(e) = self.fs.truncate(attr.ino, 0) {
                return errno(&e);
            }
        }
        let attr = match self.fs.open(attr.ino) {
            Ok(a) => a,
            Err(e) => return errno(&e),
        };
        self.created(parent, name, &attr, u64::from(attr.generation), flags)
    }

    fn rename(
        &self,
        parent: u64,
        flags: u32,
        names: (&[u8], u64, &[u8]),
        cred: &Credentials,
    ) -> Reply {
        if flags & RENAME_WHITEOUT != 0 {
            return Reply::Error(libc::EINVAL);
        }
        let (name, newdir, newname) = names;
        let exchange = flags & RENAME_EXCHANGE != 0;
        check!(self
            .fs
            .may_rename((parent, name), (newdir, newname), exchange, cred));
        // The kernel moves its entry under the new name with the time it had to live.
        self.fs.kernel_moves_name_into(newdir);
        if exchange {
            self.fs.kernel_moves_name_into(parent);
        }
        empty(self.fs.rename(
            parent,
            name,
            newdir,
            newname,
            flags & RENAME_NOREPLACE != 0,
            exchange,
        ))
    }

    /// setxattr of `system.posix_acl_*`: the kernel checked ownership and the format; the
    /// file system checks them again and keeps the mode in step. A caller outside the
    /// file's group loses the setgid bit, as with the kernel's `posix_acl_update_mode`.
    fn set_acl(
        &self,
        ino: u64,
        kind: AclKind,
        value: &[u8],
        flags: (bool, bool),
        cred: &Credentials,
    ) -> Reply {
        if !self.acls.load(Ordering::Relaxed) {
            return Reply::Error(libc::EOPNOTSUPP);
        }
        let attr = check!(self.fs.getattr(ino));
        let drop_setgid = !cred.is_root() && !cred.in_group(attr.gid);
        empty(self.fs.set_acl(ino, kind, value, flags, drop_setgid))
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
        let writeback = if self.private {
            init_flags::WRITEBACK_CACHE
        } else {
            0
        };
        // On one node the kernel's own lock tables are the whole truth, and faster.
        let locks = if self.shared {
            init_flags::POSIX_LOCKS | init_flags::FLOCK_LOCKS
        } else {
            0
        };
        InitParams {
            flags: init_flags::ASYNC_READ
                | init_flags::PARALLEL_DIROPS
                | init_flags::ASYNC_DIO
                | init_flags::BIG_WRITES
                | init_flags::MAX_PAGES
                | init_flags::ATOMIC_O_TRUNC
                | init_flags::DIRECT_IO_ALLOW_MMAP
                | init_flags::POSIX_ACL
                | locks
                | init_flags::DONT_MASK,
            without_direct_mmap: writeback,
            max_write: MAX_REQUEST_BYTES,
            max_readahead: MAX_REQUEST_BYTES,
            max_background: 64,
            congestion_threshold: 48,
        }
    }

    fn interrupt(&self, unique: u64) {
        let mut waiting = self.waiting.lock();
        if waiting.len() >= EARLY_INTERRUPTS_MAX && !waiting.contains_key(&unique) {
            // Interrupts of requests that finished before them: no use to anyone.
            waiting.retain(|_, w| w.registered);
        }
        waiting.entry(unique).or_default().interrupted = true;
    }

    fn initialized(&self, granted: u64, kernel_minor: u32) {
        let epochs = kernel_minor >= crate::kernel::abi::INC_EPOCH_MINOR;
        self.epochs.store(epochs, Ordering::Relaxed);
        if !epochs {
            tracing::info!(
                "FUSE: kernel protocol 7.{kernel_minor} has no FUSE_NOTIFY_INC_EPOCH; names in \
                 directories other nodes serve are not cached by the kernel"
            );
        }
        let acls = granted & init_flags::POSIX_ACL != 0;
        self.acls.store(acls, Ordering::Relaxed);
        if !acls {
            tracing::warn!("FUSE: kernel without POSIX_ACL; setting POSIX ACLs is refused");
        }
        let streaming = granted & init_flags::DIRECT_IO_ALLOW_MMAP != 0;
        self.streaming.store(streaming, Ordering::Relaxed);
        let gathers = self.private && granted & init_flags::WRITEBACK_CACHE == 0;
        self.gathers.store(gathers, Ordering::Relaxed);
        self.fs.set_write_behind(gathers);
        // On a cluster's node writable opens are direct anyway (`writes_shared`): the
        // daemon gathers the small writes of the files its own metanode serves while no
        // other node holds anything of them.
        self.fs.set_write_behind_owned(self.shared);
        if self.private && !gathers {
            tracing::info!(
                "FUSE: kernel without DIRECT_IO_ALLOW_MMAP; writes are gathered in the kernel's \
                 writeback cache"
            );
        }
        if !streaming {
            tracing::info!(
                "FUSE: kernel without DIRECT_IO_ALLOW_MMAP; large files are read through the page cache"
            );
        }
    }

    fn destroy(&self) {
        if let Err(e) = self.fs.sync() {
            tracing::error!("final sync: {e}");
        }
    }

    fn handle(&self, req: &Request<'_>) -> Reply {
        match self.handle_op(req) {
            Reply::Error(libc::ENOENT) if names_its_inode(&req.op) => Reply::Error(libc::ESTALE),
            reply => reply,
        }
    }
}

/// Whether `op` acts on the inode the kernel names by its node id, not on a name in it: such
/// an inode that no longer exists was removed on another node (this kernel removes nothing
/// it still reaches by a name) after this kernel looked it up, so the answer is ESTALE, as
/// NFS gives for a removed file's handle, and the VFS walks the path again, looking every
/// name up afresh, once (`retry_estale`). ENOENT would fail an `open` or `stat` of a name
/// that another node had just replaced by a rename, though the name never ceased to exist.
fn names_its_inode(op: &Op<'_>) -> bool {
    matches!(
        op,
        Op::Getattr
            | Op::Setattr(_)
            | Op::Readlink
            | Op::Open { .. }
            | Op::Opendir
            | Op::Access { .. }
            | Op::Setxattr { .. }
            | Op::Getxattr { .. }
            | Op::Listxattr { .. }
            | Op::Removexattr { .. }
    )
}

impl TesseraFuse {
    fn handle_op(&self, req: &Request<'_>) -> Reply {
        let ino = req.header.nodeid;
        let cred = credentials(req);
        // A node cut off from the cluster answers nothing from the metadata it owned:
        // another node may own and change it by now. Closes still go through (they only
        // count down opens here).
        if !matches!(
            req.op,
            Op::Release { .. } | Op::Releasedir { .. } | Op::Flush { .. }
        ) {
            if let Err(e) = self.fs.may_serve() {
                return errno(&e);
            }
        }
        match req.op {
            Op::Lookup { name } => self.lookup(ino, name, &cred),
            Op::Getattr => match self.fs.getattr_allocated(ino) {
                Ok((a, bytes)) => Reply::Attr {
                    ttl: Self::getattr_ttl(self, a.ino),
                    attr: file_attr(&a, bytes),
                },
                Err(e) => errno(&e),
            },
            Op::Setattr(ref s) => self.setattr(ino, s, &cred),
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
                Some(kind) => self.make_node(req, name, (kind, mode, umask, rdev), None),
                None => Reply::Error(libc::EINVAL),
            },
            Op::Mkdir { mode, umask, name } => {
                self.make_node(req, name, (FileKind::Directory, mode, umask, 0), None)
            }
            Op::Symlink { name, target } => {
                self.make_node(req, name, (FileKind::Symlink, 0o777, 0, 0), Some(target))
            }
            Op::Unlink { name } => {
                check!(self.fs.may_remove(ino, name, &cred));
                empty(self.fs.remove(ino, name, false))
            }
            Op::Rmdir { name } => {
                check!(self.fs.may_remove(ino, name, &cred));
                empty(self.fs.remove(ino, name, true))
            }
            Op::Rename {
                newdir,
                flags,
                name,
                newname,
            } => self.rename(ino, flags, (name, newdir, newname), &cred),
            Op::Link { oldnodeid, newname } => {
                check!(self.fs.may_link(oldnodeid, ino, &cred));
                self.entry(ino, newname, self.fs.link(oldnodeid, ino, newname))
            }
            Op::Open { flags } => {
                check!(self.fs.may_access(ino, &cred, open_mask(flags)));
                self.open(ino, flags)
            }
            // Directories need no state of ours between opendir and releasedir.
            Op::Opendir => {
                check!(self.fs.may_access(ino, &cred, MAY_READ));
                Reply::Open {
                    fh: 0,
                    open_flags: 0,
                }
            }
            // chdir(2) asks for search, access(2) for its mask; 0 asks only for existence.
            Op::Access { mask } => empty(self.fs.may_access(ino, &cred, mask)),
            Op::Releasedir => Reply::Empty,
            Op::Read { offset, size } => match self.fs.read_data(ino, offset, size) {
                Ok(d) => Reply::File(d),
                Err(e) => errno(&e),
            },
            Op::Write {
                fh,
                offset: _,
                append: true,
                data,
            } if self.shared => match self.fs.append(ino, data, fh & FH_SYNC != 0) {
                Ok(_) => Reply::Write {
                    size: data.len() as u32,
                },
                Err(e) => errno(&e),
            },
            Op::Write {
                fh, offset, data, ..
            } => match self.fs.write(ino, offset, data, fh & FH_SYNC != 0) {
                Ok(n) => Reply::Write { size: n as u32 },
                Err(e) => errno(&e),
            },
            // A close drops the closing process's record locks, which live at the owner
            // when the file system is shared.
            Op::Flush { lock_owner } if self.shared => {
                let gathered = self.fs.flush_gathered(ino);
                let holder = self.fs.lock_holder(lock_owner, LockClass::Posix);
                let r = self.fs.unlock_all(ino, holder);
                if r.is_ok() {
                    self.flushed(ino, lock_owner);
                }
                empty(r.and(gathered))
            }
            // close(2) does not promise durability (fsync does) and locks are the kernel's,
            // so there is nothing to do; ENOSYS tells the kernel to stop sending FLUSH at
            // all, which saves a round trip on every close.
            // Gathered writes land at close, which reports their failure.
            Op::Flush { .. } if self.gathers.load(Ordering::Relaxed) => {
                empty(self.fs.flush_gathered(ino))
            }
            Op::Flush { .. } => Reply::Error(libc::ENOSYS),
            Op::Release { fh, flock_owner } => {
                if let Some(owner) = flock_owner.filter(|_| self.shared) {
                    let holder = self.fs.lock_holder(owner, LockClass::Flock);
                    if let Err(e) = self.fs.unlock_all(ino, holder) {
                        tracing::warn!("inode {ino}: dropping flock locks at close: {e}");
                    }
                }
                for owner in self.released(ino, fh) {
                    let holder = self.fs.lock_holder(owner, LockClass::Posix);
                    if let Err(e) = self.fs.unlock_all(ino, holder) {
                        tracing::warn!("inode {ino}: dropping open file locks at close: {e}");
                    }
                }
                empty(self.fs.release(ino))
            }
            Op::Lock {
                fh,
                owner,
                lock,
                flock,
                test,
                sleep,
            } => self.lock(req, fh, owner, lock, (flock, test, sleep)),
            Op::Fsync | Op::Fsyncdir => empty(self.fs.fsync(ino)),
            Op::Readdir { offset, size } => self.readdir(ino, offset, size),
            Op::Statfs => self.statfs(),
            Op::Setxattr { name, value, flags } => {
                check!(self.fs.may_xattr(ino, &cred, name, true));
                let create = flags as i32 & libc::XATTR_CREATE != 0;
                let replace = flags as i32 & libc::XATTR_REPLACE != 0;
                match posix_acl::acl_xattr(name) {
                    Some(kind) => self.set_acl(ino, kind, value, (create, replace), &cred),
                    None => empty(self.fs.setxattr(ino, name, value, create, replace)),
                }
            }
            Op::Getxattr { name, size } => {
                check!(self.fs.may_xattr(ino, &cred, name, false));
                match self.fs.getxattr(ino, name) {
                    Ok(v) => xattr(v, size),
                    Err(e) => errno(&e),
                }
            }
            Op::Listxattr { size } => match self.fs.listxattr(ino) {
                Ok(v) => xattr(access::visible_xattr_names(v, &cred), size),
                Err(e) => errno(&e),
            },
            Op::Removexattr { name } => {
                check!(self.fs.may_xattr(ino, &cred, name, true));
                empty(self.fs.removexattr(ino, name))
            }
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
            | Op::Interrupt { .. }
            | Op::Unsupported(_) => Reply::Error(libc::ENOSYS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_needs_its_access_mode_and_more() {
        assert_eq!(open_mask(libc::O_RDONLY as u32), MAY_READ);
        assert_eq!(open_mask(libc::O_WRONLY as u32), MAY_WRITE);
        assert_eq!(open_mask(libc::O_RDWR as u32), MAY_READ | MAY_WRITE);
        assert_eq!(
            open_mask((libc::O_RDONLY | libc::O_TRUNC) as u32),
            MAY_READ | MAY_WRITE
        );
        assert_eq!(open_mask(libc::O_RDONLY as u32 | OPEN_FLAG_EXEC), MAY_EXEC);
        assert_eq!(OPEN_FLAG_EXEC & (libc::O_ACCMODE | libc::O_CREAT) as u32, 0);
    }

    #[test]
    fn setattr_requests_as_permission_questions() {
        let touch = SetattrIn {
            valid: fattr::ATIME | fattr::ATIME_NOW | fattr::MTIME | fattr::CTIME,
            ..SetattrIn::default()
        };
        let c = attr_change(&touch);
        assert_eq!(c.atime, Some(TimeChange::Now));
        assert_eq!(c.mtime, Some(TimeChange::Explicit(Timestamp::default())));
        assert!(c.ctime.is_some() && !c.size && !c.open_for_write && c.mode.is_none());
        let ftruncate = SetattrIn {
            valid: fattr::SIZE | fattr::FH,
            ..SetattrIn::default()
        };
        let c = attr_change(&ftruncate);
        assert!(c.size && c.open_for_write && c.atime.is_none());
        let chown = SetattrIn {
            valid: fattr::UID | fattr::GID | fattr::MODE,
            uid: 5,
            gid: 6,
            mode: 0o755,
            ..SetattrIn::default()
        };
        let c = attr_change(&chown);
        assert_eq!((c.uid, c.gid, c.mode), (Some(5), Some(6), Some(0o755)));
    }
}
