//! A FUSE connection: the INIT handshake over /dev/fuse, the classic read/write request
//! loop, and the choice between it and FUSE-over-io_uring ([`super::uring`]).
//!
//! With rings active, one /dev/fuse thread stays: FORGET, BATCH_FORGET and INTERRUPT (and
//! anything sent before every ring queue was registered) still arrive there, and its
//! `ENODEV` marks the end of the connection.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};
use std::thread::JoinHandle;

use super::abi::{self, init_flags};
use super::notify::{self, NotifyQueue};
use super::reply::{InitOut, Reply};
use super::request::{self, Op, ParseError, Request};
use super::uring;

/// What the file system asks of the kernel at INIT.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InitParams {
    /// Wanted `init_flags`; only those the kernel offers are granted.
    pub(crate) flags: u64,
    /// Flags wanted only from a kernel that does not offer `DIRECT_IO_ALLOW_MMAP` (files
    /// opened for direct I/O could not be mmapped shared there).
    pub(crate) without_direct_mmap: u64,
    pub(crate) max_write: u32,
    pub(crate) max_readahead: u32,
    pub(crate) max_background: u16,
    pub(crate) congestion_threshold: u16,
}

/// The file-system side of a session: turns requests into replies. Implementations block
/// freely; each transport thread serves one request at a time.
pub(crate) trait Handler: Send + Sync + 'static {
    fn init_params(&self) -> InitParams;
    /// The INIT flags the kernel granted and the protocol minor it speaks, before any
    /// other request arrives.
    fn initialized(&self, _granted: u64, _kernel_minor: u32) {}
    /// Answers one request (never INIT, DESTROY or a no-reply request).
    fn handle(&self, req: &Request<'_>) -> Reply;
    /// The connection ends: make everything durable.
    fn destroy(&self);
    /// The kernel asks that request `unique`, in progress, end early (its caller caught a
    /// signal); the request is still answered, by whoever serves it.
    fn interrupt(&self, _unique: u64) {}
}

/// Requests of one connection as the daemon serves them, for its metrics: counted around
/// the handler, so that a request waiting in the kernel is not in `active`.
#[derive(Debug, Default)]
pub(crate) struct RequestCounters {
    pub(crate) active: AtomicU64,
    pub(crate) served: AtomicU64,
}

/// Shared by every transport thread of one connection.
pub(crate) struct Shared {
    pub(crate) handler: Arc<dyn Handler>,
    destroyed: Once,
    counters: Arc<RequestCounters>,
}

impl Shared {
    /// Runs the handler's `destroy` once, however many threads see the connection end.
    pub(crate) fn destroy(&self) {
        self.destroyed.call_once(|| self.handler.destroy());
    }

    /// The reply to a parsed request; `None` when the kernel expects none.
    pub(crate) fn serve(&self, req: &Request<'_>) -> Option<Reply> {
        match req.op {
            Op::Interrupt { unique } => {
                self.handler.interrupt(unique);
                None
            }
            _ if req.op.is_noreply() => None,
            // INIT after the handshake is a protocol error.
            Op::Init(_) => Some(Reply::Error(libc::EIO)),
            Op::Destroy => {
                self.destroy();
                Some(Reply::Empty)
            }
            _ => {
                self.counters.active.fetch_add(1, Ordering::Relaxed);
                let reply = self.handler.handle(req);
                self.counters.active.fetch_sub(1, Ordering::Relaxed);
                self.counters.served.fetch_add(1, Ordering::Relaxed);
                Some(reply)
            }
        }
    }

    /// The reply to whatever a transport received: a request, or bytes that did not parse.
    /// Returns the `unique` to answer and the reply, or `None` for nothing to send.
    pub(crate) fn serve_parsed(
        &self,
        parsed: Result<Request<'_>, ParseError>,
    ) -> Option<(u64, Reply)> {
        match parsed {
            Ok(req) => {
                let unique = req.header.unique;
                self.serve(&req).map(|r| (unique, r))
            }
            Err(ParseError::NoHeader) => {
                tracing::error!("FUSE request shorter than its header; ignored");
                None
            }
            Err(ParseError::BadArgs { unique, opcode }) => {
                tracing::error!("malformed FUSE request (opcode {opcode}); answered EINVAL");
                Some((unique, Reply::Error(libc::EINVAL)))
            }
        }
    }
}

