//! The sending half of one queue's connection, shared by every thread with a command on
//! the queue.
//!
//! Sends combine: a thread whose PDU is small (a command capsule, with in-capsule data at
//! most [`COMBINE_MAX_BYTES`]) appends it to a pending buffer; if no other thread is
//! writing, it becomes the writer and sends what piled up, again and again until nothing
//! is pending. A thread that finds a writer busy returns at once: its PDU goes out with the
//! writer's next system call. With many threads each keeping one command in flight (how
//! vdisks and the file system drive a namespace), a handful of sends carry a burst of
//! commands, and on the controller's side one receive finds them all, instead of a system
//! call and a wake-up per command on both ends.
//!
//! Large PDUs (H2CData of a write) are not copied: their sender waits until no one is
//! writing, sends what is pending, then its own PDU straight from the caller's buffer,
//! keeping the order in which the PDUs were handed over.
//!
//! A thread that submits several commands at once (a batch of reads,
//! [`super::namespace::ReadBatch`]) defers them: each is appended to the pending buffer
//! and nothing is sent until [`Sender::flush`], so the batch leaves in one system call, as
//! a kernel block plug sends a burst of requests to a drive in one doorbell.
//!
//! A failed write is returned to the thread that made it, which kills the queue; PDUs that
//! other threads had left pending are lost with the connection, and the queue's teardown
//! fails their commands, as it does every command in flight on a dead connection.

use std::io::{self, Write};
use std::net::TcpStream;

use parking_lot::{Condvar, Mutex};

use crate::wire::pdu::{write_pdu, EncodeError};
use crate::wire::{DigestConfig, PduHeader};

/// PDUs with at most this much data are copied into the pending buffer and may combine.
pub const COMBINE_MAX_BYTES: usize = 16 << 10;

/// Pending bytes beyond which a small PDU's sender waits for the writer instead of adding
/// more: the bound on the buffer, far above what a full queue of capsules needs.
const PENDING_MAX_BYTES: usize = 1 << 20;

pub struct Sender {
    stream: TcpStream,
    digests: DigestConfig,
    state: Mutex<State>,
    idle: Condvar,
}

struct State {
    /// Encoded PDUs waiting for the writer.
    pending: Vec<u8>,
    /// A thread is writing; it sends `pending` before it lets go.
    busy: bool,
    /// The buffer the writer sent last, kept for its capacity.
    spare: Vec<u8>,
}

impl Sender {
    pub fn new(stream: TcpStream, digests: DigestConfig) -> Sender {
        Sender {
            stream,
            digests,
            state: Mutex::new(State {
                pending: Vec::new(),
                busy: false,
                spare: Vec::new(),
            }),
            idle: Condvar::new(),
        }
    }

    /// Sends one PDU, or leaves it to the thread that is writing.
    pub fn send(&self, header: &PduHeader, data: &[u8]) -> io::Result<()> {
        let small = data.len() <= COMBINE_MAX_BYTES;
        let mut st = self.state.lock();
        if small {
            while st.busy && st.pending.len() >= PENDING_MAX_BYTES {
                self.idle.wait(&mut st);
            }
            write_pdu(&mut st.pending, header, data, &self.digests).map_err(encode_error)?;
            if st.busy {
                return Ok(());
            }
        } else {
            while st.busy {
                self.idle.wait(&mut st);
            }
        }
        st.busy = true;
        let spare = std::mem::take(&mut st.spare);
        let mut batch = std::mem::replace(&mut st.pending, spare);
        drop(st);
        let mut result = (&self.stream).write_all(&batch);
        if result.is_ok() && !small {
            result =
                write_pdu(&mut &self.stream, header, data, &self.digests).map_err(encode_error);
        }
        batch.clear();
        self.drain(batch, result)
    }

    /// Appends a small PDU (at most [`COMBINE_MAX_BYTES`] of data) to the pending buffer
    /// without sending it: the caller calls [`Sender::flush`] once its batch is queued.
    /// Past the pending bound the batch so far is sent first.
    pub fn defer(&self, header: &PduHeader, data: &[u8]) -> io::Result<()> {
        assert!(
            data.len() <= COMBINE_MAX_BYTES,
            "only small PDUs are deferred"
        );
        let mut st = self.state.lock();
        while st.busy && st.pending.len() >= PENDING_MAX_BYTES {
            self.idle.wait(&mut st);
        }
        if !st.busy && st.pending.len() >= PENDING_MAX_BYTES {
            drop(st);
            self.flush()?;
            st = self.state.lock();
        }
        write_pdu(&mut st.pending, header, data, &self.digests).map_err(encode_error)
    }

    /// Sends what is pending, unless a writer is busy (it sends it before letting go).
    pub fn flush(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.busy || st.pending.is_empty() {
            return Ok(());
        }
        st.busy = true;
        let spare = std::mem::take(&mut st.spare);
        let batch = std::mem::replace(&mut st.pending, spare);
        drop(st);
        self.drain(batch, Ok(()))
    }

    /// As the writer, with `batch` still to send unless `result` already failed: sends it
    /// and then whatever other threads left pending meanwhile, until nothing is.
    fn drain(&self, mut batch: Vec<u8>, mut result: io::Result<()>) -> io::Result<()> {
        loop {
            if result.is_ok() && !batch.is_empty() {
                result = (&self.stream).write_all(&batch);
            }
            batch.clear();
            let mut st = self.state.lock();
            if result.is_err() || st.pending.is_empty() {
                st.busy = false;
                st.spare = batch;
                drop(st);
                self.idle.notify_all();
                return result;
            }
            std::mem::swap(&mut st.pending, &mut batch);
        }
    }
}

fn encode_error(e: EncodeError) -> io::Error {
    match e {
        EncodeError::Io(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
    }
}
