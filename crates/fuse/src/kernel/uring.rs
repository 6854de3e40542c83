//! FUSE-over-io_uring (Linux 6.14+): the kernel keeps one request queue per possible CPU
//! and hands a request issued on CPU n to a free ring entry of queue n. Every entry here is
//! owned by its own thread, pinned to that CPU, with its own small io_uring: the thread
//! that serves a request runs on the CPU that issued it, so a round trip needs no wake-up
//! of another CPU (on a VM an idle vCPU costs a HLT exit and an IPI, tens of microseconds).
//!
//! An entry is a header buffer (`struct fuse_uring_req_header`: the in/out header, the
//! per-opcode header, `fuse_uring_ent_in_out`) and a payload buffer of `max_write` bytes,
//! registered with `FUSE_IO_URING_CMD_REGISTER`. The kernel completes the command when it
//! has put a request into the buffers; the thread answers it in the same buffers (the out
//! header in `in_out`, the reply body in the payload, its length in `payload_sz`) and
//! sends `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which delivers the reply and waits for the
//! next request. When the connection ends (unmount, abort) the kernel completes pending
//! commands with an error and the threads exit; when the process dies, closing the rings
//! cancels them.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::abi;
use super::reply::Reply;
use super::request;
use super::session::Shared;

/// Ring threads per CPU queue, each owning one ring entry. The file system's calls block
/// on drive I/O and log commits (fsync, O_DIRECT writes, reads that miss the page cache)
/// and an entry is busy for the whole call, so a queue with one entry would stall every
/// later request issued on that CPU behind one slow request. Four per CPU keeps as many
/// requests in flight per CPU as the classic loop's default four threads had in total,
/// at 4 × 1 MiB of payload buffer per CPU. `TESSERA_FUSE_RING_THREADS` overrides it.
pub(crate) const RING_THREADS_PER_QUEUE: usize = 4;
/// Ring threads per mount at most, so a machine with many possible CPUs does not get
/// hundreds of threads and buffers; the per-queue count shrinks to fit, but never below
/// one, since the kernel uses the rings only once every queue has an entry.
const RING_THREADS_MAX: usize = 128;

/// `enum fuse_uring_cmd`.
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, `fuse_uring_ent_in_out`.
const HEADER_BYTES: usize = 288;
const IN_OUT_OFFSET: usize = 0;
const OP_IN_OFFSET: usize = 128;
const ENT_COMMIT_ID_OFFSET: usize = 256 + 8;
const ENT_PAYLOAD_SZ_OFFSET: usize = 256 + 16;
/// Submission entries per thread's ring: one command is in flight at a time.
const SQ_ENTRIES: u32 = 2;

const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);

/// Number of kernel queues: one per possible CPU (`num_possible_cpus()`), qid = CPU.
fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let count: usize = text
        .trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|range| match range.split_once('-') {
            Some((a, b)) => match (a.parse::<usize>(), b.parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 1,
            },
            None => 1,
        })
        .sum();
    count.max(1)
}

fn threads_per_queue(queues: usize) -> usize {
    let wanted = std::env::var("TESSERA_FUSE_RING_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(RING_THREADS_PER_QUEUE);
    wanted.min(RING_THREADS_MAX / queues).max(1)
}

fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks nothing, so check first.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: set is a valid cpu_set_t of the size given.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An SQE128 carrying `FUSE_IO_URING_CMD_*` for queue `qid`.
fn uring_cmd(
    dev: RawFd,
    cmd_op: u32,
    qid: u16,
    commit_id: u64,
    iov: *const libc::iovec,
) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 padding[6]; }
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(dev), cmd_op)
        .cmd(cmd)
        .addr(Some(iov as u64))
        .build();
    with_len(sqe, 2)
}

/// Sets `sqe->len`, which `UringCmd80` leaves zero; fuse wants the iovec count there.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is #[repr(C)] (struct io_uring_sqe, [u8; 64]), 128 bytes, built
    // from zeroed memory, so every byte is initialized; `len` is the u32 at offset 24 of
    // struct io_uring_sqe, and any value is valid there.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// One ring entry and the ring its thread submits on.
struct RingEntry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: RawFd,
    qid: u16,
    /// The kernel writes these buffers while a command is pending, so they are reached
    /// only through raw pointers, and only between a completion and the next submission.
    header: *mut u8,
    payload: *mut u8,
    payload_bytes: usize,
    iov: Box<[libc::iovec; 2]>,
    /// A completion that arrived together with the REGISTER submission.
    early: Option<i32>,
    _header_mem: Box<[u64]>,
    _payload_mem: Vec<u8>,
}