/// Largest request the classic loop reads: `max_write` of data plus headers, with room to
/// spare (the kernel refuses reads into buffers smaller than it could need).
fn dev_buffer_bytes(max_write: u32) -> usize {
    max_write as usize + (64 << 10)
}

/// How the session's requests are transported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    Classic,
    Uring,
}

/// A running session.
pub(crate) struct Session {
    /// The /dev/fuse file the mount was made with; every ring command names it.
    _dev: Arc<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    pub(crate) transport: Transport,
    pub(crate) counters: Arc<RequestCounters>,
}

/// Session options.
pub(crate) struct SessionOptions {
    /// Classic /dev/fuse request threads when rings are not used.
    pub(crate) classic_threads: usize,
    /// Try FUSE-over-io_uring when the kernel offers it.
    pub(crate) uring: bool,
}

impl Session {
    /// Answers INIT on `dev` (a mounted connection) and starts the request threads, and
    /// a thread per queue of `notifications` that writes the handler's notifications.
    pub(crate) fn start(
        dev: OwnedFd,
        handler: Arc<dyn Handler>,
        opts: &SessionOptions,
        notifications: Vec<NotifyQueue>,
    ) -> io::Result<Session> {
        let dev = Arc::new(dev);
        let counters = Arc::new(RequestCounters::default());
        let shared = Arc::new(Shared {
            handler,
            destroyed: Once::new(),
            counters: Arc::clone(&counters),
        });
        let params = shared.handler.init_params();
        let mut buf = vec![0u8; dev_buffer_bytes(params.max_write)];
        let init = read_init(dev.as_raw_fd(), &mut buf)?;
        let mut out = negotiate(&init.1, &params);
        shared.handler.initialized(out.flags, init.1.minor);

        // Rings are prepared (threads, rings, buffers) before INIT is answered: once the
        // kernel accepts FUSE_OVER_IO_URING it holds back every request until each CPU's
        // queue has a registered entry, so failing after that point would hang the mount.
        let offered = init.1.flags & init_flags::OVER_IO_URING != 0;
        if opts.uring && !offered {
            tracing::info!("FUSE: the kernel does not offer io_uring; using /dev/fuse");
        }
        let mut rings = None;
        if opts.uring && offered {
            match uring::Rings::prepare(&dev, &shared, params.max_write) {
                Ok(r) => {
                    out.flags |= init_flags::OVER_IO_URING;
                    rings = Some(r);
                }
                Err(e) => tracing::warn!("FUSE: cannot set up io_uring ({e}); using /dev/fuse"),
            }
        }
        let reply = Reply::Init(out);
        send(dev.as_raw_fd(), init.0, &reply, &mut Vec::new())?;

        let mut threads = Vec::new();
        let mut transport = Transport::Classic;
        let mut classic_threads = opts.classic_threads.max(1);
        if let Some(r) = rings {
            let (handles, registered) = r.register();
            threads.extend(handles);
            if registered {
                transport = Transport::Uring;
                classic_threads = 1;
            } else {
                tracing::warn!("FUSE: io_uring registration failed; using /dev/fuse");
            }
        }
        let gate = Arc::new(ReaderGate::default());
        for i in 0..classic_threads {
            let fd = if i == 0 {
                None
            } else {
                Some(super::mount::clone_dev(dev.as_raw_fd())?)
            };
            let dev = Arc::clone(&dev);
            let shared = Arc::clone(&shared);
            let gate = Arc::clone(&gate);
            let bytes = buf.len();
            let t = std::thread::Builder::new()
                .name(format!("fuse-dev-{i}"))
                .spawn(move || {
                    let raw = fd.as_ref().map_or(dev.as_raw_fd(), AsRawFd::as_raw_fd);
                    classic_loop(raw, &shared, &gate, bytes);
                    drop(fd);
                })?;
            threads.push(t);
        }
        for queue in notifications {
            threads.push(notify::spawn(Arc::clone(&dev), queue)?);
        }
        Ok(Session {
            _dev: dev,
            threads,
            transport,
            counters,
        })
    }

    /// Waits for every request thread; call once the connection has ended (unmounted or
    /// aborted), or it waits forever.
    pub(crate) fn join(mut self) {
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a FUSE request thread panicked");
            }
        }
    }
}

