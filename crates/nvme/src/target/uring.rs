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
//! A read larger than `PIECE_BYTES` is issued as several drive reads at once, and its data
//! goes to the host piece by piece, in order, as the pieces finish: at queue depth 1 the
//! transfer of the first piece then overlaps the drive reading the rest, where one read
//! made the host wait for the whole drive read and then for the whole transfer.
//!
//! Writes of up to one piece whose data is all in and that need no flush (no FUA, the
//! volatile write cache on) take the same path: a 4 KiB write through the worker pool
//! paid the same hand-offs, and random 4 KiB writes at QD32 went from 19–22k to 35–36k
//! IOPS (p99 from about 19 ms to 3.4 ms) when they moved here.
//!
//! Only namespaces whose device the server opened itself take this path (the namespace
//! then has a descriptor of its own); everything else, and everything when the kernel
//! refuses io_uring, runs on the worker pool as before.
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
use super::io::{read_done, write_done, write_fault, ReadPlan, WritePlan};
use crate::wire::Status;

/// Submission queue entries; the completion queue has twice as many and the kernel keeps
/// any overflow, so this bounds only how many reads go to the kernel per system call.
const RING_ENTRIES: u32 = 128;
/// `user_data` of the socket receive; drive reads use `slot << PIECE_BITS | piece`.
const RECV: u64 = u64::MAX;
/// Bytes of one drive read within a command, and the largest write issued here.
pub(crate) const PIECE_BYTES: usize = 256 << 10;
const PIECE_BITS: u32 = 8;
/// Idle small read buffers kept per buffer size (large ones: `super::buffers`).
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

/// What a command in flight on the ring does.
enum Plan {
    Read(ReadPlan),
    /// A write of at most one piece whose data came with the command (in the capsule).
    Write(WritePlan),
}

impl Plan {
    fn len(&self) -> usize {
        match self {
            Plan::Read(p) => p.len,
            Plan::Write(p) => p.len,
        }
    }

    fn offset(&self) -> u64 {
        match self {
            Plan::Read(p) => p.offset,
            Plan::Write(p) => p.offset,
        }
    }

    /// Accounts for the finished command; its completion status.
    fn done(&self, result: io::Result<()>) -> Status {
        match self {
            Plan::Read(p) => read_done(p, result),
            Plan::Write(p) => {
                // Through the ring's descriptor, not the device: the next flush must sync
                // it (even a failed write may have changed part of the range).
                p.ns.wrote_behind();
                let failed = result.err().map(|e| write_fault(&p.ns, p.offset, &e));
                write_done(p, failed)
            }
        }
    }
}

/// A command in flight: its pieces, each a drive read (or, for a write, the one drive
/// write) of up to `PIECE_BYTES`.
struct Op {
    cid: u16,
    plan: Plan,
    buf: AlignedBuf,
    /// How many pieces the read has (at most 64).
    pieces: usize,
    /// Bit `i`: piece `i`'s bytes are in `buf`.
    done: u64,
    /// Pieces already sent to the host, in order.
    sent: usize,
    /// Pieces still with the kernel.
    pending: usize,
    /// The first piece that failed; the command fails once every piece is back.
    failed: Option<io::Error>,
}

impl Op {
    fn piece_range(&self, piece: usize) -> std::ops::Range<usize> {
        piece_range(self.plan.len(), piece)
    }

    fn is_done(&self, piece: usize) -> bool {
        self.done & (1 << piece) != 0
    }
}

