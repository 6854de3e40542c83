//! A namespace reached over every path of its subsystem, presented as a `BlockDevice`.
//!
//! Every command goes through [`MultipathNamespace::with_path`]: pick a path
//! ([`select_path`]: live OPTIMIZED paths round robin, else NON-OPTIMIZED), run the command
//! there, and on a path error try another path without telling the caller (block reads and
//! writes are idempotent). When no path is usable the command waits for one, up to
//! `ctrl_loss_tmo` (or the shorter `fast_io_fail_tmo`, taking the longest over the paths)
//! after the namespace lost its last usable path, then fails with a message that names the
//! paths and what to check. Past `fast_io_fail_tmo` new commands fail at once until a path
//! is usable again; the paths keep reconnecting until `ctrl_loss_tmo`. Errors the drive itself returns (LBA out of
//! range, media errors, Reservation Conflict) fail at once and carry their [`Status`].
//!
//! # Flush
//!
//! NVMe Flush commits the namespace's volatile write cache, whichever controller wrote to
//! it, so one Flush on any path would do for a standard target. The host still sends one
//! Flush on each path that carried writes since the last flush, because a target may keep
//! per-association write state (a drive server buffering per connection, say) and the
//! `BlockDevice` contract is stable storage for every completed write. A path that died
//! since is covered by a Flush on another live path: its completed writes reached the same
//! namespace.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tessera_drive::{check_io, AlignedBuf, BlockDevice};

use super::completion::{Completed, Completions, Finished};
use super::controller::Controller;
use super::error::{status_kind, status_name, HostError, NvmeStatusError};
use super::path::{Notifier, Path};
use super::policy::{select_path, split_request, AnaPathState, Candidate};
use super::queue::{Dispatch, Queue, Xfer};
use super::PathState;
use crate::wire::command::{
    DatasetManagement, DsmRange, IoCommand, ReadWrite, WriteZeroes, DSM_RANGES_MAX,
};
use crate::wire::reservation::{
    encode_release_data, AcquireAction, KeyPair, RegisterAction, ReleaseAction, ReservationAcquire,
    ReservationRegister, ReservationRelease, ReservationReport, ReservationStatus, ReservationType,
};
use crate::wire::Status;

/// Most paths one namespace may have (bounds the per-command selection work).
pub const PATHS_PER_NAMESPACE_MAX: usize = 32;
/// How long queued I/O sleeps between looks at the paths when nothing notifies it.
const QUEUED_RECHECK: Duration = Duration::from_millis(100);
/// Backoff after every usable path failed the same command once, doubling to the max.
const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(5);
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Reservation Report buffer: header plus 63 extended registrants.
const RESERVATION_REPORT_BYTES: usize = 4096;

/// A path of this namespace, and whether it carried writes since the last flush.
#[derive(Debug)]
pub(crate) struct NsPath {
    pub(crate) path: Arc<Path>,
    dirty: AtomicBool,
}

/// One namespace over all its paths.
pub struct MultipathNamespace {
    name: String,
    subnqn: String,
    nsid: u32,
    size_bytes: u64,
    lba_bytes: u32,
    nguid: [u8; 16],
    eui64: [u8; 8],
    uuid: Option<[u8; 16]>,
    paths: RwLock<Vec<Arc<NsPath>>>,
    max_transfer: AtomicU32,
    ctrl_loss_tmo_ms: AtomicU64,
    /// How long commands wait without a usable path: the longest `io_fail_tmo` of the
    /// paths (`fast_io_fail_tmo`, else `ctrl_loss_tmo`).
    io_fail_tmo_ms: AtomicU64,
    rr: AtomicUsize,
    unreachable_advice: Arc<str>,
    /// A write without FUA completed (on any path, also one gone since) after the last
    /// flush began: a flush with this clear has nothing to make durable and sends nothing.
    unflushed: AtomicBool,
    unusable_since: Mutex<Option<Instant>>,
    /// Set while `unusable_since` is, so the I/O path skips its lock.
    unusable: AtomicBool,
    removed: AtomicBool,
    /// Some controller of the namespace reported Dataset Management in ONCS, so freed
    /// space can be deallocated (`BlockDevice::discard`).
    dsm: AtomicBool,
    /// Every path's Identify Namespace says deallocated blocks read as zeros (DLFEAT).
    deallocate_zeroes: AtomicBool,
    notifier: Arc<Notifier>,
}

