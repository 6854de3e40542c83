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
//! The data of a read of `SENDER_MIN_BYTES` or more goes to the host from a sender thread
//! of the connection, fed in order by the ring thread: a 4 MiB answer takes a millisecond or
//! more to copy into the socket, and while the ring thread did that itself it neither
//! reaped the drive reads that finished nor read the host's next commands, so the drive's
//! queue ran low. Four sequential readers through an NSD server went from 0.58-0.65 of the
//! server's local reads to 0.71-0.75 with this and MDTS 4 MiB (bench/RESULTS.md). Smaller
//! reads are answered by the ring thread, where a hand-off would cost more than the copy.
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
//! Soundness: a buffer handed to the kernel (a read's [`SharedBuf`], kept in its [`Op`];
//! the caller's buffer of a `RECV`) stays alive until its completion is reaped: `RECV` is
//! waited for before [`Socket::read`] returns, and dropping the [`Engine`] waits for every
//! drive read still in flight. Should `io_uring_enter` fail for good while the kernel may
//! still own a buffer, the process aborts rather than free it. The sender thread touches
//! only pieces whose drive reads were reaped, and holds the buffer until it has sent them.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
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
/// Reads of at least this many bytes are sent by the connection's sender thread; smaller
/// ones are written by the ring thread itself, which costs less than a hand-off.
const SENDER_MIN_BYTES: usize = 512 << 10;
/// Large reads (`SENDER_MIN_BYTES` and up) of one connection at the drive at once; the
/// others wait their turn, oldest first. A drive given several large reads at once serves
/// them side by side and finishes them together, so their data then crossed the network
/// with nothing at the drive, and the next ones were read with nothing on the network.
/// One at a time per connection, a read's transfer overlaps the next one's drive read:
/// through an NSD server with two queues, four fio readers went from 1934-2031 to
/// 2431-2653 MiB/s and one reader from 1318-1817 to 2258-2535 (local 2118-2846; two at a
/// time: 2491-2619 and 1535-2023; bench/RESULTS.md). A 4 MiB read is itself many drive
/// requests in flight, and a drive server with several queues or hosts has one at the
/// drive for each.
const LARGE_READS_AT_DRIVE: usize = 1;
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
            // Reads waiting for their turn at the drive go out from `recv`.
            Some(engine) if engine.outstanding > 0 || !engine.waiting.is_empty() => {
                engine.recv(&self.stream, buf)
            }
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
    buf: Arc<SharedBuf>,
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

    /// Whether its data goes to the host through the connection's sender thread.
    fn offloaded(&self) -> bool {
        matches!(self.plan, Plan::Read(_)) && self.plan.len() >= SENDER_MIN_BYTES
    }
}

/// A command's buffer, shared by the ring (the kernel fills pieces of it) and the sender
/// thread (which copies finished pieces into the socket): each piece is written by the
/// kernel before it is handed to the sender, and never after.
struct SharedBuf {
    /// Owns the memory; touched again only once the buffer is no longer shared.
    buf: UnsafeCell<AlignedBuf>,
    base: *mut u8,
    len: usize,
}

// SAFETY: the ring thread and the sender touch disjoint pieces (above); the buffer itself
// (its heap block) does not move.
unsafe impl Sync for SharedBuf {}
unsafe impl Send for SharedBuf {}

impl SharedBuf {
    fn new(mut buf: AlignedBuf) -> Arc<SharedBuf> {
        let (base, len) = (buf.as_mut_ptr(), buf.len());
        Arc::new(SharedBuf {
            buf: UnsafeCell::new(buf),
            base,
            len,
        })
    }

    fn base(&self) -> *mut u8 {
        self.base
    }

    fn len(&self) -> usize {
        self.len
    }

    /// # Safety
    /// Nobody writes `range` while the slice lives (the kernel is done with it).
    unsafe fn part(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(range.end <= self.len());
        std::slice::from_raw_parts(self.base.add(range.start), range.len())
    }

    /// # Safety
    /// Nobody else touches `range` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part_mut(&self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(range.end <= self.len());
        std::slice::from_raw_parts_mut(self.base.add(range.start), range.len())
    }

    fn into_inner(this: Arc<SharedBuf>) -> Option<AlignedBuf> {
        Arc::try_unwrap(this)
            .ok()
            .map(|mut b| std::mem::replace(b.buf.get_mut(), AlignedBuf::for_io(0)))
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        // The shared pool keeps large buffers only; small ones are freed.
        super::buffers::give(std::mem::replace(self.buf.get_mut(), AlignedBuf::for_io(0)));
    }
}

/// Pieces handed to the sender thread: `(cid, offset, buffer, range, completion)`.
type Offload = Vec<(
    u16,
    u32,
    Arc<SharedBuf>,
    std::ops::Range<usize>,
    Option<Status>,
)>;