impl RingEntry {
    fn new(dev: RawFd, qid: u16, payload_bytes: usize) -> io::Result<RingEntry> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(SQ_ENTRIES)
            .or_else(|_| IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(SQ_ENTRIES))?;
        let mut header_mem = vec![0u64; HEADER_BYTES / 8].into_boxed_slice();
        let mut payload_mem = vec![0u8; payload_bytes];
        let header = header_mem.as_mut_ptr().cast::<u8>();
        let payload = payload_mem.as_mut_ptr();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                iov_base: payload.cast(),
                iov_len: payload_bytes,
            },
        ]);
        Ok(RingEntry {
            ring,
            dev,
            qid,
            header,
            payload,
            payload_bytes,
            iov,
            early: None,
            _header_mem: header_mem,
            _payload_mem: payload_mem,
        })
    }

    /// Submits REGISTER; an error the kernel reports at once (io_uring disabled, bad
    /// buffers, connection gone) is returned.
    fn register(&mut self) -> io::Result<()> {
        let sqe = uring_cmd(
            self.dev,
            FUSE_IO_URING_CMD_REGISTER,
            self.qid,
            0,
            self.iov.as_ptr(),
        );
        // SAFETY: the iovecs and the buffers they name live as long as self, which
        // outlives the ring (declared first, dropped first).
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("submission queue full"))?;
        self.ring.submit()?;
        if let Some(cqe) = self.ring.completion().next() {
            if cqe.result() < 0 {
                return Err(io::Error::from_raw_os_error(-cqe.result()));
            }
            // A request already: serve() starts with it.
            self.early = Some(cqe.result());
        }
        Ok(())
    }

    /// Serves requests until the kernel ends the connection.
    fn serve(&mut self, shared: &Shared) {
        let mut scratch = Vec::with_capacity(4096);
        loop {
            let result = match self.early.take() {
                Some(r) => r,
                None => {
                    match self.ring.submit_and_wait(1) {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                        Err(e) => {
                            tracing::error!("FUSE ring {}: io_uring_enter: {e}", self.qid);
                            return;
                        }
                    }
                    let Some(cqe) = self.ring.completion().next() else {
                        continue;
                    };
                    cqe.result()
                }
            };
            if result < 0 {
                let e = -result;
                // ENOTCONN, ECONNABORTED, ECANCELED: the connection ended.
                if ![
                    libc::ENOTCONN,
                    libc::ECONNABORTED,
                    libc::ECANCELED,
                    libc::ENODEV,
                ]
                .contains(&e)
                {
                    tracing::error!(
                        "FUSE ring {}: {}",
                        self.qid,
                        io::Error::from_raw_os_error(e)
                    );
                }
                return;
            }
            let commit_id = self.answer(shared, &mut scratch);
            let sqe = uring_cmd(
                self.dev,
                FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                self.qid,
                commit_id,
                self.iov.as_ptr(),
            );
            // SAFETY: as in register(); the SQ has room because one command is in flight
            // at a time and its completion has been consumed.
            unsafe { self.ring.submission().push(&sqe) }.expect("ring has a free SQE");
        }
    }

    /// Serves the request in the buffers and writes the reply there; returns the commit id.
    fn answer(&mut self, shared: &Shared, scratch: &mut Vec<u8>) -> u64 {
        // SAFETY: the kernel completed the command, so it no longer writes the buffers
        // until the next submission; the slices are dropped before that.
        let header = unsafe { std::slice::from_raw_parts_mut(self.header, HEADER_BYTES) };
        let read_u64 = |b: &[u8], o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let commit_id = read_u64(header, ENT_COMMIT_ID_OFFSET);
        let payload_sz = u32::from_ne_bytes(
            header[ENT_PAYLOAD_SZ_OFFSET..ENT_PAYLOAD_SZ_OFFSET + 4]
                .try_into()
                .unwrap(),
        ) as usize;
        let answer = {
            let payload = unsafe {
                std::slice::from_raw_parts(self.payload, payload_sz.min(self.payload_bytes))
            };
            let parsed = request::parse_parts(
                &header[IN_OUT_OFFSET..OP_IN_OFFSET],
                &header[OP_IN_OFFSET..OP_IN_OFFSET + 128],
                payload,
            );
            shared.serve_parsed(parsed)
        };
        // Every request from a ring must be committed, even one that wants no reply or
        // could not be parsed, or its entry would be lost; the commit id is its unique.
        let reply = answer.map_or(Reply::Error(libc::EIO), |(_, r)| r);
        let (mut error, mut body) = reply.encode(scratch);
        if body.len() > self.payload_bytes {
            tracing::error!(
                "FUSE reply of {} bytes exceeds the ring payload",
                body.len()
            );
            (error, body) = (-libc::EIO, &[]);
        }
        // SAFETY: as above; the payload slice of the request is no longer alive.
        let payload = unsafe { std::slice::from_raw_parts_mut(self.payload, body.len()) };
        payload.copy_from_slice(body);
        header[..abi::OUT_HEADER_BYTES].copy_from_slice(&abi::out_header(
            commit_id,
            error,
            body.len(),
        ));
        header[ENT_PAYLOAD_SZ_OFFSET..ENT_PAYLOAD_SZ_OFFSET + 4]
            .copy_from_slice(&(body.len() as u32).to_ne_bytes());
        commit_id
    }
}

enum Status {
    Prepared(io::Result<()>),
    Registered(io::Result<()>),
}

