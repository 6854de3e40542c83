//! Completion queues for reads submitted without waiting
//! ([`super::namespace::MultipathNamespace::submit_read`]).
//!
//! The blocking calls (`read_at`, `write_at`) keep one command in flight per thread; a
//! caller that wants many in flight from one thread, as fio does with io_uring, submits
//! reads with a [`Completions`] and reaps them from it. The queue's reader thread posts a
//! command here when its data and status are in, instead of waking a waiting thread, so
//! the commands completed by one socket read cost one wake-up between them.
//!
//! A command that never completes (a controller that is alive but lost it) is found by
//! [`Completions::wait`]: past the command timeout it kills the command's queue, whose
//! teardown then posts every command still on it with a transport error, as the blocking
//! path does.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tessera_drive::AlignedBuf;

use super::error::HostError;
use super::path::Path;
use super::queue::Queue;
use crate::wire::Cqe;

/// One finished read: the caller's tag, with its buffer and outcome inside. Pass it to
/// [`super::namespace::MultipathNamespace::finish_read`], which retries path errors.
pub struct Completed {
    /// The caller's tag.
    pub tag: u64,
    buf: Option<AlignedBuf>,
    outcome: Option<Outcome>,
}

enum Outcome {
    /// The command's completion; its slot stays taken until this is consumed or dropped,
    /// so the CID is not reused before the caller has seen it.
    Command {
        result: Result<Cqe, HostError>,
        queue: Arc<Queue>,
        cid: u16,
        submitted: Instant,
        path: Option<Arc<Path>>,
    },
    /// Done on the blocking path because no path could take it when submitted.
    Done(io::Result<()>),
}

/// What [`Completed::take`] hands to `finish_read`.
pub(crate) enum Finished {
    Command {
        result: Result<Cqe, HostError>,
        addr: SocketAddr,
        submitted: Instant,
        path: Option<Arc<Path>>,
    },
    Done(io::Result<()>),
}

impl Completed {
    pub(crate) fn command(
        tag: u64,
        buf: AlignedBuf,
        result: Result<Cqe, HostError>,
        queue: Arc<Queue>,
        cid: u16,
        submitted: Instant,
        path: Option<Arc<Path>>,
    ) -> Completed {
        Completed {
            tag,
            buf: Some(buf),
            outcome: Some(Outcome::Command {
                result,
                queue,
                cid,
                submitted,
                path,
            }),
        }
    }

    /// The buffer and the outcome; frees the command's slot.
    pub(crate) fn take(mut self) -> (AlignedBuf, Finished) {
        let buf = self.buf.take().expect("taken once");
        let finished = match self.outcome.take().expect("taken once") {
            Outcome::Command {
                result,
                queue,
                cid,
                submitted,
                path,
            } => {
                queue.recycle(cid);
                Finished::Command {
                    result,
                    addr: queue.addr(),
                    submitted,
                    path,
                }
            }
            Outcome::Done(r) => Finished::Done(r),
        };
        (buf, finished)
    }

    fn key(&self) -> Option<(usize, u16)> {
        match &self.outcome {
            Some(Outcome::Command { queue, cid, .. }) => Some((Arc::as_ptr(queue) as usize, *cid)),
            _ => None,
        }
    }
}

impl Drop for Completed {
    fn drop(&mut self) {
        if let Some(Outcome::Command { queue, cid, .. }) = self.outcome.take() {
            queue.recycle(cid);
        }
    }
}

/// Commands in flight by (queue address, CID): when each was submitted, and its queue.
type InFlight = HashMap<(usize, u16), (Instant, Arc<Queue>)>;

/// Where submitted reads are posted as they complete.
pub struct Completions {
    done: Mutex<VecDeque<Completed>>,
    cv: Condvar,
    /// Commands in flight: (queue address, CID) to the time they were submitted and their
    /// queue, for the timeout.
    outstanding: Mutex<InFlight>,
    timeout: Duration,
}

impl Completions {
    /// A completion queue whose commands are given `timeout` to complete.
    #[must_use]
    pub fn new(timeout: Duration) -> Arc<Completions> {
        Arc::new(Completions {
            done: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            outstanding: Mutex::new(HashMap::new()),
            timeout,
        })
    }

    /// Commands submitted and not yet reaped by [`Completions::wait`].
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.outstanding.lock().len() + self.done.lock().len()
    }

    pub(crate) fn submitted(&self, queue: &Arc<Queue>, cid: u16) {
        let key = (Arc::as_ptr(queue) as usize, cid);
        self.outstanding
            .lock()
            .insert(key, (Instant::now(), Arc::clone(queue)));
    }

    /// A submitted command that never reached the wire (its queue died first).
    pub(crate) fn forget(&self, queue: &Arc<Queue>, cid: u16) {
        let key = (Arc::as_ptr(queue) as usize, cid);
        self.outstanding.lock().remove(&key);
    }

    /// Called by the queue's reader thread or its teardown.
    pub(crate) fn post(&self, c: Completed) {
        if let Some(key) = c.key() {
            self.outstanding.lock().remove(&key);
        }
        self.done.lock().push_back(c);
        self.cv.notify_one();
    }

    /// Posts a read that was done on the blocking path.
    pub(crate) fn post_finished(&self, tag: u64, buf: AlignedBuf, result: io::Result<()>) {
        self.post(Completed {
            tag,
            buf: Some(buf),
            outcome: Some(Outcome::Done(result)),
        });
    }

    /// Waits up to `limit` for at least one completion and returns all there are. Kills
    /// the queue of any command older than the timeout.
    pub fn wait(&self, limit: Duration) -> Vec<Completed> {
        let deadline = Instant::now() + limit;
        let mut done = self.done.lock();
        loop {
            if !done.is_empty() {
                return done.drain(..).collect();
            }
            let now = Instant::now();
            if now >= deadline {
                return Vec::new();
            }
            let step = (deadline - now).min(Duration::from_secs(1));
            if self.cv.wait_for(&mut done, step).timed_out() {
                drop(done);
                self.kill_stuck();
                done = self.done.lock();
            }
        }
    }

    fn kill_stuck(&self) {
        let stuck: Vec<Arc<Queue>> = self
            .outstanding
            .lock()
            .values()
            .filter(|(at, _)| at.elapsed() > self.timeout)
            .map(|(_, q)| Arc::clone(q))
            .collect();
        for q in stuck {
            tracing::warn!(addr = %q.addr(), "a submitted read timed out after {:?}; resetting the connection", self.timeout);
            q.kill("a submitted read timed out");
        }
    }
}