impl std::fmt::Debug for MultipathNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultipathNamespace")
            .field("name", &self.name)
            .field("subnqn", &self.subnqn)
            .field("nsid", &self.nsid)
            .finish_non_exhaustive()
    }
}

/// The identifiers a namespace is created with.
pub(crate) struct NamespaceIdentity {
    pub(crate) name: String,
    pub(crate) subnqn: String,
    pub(crate) nsid: u32,
    pub(crate) size_bytes: u64,
    pub(crate) lba_bytes: u32,
    pub(crate) nguid: [u8; 16],
    pub(crate) eui64: [u8; 8],
    pub(crate) uuid: Option<[u8; 16]>,
    /// What to check when no path answers (see `Host::with_unreachable_advice`).
    pub(crate) unreachable_advice: Arc<str>,
}

impl MultipathNamespace {
    pub(crate) fn new(id: NamespaceIdentity, notifier: Arc<Notifier>) -> Self {
        MultipathNamespace {
            name: id.name,
            subnqn: id.subnqn,
            nsid: id.nsid,
            size_bytes: id.size_bytes,
            lba_bytes: id.lba_bytes,
            nguid: id.nguid,
            eui64: id.eui64,
            uuid: id.uuid,
            unreachable_advice: id.unreachable_advice,
            paths: RwLock::new(Vec::new()),
            max_transfer: AtomicU32::new(u32::MAX),
            ctrl_loss_tmo_ms: AtomicU64::new(0),
            io_fail_tmo_ms: AtomicU64::new(0),
            rr: AtomicUsize::new(0),
            unflushed: AtomicBool::new(false),
            unusable_since: Mutex::new(None),
            unusable: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            dsm: AtomicBool::new(false),
            deallocate_zeroes: AtomicBool::new(true),
            notifier,
        }
    }

    /// Local name, "nvme0n1".
    #[must_use]
    pub fn local_name(&self) -> &str {
        &self.name
    }

    /// The name that survives reconnects and restarts ("eui.<NGUID>"), unlike
    /// [`MultipathNamespace::local_name`], which counts subsystems in connection order.
    #[must_use]
    pub fn stable_name(&self) -> String {
        super::stable_namespace_name(&self.nguid, &self.eui64, &self.subnqn, self.nsid)
    }

    /// Subsystem NQN.
    #[must_use]
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    /// Namespace ID.
    #[must_use]
    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// Logical block size of the namespace (512 or 4096).
    #[must_use]
    pub fn lba_bytes(&self) -> u32 {
        self.lba_bytes
    }

    /// NGUID (zero when not reported).
    #[must_use]
    pub fn nguid(&self) -> [u8; 16] {
        self.nguid
    }

    /// EUI-64 (zero when not reported).
    #[must_use]
    pub fn eui64(&self) -> [u8; 8] {
        self.eui64
    }

    /// UUID, when reported.
    #[must_use]
    pub fn uuid(&self) -> Option<[u8; 16]> {
        self.uuid
    }

    /// Whether a path is connected now: I/O to a namespace without one waits for a path
    /// to come back (up to `fast_io_fail_tmo` or `ctrl_loss_tmo`).
    #[must_use]
    pub fn has_live_path(&self) -> bool {
        self.paths
            .read()
            .iter()
            .any(|p| p.path.state().0 == super::PathState::Live)
    }

    pub(crate) fn paths(&self) -> Vec<Arc<NsPath>> {
        self.paths.read().clone()
    }

    pub(crate) fn attach(
        &self,
        path: &Arc<Path>,
        max_transfer: u32,
        dsm: bool,
        deallocate_zeroes: bool,
    ) {
        let mut paths = self.paths.write();
        assert!(
            paths.len() < PATHS_PER_NAMESPACE_MAX,
            "path limit checked by the caller"
        );
        paths.push(Arc::new(NsPath {
            path: Arc::clone(path),
            dirty: AtomicBool::new(false),
        }));
        self.max_transfer.fetch_min(max_transfer, Ordering::Relaxed);
        if dsm {
            self.dsm.store(true, Ordering::Relaxed);
        }
        if !deallocate_zeroes {
            self.deallocate_zeroes.store(false, Ordering::Relaxed);
        }
        let tmo_ms = u64::try_from(path.opts.ctrl_loss_tmo.as_millis()).unwrap_or(u64::MAX);
        self.ctrl_loss_tmo_ms.fetch_max(tmo_ms, Ordering::Relaxed);
        let fail_ms = u64::try_from(path.opts.io_fail_tmo().as_millis()).unwrap_or(u64::MAX);
        self.io_fail_tmo_ms.fetch_max(fail_ms, Ordering::Relaxed);
        drop(paths);
        self.notifier.notify();
    }

