//! The parts of the kernel's FUSE protocol (`include/uapi/linux/fuse.h`, 7.4x) that Tessera
//! speaks. FUSE messages are in host byte order, so every field is read and written with
//! `from_ne_bytes`/`to_ne_bytes`: this is a wire format between two sides of one machine, not an
//! on-disk format.
//!
//! Only the structs we use are described, as field readers (requests) and encoders (replies);
//! the sizes the kernel checks are pinned by `const` assertions and unit tests.

/// Protocol major version; the kernel refuses any other.
pub(crate) const KERNEL_VERSION: u32 = 7;
/// Newest minor version we understand. 7.42 added FUSE-over-io_uring.
pub(crate) const KERNEL_MINOR_VERSION: u32 = 42;

/// Opcodes (`enum fuse_opcode`).
pub(crate) mod opcode {
    pub(crate) const LOOKUP: u32 = 1;
    pub(crate) const FORGET: u32 = 2;
    pub(crate) const GETATTR: u32 = 3;
    pub(crate) const SETATTR: u32 = 4;
    pub(crate) const READLINK: u32 = 5;
    pub(crate) const SYMLINK: u32 = 6;
    pub(crate) const MKNOD: u32 = 8;
    pub(crate) const MKDIR: u32 = 9;
    pub(crate) const UNLINK: u32 = 10;
    pub(crate) const RMDIR: u32 = 11;
    pub(crate) const RENAME: u32 = 12;
    pub(crate) const LINK: u32 = 13;
    pub(crate) const OPEN: u32 = 14;
    pub(crate) const READ: u32 = 15;
    pub(crate) const WRITE: u32 = 16;
    pub(crate) const STATFS: u32 = 17;
    pub(crate) const RELEASE: u32 = 18;
    pub(crate) const FSYNC: u32 = 20;
    pub(crate) const SETXATTR: u32 = 21;
    pub(crate) const GETXATTR: u32 = 22;
    pub(crate) const LISTXATTR: u32 = 23;
    pub(crate) const REMOVEXATTR: u32 = 24;
    pub(crate) const FLUSH: u32 = 25;
    pub(crate) const INIT: u32 = 26;
    pub(crate) const OPENDIR: u32 = 27;
    pub(crate) const READDIR: u32 = 28;
    pub(crate) const RELEASEDIR: u32 = 29;
    pub(crate) const FSYNCDIR: u32 = 30;
    pub(crate) const GETLK: u32 = 31;
    pub(crate) const SETLK: u32 = 32;
    pub(crate) const SETLKW: u32 = 33;
    pub(crate) const ACCESS: u32 = 34;
    pub(crate) const CREATE: u32 = 35;
    pub(crate) const INTERRUPT: u32 = 36;
    pub(crate) const DESTROY: u32 = 38;
    pub(crate) const BATCH_FORGET: u32 = 42;
    pub(crate) const FALLOCATE: u32 = 43;
    pub(crate) const READDIRPLUS: u32 = 44;
    pub(crate) const RENAME2: u32 = 45;
}