/// Reads until INIT arrives; returns its `unique` and arguments.
fn read_init(fd: RawFd, buf: &mut [u8]) -> io::Result<(u64, request::InitIn)> {
    loop {
        let n = read_dev(fd, buf)?;
        let Some(n) = n else { continue };
        match request::parse_dev(&buf[..n]) {
            Ok(Request {
                header,
                op: Op::Init(init),
            }) => {
                if init.major != abi::KERNEL_VERSION {
                    // A newer major would retry with ours; an older one cannot be spoken.
                    send(
                        fd,
                        header.unique,
                        &Reply::Error(libc::EPROTO),
                        &mut Vec::new(),
                    )?;
                    return Err(io::Error::other(format!(
                        "FUSE kernel protocol {}.{} is not supported",
                        init.major, init.minor
                    )));
                }
                return Ok((header.unique, init));
            }
            Ok(req) => {
                tracing::error!("FUSE request before INIT (opcode {})", req.header.opcode);
                send(
                    fd,
                    req.header.unique,
                    &Reply::Error(libc::EIO),
                    &mut Vec::new(),
                )?;
            }
            Err(e) => tracing::error!("malformed FUSE request before INIT: {e:?}"),
        }
    }
}

/// The INIT reply: what we want of what the kernel offers.
/// Pages a request of `bytes` may span: one more than it fills, so that a buffer not
/// aligned to a page still goes in one request.
pub(crate) fn max_pages(bytes: u32) -> u32 {
    const PAGE: u32 = 4096;
    bytes.div_ceil(PAGE) + 1
}

fn negotiate(init: &request::InitIn, p: &InitParams) -> InitOut {
    let mut flags = (p.flags | init_flags::INIT_EXT) & init.flags;
    if init.flags & init_flags::DIRECT_IO_ALLOW_MMAP == 0 {
        flags |= p.without_direct_mmap & init.flags;
    }
    let max_readahead = p.max_readahead.min(init.max_readahead);
    let max_pages = max_pages(p.max_write.max(max_readahead));
    InitOut {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION.min(init.minor),
        max_readahead,
        flags,
        max_background: p.max_background,
        congestion_threshold: p.congestion_threshold,
        max_write: p.max_write,
        time_gran: 1,
        max_pages: u16::try_from(max_pages).unwrap_or(u16::MAX),
    }
}

/// One read of a request; `Ok(None)` for the errors that mean "try again".
fn read_dev(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // ENOENT: the request was interrupted before we read it.
        Some(libc::ENOENT | libc::EINTR | libc::EAGAIN) => Ok(None),
        _ => Err(e),
    }
}

/// Writes a reply to /dev/fuse in one writev; file data goes straight from its pieces.
fn send(fd: RawFd, unique: u64, reply: &Reply, scratch: &mut Vec<u8>) -> io::Result<()> {
    let slice = |b: &[u8]| libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    };
    let n = if let Reply::File(d) = reply {
        let header = abi::out_header(unique, 0, d.len());
        let iov: Vec<libc::iovec> = std::iter::once(slice(&header))
            .chain(d.slices().map(slice))
            .collect();
        // SAFETY: every iovec points at a live buffer of the given length.
        unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as libc::c_int) }
    } else {
        let (error, body) = reply.encode(scratch);
        let header = abi::out_header(unique, error, body.len());
        let iov = [slice(&header), slice(body)];
        // SAFETY: both iovecs point at live buffers of the given lengths.
        unsafe { libc::writev(fd, iov.as_ptr(), 2) }
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        // ENOENT: the request was interrupted or the connection aborted meanwhile.
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    Ok(())
}

/// Serves requests read from `fd` until the connection ends.
/// Idle request threads allowed to wait in `read` on /dev/fuse at once.
const IDLE_READERS_MAX: usize = 2;

/// Keeps at most [`IDLE_READERS_MAX`] request threads waiting on /dev/fuse; the others
/// park here until a reader takes a request and leaves no idle reader behind. The kernel
/// wakes the waiters of /dev/fuse in turn, so with every thread waiting there, a client
/// that issues one request at a time (an `ls`, a create loop) had each request served by a
/// different, cold thread, and the queue's lock contended: metadata rates were 20 % lower
/// with 8 threads than with 2. Under parallel load every thread still serves.
#[derive(Default)]
struct ReaderGate {
    state: Mutex<GateState>,
    wake: Condvar,
}

#[derive(Default)]
struct GateState {
    idle_readers: usize,
    parked: usize,
    closed: bool,
}