    pub(crate) fn detach(&self, path_id: u64) {
        self.paths.write().retain(|p| p.path.id != path_id);
        self.notifier.notify();
    }

    pub(crate) fn path_count(&self) -> usize {
        self.paths.read().len()
    }

    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Ordering::SeqCst);
        self.notifier.notify();
    }

    fn describe(&self) -> String {
        format!("{} ({}, nsid {})", self.name, self.subnqn, self.nsid)
    }

    /// Picks a live, usable path that is not in `tried`.
    fn pick(&self, tried: &[u64]) -> Option<(Arc<NsPath>, Arc<Controller>)> {
        let paths = self.paths.read();
        let mut candidates = [Candidate {
            live: false,
            ana: AnaPathState::Inaccessible,
            excluded: true,
        }; PATHS_PER_NAMESPACE_MAX];
        let mut ctrls: [Option<Arc<Controller>>; PATHS_PER_NAMESPACE_MAX] = Default::default();
        let count = paths.len().min(PATHS_PER_NAMESPACE_MAX);
        for (i, p) in paths.iter().take(count).enumerate() {
            ctrls[i] = p.path.controller();
            candidates[i] = Candidate {
                live: ctrls[i].is_some(),
                ana: p.path.ana_state(self.nsid),
                excluded: tried.contains(&p.path.id),
            };
        }
        let rr = self.rr.fetch_add(1, Ordering::Relaxed);
        let index = select_path(&candidates[..count], rr)?;
        let ctrl = ctrls[index].take()?;
        Some((Arc::clone(&paths[index]), ctrl))
    }

    /// Runs `op` on a usable path, retrying path errors on other paths and queueing while
    /// no path is usable (see the module documentation). `bytes` is (read, written) for
    /// the counters.
    fn with_path<T>(
        &self,
        what: &str,
        bytes: (u64, u64),
        op: impl FnMut(&Controller) -> Result<T, HostError>,
    ) -> io::Result<T> {
        self.with_path_leaving(what, bytes, bytes.1 > 0, op)
    }

    /// [`Self::with_path`]; `unflushed` says whether the command leaves data a flush must
    /// make durable (a write without FUA).
    fn with_path_leaving<T>(
        &self,
        what: &str,
        bytes: (u64, u64),
        unflushed: bool,
        mut op: impl FnMut(&Controller) -> Result<T, HostError>,
    ) -> io::Result<T> {
        let mut tried: Vec<u64> = Vec::new();
        let mut backoff = RETRY_BACKOFF_MIN;
        let mut first_error: Option<Instant> = None;
        loop {
            if self.removed.load(Ordering::SeqCst) {
                return Err(self.removed_error());
            }
            let Some((nspath, ctrl)) = self.pick(&tried).or_else(|| {
                let retry = !tried.is_empty();
                tried.clear();
                let pick = self.pick(&tried);
                if retry && pick.is_some() {
                    // Every usable path failed this command once: back off before going
                    // round again, so a flapping target is not hammered.
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
                }
                pick
            }) else {
                self.wait_for_path()?;
                continue;
            };
            let start = Instant::now();
            let path = &nspath.path;
            match op(&ctrl) {
                Ok(v) => {
                    path.counters.record(bytes.0, bytes.1, start.elapsed());
                    if unflushed {
                        nspath.dirty.store(true, Ordering::Release);
                        self.unflushed.store(true, Ordering::Release);
                    }
                    if self.unusable.load(Ordering::Relaxed) {
                        self.unusable.store(false, Ordering::Relaxed);
                        *self.unusable_since.lock() = None;
                    }
                    return Ok(v);
                }
                Err(e) if e.is_path_error() => {
                    path.counters.record_error(true);
                    tracing::warn!(ns = %self.name, path = %path.name, "{what}: {e}; retrying on another path");
                    self.after_path_error(&ctrl, path, &e);
                    let since = *first_error.get_or_insert_with(Instant::now);
                    if since.elapsed() > self.io_fail_tmo() {
                        return Err(self.io_error(what, e));
                    }
                    tried.push(path.id);
                }
                Err(e) => {
                    path.counters.record_error(false);
                    return Err(self.io_error(what, e));
                }
            }
        }
    }

    fn after_path_error(&self, ctrl: &Controller, path: &Path, e: &HostError) {
        if e.is_ana_error() {
            path.refresh_ana(ctrl);
        } else if matches!(e, HostError::Transport { .. } | HostError::Timeout { .. }) {
            // The queue is gone; the whole association is reset and reconnected.
            ctrl.kill(&e.to_string());
        }
    }

    fn ctrl_loss_tmo(&self) -> Duration {
        Duration::from_millis(self.ctrl_loss_tmo_ms.load(Ordering::Relaxed))
    }

    fn io_fail_tmo(&self) -> Duration {
        Duration::from_millis(self.io_fail_tmo_ms.load(Ordering::Relaxed))
    }

    /// Waits for a path to become usable; fails once `io_fail_tmo` (`fast_io_fail_tmo`, or
    /// `ctrl_loss_tmo`) has passed since the namespace lost its last usable path, or at once
    /// when no path is left at all.
    fn wait_for_path(&self) -> io::Result<()> {
        self.unusable.store(true, Ordering::Relaxed);
        // Counted from when the last path went down, not from this namespace's first
        // command after that (as Linux counts fast_io_fail_tmo per controller): a namespace
        // nobody used while its enclosure was away fails at once, not after another wait.
        let lost = self.last_path_lost();
        let since = {
            let mut since = self.unusable_since.lock();
            let first = since.unwrap_or_else(Instant::now);
            *since.insert(lost.map_or(first, |lost| lost.min(first)))
        };
        let tmo = self.io_fail_tmo();
        let deadline = super::policy::io_deadline(since, tmo);
        let now = Instant::now();
        if self.path_count() == 0 || now >= deadline {
            return Err(self.no_path_error(since, tmo));
        }
        self.notifier.wait(QUEUED_RECHECK.min(deadline - now));
        Ok(())
    }

    /// When the namespace lost its last path, if every path it has is down (reconnecting):
    /// the latest of their losses. `None` while a path is live (its ANA state may still
    /// keep I/O off it) or none is left.
    fn last_path_lost(&self) -> Option<Instant> {
        let paths = self.paths.read();
        let mut last: Option<Instant> = None;
        for p in paths.iter() {
            match p.path.state() {
                (PathState::Connecting, Some(lost)) => {
                    last = Some(last.map_or(lost, |l| l.max(lost)))
                }
                _ => return None,
            }
        }
        last
    }

    fn no_path_error(&self, since: Instant, tmo: Duration) -> io::Error {
        let paths = self.paths();
        let detail = if paths.is_empty() {
            "no paths left: every controller was removed after ctrl_loss_tmo or disconnected"
                .to_owned()
        } else {
            let list: Vec<String> = paths.iter().map(|p| self.describe_path(&p.path)).collect();
            format!("paths {}", list.join(", "))
        };
        let ctrl_loss = self.ctrl_loss_tmo();
        let (limit, then) = if tmo < ctrl_loss && !paths.is_empty() {
            (
                format!("fast_io_fail_tmo {} s", tmo.as_secs()),
                format!(
                    "I/O works again as soon as a path reconnects (they keep trying for up to \
                     ctrl_loss_tmo {} s)",
                    ctrl_loss.as_secs()
                ),
            )
        } else {
            (
                format!("ctrl_loss_tmo {} s", tmo.as_secs()),
                "then `tessera nvme connect` again".to_owned(),
            )
        };
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "no usable path to {} ({}, {detail}) for {} s ({limit}); \
                 {}; {then}",
                self.name,
                self.subnqn,
                since.elapsed().as_secs(),
                self.unreachable_advice,
            ),
        )
    }

    fn describe_path(&self, path: &Path) -> String {
        match path.state() {
            (PathState::Live, _) => {
                format!(
                    "{} live but ANA {}",
                    path.opts.addr,
                    path.ana_state(self.nsid)
                )
            }
            (PathState::Connecting, since) => format!(
                "{} down since {} s",
                path.opts.addr,
                since.map_or(0, |s| s.elapsed().as_secs())
            ),
            (PathState::Deleting, _) => format!("{} being removed", path.opts.addr),
        }
    }

    fn removed_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotConnected,
            format!(
                "{} was disconnected (`tessera nvme disconnect`); connect it again to use it",
                self.describe()
            ),
        )
    }

    fn io_error(&self, what: &str, e: HostError) -> io::Error {
        if e.is_path_error() {
            // A path error that outlasted `io_fail_tmo`: the drive cannot be reached, which
            // callers (a declustered array) must tell from a failing drive, so the kind says
            // so whatever the transport's own error was.
            let kind = if matches!(e, HostError::Timeout { .. }) {
                io::ErrorKind::TimedOut
            } else {
                io::ErrorKind::NotConnected
            };
            return io::Error::new(
                kind,
                format!(
                    "{}: {what} failed: no path answered within io_fail_tmo {} s (last: {e}); \
                     {}",
                    self.describe(),
                    self.io_fail_tmo().as_secs(),
                    self.unreachable_advice
                ),
            );
        }
        match e.status() {
            Some(status) => {
                let message = format!(
                    "{}: {what} failed: {} ({e})",
                    self.describe(),
                    status_name(status)
                );
                io::Error::new(status_kind(status), NvmeStatusError { status, message })
            }
            None => io::Error::other(format!("{}: {what} failed: {e}", self.describe())),
        }
    }

    fn lba(&self, offset: u64) -> u64 {
        offset / u64::from(self.lba_bytes)
    }

    fn blocks(&self, len: usize) -> u32 {
        (len / self.lba_bytes as usize) as u32
    }

    fn max_transfer(&self) -> u32 {
        self.max_transfer.load(Ordering::Relaxed).max(4096)
    }

    /// Starts a read of `buf.len()` bytes at `offset` (within one transfer, see
    /// [`MultipathNamespace::max_read_submit`]) on a usable path and returns without
    /// waiting; it is posted to `cq` with `tag`. Every [`Completed`] must go through
    /// [`MultipathNamespace::finish_read`], which retries what failed on a path the way
    /// `read_at` does. When no path can take the read now, it is done at once with
    /// `read_at` (queueing for a path up to `ctrl_loss_tmo`) and posted as finished.
    ///
    /// # Errors
    /// A request outside the namespace or not in whole blocks; the buffer is dropped.
    pub fn submit_read(
        &self,
        buf: AlignedBuf,
        offset: u64,
        tag: u64,
        cq: &Arc<Completions>,
    ) -> io::Result<()> {
        self.submit(buf, offset, tag, cq, None)
    }

    /// A batch of submitted reads whose capsules leave together when the batch is
    /// dropped (or [`ReadBatch::submit`]), one system call per queue instead of one per
    /// read: for a caller that reaps several completions and starts as many reads again.
    #[must_use]
    pub fn read_batch<'a>(&'a self, cq: &'a Arc<Completions>) -> ReadBatch<'a> {
        ReadBatch {
            ns: self,
            cq,
            queues: Vec::new(),
        }
    }

    /// [`MultipathNamespace::submit_read`]; with `batch`, the capsule waits in its queue's
    /// sender and the queue is noted for the batch's flush.
    fn submit(
        &self,
        mut buf: AlignedBuf,
        offset: u64,
        tag: u64,
        cq: &Arc<Completions>,
        batch: Option<&mut Vec<Arc<Queue>>>,
    ) -> io::Result<()> {
        check_io(self, &buf, offset)?;
        if buf.len() > self.max_read_submit() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a submitted read is at most {} bytes, not {}",
                    self.describe(),
                    self.max_read_submit(),
                    buf.len()
                ),
            ));
        }
        let sqe = self.rw_sqe(
            crate::wire::command::io_opcode::READ,
            offset,
            buf.len(),
            false,
        )?;
        if !self.removed.load(Ordering::SeqCst) {
            if let Some((nspath, ctrl)) = self.pick(&[]) {
                if let Ok(queue) = ctrl.io_queue() {
                    let len = buf.len();
                    let path = Some(Arc::clone(&nspath.path));
                    let dispatch = if batch.is_some() {
                        Dispatch::Deferred
                    } else {
                        Dispatch::Now
                    };
                    match queue.submit_read(sqe, buf, len, (cq, tag, path), dispatch) {
                        Ok(()) => {
                            if let Some(queues) = batch {
                                if !queues.iter().any(|q| Arc::ptr_eq(q, queue)) {
                                    queues.push(Arc::clone(queue));
                                }
                            }
                            return Ok(());
                        }
                        Err(not_sent) => {
                            // No error: the queue is full, and this read waits its turn on
                            // the blocking path.
                            if let Some(e) = &not_sent.error {
                                self.after_path_error(&ctrl, &nspath.path, e);
                            }
                            buf = not_sent.buf;
                        }
                    }
                }
            }
        }
        // No path took it: the blocking path waits for one, retries, or fails.
        let result = self.read_at(&mut buf, offset);
        cq.post_finished(tag, buf, result);
        Ok(())
    }

    /// The largest read [`MultipathNamespace::submit_read`] takes: one command.
    #[must_use]
    pub fn max_read_submit(&self) -> usize {
        self.max_transfer() as usize
    }

    /// The outcome of a submitted read: its buffer with the data, or the error after the
    /// retries `read_at` makes (other paths, queueing up to `ctrl_loss_tmo`).
    ///
    /// # Errors
    /// As [`BlockDevice::read_at`].
    pub fn finish_read(&self, c: Completed, offset: u64) -> io::Result<AlignedBuf> {
        let (mut buf, finished) = c.take();
        let (error, path) = match finished {
            Finished::Done(r) => return r.map(|()| buf),
            Finished::Command {
                result,
                addr,
                submitted,
                path,
            } => match result {
                Ok(cqe) if cqe.status.is_success() => {
                    if let Some(path) = &path {
                        path.counters
                            .record(buf.len() as u64, 0, submitted.elapsed());
                    }
                    return Ok(buf);
                }
                Ok(cqe) => (
                    HostError::Status {
                        addr,
                        command: "Read",
                        status: cqe.status,
                    },
                    path,
                ),
                Err(e) => (e, path),
            },
        };
        if let Some(path) = &path {
            path.counters.record_error(error.is_path_error());
        }
        if !error.is_path_error() {
            return Err(self.io_error("Read", error));
        }
        if let Some(path) = &path {
            if let Some(ctrl) = path.controller() {
                self.after_path_error(&ctrl, path, &error);
            }
        }
        tracing::warn!(ns = %self.name, "submitted Read: {error}; retrying on any path");
        self.read_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn rw_sqe(
        &self,
        opcode: u8,
        offset: u64,
        len: usize,
        fua: bool,
    ) -> io::Result<crate::wire::Sqe> {
        let rw = ReadWrite::new(self.nsid, self.lba(offset), self.blocks(len), fua)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(rw.to_sqe(opcode, 0))
    }
}

