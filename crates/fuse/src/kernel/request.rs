//! Kernel requests parsed into a typed [`Request`], bounds-checked throughout: a truncated or
//! malformed request becomes a [`ParseError`], answered with `EINVAL`, never a panic.
//!
//! Both transports hand the parser the same three parts: the `fuse_in_header`, the fixed
//! per-opcode header (`in_args[0]`, see [`abi::op_header_bytes`]) and the payload (names,
//! write data). /dev/fuse delivers them back to back, io_uring in separate buffers.

use super::abi::{self, opcode, InHeader, Reader};

/// `fuse_setattr_in`, the fields we use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SetattrIn {
    pub(crate) valid: u32,
    pub(crate) size: u64,
    pub(crate) atime: (i64, u32),
    pub(crate) mtime: (i64, u32),
    pub(crate) ctime: (i64, u32),
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// `fuse_init_in`, the fields we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InitIn {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) max_readahead: u32,
    /// `flags | flags2 << 32` when the kernel sets `INIT_EXT`, else `flags`.
    pub(crate) flags: u64,
}

/// One kernel request's operation and arguments, borrowing names and data from the
/// transport's buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    Init(InitIn),
    Destroy,
    Forget,
    BatchForget,
    /// The kernel's wish that request `unique` end early (a signal reached its caller).
    Interrupt {
        unique: u64,
    },
    Lookup {
        name: &'a [u8],
    },
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        rdev: u32,
        umask: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        newname: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Opendir,
    Read {
        offset: u64,
        size: u32,
    },
    Write {
        fh: u64,
        offset: u64,
        /// The file is open with O_APPEND (now: fcntl can change it after the open).
        append: bool,
        data: &'a [u8],
    },
    Statfs,
    Release {
        /// The handle the open answered.
        fh: u64,
        /// The open file's `flock` owner when its locks are to be dropped
        /// (`FUSE_RELEASE_FLOCK_UNLOCK`).
        flock_owner: Option<u64>,
    },
    Releasedir,
    Fsync,
    Fsyncdir,
    /// A close of one file descriptor: drops the closing process's record locks.
    Flush {
        lock_owner: u64,
    },
    /// F_GETLK, F_SETLK and F_SETLKW (`sleep`) of a record or, with `flock`, flock lock.
    Lock {
        /// The handle of the open file the lock is asked through.
        fh: u64,
        owner: u64,
        lock: abi::FileLock,
        flock: bool,
        test: bool,
        sleep: bool,
    },
    Setxattr {
        name: &'a [u8],
        value: &'a [u8],
        flags: u32,
    },
    Getxattr {
        name: &'a [u8],
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Readdir {
        offset: u64,
        size: u32,
    },
    Create {
        flags: u32,
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    /// access(2) and chdir(2): `mask` is `R_OK | W_OK | X_OK`, 0 for existence.
    Access {
        mask: u32,
    },
    /// Any opcode we do not implement; answered with ENOSYS.
    Unsupported(u32),
}

impl Op<'_> {
    /// Whether the kernel expects no reply at all.
    pub(crate) fn is_noreply(&self) -> bool {
        matches!(self, Op::Forget | Op::BatchForget | Op::Interrupt { .. })
    }
}

/// A parsed request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request<'a> {
    pub(crate) header: InHeader,
    pub(crate) op: Op<'a>,
}

/// Why a request could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// Not even a `fuse_in_header`: there is no `unique` to answer.
    NoHeader,
    /// The header is valid (answer `unique` with EINVAL) but the arguments are not.
    BadArgs { unique: u64, opcode: u32 },
}

/// Parses a whole /dev/fuse message of `msg.len()` bytes.
pub(crate) fn parse_dev(msg: &[u8]) -> Result<Request<'_>, ParseError> {
    let header = InHeader::parse(msg).ok_or(ParseError::NoHeader)?;
    let bad = ParseError::BadArgs {
        unique: header.unique,
        opcode: header.opcode,
    };
    if header.len as usize != msg.len() {
        return Err(bad);
    }
    let body = &msg[abi::IN_HEADER_BYTES..];
    let split = abi::op_header_bytes(header.opcode).min(body.len());
    let (op_in, payload) = body.split_at(split);
    let op = parse_op(header.opcode, op_in, payload).ok_or(bad)?;
    Ok(Request { header, op })
}