/// INIT flags (`FUSE_*`), as one 64-bit set: bits 32..63 travel in `flags2` when
/// `INIT_EXT` is set.
pub(crate) mod init_flags {
    pub(crate) const ASYNC_READ: u64 = 1 << 0;
    pub(crate) const POSIX_LOCKS: u64 = 1 << 1;
    pub(crate) const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub(crate) const FLOCK_LOCKS: u64 = 1 << 10;
    pub(crate) const BIG_WRITES: u64 = 1 << 5;
    /// The kernel leaves the umask to us (create requests carry it).
    pub(crate) const DONT_MASK: u64 = 1 << 6;
    pub(crate) const ASYNC_DIO: u64 = 1 << 15;
    pub(crate) const WRITEBACK_CACHE: u64 = 1 << 16;
    pub(crate) const PARALLEL_DIROPS: u64 = 1 << 18;
    /// The kernel checks POSIX ACLs (read with GETXATTR) and implies `default_permissions`.
    pub(crate) const POSIX_ACL: u64 = 1 << 20;
    pub(crate) const MAX_PAGES: u64 = 1 << 22;
    pub(crate) const INIT_EXT: u64 = 1 << 30;
    /// Files opened with `FOPEN_DIRECT_IO` may still be mmapped (through the page cache).
    pub(crate) const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub(crate) const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_open_out.open_flags`.
pub(crate) const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub(crate) const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// No `FUSE_FLUSH` at this open file's closes.
pub(crate) const FOPEN_NOFLUSH: u32 = 1 << 5;

/// `fuse_setattr_in.valid` bits.
pub(crate) mod fattr {
    pub(crate) const MODE: u32 = 1 << 0;
    pub(crate) const UID: u32 = 1 << 1;
    pub(crate) const GID: u32 = 1 << 2;
    pub(crate) const SIZE: u32 = 1 << 3;
    pub(crate) const ATIME: u32 = 1 << 4;
    pub(crate) const MTIME: u32 = 1 << 5;
    /// The request names an open file handle (`fh`).
    pub(crate) const FH: u32 = 1 << 6;
    pub(crate) const ATIME_NOW: u32 = 1 << 7;
    pub(crate) const MTIME_NOW: u32 = 1 << 8;
    pub(crate) const CTIME: u32 = 1 << 10;
}

/// `FUSE_NOTIFY_INVAL_INODE`: the `error` field of a notification that drops an inode's
/// cached attributes and pages.
pub(crate) const NOTIFY_INVAL_INODE: i32 = 2;
/// `struct fuse_notify_inval_inode_out`: ino, off, len.
pub(crate) const NOTIFY_INVAL_INODE_OUT_BYTES: usize = 24;
/// `FUSE_NOTIFY_INC_EPOCH` (protocol 7.44, Linux 6.16): the `error` field of a
/// notification, with no body, that makes every cached name older than it invalid
/// (`fuse_dentry_revalidate` compares the name's epoch, taken when its lookup began, with
/// the connection's), without taking any lock.
pub(crate) const NOTIFY_INC_EPOCH: i32 = 8;
/// The protocol minor from which the kernel knows [`NOTIFY_INC_EPOCH`].
pub(crate) const INC_EPOCH_MINOR: u32 = 44;
/// `FUSE_NOTIFY_INVAL_ENTRY`: the `error` field of a notification that drops a cached name.
pub(crate) const NOTIFY_INVAL_ENTRY: i32 = 3;
/// `struct fuse_notify_inval_entry_out`: parent, namelen, flags.
pub(crate) const NOTIFY_INVAL_ENTRY_OUT_BYTES: usize = 16;

/// `FUSE_LK_FLOCK` in `fuse_lk_in.lk_flags`: an flock(2) lock, not a record lock.
pub(crate) const LK_FLOCK: u32 = 1 << 0;
/// `FUSE_RELEASE_FLOCK_UNLOCK` in `fuse_release_in.release_flags`.
pub(crate) const RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// Bytes of `struct fuse_lk_out`.
#[cfg(test)]
pub(crate) const LK_OUT_BYTES: usize = 24;

/// `struct fuse_file_lock`: bytes `start..=end`, `typ` F_RDLCK, F_WRLCK or F_UNLCK.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileLock {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) typ: u32,
    pub(crate) pid: u32,
}

/// `struct fuse_in_header`.
pub(crate) const IN_HEADER_BYTES: usize = 40;
/// `struct fuse_out_header`.
pub(crate) const OUT_HEADER_BYTES: usize = 16;
/// `struct fuse_attr`.
pub(crate) const ATTR_BYTES: usize = 88;
/// `struct fuse_entry_out`.
pub(crate) const ENTRY_OUT_BYTES: usize = 40 + ATTR_BYTES;
/// `struct fuse_attr_out`.
pub(crate) const ATTR_OUT_BYTES: usize = 16 + ATTR_BYTES;
/// `struct fuse_open_out`.
#[cfg(test)]
pub(crate) const OPEN_OUT_BYTES: usize = 16;
/// `struct fuse_kstatfs` inside `fuse_statfs_out`.
#[cfg(test)]
pub(crate) const STATFS_OUT_BYTES: usize = 80;
/// `struct fuse_init_out` for minor >= 23.
pub(crate) const INIT_OUT_BYTES: usize = 64;
/// `struct fuse_dirent` without its name.
pub(crate) const DIRENT_BYTES: usize = 24;

const _: () = assert!(ENTRY_OUT_BYTES == 128);
const _: () = assert!(ATTR_OUT_BYTES == 104);

/// Size of the fixed per-opcode struct the kernel sends first (`in_args[0]`). Over
/// /dev/fuse it is followed directly by the variable arguments (names, data); over io_uring
/// it arrives in the `op_in` area and the rest in the payload buffer, so parsing splits a
/// /dev/fuse body at this size to see both transports the same way. Opcodes whose first
/// argument is a name have a zero-sized header (the kernel's `fuse_set_zero_arg0`). Sizes
/// are those of protocol 7.12+ without `FUSE_SETXATTR_EXT`, which we never ask for.
pub(crate) fn op_header_bytes(op: u32) -> usize {
    use opcode::*;
    match op {
        FORGET | MKDIR | RENAME | LINK | OPEN | OPENDIR | SETXATTR | GETXATTR | LISTXATTR
        | ACCESS | INTERRUPT | BATCH_FORGET => 8,
        GETATTR | MKNOD | FSYNC | FSYNCDIR | CREATE | RENAME2 => 16,
        RELEASE | RELEASEDIR | FLUSH => 24,
        FALLOCATE => 32,
        GETLK | SETLK | SETLKW => 48,
        READ | WRITE | READDIR | READDIRPLUS => 40,
        INIT => 64,
        SETATTR => 88,
        _ => 0,
    }
}

/// `struct fuse_in_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InHeader {
    pub(crate) len: u32,
    pub(crate) opcode: u32,
    pub(crate) unique: u64,
    pub(crate) nodeid: u64,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) pid: u32,
}