impl BlockDevice for MultipathNamespace {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        for (at, start, len) in split_request(offset, buf.len(), self.max_transfer()) {
            let sqe = self.rw_sqe(crate::wire::command::io_opcode::READ, at, len, false)?;
            let piece = &mut buf[start..start + len];
            self.with_path("Read", (len as u64, 0), |ctrl| {
                ctrl.io_command(sqe, Xfer::FromController(piece), "Read")
            })?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_pieces(buf, offset, false)
    }

    /// Writes with the FUA bit: the target completes each only once it is on stable
    /// storage, so no Flush (another round trip) follows, and the paths stay clean.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_pieces(buf, offset, true)
    }

    /// One Flush per path that carried writes since the last flush (see the module
    /// documentation); a dead path's share goes to any live path. Nothing when no write
    /// without FUA completed since the last flush began.
    fn flush(&self) -> io::Result<()> {
        if !self.unflushed.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let result = self.flush_paths();
        if result.is_err() {
            // Not durable: the next flush must try again.
            self.unflushed.store(true, Ordering::Release);
        }
        result
    }

    /// Dataset Management Deallocate, on whichever path is usable (like a write, it fails
    /// over to another path and waits for one within `io_fail_tmo`).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        tessera_drive::check_discard(self, offset, len)?;
        if !self.can_discard() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: no controller of {} supports Dataset Management (deallocate)",
                    self.name, self.subnqn
                ),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.deallocate(offset, len)
    }

    fn can_discard(&self) -> bool {
        self.dsm.load(Ordering::Relaxed)
    }

    fn discard_zeroes(&self) -> bool {
        self.can_discard() && self.deallocate_zeroes.load(Ordering::Relaxed)
    }
}