/// Parses a request delivered in an io_uring entry: `in_out` holds the header, `op_in` the
/// per-opcode header, `payload` the rest.
pub(crate) fn parse_parts<'a>(
    in_out: &[u8],
    op_in: &'a [u8],
    payload: &'a [u8],
) -> Result<Request<'a>, ParseError> {
    let header = InHeader::parse(in_out).ok_or(ParseError::NoHeader)?;
    let op = parse_op(header.opcode, op_in, payload).ok_or(ParseError::BadArgs {
        unique: header.unique,
        opcode: header.opcode,
    })?;
    Ok(Request { header, op })
}

/// `None` when the arguments are malformed.
fn parse_op<'a>(op: u32, op_in: &'a [u8], payload: &'a [u8]) -> Option<Op<'a>> {
    let mut h = Reader::new(op_in);
    let mut p = Reader::new(payload);
    Some(match op {
        opcode::INIT => Op::Init(parse_init(&mut h)?),
        opcode::DESTROY => Op::Destroy,
        opcode::FORGET => Op::Forget,
        opcode::BATCH_FORGET => Op::BatchForget,
        opcode::INTERRUPT => Op::Interrupt { unique: h.u64()? },
        opcode::LOOKUP => Op::Lookup { name: p.cstr()? },
        opcode::GETATTR => Op::Getattr,
        opcode::SETATTR => Op::Setattr(parse_setattr(&mut h)?),
        opcode::READLINK => Op::Readlink,
        opcode::SYMLINK => Op::Symlink {
            name: p.cstr()?,
            target: p.cstr()?,
        },
        opcode::MKNOD => Op::Mknod {
            mode: h.u32()?,
            rdev: h.u32()?,
            umask: h.u32()?,
            name: p.cstr()?,
        },
        opcode::MKDIR => Op::Mkdir {
            mode: h.u32()?,
            umask: h.u32()?,
            name: p.cstr()?,
        },
        opcode::UNLINK => Op::Unlink { name: p.cstr()? },
        opcode::RMDIR => Op::Rmdir { name: p.cstr()? },
        opcode::RENAME | opcode::RENAME2 => Op::Rename {
            newdir: h.u64()?,
            flags: if op == opcode::RENAME2 { h.u32()? } else { 0 },
            name: p.cstr()?,
            newname: p.cstr()?,
        },
        opcode::LINK => Op::Link {
            oldnodeid: h.u64()?,
            newname: p.cstr()?,
        },
        opcode::OPEN => Op::Open { flags: h.u32()? },
        opcode::OPENDIR => Op::Opendir,
        opcode::READ => {
            let (_fh, offset, size) = (h.u64()?, h.u64()?, h.u32()?);
            Op::Read { offset, size }
        }
        opcode::WRITE => parse_write(&mut h, &mut p)?,
        opcode::STATFS => Op::Statfs,
        opcode::RELEASE => {
            let (fh, _flags, release_flags, lock_owner) = (h.u64()?, h.u32()?, h.u32()?, h.u64()?);
            Op::Release {
                fh,
                flock_owner: (release_flags & abi::RELEASE_FLOCK_UNLOCK != 0).then_some(lock_owner),
            }
        }
        opcode::RELEASEDIR => Op::Releasedir,
        opcode::FSYNC => Op::Fsync,
        opcode::FSYNCDIR => Op::Fsyncdir,
        opcode::FLUSH => {
            let (_fh, _unused, _padding) = (h.u64()?, h.u32()?, h.u32()?);
            Op::Flush {
                lock_owner: h.u64()?,
            }
        }
        opcode::GETLK | opcode::SETLK | opcode::SETLKW => {
            let (fh, owner) = (h.u64()?, h.u64()?);
            let lock = abi::FileLock {
                start: h.u64()?,
                end: h.u64()?,
                typ: h.u32()?,
                pid: h.u32()?,
            };
            Op::Lock {
                fh,
                owner,
                lock,
                flock: h.u32()? & abi::LK_FLOCK != 0,
                test: op == opcode::GETLK,
                sleep: op == opcode::SETLKW,
            }
        }
        opcode::SETXATTR => {
            let (size, flags) = (h.u32()?, h.u32()?);
            let name = p.cstr()?;
            Op::Setxattr {
                name,
                value: p.bytes(size as usize)?,
                flags,
            }
        }
        opcode::GETXATTR => Op::Getxattr {
            size: h.u32()?,
            name: p.cstr()?,
        },
        opcode::LISTXATTR => Op::Listxattr { size: h.u32()? },
        opcode::REMOVEXATTR => Op::Removexattr { name: p.cstr()? },
        opcode::READDIR => {
            let (_fh, offset, size) = (h.u64()?, h.u64()?, h.u32()?);
            Op::Readdir { offset, size }
        }
        opcode::CREATE => Op::Create {
            flags: h.u32()?,
            mode: h.u32()?,
            umask: h.u32()?,
            name: p.cstr()?,
        },
        opcode::FALLOCATE => {
            let _fh = h.u64()?;
            Op::Fallocate {
                offset: h.u64()?,
                length: h.u64()?,
                mode: h.u32()?,
            }
        }
        opcode::ACCESS => Op::Access { mask: h.u32()? },
        other => Op::Unsupported(other),
    })
}