/// Ring threads that have set up their rings and buffers and wait for the word to
/// register (which the kernel accepts only after INIT is answered).
pub(crate) struct Rings {
    threads: Vec<JoinHandle<()>>,
    go: Vec<mpsc::Sender<bool>>,
    status: mpsc::Receiver<(usize, Status)>,
}

impl Rings {
    /// Starts the ring threads; fails, leaving nothing behind, if any cannot set up.
    pub(crate) fn prepare(
        dev: &Arc<OwnedFd>,
        shared: &Arc<Shared>,
        max_write: u32,
    ) -> io::Result<Rings> {
        let queues = possible_cpus();
        let per_queue = threads_per_queue(queues);
        // The kernel wants room for max_write and max_pages of data; a page more is slack.
        let payload_bytes = max_write as usize + 4096;
        let (status_tx, status) = mpsc::channel();
        let mut rings = Rings {
            threads: Vec::new(),
            go: Vec::new(),
            status,
        };
        for qid in 0..queues {
            for i in 0..per_queue {
                let (go_tx, go_rx) = mpsc::channel();
                let (dev, shared, status_tx) =
                    (Arc::clone(dev), Arc::clone(shared), status_tx.clone());
                let index = rings.threads.len();
                let spawned = std::thread::Builder::new()
                    .name(format!("fuse-ring-{qid}.{i}"))
                    .spawn(move || {
                        ring_thread(&dev, qid, payload_bytes, &shared, index, &status_tx, &go_rx);
                    });
                match spawned {
                    Ok(t) => {
                        rings.threads.push(t);
                        rings.go.push(go_tx);
                    }
                    Err(e) => {
                        rings.stop();
                        return Err(e);
                    }
                }
            }
        }
        let mut first_error = None;
        for _ in 0..rings.threads.len() {
            match rings.status.recv() {
                Ok((_, Status::Prepared(Ok(())))) => {}
                Ok((i, Status::Prepared(Err(e)))) => {
                    first_error.get_or_insert(io::Error::new(e.kind(), format!("ring {i}: {e}")));
                }
                Ok((_, Status::Registered(_))) | Err(_) => {
                    first_error.get_or_insert(io::Error::other("ring thread lost"));
                }
            }
        }
        if let Some(e) = first_error {
            rings.stop();
            return Err(e);
        }
        tracing::info!(
            "FUSE: {queues} io_uring queues x {per_queue} threads, {} KiB payload each",
            payload_bytes >> 10
        );
        Ok(rings)
    }

    fn stop(self) {
        for g in &self.go {
            let _ = g.send(false);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Lets every thread register its entry; returns the threads and whether all did.
    pub(crate) fn register(self) -> (Vec<JoinHandle<()>>, bool) {
        for g in &self.go {
            let _ = g.send(true);
        }
        let mut all = true;
        for _ in 0..self.threads.len() {
            match self.status.recv() {
                Ok((_, Status::Registered(Ok(())))) => {}
                Ok((i, Status::Registered(Err(e)))) => {
                    tracing::warn!("FUSE ring thread {i}: REGISTER: {e}");
                    all = false;
                }
                _ => all = false,
            }
        }
        (self.threads, all)
    }
}

fn ring_thread(
    dev: &Arc<OwnedFd>,
    qid: usize,
    payload_bytes: usize,
    shared: &Shared,
    index: usize,
    status: &mpsc::Sender<(usize, Status)>,
    go: &mpsc::Receiver<bool>,
) {
    if let Err(e) = pin_to_cpu(qid) {
        // An offline CPU: the queue still needs an entry, served from anywhere.
        tracing::debug!("FUSE ring {qid}: cannot pin to CPU {qid}: {e}");
    }
    let qid16 = u16::try_from(qid).expect("fewer than 65536 CPUs");
    let mut entry = match RingEntry::new(dev.as_raw_fd(), qid16, payload_bytes) {
        Ok(e) => {
            let _ = status.send((index, Status::Prepared(Ok(()))));
            e
        }
        Err(e) => {
            let _ = status.send((index, Status::Prepared(Err(e))));
            return;
        }
    };
    if go.recv() != Ok(true) {
        return;
    }
    let registered = entry.register();
    let ok = registered.is_ok();
    let _ = status.send((index, Status::Registered(registered)));
    if ok {
        entry.serve(shared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_carries_cmd_and_iovec_count() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = uring_cmd(
            7,
            FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
            3,
            0xabcd,
            iov.as_ptr(),
        );
        let raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(raw[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7);
        // cmd_op shares the `off` union.
        assert_eq!(u32::from_ne_bytes(raw[8..12].try_into().unwrap()), 2);
        assert_eq!(
            u64::from_ne_bytes(raw[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        // The command area starts at byte 48.
        assert_eq!(u64::from_ne_bytes(raw[56..64].try_into().unwrap()), 0xabcd);
        assert_eq!(u16::from_ne_bytes(raw[64..66].try_into().unwrap()), 3);
    }

    #[test]
    fn possible_cpus_is_positive() {
        assert!(possible_cpus() >= 1);
        assert!(threads_per_queue(1000) >= 1);
    }
}