impl MultipathNamespace {
    /// One Flush per path that carried writes since the last flush; a dead path's share
    /// goes to any live path.
    fn flush_paths(&self) -> io::Result<()> {
        let dirty: Vec<Arc<NsPath>> = self
            .paths()
            .into_iter()
            .filter(|p| p.dirty.swap(false, Ordering::AcqRel))
            .collect();
        let mut need_any = dirty.is_empty();
        for nspath in &dirty {
            let result = match nspath.path.controller() {
                Some(ctrl) => ctrl.flush(self.nsid),
                None => {
                    need_any = true;
                    continue;
                }
            };
            match result {
                Ok(()) => nspath.path.counters.record(0, 0, Duration::ZERO),
                Err(e) if e.is_path_error() => {
                    nspath.path.counters.record_error(true);
                    need_any = true;
                }
                Err(e) => {
                    nspath.dirty.store(true, Ordering::Release);
                    return Err(self.io_error("Flush", e));
                }
            }
        }
        if need_any {
            let nsid = self.nsid;
            self.with_path("Flush", (0, 0), |ctrl| ctrl.flush(nsid))?;
        }
        Ok(())
    }

    fn write_pieces(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let what = if fua { "Write (FUA)" } else { "Write" };
        for (at, start, len) in split_request(offset, buf.len(), self.max_transfer()) {
            let sqe = self.rw_sqe(crate::wire::command::io_opcode::WRITE, at, len, fua)?;
            let piece = &buf[start..start + len];
            self.with_path_leaving(what, (0, len as u64), !fua, |ctrl| {
                ctrl.io_command(sqe, Xfer::ToController(piece), what)
            })?;
        }
        Ok(())
    }