fn parse_init(h: &mut Reader<'_>) -> Option<InitIn> {
    let major = h.u32()?;
    let minor = h.u32()?;
    let max_readahead = h.u32()?;
    let mut flags = u64::from(h.u32()?);
    // `flags2` follows from 7.36 on; older kernels send only the first 16 bytes.
    if flags & abi::init_flags::INIT_EXT != 0 {
        if let Some(flags2) = h.u32() {
            flags |= u64::from(flags2) << 32;
        }
    }
    Some(InitIn {
        major,
        minor,
        max_readahead,
        flags,
    })
}

fn parse_setattr(h: &mut Reader<'_>) -> Option<SetattrIn> {
    let valid = h.u32()?;
    let _padding = h.u32()?;
    let _fh = h.u64()?;
    let size = h.u64()?;
    let _lock_owner = h.u64()?;
    let (atime, mtime, ctime) = (h.u64()?, h.u64()?, h.u64()?);
    let (atimensec, mtimensec, ctimensec) = (h.u32()?, h.u32()?, h.u32()?);
    let mode = h.u32()?;
    let _unused4 = h.u32()?;
    let uid = h.u32()?;
    let gid = h.u32()?;
    Some(SetattrIn {
        valid,
        size,
        atime: (atime as i64, atimensec),
        mtime: (mtime as i64, mtimensec),
        ctime: (ctime as i64, ctimensec),
        mode,
        uid,
        gid,
    })
}

