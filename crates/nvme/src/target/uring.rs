//! Drive reads through io_uring, issued and completed on the connection's own thread.
//!
//! A 4 KiB read through a worker pool costs three thread hand-offs on the target alone
//! (reader → worker, the worker's sleep in `pread`, the wake-up by the disk), which on a
//! small machine costs more than the I/O. Here the connection thread queues the read on
//! its ring instead, and its socket reads ([`Socket`] is what the `BufReader` reads from)
//! become an io_uring `RECV` waited for together with the drive reads: whichever finishes
//! first wakes the same thread. Completed reads are answered in one vectored write per
//! wake-up, and the reads queued while parsing a burst of capsules go to the kernel in the
//! same `io_uring_enter` as the next `RECV`.
//!
//! Only Reads of namespaces whose device the server opened itself take this path (the
//! namespace then has a read descriptor of its own); everything else, and every read when
//! the kernel refuses io_uring, runs on the worker pool as before.
//!
//! Soundness: a buffer handed to the kernel (a read's [`AlignedBuf`], kept in its [`Op`];
//! the caller's buffer of a `RECV`) stays alive until its completion is reaped: `RECV` is
//! waited for before [`Socket::read`] returns, and dropping the [`Engine`] waits for every
//! drive read still in flight. Should `io_uring_enter` fail for good while the kernel may
//! still own a buffer, the process aborts rather than free it.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};
use tessera_drive::AlignedBuf;

use super::connection::ConnWriter;
use super::io::{read_done, ReadPlan};
use crate::wire::Status;

/// Submission queue entries; the completion queue has twice as many and the kernel keeps
/// any overflow, so this bounds only how many reads go to the kernel per system call.
const RING_ENTRIES: u32 = 128;
/// `user_data` of the socket receive; drive reads use their slot index.
const RECV: u64 = u64::MAX;
/// Idle read buffers kept per buffer size.
const POOL_BYTES_PER_SIZE: usize = 4 << 20;

/// Warn only once per process that io_uring is unavailable.
static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// The connection's socket as its `BufReader` sees it.
pub(crate) struct Socket {
    stream: TcpStream,
    engine: Option<Engine>,
}

impl Socket {
    pub fn new(stream: TcpStream) -> Socket {
        Socket {
            stream,
            engine: None,
        }
    }

    /// Sets up the ring of an I/O queue; false (and logged) when the kernel refuses it.
    pub fn start_engine(&mut self, writer: Arc<ConnWriter>, inflight: Arc<AtomicUsize>) -> bool {
        assert!(self.engine.is_none(), "engine started twice");
        match Engine::new(writer, inflight) {
            Ok(engine) => {
                self.engine = Some(engine);
                true
            }
            Err(e) => {
                if !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::warn!("io_uring unavailable ({e}): drive reads run on worker threads");
                } else {
                    tracing::debug!("io_uring unavailable ({e})");
                }
                false
            }
        }
    }

    pub fn engine(&mut self) -> Option<&mut Engine> {
        self.engine.as_mut()
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.engine {
            Some(engine) if engine.outstanding > 0 => engine.recv(&self.stream, buf),
            _ => (&self.stream).read(buf),
        }
    }
}

/// A drive read in flight.
struct Op {
    cid: u16,
    plan: ReadPlan,
    buf: AlignedBuf,
}

/// One connection's ring, its reads in flight and its idle buffers.
pub(crate) struct Engine {
    ring: IoUring,
    ops: Vec<Option<Op>>,
    free_slots: Vec<usize>,
    /// Reads queued or in the kernel, not yet reaped.
    outstanding: usize,
    pool: HashMap<usize, Vec<AlignedBuf>>,
    writer: Arc<ConnWriter>,
    inflight: Arc<AtomicUsize>,
    finished: Vec<(u16, Status, AlignedBuf, usize)>,
}

impl Engine {
    fn new(writer: Arc<ConnWriter>, inflight: Arc<AtomicUsize>) -> io::Result<Engine> {
        // Only this thread submits and waits, so completions can wait for it to ask
        // (no interruption of its socket writes); older kernels lack the flags.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(RING_ENTRIES)
            .or_else(|_| IoUring::builder().setup_coop_taskrun().build(RING_ENTRIES))
            .or_else(|_| IoUring::new(RING_ENTRIES))?;
        Ok(Engine {
            ring,
            ops: Vec::new(),
            free_slots: Vec::new(),
            outstanding: 0,
            pool: HashMap::new(),
            writer,
            inflight,
            finished: Vec::new(),
        })
    }