impl InHeader {
    /// Reads the header from the start of `b`; `None` if `b` is too short.
    pub(crate) fn parse(b: &[u8]) -> Option<InHeader> {
        let mut r = Reader::new(b.get(..IN_HEADER_BYTES)?);
        Some(InHeader {
            len: r.u32()?,
            opcode: r.u32()?,
            unique: r.u64()?,
            nodeid: r.u64()?,
            uid: r.u32()?,
            gid: r.u32()?,
            pid: r.u32()?,
        })
    }

    #[cfg(test)]
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        put32(out, self.len);
        put32(out, self.opcode);
        put64(out, self.unique);
        put64(out, self.nodeid);
        put32(out, self.uid);
        put32(out, self.gid);
        put32(out, self.pid);
        put32(out, 0);
    }
}

/// Writes `struct fuse_out_header` for a reply with a `body_bytes` body.
pub(crate) fn out_header(unique: u64, error: i32, body_bytes: usize) -> [u8; OUT_HEADER_BYTES] {
    let len = u32::try_from(OUT_HEADER_BYTES + body_bytes).expect("reply larger than 4 GiB");
    let mut h = [0u8; OUT_HEADER_BYTES];
    h[0..4].copy_from_slice(&len.to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// A bounds-checked reader of host-order integers; every read past the end yields `None`.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.buf.len() < n {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.bytes(4)?.try_into().ok()?))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.bytes(8)?.try_into().ok()?))
    }

    /// A NUL-terminated string, without its NUL; `None` if no NUL is left.
    pub(crate) fn cstr(&mut self) -> Option<&'a [u8]> {
        let end = self.buf.iter().position(|&c| c == 0)?;
        let s = &self.buf[..end];
        self.buf = &self.buf[end + 1..];
        Some(s)
    }

    #[cfg(test)]
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
}

pub(crate) fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_ne_bytes());
}

pub(crate) fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_ne_bytes());
}

pub(crate) fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_ne_bytes());
}

/// `struct fuse_attr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FuseAttr {
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) blocks: u64,
    /// (seconds, nanoseconds) since the epoch; seconds are two's complement.
    pub(crate) atime: (i64, u32),
    pub(crate) mtime: (i64, u32),
    pub(crate) ctime: (i64, u32),
    /// File type bits and permissions, as in `st_mode`.
    pub(crate) mode: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) rdev: u32,
    pub(crate) blksize: u32,
}

impl FuseAttr {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put64(out, self.ino);
        put64(out, self.size);
        put64(out, self.blocks);
        put64(out, self.atime.0 as u64);
        put64(out, self.mtime.0 as u64);
        put64(out, self.ctime.0 as u64);
        put32(out, self.atime.1);
        put32(out, self.mtime.1);
        put32(out, self.ctime.1);
        put32(out, self.mode);
        put32(out, self.nlink);
        put32(out, self.uid);
        put32(out, self.gid);
        put32(out, self.rdev);
        put32(out, self.blksize);
        put32(out, 0); // flags
        debug_assert_eq!(out.len() - start, ATTR_BYTES);
    }
}

/// A cache lifetime as the kernel wants it: whole seconds and nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ttl {
    pub(crate) secs: u64,
    pub(crate) nsecs: u32,
}

impl Ttl {
    pub(crate) fn from_duration(d: std::time::Duration) -> Ttl {
        Ttl {
            secs: d.as_secs(),
            nsecs: d.subsec_nanos(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_header_round_trip_and_short_input() {
        let h = InHeader {
            len: 48,
            opcode: opcode::LOOKUP,
            unique: 7,
            nodeid: 1,
            uid: 2,
            gid: 3,
            pid: 4,
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        assert_eq!(b.len(), IN_HEADER_BYTES);
        assert_eq!(InHeader::parse(&b), Some(h));
        assert_eq!(InHeader::parse(&b[..IN_HEADER_BYTES - 1]), None);
    }

    #[test]
    fn reader_stops_at_end() {
        let mut r = Reader::new(b"ab\0c");
        assert_eq!(r.cstr(), Some(&b"ab"[..]));
        assert_eq!(r.cstr(), None);
        assert_eq!(r.u32(), None);
        assert_eq!(r.rest(), b"c");
        assert_eq!(r.u64(), None);
    }

    #[test]
    fn attr_is_88_bytes() {
        let mut b = Vec::new();
        FuseAttr::default().encode(&mut b);
        assert_eq!(b.len(), ATTR_BYTES);
    }

    #[test]
    fn out_header_layout() {
        let h = out_header(0x0102_0304_0506_0708, -2, 8);
        assert_eq!(u32::from_ne_bytes(h[0..4].try_into().unwrap()), 24);
        assert_eq!(i32::from_ne_bytes(h[4..8].try_into().unwrap()), -2);
        assert_eq!(
            u64::from_ne_bytes(h[8..16].try_into().unwrap()),
            0x0102_0304_0506_0708
        );
    }
}