fn parse_write<'a>(h: &mut Reader<'a>, p: &mut Reader<'a>) -> Option<Op<'a>> {
    let fh = h.u64()?;
    let offset = h.u64()?;
    let size = h.u32()?;
    let (_write_flags, _lock_owner, flags) = (h.u32()?, h.u64()?, h.u32()?);
    Some(Op::Write {
        fh,
        offset,
        append: flags as i32 & libc::O_APPEND != 0,
        data: p.bytes(size as usize)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32, body_bytes: usize) -> Vec<u8> {
        let mut b = Vec::new();
        InHeader {
            len: (abi::IN_HEADER_BYTES + body_bytes) as u32,
            opcode,
            unique: 99,
            nodeid: 5,
            uid: 1000,
            gid: 100,
            pid: 42,
        }
        .encode(&mut b);
        b
    }

    fn msg(opcode: u32, body: &[u8]) -> Vec<u8> {
        let mut b = header(opcode, body.len());
        b.extend_from_slice(body);
        b
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn lookup_and_unlink_names() {
        let m = msg(opcode::LOOKUP, b"file.1\0");
        let r = parse_dev(&m).unwrap();
        assert_eq!(r.header.unique, 99);
        assert_eq!(r.header.nodeid, 5);
        assert_eq!(r.op, Op::Lookup { name: b"file.1" });
        let m = msg(opcode::UNLINK, b"x\0");
        assert_eq!(parse_dev(&m).unwrap().op, Op::Unlink { name: b"x" });
    }

    #[test]
    fn create_splits_header_and_name() {
        let mut body = u32s(&[0o101, 0o100644, 0o022, 0]);
        body.extend_from_slice(b"new\0");
        let m = msg(opcode::CREATE, &body);
        assert_eq!(
            parse_dev(&m).unwrap().op,
            Op::Create {
                flags: 0o101,
                mode: 0o100644,
                umask: 0o022,
                name: b"new"
            }
        );
    }

    #[test]
    fn write_data_over_both_transports() {
        let mut hdr = Vec::new();
        hdr.extend_from_slice(&7u64.to_ne_bytes()); // fh
        hdr.extend_from_slice(&4096u64.to_ne_bytes()); // offset
        hdr.extend_from_slice(&u32s(&[5, 0]));
        hdr.extend_from_slice(&0u64.to_ne_bytes());
        hdr.extend_from_slice(&u32s(&[libc::O_WRONLY as u32 | libc::O_APPEND as u32, 0]));
        assert_eq!(hdr.len(), 40);
        let mut body = hdr.clone();
        body.extend_from_slice(b"hello");
        let m = msg(opcode::WRITE, &body);
        let want = Op::Write {
            fh: 7,
            offset: 4096,
            append: true,
            data: b"hello",
        };
        assert_eq!(parse_dev(&m).unwrap().op, want);
        // io_uring: op_in is the 128-byte area, the payload separate.
        let mut op_in = hdr;
        op_in.resize(128, 0);
        let r = parse_parts(&header(opcode::WRITE, 0), &op_in, b"hello").unwrap();
        assert_eq!(r.op, want);
        // Data shorter than announced is malformed.
        assert_eq!(
            parse_parts(&header(opcode::WRITE, 0), &op_in, b"hell"),
            Err(ParseError::BadArgs {
                unique: 99,
                opcode: opcode::WRITE
            })
        );
    }

    #[test]
    fn lock_requests_flush_and_release_carry_their_owners() {
        let mut body = 7u64.to_ne_bytes().to_vec(); // fh
        body.extend_from_slice(&0xabcdu64.to_ne_bytes()); // owner
        body.extend_from_slice(&10u64.to_ne_bytes());
        body.extend_from_slice(&19u64.to_ne_bytes());
        body.extend_from_slice(&u32s(&[libc::F_WRLCK as u32, 42, abi::LK_FLOCK, 0]));
        assert_eq!(body.len(), abi::op_header_bytes(opcode::SETLKW));
        let want = Op::Lock {
            fh: 7,
            owner: 0xabcd,
            lock: abi::FileLock {
                start: 10,
                end: 19,
                typ: libc::F_WRLCK as u32,
                pid: 42,
            },
            flock: true,
            test: false,
            sleep: true,
        };
        assert_eq!(parse_dev(&msg(opcode::SETLKW, &body)).unwrap().op, want);
        let Op::Lock { test, sleep, .. } = parse_dev(&msg(opcode::GETLK, &body)).unwrap().op else {
            panic!("not a lock request");
        };
        assert!(test && !sleep);
        // Too short: malformed, not a lock of garbage.
        assert!(parse_dev(&msg(opcode::SETLK, &body[..40])).is_err());
        let mut flush = 7u64.to_ne_bytes().to_vec();
        flush.extend_from_slice(&u32s(&[0, 0]));
        flush.extend_from_slice(&0x55u64.to_ne_bytes());
        assert_eq!(
            parse_dev(&msg(opcode::FLUSH, &flush)).unwrap().op,
            Op::Flush { lock_owner: 0x55 }
        );
        let mut release = 7u64.to_ne_bytes().to_vec();
        release.extend_from_slice(&u32s(&[0, abi::RELEASE_FLOCK_UNLOCK]));
        release.extend_from_slice(&0x66u64.to_ne_bytes());
        assert_eq!(
            parse_dev(&msg(opcode::RELEASE, &release)).unwrap().op,
            Op::Release {
                fh: 7,
                flock_owner: Some(0x66)
            }
        );
        assert_eq!(
            parse_dev(&msg(opcode::INTERRUPT, &99u64.to_ne_bytes()))
                .unwrap()
                .op,
            Op::Interrupt { unique: 99 }
        );
    }

    #[test]
    fn rename_and_rename2() {
        let mut body = 9u64.to_ne_bytes().to_vec();
        body.extend_from_slice(b"a\0b\0");
        let m = msg(opcode::RENAME, &body);
        let r = parse_dev(&m).unwrap();
        assert_eq!(
            r.op,
            Op::Rename {
                newdir: 9,
                flags: 0,
                name: b"a",
                newname: b"b"
            }
        );
        let mut body = 9u64.to_ne_bytes().to_vec();
        body.extend_from_slice(&u32s(&[1, 0]));
        body.extend_from_slice(b"a\0b\0");
        let m = msg(opcode::RENAME2, &body);
        let r = parse_dev(&m).unwrap();
        assert!(matches!(r.op, Op::Rename { flags: 1, .. }));
    }

    #[test]
    fn setxattr_value_by_size() {
        let mut body = u32s(&[3, 1]);
        body.extend_from_slice(b"user.k\0v\0z");
        let m = msg(opcode::SETXATTR, &body);
        let r = parse_dev(&m).unwrap();
        assert_eq!(
            r.op,
            Op::Setxattr {
                name: b"user.k",
                value: b"v\0z",
                flags: 1
            }
        );
    }

    #[test]
    fn setattr_fields() {
        let mut body = Vec::new();
        body.extend_from_slice(&u32s(&[abi::fattr::SIZE | abi::fattr::MTIME, 0]));
        for v in [0u64, 123, 0, 1, 2, 3] {
            body.extend_from_slice(&v.to_ne_bytes());
        }
        body.extend_from_slice(&u32s(&[10, 20, 30, 0o644, 0, 7, 8, 0]));
        assert_eq!(body.len(), 88);
        let m = msg(opcode::SETATTR, &body);
        let r = parse_dev(&m).unwrap();
        let Op::Setattr(s) = r.op else {
            panic!("not setattr")
        };
        assert_eq!(s.size, 123);
        assert_eq!(s.mtime, (2, 20));
        assert_eq!((s.mode, s.uid, s.gid), (0o644, 7, 8));
    }

    #[test]
    fn init_with_flags2() {
        let flags = (abi::init_flags::INIT_EXT | abi::init_flags::ASYNC_READ) as u32;
        let mut body = u32s(&[7, 44, 131072, flags, 1 << 9]);
        body.resize(64, 0);
        let m = msg(opcode::INIT, &body);
        let r = parse_dev(&m).unwrap();
        let Op::Init(i) = r.op else { panic!() };
        assert_eq!((i.major, i.minor, i.max_readahead), (7, 44, 131072));
        assert_eq!(i.flags & abi::init_flags::OVER_IO_URING, 1 << 41);
        // An old kernel's 16-byte INIT still parses.
        let body = u32s(&[7, 31, 65536, 1]);
        assert!(matches!(
            parse_dev(&msg(opcode::INIT, &body)).unwrap().op,
            Op::Init(InitIn { minor: 31, .. })
        ));
    }

    #[test]
    fn access_mask() {
        // `fuse_access_in`: mask and padding.
        let m = msg(opcode::ACCESS, &u32s(&[4 | 1, 0]));
        assert_eq!(parse_dev(&m).unwrap().op, Op::Access { mask: 5 });
        let op_in = u32s(&[2, 0]);
        let r = parse_parts(&header(opcode::ACCESS, 0), &op_in, &[]).unwrap();
        assert_eq!(r.op, Op::Access { mask: 2 });
        assert!(parse_dev(&msg(opcode::ACCESS, &[1, 0])).is_err());
    }

    #[test]
    fn unknown_opcode_is_unsupported() {
        let m = msg(4000, b"whatever");
        let r = parse_dev(&m).unwrap();
        assert_eq!(r.op, Op::Unsupported(4000));
    }

    #[test]
    fn truncated_requests_are_errors_not_panics() {
        assert_eq!(parse_dev(&[0u8; 10]), Err(ParseError::NoHeader));
        // Every opcode with every truncation of a plausible body.
        let mut body = u32s(&[1; 22]);
        body.extend_from_slice(b"name\0target\0");
        for op in 0..60 {
            for cut in 0..body.len() {
                let m = msg(op, &body[..cut]);
                let _ = parse_dev(&m);
                let _ = parse_parts(&m, &body[..cut.min(128)], &body[cut..]);
            }
        }
        // A name without its NUL.
        assert!(matches!(
            parse_dev(&msg(opcode::LOOKUP, b"abc")),
            Err(ParseError::BadArgs { unique: 99, .. })
        ));
        // A header length that disagrees with what was read.
        let mut m = msg(opcode::LOOKUP, b"abc\0");
        m.push(0);
        assert!(parse_dev(&m).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        // A small deterministic generator; the point is coverage of odd lengths and values.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 200) as usize;
            let mut m: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
            if m.len() >= 8 {
                m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
                m[4..8].copy_from_slice(&((x >> 20) as u32 % 60).to_ne_bytes());
            }
            let _ = parse_dev(&m);
            let split = (x >> 8) as usize % (len + 1);
            let _ = parse_parts(&m, &m[..split], &m[split..]);
        }
    }
}