    /// Write Zeroes over `len` bytes at `offset` (4 KiB aligned); with `deallocate` the
    /// blocks may also be unmapped.
    ///
    /// # Errors
    /// As [`BlockDevice::write_at`].
    pub fn write_zeroes(&self, offset: u64, len: u64, deallocate: bool) -> io::Result<()> {
        self.check_range(offset, len)?;
        // 65536 blocks per command (NLB is 16 bits).
        let max_bytes = 65_536 * u64::from(self.lba_bytes);
        let mut at = offset;
        while at < offset + len {
            let piece = max_bytes.min(offset + len - at);
            let cmd = WriteZeroes {
                nsid: self.nsid,
                slba: self.lba(at),
                nlb: (piece / u64::from(self.lba_bytes) - 1) as u16,
                fua: false,
                deallocate,
            };
            let sqe = IoCommand::WriteZeroes(cmd).to_sqe(0);
            self.with_path("Write Zeroes", (0, piece), |ctrl| {
                ctrl.io_command(sqe, Xfer::None, "Write Zeroes")
            })?;
            at += piece;
        }
        Ok(())
    }

    /// Dataset Management Deallocate (TRIM) of `len` bytes at `offset` (4 KiB aligned).
    ///
    /// # Errors
    /// As [`BlockDevice::write_at`].
    pub fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        let lba = u64::from(self.lba_bytes);
        let range_max = u64::from(u32::MAX) / lba * lba;
        let mut ranges = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let piece = range_max.min(offset + len - at);
            ranges.push(DsmRange {
                context_attributes: 0,
                nlb: (piece / lba) as u32,
                slba: self.lba(at),
            });
            at += piece;
        }
        for chunk in ranges.chunks(DSM_RANGES_MAX) {
            let data = DsmRange::encode_list(chunk);
            let cmd = DatasetManagement {
                nsid: self.nsid,
                nr: (chunk.len() - 1) as u8,
                idr: false,
                idw: false,
                deallocate: true,
            };
            let sqe = IoCommand::DatasetManagement(cmd).to_sqe(0);
            self.with_path("Deallocate", (0, 0), |ctrl| {
                ctrl.io_command(sqe, Xfer::ToController(&data), "Dataset Management")
            })?;
        }
        Ok(())
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let aligned = offset.is_multiple_of(4096) && len.is_multiple_of(4096) && len > 0;
        if !aligned
            || offset
                .checked_add(len)
                .is_none_or(|end| end > self.size_bytes)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: range at {offset} length {len} is unaligned, empty or past the end \
                     ({} bytes)",
                    self.name, self.size_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Reservation Register: `Register` a new key `nrkey`, `Unregister` `crkey`, or
    /// `Replace` `crkey` by `nrkey` (`iekey` ignores the current key). The registration
    /// belongs to the host ID, so it covers every path. `persist` changes whether the
    /// namespace's registrations and reservation survive a power loss (a restart of a
    /// drive server): `Some(true)` asks for it (CPTPL 11b; Invalid Field from a namespace
    /// that cannot), `Some(false)` turns it off (10b), `None` leaves it.
    ///
    /// # Errors
    /// NVMe errors carry their status ([`super::nvme_status`]).
    pub fn reservation_register(
        &self,
        action: RegisterAction,
        crkey: u64,
        nrkey: u64,
        iekey: bool,
        persist: Option<bool>,
    ) -> io::Result<()> {
        let cmd = ReservationRegister {
            nsid: self.nsid,
            action,
            iekey,
            cptpl: match persist {
                None => 0b00,
                Some(false) => 0b10,
                Some(true) => 0b11,
            },
        };
        let data = KeyPair {
            crkey,
            second: nrkey,
        }
        .encode();
        let sqe = IoCommand::ReservationRegister(cmd).to_sqe(0);
        self.with_path("Reservation Register", (0, 0), |ctrl| {
            ctrl.io_command(sqe, Xfer::ToController(&data), "Reservation Register")
        })
        .map(|_| ())
    }

    /// Reservation Acquire: `Acquire` a reservation of `rtype` with key `crkey`, or
    /// `Preempt` (`PreemptAndAbort`) the registrant holding `prkey`.
    ///
    /// A preempt retried after a path error may find the preempted key already gone and
    /// fail with Reservation Conflict although the first attempt succeeded; a caller that
    /// fences checks the outcome with [`MultipathNamespace::reservation_report`].
    ///
    /// # Errors
    /// NVMe errors carry their status ([`super::nvme_status`]).
    pub fn reservation_acquire(
        &self,
        action: AcquireAction,
        rtype: ReservationType,
        crkey: u64,
        prkey: u64,
    ) -> io::Result<()> {
        let cmd = ReservationAcquire {
            nsid: self.nsid,
            action,
            iekey: false,
            rtype,
        };
        let data = KeyPair {
            crkey,
            second: prkey,
        }
        .encode();
        let sqe = IoCommand::ReservationAcquire(cmd).to_sqe(0);
        self.with_path("Reservation Acquire", (0, 0), |ctrl| {
            ctrl.io_command(sqe, Xfer::ToController(&data), "Reservation Acquire")
        })
        .map(|_| ())
    }

    /// Reservation Release: `Release` the reservation of `rtype` held with `crkey`, or
    /// `Clear` every registration.
    ///
    /// # Errors
    /// NVMe errors carry their status ([`super::nvme_status`]).
    pub fn reservation_release(
        &self,
        action: ReleaseAction,
        rtype: ReservationType,
        crkey: u64,
    ) -> io::Result<()> {
        let cmd = ReservationRelease {
            nsid: self.nsid,
            action,
            iekey: false,
            rtype: Some(rtype),
        };
        let data = encode_release_data(crkey);
        let sqe = IoCommand::ReservationRelease(cmd).to_sqe(0);
        self.with_path("Reservation Release", (0, 0), |ctrl| {
            ctrl.io_command(sqe, Xfer::ToController(&data), "Reservation Release")
        })
        .map(|_| ())
    }

    /// Reservation Report with 128-bit host IDs (the extended format Fabrics requires).
    ///
    /// # Errors
    /// NVMe errors carry their status, a malformed report is `InvalidData`.
    pub fn reservation_report(&self) -> io::Result<ReservationStatus> {
        let cmd = ReservationReport {
            nsid: self.nsid,
            numd: (RESERVATION_REPORT_BYTES / 4 - 1) as u32,
            eds: true,
        };
        let sqe = IoCommand::ReservationReport(cmd).to_sqe(0);
        let mut buf = vec![0u8; RESERVATION_REPORT_BYTES];
        self.with_path("Reservation Report", (0, 0), |ctrl| {
            ctrl.io_command(sqe, Xfer::FromController(&mut buf), "Reservation Report")
        })?;
        ReservationStatus::decode(&buf, true)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", self.name)))
    }

    /// Whether `err` (from this namespace) is a Reservation Conflict.
    #[must_use]
    pub fn is_reservation_conflict(err: &io::Error) -> bool {
        super::nvme_status(err).is_some_and(|s| s.code() == Status::RESERVATION_CONFLICT.code())
    }
}

/// Reads started together ([`MultipathNamespace::read_batch`]): each is queued at once,
/// and their capsules are sent when the batch is submitted or dropped.
pub struct ReadBatch<'a> {
    ns: &'a MultipathNamespace,
    cq: &'a Arc<Completions>,
    /// Queues holding deferred capsules of this batch.
    queues: Vec<Arc<Queue>>,
}

impl ReadBatch<'_> {
    /// Adds a read, as [`MultipathNamespace::submit_read`] but sent with the batch.
    ///
    /// # Errors
    /// As [`MultipathNamespace::submit_read`]; the reads added before stay in the batch.
    pub fn read(&mut self, buf: AlignedBuf, offset: u64, tag: u64) -> io::Result<()> {
        self.ns
            .submit(buf, offset, tag, self.cq, Some(&mut self.queues))
    }

    /// Sends the batch's capsules.
    pub fn submit(self) {}
}

impl Drop for ReadBatch<'_> {
    fn drop(&mut self) {
        for queue in self.queues.drain(..) {
            queue.flush_deferred();
        }
    }
}