    /// Queues a checked read of `plan.ns`, whose namespace has a direct descriptor; the
    /// caller has counted it in `inflight`. It reaches the kernel with the next socket read.
    pub fn submit_read(&mut self, cid: u16, plan: ReadPlan) {
        let fd = plan
            .ns
            .direct
            .as_ref()
            .expect("only namespaces with a direct descriptor are read here")
            .as_raw_fd();
        let len = u32::try_from(plan.len).expect("MDTS bounds a read");
        let mut buf = self.take_buf(plan.len);
        assert!(buf.len() >= plan.len);
        let sqe = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len)
            .offset(plan.offset)
            .build();
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        assert!(self.ops[slot].is_none(), "read slot {slot} in use");
        // The buffer's heap block does not move with the `AlignedBuf`.
        self.ops[slot] = Some(Op { cid, plan, buf });
        self.outstanding += 1;
        self.push(&sqe.user_data(slot as u64));
    }

    /// Receives from the socket while completing the drive reads that finish meanwhile.
    fn recv(&mut self, stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let sqe = opcode::Recv::new(types::Fd(stream.as_raw_fd()), buf.as_mut_ptr(), len)
            .build()
            .user_data(RECV);
        self.push(&sqe);
        loop {
            self.enter(1);
            if let Some(res) = self.reap() {
                return match res {
                    n if n >= 0 => Ok(n as usize),
                    e if e == -libc::EINTR || e == -libc::EAGAIN => {
                        Err(io::ErrorKind::Interrupted.into())
                    }
                    e => Err(io::Error::from_raw_os_error(-e)),
                };
            }
        }
    }

    /// Puts `sqe` on the submission queue, submitting what is there when it is full.
    fn push(&mut self, sqe: &squeue::Entry) {
        loop {
            // SAFETY: every buffer an entry points to outlives its completion (module
            // documentation): read buffers live in `ops`, a RECV's caller waits for it.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return;
            }
            self.enter(0);
            if let Some(res) = self.reap() {
                unreachable!("RECV completed ({res}) before it was queued");
            }
        }
    }

    /// Submits the queued entries and waits for `want` completions.
    fn enter(&mut self, want: usize) {
        match self.ring.submit_and_wait(want) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => {
                // The kernel may own buffers this thread cannot keep track of any more.
                tracing::error!("io_uring_enter failed: {e}; aborting");
                std::process::abort();
            }
        }
    }

    /// Completes the drive reads that finished and answers them in one write; returns the
    /// RECV's result if it completed.
    fn reap(&mut self) -> Option<i32> {
        let mut received = None;
        for cqe in self.ring.completion() {
            if cqe.user_data() == RECV {
                received = Some(cqe.result());
                continue;
            }
            let slot = cqe.user_data() as usize;
            let mut op = self.ops[slot]
                .take()
                .expect("completion of an idle read slot");
            self.free_slots.push(slot);
            self.outstanding -= 1;
            let len = op.plan.len;
            let result = match cqe.result() {
                n if n >= 0 && n as usize == len => Ok(()),
                n if n >= 0 => {
                    // Short read (should not happen inside the device): read it again,
                    // whole, through the device itself.
                    op.plan.ns.dev.read_at(&mut op.buf[..len], op.plan.offset)
                }
                e => Err(io::Error::from_raw_os_error(-e)),
            };
            let status = read_done(&op.plan, result);
            self.finished.push((op.cid, status, op.buf, len));
        }
        if !self.finished.is_empty() {
            self.answer();
        }
        received
    }

    fn answer(&mut self) {
        // Free the slots before the host can see the completions and reuse them.
        self.inflight
            .fetch_sub(self.finished.len(), Ordering::SeqCst);
        {
            let replies: Vec<(u16, Status, &[u8])> = self
                .finished
                .iter()
                .map(|(cid, status, buf, len)| (*cid, *status, &buf[..*len]))
                .collect();
            self.writer.respond_reads(&replies);
        }
        let mut finished = std::mem::take(&mut self.finished);
        for (_, _, buf, _) in finished.drain(..) {
            self.put_buf(buf);
        }
        self.finished = finished;
    }

    fn take_buf(&mut self, len: usize) -> AlignedBuf {
        self.pool
            .get_mut(&len)
            .and_then(Vec::pop)
            .unwrap_or_else(|| AlignedBuf::for_io(len))
    }

    fn put_buf(&mut self, buf: AlignedBuf) {
        let len = buf.len();
        let idle = self.pool.entry(len).or_default();
        if (idle.len() + 1) * len <= POOL_BYTES_PER_SIZE {
            idle.push(buf);
        }
    }
}

impl Drop for Engine {
    /// Waits for the drive reads still in flight: the kernel writes into their buffers.
    /// Their answers are dropped (the connection is closing).
    fn drop(&mut self) {
        while self.outstanding > 0 {
            self.enter(1);
            for cqe in self.ring.completion() {
                if cqe.user_data() == RECV {
                    continue;
                }
                let slot = cqe.user_data() as usize;
                if self.ops[slot].take().is_some() {
                    self.outstanding -= 1;
                }
            }
        }
    }
}