impl ReaderGate {
    /// Waits until this thread may read; false once the connection has ended.
    fn enter(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !st.closed && st.idle_readers >= IDLE_READERS_MAX {
            st.parked += 1;
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            st.parked -= 1;
        }
        if st.closed {
            return false;
        }
        st.idle_readers += 1;
        true
    }

    /// The thread stopped reading (it has a request, or the connection ended); wakes a
    /// parked one if nobody is left reading.
    fn leave(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.idle_readers -= 1;
        if st.idle_readers == 0 && st.parked > 0 {
            self.wake.notify_one();
        }
    }

    fn close(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.closed = true;
        self.wake.notify_all();
    }
}

/// Where a write's data starts in a request: after the `fuse_in_header` and the 40-byte
/// `fuse_write_in`.
const WRITE_DATA_AT: usize = abi::IN_HEADER_BYTES + 40;

/// Page size, and the alignment O_DIRECT drives need of a buffer.
const PAGE: usize = 4096;

fn classic_loop(fd: RawFd, shared: &Shared, gate: &ReaderGate, buf_bytes: usize) {
    // One buffer per thread, reused for every request, placed so that a write's data
    // starts on a page boundary: the data path then hands it to the drives as it is,
    // instead of copying every written byte into an aligned buffer first.
    let mut storage = vec![0u8; buf_bytes + PAGE];
    let start = (PAGE - (storage.as_ptr() as usize + WRITE_DATA_AT) % PAGE) % PAGE;
    let buf = &mut storage[start..start + buf_bytes];
    let mut scratch = Vec::with_capacity(4096);
    loop {
        if !gate.enter() {
            break;
        }
        let read = read_dev(fd, buf);
        gate.leave();
        let n = match read {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) => {
                if e.raw_os_error() != Some(libc::ENODEV) {
                    tracing::error!("reading /dev/fuse: {e}");
                }
                break;
            }
        };
        let parsed = request::parse_dev(&buf[..n]);
        if let Some((unique, reply)) = shared.serve_parsed(parsed) {
            if let Err(e) = send(fd, unique, &reply, &mut scratch) {
                if e.raw_os_error() == Some(libc::ENODEV) {
                    break;
                }
                tracing::error!("replying on /dev/fuse: {e}");
            }
        }
    }
    gate.close();
    shared.destroy();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_grants_only_offered_flags() {
        let init = request::InitIn {
            major: 7,
            minor: 44,
            max_readahead: 131072,
            flags: init_flags::ASYNC_READ | init_flags::INIT_EXT | init_flags::OVER_IO_URING,
        };
        let p = InitParams {
            flags: init_flags::ASYNC_READ | init_flags::WRITEBACK_CACHE,
            without_direct_mmap: 0,
            max_write: 1 << 20,
            max_readahead: 1 << 20,
            max_background: 64,
            congestion_threshold: 48,
        };
        let out = negotiate(&init, &p);
        assert_eq!(out.flags, init_flags::ASYNC_READ | init_flags::INIT_EXT);
        assert_eq!(out.minor, abi::KERNEL_MINOR_VERSION);
        assert_eq!(out.max_readahead, 131072);
        assert_eq!(out.max_pages, 257);
    }

    #[test]
    fn writeback_only_from_a_kernel_that_cannot_mmap_direct_io_files() {
        let mut init = request::InitIn {
            major: 7,
            minor: 44,
            max_readahead: 131072,
            flags: init_flags::ASYNC_READ
                | init_flags::WRITEBACK_CACHE
                | init_flags::DIRECT_IO_ALLOW_MMAP,
        };
        let p = InitParams {
            flags: init_flags::ASYNC_READ | init_flags::DIRECT_IO_ALLOW_MMAP,
            without_direct_mmap: init_flags::WRITEBACK_CACHE,
            max_write: 1 << 20,
            max_readahead: 1 << 20,
            max_background: 64,
            congestion_threshold: 48,
        };
        let granted = negotiate(&init, &p).flags;
        assert_eq!(granted & init_flags::WRITEBACK_CACHE, 0);
        assert_ne!(granted & init_flags::DIRECT_IO_ALLOW_MMAP, 0);
        init.flags &= !init_flags::DIRECT_IO_ALLOW_MMAP;
        let granted = negotiate(&init, &p).flags;
        assert_ne!(granted & init_flags::WRITEBACK_CACHE, 0);
    }

    #[test]
    fn opcode_constants_are_the_kernels() {
        assert_eq!(abi::opcode::INIT, 26);
        assert_eq!(abi::opcode::RENAME2, 45);
    }
}