/// Bytes of piece `piece` of a read of `len` bytes.
fn piece_range(len: usize, piece: usize) -> std::ops::Range<usize> {
    let start = piece * PIECE_BYTES;
    start..(start + PIECE_BYTES).min(len)
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
    /// Read commands with something to send after a reap: their slots.
    ready: Vec<usize>,
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
            ready: Vec::new(),
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
        let mut buf = self.take_buf(plan.len);
        assert!(buf.len() >= plan.len);
        let base = buf.as_mut_ptr();
        let (offset, len) = (plan.offset, plan.len);
        // The buffer's heap block does not move with the `AlignedBuf`.
        let slot = self.start_op(cid, Plan::Read(plan), buf);
        let pieces = self.ops[slot].as_ref().expect("just started").pieces;
        for i in 0..pieces {
            let r = piece_range(len, i);
            let len = u32::try_from(r.len()).expect("a piece fits u32");
            // SAFETY: `r` lies inside the buffer (piece_range is bounded by plan.len).
            let at = unsafe { base.add(r.start) };
            let sqe = opcode::Read::new(types::Fd(fd), at, len)
                .offset(offset + r.start as u64)
                .build()
                .user_data((slot as u64) << PIECE_BITS | i as u64);
            self.outstanding += 1;
            self.push(&sqe);
        }
    }

    /// Queues a checked write of `data` (all received, at most one piece, aligned for
    /// O_DIRECT) to `plan.ns`, whose namespace has a direct descriptor and whose plan asks
    /// for no flush; the caller has counted it in `inflight`. Answered with a response
    /// capsule once the drive has it.
    pub fn submit_write(&mut self, cid: u16, plan: WritePlan, data: AlignedBuf) {
        let fd = plan
            .ns
            .direct
            .as_ref()
            .expect("only namespaces with a direct descriptor are written here")
            .as_raw_fd();
        assert!(
            !plan.flush,
            "writes that need a flush go to the worker pool"
        );
        assert!(plan.len <= PIECE_BYTES && data.len() >= plan.len);
        let (offset, len) = (plan.offset, plan.len);
        let at = data.as_ptr();
        let slot = self.start_op(cid, Plan::Write(plan), data);
        let sqe = opcode::Write::new(types::Fd(fd), at, u32::try_from(len).expect("one piece"))
            .offset(offset)
            .build()
            .user_data((slot as u64) << PIECE_BITS);
        self.outstanding += 1;
        self.push(&sqe);
    }

    /// Takes a command slot for `plan`, whose drive I/O uses `buf`.
    fn start_op(&mut self, cid: u16, plan: Plan, buf: AlignedBuf) -> usize {
        let pieces = plan.len().div_ceil(PIECE_BYTES).max(1);
        assert!(pieces <= 64, "MDTS bounds a command");
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        assert!(self.ops[slot].is_none(), "command slot {slot} in use");
        self.ops[slot] = Some(Op {
            cid,
            plan,
            buf,
            pieces,
            done: 0,
            sent: 0,
            pending: pieces,
            failed: None,
        });
        slot
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

    /// Takes in the drive reads that finished, sends what is ready in one write; returns the
    /// RECV's result if it completed.
    fn reap(&mut self) -> Option<i32> {
        let mut received = None;
        for cqe in self.ring.completion() {
            if cqe.user_data() == RECV {
                received = Some(cqe.result());
                continue;
            }
            let slot = (cqe.user_data() >> PIECE_BITS) as usize;
            let piece = (cqe.user_data() & ((1 << PIECE_BITS) - 1)) as usize;
            self.outstanding -= 1;
            let op = self.ops[slot]
                .as_mut()
                .expect("completion of an idle read slot");
            op.pending -= 1;
            let range = op.piece_range(piece);
            let result = match cqe.result() {
                n if n >= 0 && n as usize == range.len() => Ok(()),
                n if n >= 0 => {
                    // Short transfer (should not happen inside the device): do the piece
                    // again, whole, through the device itself.
                    let at = op.plan.offset() + range.start as u64;
                    match &op.plan {
                        Plan::Read(p) => p.ns.dev.read_at(&mut op.buf[range], at),
                        Plan::Write(p) => p.ns.dev.write_at(&op.buf[range], at),
                    }
                }
                e => Err(io::Error::from_raw_os_error(-e)),
            };
            match result {
                Ok(()) => op.done |= 1 << piece,
                Err(e) => {
                    op.failed.get_or_insert(e);
                }
            }
            if !self.ready.contains(&slot) {
                self.ready.push(slot);
            }
        }
        if !self.ready.is_empty() {
            self.answer();
        }
        received
    }

    /// Sends, for every command that moved, its pieces that are next in order, and its
    /// completion once it is whole or once every piece of a failed one is back.
    fn answer(&mut self) {
        let mut sends: Vec<(usize, std::ops::Range<usize>, Option<Status>)> = Vec::new();
        let mut finished = Vec::new();
        for &slot in &self.ready {
            let op = self.ops[slot].as_mut().expect("ready slot holds a command");
            if op.failed.is_some() {
                if op.pending == 0 {
                    let e = op.failed.take().expect("checked");
                    let status = op.plan.done(Err(e));
                    sends.push((slot, 0..0, Some(status)));
                    finished.push(slot);
                }
                continue;
            }
            if matches!(op.plan, Plan::Write(_)) {
                // A write is answered with a response capsule, no data.
                sends.push((slot, 0..0, Some(op.plan.done(Ok(())))));
                op.sent = op.pieces;
                finished.push(slot);
                continue;
            }
            while op.sent < op.pieces && op.is_done(op.sent) {
                let last = op.sent + 1 == op.pieces;
                let status = last.then(|| op.plan.done(Ok(())));
                sends.push((slot, op.piece_range(op.sent), status));
                op.sent += 1;
            }
            if op.sent == op.pieces {
                finished.push(slot);
            }
        }
        self.ready.clear();
        // Free the command slots before the host can see the completions and reuse them.
        self.inflight.fetch_sub(finished.len(), Ordering::SeqCst);
        {
            let pieces: Vec<(u16, u32, &[u8], Option<Status>)> = sends
                .iter()
                .map(|(slot, range, status)| {
                    let op = self.ops[*slot]
                        .as_ref()
                        .expect("ready slot holds a command");
                    let offset = u32::try_from(range.start).expect("MDTS bounds a read");
                    (op.cid, offset, &op.buf[range.clone()], *status)
                })
                .collect();
            self.writer.respond_read_pieces(&pieces);
        }
        for slot in finished {
            let op = self.ops[slot]
                .take()
                .expect("finished slot holds a command");
            self.free_slots.push(slot);
            if matches!(op.plan, Plan::Read(_)) {
                self.put_buf(op.buf);
            }
        }
    }

    /// Large buffers come from the process-wide pool, sized for every connection's reads
    /// in flight together (a connection's own few megabytes ran out as soon as a host kept
    /// several large reads in flight on it, and each fresh buffer's huge page was zeroed by
    /// the kernel when the drive first wrote into it: 12 % of all CPU time while four
    /// readers streamed through an NSD server); small ones stay here, without a lock.
    fn take_buf(&mut self, len: usize) -> AlignedBuf {
        if len >= super::buffers::POOLED_MIN_BYTES {
            return super::buffers::take(len);
        }
        self.pool
            .get_mut(&len)
            .and_then(Vec::pop)
            .unwrap_or_else(|| AlignedBuf::for_io(len))
    }

    fn put_buf(&mut self, buf: AlignedBuf) {
        let len = buf.len();
        if len >= super::buffers::POOLED_MIN_BYTES {
            super::buffers::give(buf);
            return;
        }
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
                if cqe.user_data() != RECV {
                    self.outstanding -= 1;
                }
            }
        }
    }
}
