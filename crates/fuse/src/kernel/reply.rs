//! Replies to kernel requests, and their encoding into the bytes after `fuse_out_header`.

use super::abi::{self, put16, put32, put64, FuseAttr, Ttl};

/// `fuse_entry_out`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EntryOut {
    pub(crate) nodeid: u64,
    pub(crate) generation: u64,
    /// How long the kernel may use the name without asking us again (LOOKUP).
    pub(crate) entry_ttl: Ttl,
    /// How long it may use the attributes.
    pub(crate) attr_ttl: Ttl,
    pub(crate) attr: FuseAttr,
}

/// `fuse_kstatfs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StatfsOut {
    pub(crate) blocks: u64,
    pub(crate) bfree: u64,
    pub(crate) bavail: u64,
    pub(crate) files: u64,
    pub(crate) ffree: u64,
    pub(crate) bsize: u32,
    pub(crate) namelen: u32,
    pub(crate) frsize: u32,
}

/// `fuse_init_out`, the fields we set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct InitOut {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) max_readahead: u32,
    pub(crate) flags: u64,
    pub(crate) max_background: u16,
    pub(crate) congestion_threshold: u16,
    pub(crate) max_write: u32,
    pub(crate) time_gran: u32,
    pub(crate) max_pages: u16,
}

/// The answer to one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A positive errno.
    Error(i32),
    /// Success without a body.
    Empty,
    Entry(EntryOut),
    Attr {
        ttl: Ttl,
        attr: FuseAttr,
    },
    Open {
        fh: u64,
        open_flags: u32,
    },
    Create {
        entry: EntryOut,
        fh: u64,
        open_flags: u32,
    },
    Write {
        size: u32,
    },
    /// Raw bytes: file data, a symlink target, xattr values, directory entries.
    Data(Vec<u8>),
    /// File data in pieces, some shared with the file system's read-ahead: the classic
    /// transport writes them to the kernel without gathering them first.
    File(tessera_fs::FileData),
    Statfs(StatfsOut),
    /// `fuse_getxattr_out`: the size a getxattr/listxattr probe asked for.
    XattrSize(u32),
    Init(InitOut),
    /// `fuse_lk_out`: the lock that conflicts (type F_UNLCK when none does).
    Lock(super::abi::FileLock),
}

impl Reply {
    /// The `error` field of the out header (zero or a negative errno) and the body, encoded
    /// into `scratch` unless the reply already holds its bytes.
    pub(crate) fn encode<'a>(&'a self, scratch: &'a mut Vec<u8>) -> (i32, &'a [u8]) {
        scratch.clear();
        match self {
            Reply::Error(e) => {
                // An errno is positive; anything else is our bug, which the kernel must
                // still see as a failure rather than as success.
                debug_assert!(*e > 0, "errno must be positive, got {e}");
                return (if *e > 0 { -e } else { -libc::EIO }, &[]);
            }
            Reply::Data(d) => return (0, d),
            Reply::File(d) => {
                scratch.reserve(d.len());
                for piece in d.slices() {
                    scratch.extend_from_slice(piece);
                }
            }
            Reply::Empty => {}
            Reply::Entry(e) => encode_entry(scratch, e),
            Reply::Attr { ttl, attr } => {
                put64(scratch, ttl.secs);
                put32(scratch, ttl.nsecs);
                put32(scratch, 0);
                attr.encode(scratch);
            }
            Reply::Open { fh, open_flags } => encode_open(scratch, *fh, *open_flags),
            Reply::Create {
                entry,
                fh,
                open_flags,
            } => {
                encode_entry(scratch, entry);
                encode_open(scratch, *fh, *open_flags);
            }
            Reply::Lock(l) => {
                scratch.extend_from_slice(&l.start.to_le_bytes());
                scratch.extend_from_slice(&l.end.to_le_bytes());
                put32(scratch, l.typ);
                put32(scratch, l.pid);
            }
            Reply::Write { size } | Reply::XattrSize(size) => {
                put32(scratch, *size);
                put32(scratch, 0);
            }
            Reply::Statfs(s) => encode_statfs(scratch, s),
            Reply::Init(i) => encode_init(scratch, i),
        }
        (0, scratch)
    }
}

fn encode_entry(out: &mut Vec<u8>, e: &EntryOut) {
    put64(out, e.nodeid);
    put64(out, e.generation);
    put64(out, e.entry_ttl.secs); // entry_valid
    put64(out, e.attr_ttl.secs); // attr_valid
    put32(out, e.entry_ttl.nsecs);
    put32(out, e.attr_ttl.nsecs);
    e.attr.encode(out);
}

fn encode_open(out: &mut Vec<u8>, fh: u64, open_flags: u32) {
    put64(out, fh);
    put32(out, open_flags);
    put32(out, 0); // backing_id
}

fn encode_statfs(out: &mut Vec<u8>, s: &StatfsOut) {
    for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
        put64(out, v);
    }
    for v in [s.bsize, s.namelen, s.frsize, 0] {
        put32(out, v);
    }
    out.resize(out.len() + 24, 0); // spare[6]
}

fn encode_init(out: &mut Vec<u8>, i: &InitOut) {
    let start = out.len();
    put32(out, i.major);
    put32(out, i.minor);
    put32(out, i.max_readahead);
    put32(out, i.flags as u32);
    put16(out, i.max_background);
    put16(out, i.congestion_threshold);
    put32(out, i.max_write);
    put32(out, i.time_gran);
    put16(out, i.max_pages);
    put16(out, 0); // map_alignment
    put32(out, (i.flags >> 32) as u32);
    put32(out, 0); // max_stack_depth
    put16(out, 0); // request_timeout
    out.resize(start + abi::INIT_OUT_BYTES, 0);
}