/// The sender thread: writes the pieces the ring hands over, in the order they came, as
/// few writes as possible (everything queued meanwhile goes out together). It ends when
/// the ring is dropped; a write blocked on a host that stopped reading fails once the
/// connection shuts its socket.
fn sender_loop(writer: Arc<ConnWriter>, rx: mpsc::Receiver<Offload>) {
    /// Closes the connection if the sender dies by panic: the reads it holds would never be
    /// answered, and the host fails them at once on a closed connection (and retries them
    /// on another path) instead of waiting out its command timeout.
    struct CloseOnPanic<'a>(&'a ConnWriter);
    impl Drop for CloseOnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                tracing::error!("the connection's sender thread panicked; closing the connection");
                self.0.shutdown();
            }
        }
    }
    let _close_on_panic = CloseOnPanic(&writer);
    while let Ok(mut batch) = rx.recv() {
        while let Ok(more) = rx.try_recv() {
            batch.extend(more);
        }
        let pieces: Vec<(u16, u32, &[u8], Option<Status>)> = batch
            .iter()
            // SAFETY: the ring hands over only pieces the kernel has finished with.
            .map(|(cid, offset, buf, range, status)| {
                (*cid, *offset, unsafe { buf.part(range.clone()) }, *status)
            })
            .collect();
        writer.respond_read_pieces(&pieces);
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
    /// The sender thread's queue, once a large read needed it.
    sender: Option<mpsc::Sender<Offload>>,
    /// Large reads waiting for their turn at the drive, oldest first
    /// ([`LARGE_READS_AT_DRIVE`]).
    waiting: std::collections::VecDeque<(u16, ReadPlan)>,
    /// Large reads with pieces at the drive.
    large_at_drive: usize,
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
            sender: None,
            waiting: std::collections::VecDeque::new(),
            large_at_drive: 0,
        })
    }

    /// Queues a checked read of `plan.ns`, whose namespace has a direct descriptor; the
    /// caller has counted it in `inflight`. It reaches the kernel with the next socket read.
    pub fn submit_read(&mut self, cid: u16, plan: ReadPlan) {
        if plan.len >= SENDER_MIN_BYTES {
            if self.large_at_drive >= LARGE_READS_AT_DRIVE {
                self.waiting.push_back((cid, plan));
                return;
            }
            self.large_at_drive += 1;
        }
        let fd = plan
            .ns
            .direct
            .as_ref()
            .expect("only namespaces with a direct descriptor are read here")
            .as_raw_fd();
        let buf = SharedBuf::new(self.take_buf(plan.len));
        assert!(buf.len() >= plan.len);
        let base = buf.base();
        let (offset, len) = (plan.offset, plan.len);
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
        let data = SharedBuf::new(data);
        let at = data.base();
        let slot = self.start_op(cid, Plan::Write(plan), data);
        let sqe = opcode::Write::new(types::Fd(fd), at, u32::try_from(len).expect("one piece"))
            .offset(offset)
            .build()
            .user_data((slot as u64) << PIECE_BITS);
        self.outstanding += 1;
        self.push(&sqe);
    }

    /// Takes a command slot for `plan`, whose drive I/O uses `buf`.
    fn start_op(&mut self, cid: u16, plan: Plan, buf: Arc<SharedBuf>) -> usize {
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
            while self.large_at_drive < LARGE_READS_AT_DRIVE {
                let Some((cid, plan)) = self.waiting.pop_front() else {
                    break;
                };
                self.submit_read(cid, plan);
            }
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
            if op.pending == 0 && matches!(op.plan, Plan::Read(_)) && op.offloaded() {
                self.large_at_drive -= 1;
            }
            let range = op.piece_range(piece);
            let result = match cqe.result() {
                n if n >= 0 && n as usize == range.len() => Ok(()),
                n if n >= 0 => {
                    // Short transfer (should not happen inside the device): do the piece
                    // again, whole, through the device itself.
                    let at = op.plan.offset() + range.start as u64;
                    // SAFETY: the kernel is done with this piece and it was not sent yet.
                    let part = unsafe { op.buf.part_mut(range) };
                    match &op.plan {
                        Plan::Read(p) => p.ns.dev.read_at(part, at),
                        Plan::Write(p) => p.ns.dev.write_at(part, at),
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
            let mut offload: Offload = Vec::new();
            let mut pieces: Vec<(u16, u32, &[u8], Option<Status>)> = Vec::new();
            for (slot, range, status) in &sends {
                let op = self.ops[*slot]
                    .as_ref()
                    .expect("ready slot holds a command");
                let offset = u32::try_from(range.start).expect("MDTS bounds a read");
                if op.offloaded() {
                    offload.push((op.cid, offset, op.buf.clone(), range.clone(), *status));
                } else {
                    // SAFETY: the kernel is done with every piece that is sent.
                    pieces.push((
                        op.cid,
                        offset,
                        unsafe { op.buf.part(range.clone()) },
                        *status,
                    ));
                }
            }
            if !pieces.is_empty() {
                self.writer.respond_read_pieces(&pieces);
            }
            if !offload.is_empty() {
                let writer = &self.writer;
                let sender = self.sender.get_or_insert_with(|| {
                    let (tx, rx) = mpsc::channel();
                    let writer = writer.clone();
                    std::thread::Builder::new()
                        .name("nvmet-send".into())
                        .spawn(move || sender_loop(writer, rx))
                        .expect("spawn the connection's sender thread");
                    tx
                });
                // Fails only once the sender died by panic, and its guard has closed the
                // connection already (sender_loop).
                let _ = sender.send(offload);
            }
        }
        for slot in finished {
            let op = self.ops[slot]
                .take()
                .expect("finished slot holds a command");
            self.free_slots.push(slot);
            if matches!(op.plan, Plan::Read(_)) {
                if let Some(buf) = SharedBuf::into_inner(op.buf) {
                    self.put_buf(buf);
                }
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