/// Directory entries (`fuse_dirent`) packed into at most `size_max` bytes, as READDIR wants.
pub(crate) struct DirBuf {
    buf: Vec<u8>,
    size_max: usize,
}

impl DirBuf {
    pub(crate) fn new(size_max: u32) -> DirBuf {
        let size_max = size_max as usize;
        DirBuf {
            buf: Vec::with_capacity(size_max.min(64 << 10)),
            size_max,
        }
    }

    /// Appends an entry; returns `true`, adding nothing, when it does not fit.
    /// `offset` is the cookie the kernel hands back to continue after this entry.
    pub(crate) fn add(&mut self, ino: u64, offset: u64, dtype: u32, name: &[u8]) -> bool {
        let entry_bytes = (abi::DIRENT_BYTES + name.len()).next_multiple_of(8);
        if self.buf.len() + entry_bytes > self.size_max {
            return true;
        }
        let start = self.buf.len();
        put64(&mut self.buf, ino);
        put64(&mut self.buf, offset);
        put32(&mut self.buf, name.len() as u32);
        put32(&mut self.buf, dtype);
        self.buf.extend_from_slice(name);
        self.buf.resize(start + entry_bytes, 0);
        false
    }

    pub(crate) fn into_reply(self) -> Reply {
        Reply::Data(self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> FuseAttr {
        FuseAttr {
            ino: 5,
            size: 10,
            mode: 0o100644,
            nlink: 1,
            blksize: 1 << 20,
            ..FuseAttr::default()
        }
    }

    #[test]
    fn sizes_match_the_kernel() {
        let mut s = Vec::new();
        let lock = Reply::Lock(abi::FileLock::default());
        assert_eq!(lock.encode(&mut s).1.len(), abi::LK_OUT_BYTES);
        let ttl = Ttl { secs: 60, nsecs: 0 };
        let entry = EntryOut {
            nodeid: 5,
            generation: 1,
            entry_ttl: ttl,
            attr_ttl: ttl,
            attr: attr(),
        };
        assert_eq!(
            Reply::Entry(entry).encode(&mut s).1.len(),
            abi::ENTRY_OUT_BYTES
        );
        let r = Reply::Attr { ttl, attr: attr() };
        assert_eq!(r.encode(&mut s).1.len(), abi::ATTR_OUT_BYTES);
        let r = Reply::Open {
            fh: 1,
            open_flags: abi::FOPEN_KEEP_CACHE,
        };
        assert_eq!(r.encode(&mut s).1.len(), abi::OPEN_OUT_BYTES);
        let r = Reply::Create {
            entry,
            fh: 1,
            open_flags: 0,
        };
        assert_eq!(
            r.encode(&mut s).1.len(),
            abi::ENTRY_OUT_BYTES + abi::OPEN_OUT_BYTES
        );
        let r = Reply::Statfs(StatfsOut::default());
        assert_eq!(r.encode(&mut s).1.len(), abi::STATFS_OUT_BYTES);
        let r = Reply::Init(InitOut::default());
        assert_eq!(r.encode(&mut s).1.len(), abi::INIT_OUT_BYTES);
        assert_eq!(Reply::Write { size: 3 }.encode(&mut s).1.len(), 8);
        assert_eq!(Reply::Empty.encode(&mut s), (0, &[][..]));
    }

    #[test]
    fn entry_fields_in_place() {
        let mut s = Vec::new();
        let e = EntryOut {
            nodeid: 0x11,
            generation: 0x22,
            entry_ttl: Ttl { secs: 0, nsecs: 0 },
            attr_ttl: Ttl { secs: 60, nsecs: 5 },
            attr: attr(),
        };
        let r = Reply::Entry(e);
        let (err, b) = r.encode(&mut s);
        assert_eq!(err, 0);
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(
            (u64_at(0), u64_at(8), u64_at(16), u64_at(24)),
            (0x11, 0x22, 0, 60)
        );
        assert_eq!((u32_at(32), u32_at(36)), (0, 5));
        assert_eq!(u64_at(40), 5); // attr.ino
        assert_eq!(u32_at(40 + 60), 0o100644); // attr.mode
    }

    #[test]
    fn errors_are_negative_and_bodiless() {
        let mut s = Vec::new();
        assert_eq!(
            Reply::Error(libc::ENOENT).encode(&mut s),
            (-libc::ENOENT, &[][..])
        );
    }

    #[test]
    fn init_flags_split_into_flags2() {
        let mut s = Vec::new();
        let i = InitOut {
            major: 7,
            minor: 42,
            flags: abi::init_flags::OVER_IO_URING | abi::init_flags::INIT_EXT,
            max_write: 1 << 20,
            max_pages: 256,
            ..InitOut::default()
        };
        let binding = Reply::Init(i);
        let (_, b) = binding.encode(&mut s);
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(u32_at(12), 1 << 30);
        assert_eq!(u32_at(20), 1 << 20);
        assert_eq!(u16::from_ne_bytes(b[28..30].try_into().unwrap()), 256);
        assert_eq!(u32_at(32), 1 << 9);
    }

    #[test]
    fn dirents_pad_to_8_and_stop_when_full() {
        let mut d = DirBuf::new(64);
        assert!(!d.add(2, 1, 8, b"abc")); // 24 + 3 -> 32
        assert!(!d.add(3, 2, 4, b"")); // 24 -> 24, total 56
        assert!(d.add(4, 3, 8, b"x")); // 32 more does not fit
        let Reply::Data(b) = d.into_reply() else {
            panic!()
        };
        assert_eq!(b.len(), 56);
        assert_eq!(&b[24..27], b"abc");
        assert_eq!(u64::from_ne_bytes(b[32..40].try_into().unwrap()), 3);
    }
}
