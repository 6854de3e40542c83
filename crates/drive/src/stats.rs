//! I/O statistics of one drive as a layer above it: [`Counted`] wraps any [`BlockDevice`]
//! and counts what passes through (requests, bytes, errors, latencies) in [`IoStats`], for
//! the per-NSD metrics of a mounted file system, and can note each request in an
//! [`IoHistory`] shared by the drives of a node (`tessera diag --iohist`, as mmdiag's). A
//! few relaxed atomic additions, a clock read and, with a history, two short locks per
//! request (noting it in flight for `diag --waiters`, then in the history): nothing next
//! to the I/O itself.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::BlockDevice;

/// Upper bounds (inclusive) of the latency buckets, in nanoseconds: from NVMe's tens of
/// microseconds to a second; a last bucket holds what is slower.
pub const LATENCY_BUCKETS_NS: [u64; 12] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    100_000_000,
    300_000_000,
    1_000_000_000,
];

const BUCKETS: usize = LATENCY_BUCKETS_NS.len() + 1;

/// The bucket of `LATENCY_BUCKETS_NS` a latency falls in (the last one: above every bound).
pub fn latency_bucket(ns: u64) -> usize {
    LATENCY_BUCKETS_NS
        .iter()
        .position(|b| ns <= *b)
        .unwrap_or(BUCKETS - 1)
}

/// The kinds of request a drive serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    Read = 0,
    Write = 1,
    Flush = 2,
}

impl IoKind {
    pub const ALL: [IoKind; 3] = [IoKind::Read, IoKind::Write, IoKind::Flush];

    pub fn name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
        }
    }
}

#[derive(Debug, Default)]
struct KindStats {
    requests: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    sum_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// Counters of one drive, shared between the [`Counted`] layer and whoever reports them.
#[derive(Debug, Default)]
pub struct IoStats {
    kinds: [KindStats; 3],
}

/// A copy of one kind's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IoKindSnapshot {
    pub requests: u64,
    pub bytes: u64,
    pub errors: u64,
    pub sum_seconds: f64,
    /// Requests per bucket of `LATENCY_BUCKETS_NS` (not cumulative), the last above them.
    pub buckets: Vec<u64>,
}

impl IoStats {
    fn record(&self, kind: IoKind, bytes: u64, ns: u64, ok: bool) {
        let k = &self.kinds[kind as usize];
        k.requests.fetch_add(1, Relaxed);
        if ok {
            k.bytes.fetch_add(bytes, Relaxed);
        } else {
            k.errors.fetch_add(1, Relaxed);
        }
        k.sum_ns.fetch_add(ns, Relaxed);
        k.buckets[latency_bucket(ns)].fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self, kind: IoKind) -> IoKindSnapshot {
        let k = &self.kinds[kind as usize];
        IoKindSnapshot {
            requests: k.requests.load(Relaxed),
            bytes: k.bytes.load(Relaxed),
            errors: k.errors.load(Relaxed),
            sum_seconds: k.sum_ns.load(Relaxed) as f64 / 1e9,
            buckets: k.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        }
    }
}

/// One request in an [`IoHistory`].
#[derive(Clone, Debug, PartialEq)]
pub struct IoRecord {
    /// When it was issued, in nanoseconds since the Unix epoch.
    pub start_unix_nanos: u64,
    pub kind: IoKind,
    /// The drive's label in the history (an NSD name).
    pub device: Arc<str>,
    pub offset: u64,
    pub bytes: u64,
    pub latency_ns: u64,
    pub ok: bool,
    /// The node this request was made for, as its NSD server; `None` for this node's own.
    pub served_for: Option<Arc<str>>,
}

/// A request that has not completed yet (`tessera diag --waiters`).
#[derive(Clone, Debug, PartialEq)]
pub struct Waiter {
    pub waiting: std::time::Duration,
    pub kind: IoKind,
    pub device: Arc<str>,
    pub offset: u64,
    pub bytes: u64,
    pub served_for: Option<Arc<str>>,
}

struct Issued {
    started: Instant,
    kind: IoKind,
    device: Arc<str>,
    offset: u64,
    bytes: u64,
    served_for: Option<Arc<str>>,
}

/// A request noted by [`IoHistory::begin`]; [`IoHistory::end`] takes it back.
#[derive(Debug)]
pub struct HistoryTicket {
    slot: u64,
    started: Instant,
}

/// Now on the wall clock less `latency_ns`: when a request that took that long started.
fn started_unix_nanos(latency_ns: u64) -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .saturating_sub(latency_ns)
}

/// The last requests of several drives, oldest first, at most a fixed number, and those
/// still in flight.
pub struct IoHistory {
    capacity: usize,
    state: Mutex<HistoryState>,
}

struct HistoryState {
    ring: VecDeque<IoRecord>,
    /// Requests issued and not yet completed; a ticket is a slot here. Bounded by the
    /// requests the drives have in flight at once. Slots rather than a map: every request
    /// of every drive passes through here twice, under one lock.
    in_flight: Vec<Option<Issued>>,
    free_slots: Vec<usize>,
}

impl IoHistory {
    pub fn new(capacity: usize) -> IoHistory {
        IoHistory {
            capacity: capacity.max(1),
            state: Mutex::new(HistoryState {
                ring: VecDeque::with_capacity(capacity.max(1)),
                in_flight: Vec::new(),
                free_slots: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HistoryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a request as issued; `complete` with the ticket ends it.
    fn issue(&self, issued: Issued) -> u64 {
        let mut s = self.lock();
        let slot = match s.free_slots.pop() {
            Some(slot) => slot,
            None => {
                s.in_flight.push(None);
                s.in_flight.len() - 1
            }
        };
        s.in_flight[slot] = Some(issued);
        slot as u64
    }

    /// Ends the request of `ticket`: it leaves the requests in flight and joins the history
    /// (with the label it was issued under, moved rather than shared again).
    fn complete(&self, ticket: u64, start_unix_nanos: u64, latency_ns: u64, ok: bool) {
        let mut s = self.lock();
        let slot = usize::try_from(ticket).unwrap_or(usize::MAX);
        let Some(issued) = s.in_flight.get_mut(slot).and_then(Option::take) else {
            return;
        };
        s.free_slots.push(slot);
        if s.ring.len() == self.capacity {
            s.ring.pop_front();
        }
        s.ring.push_back(IoRecord {
            start_unix_nanos,
            kind: issued.kind,
            device: issued.device,
            offset: issued.offset,
            bytes: issued.bytes,
            latency_ns,
            ok,
            served_for: issued.served_for,
        });
    }

    /// Notes a request that does not pass through a [`Counted`] drive (an NSD server's
    /// drive I/O for another node) as in flight; [`IoHistory::end`] completes it.
    pub fn begin(
        &self,
        kind: IoKind,
        device: Arc<str>,
        offset: u64,
        bytes: u64,
        served_for: Option<Arc<str>>,
    ) -> HistoryTicket {
        let started = Instant::now();
        let slot = self.issue(Issued {
            started,
            kind,
            device,
            offset,
            bytes,
            served_for,
        });
        HistoryTicket { slot, started }
    }

    /// Completes the request of `ticket`: it joins the history.
    pub fn end(&self, ticket: HistoryTicket, ok: bool) {
        let latency_ns = u64::try_from(ticket.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.complete(ticket.slot, started_unix_nanos(latency_ns), latency_ns, ok);
    }

    /// The requests kept, oldest first.
    pub fn recent(&self) -> Vec<IoRecord> {
        self.lock().ring.iter().cloned().collect()
    }

    /// The requests in flight, the longest waiting first.
    pub fn waiters(&self) -> Vec<Waiter> {
        let mut waiters: Vec<Waiter> = self
            .lock()
            .in_flight
            .iter()
            .flatten()
            .map(|i| Waiter {
                waiting: i.started.elapsed(),
                kind: i.kind,
                device: Arc::clone(&i.device),
                offset: i.offset,
                bytes: i.bytes,
                served_for: i.served_for.clone(),
            })
            .collect();
        waiters.sort_by_key(|w| std::cmp::Reverse(w.waiting));
        waiters
    }
}

/// A drive whose requests are counted in an [`IoStats`] (and noted in an [`IoHistory`]).
pub struct Counted {
    inner: Arc<dyn BlockDevice>,
    stats: Arc<IoStats>,
    history: Option<(Arc<IoHistory>, Arc<str>)>,
}

impl Counted {
    pub fn wrap(inner: Arc<dyn BlockDevice>, stats: Arc<IoStats>) -> Arc<dyn BlockDevice> {
        Arc::new(Counted {
            inner,
            stats,
            history: None,
        })
    }

    /// Also notes every request in `history` under `label`.
    pub fn wrap_with_history(
        inner: Arc<dyn BlockDevice>,
        stats: Arc<IoStats>,
        history: Arc<IoHistory>,
        label: &str,
    ) -> Arc<dyn BlockDevice> {
        Arc::new(Counted {
            inner,
            stats,
            history: Some((history, Arc::from(label))),
        })
    }

    /// Starts the clock of one request and, with a history, notes it as in flight.
    fn issue(&self, kind: IoKind, offset: u64, bytes: u64) -> (Instant, Option<u64>) {
        let started = Instant::now();
        let ticket = self.history.as_ref().map(|(history, label)| {
            history.issue(Issued {
                started,
                kind,
                device: Arc::clone(label),
                offset,
                bytes,
                served_for: None,
            })
        });
        (started, ticket)
    }

    fn note(&self, kind: IoKind, bytes: u64, issued: (Instant, Option<u64>), ok: bool) {
        let (started, ticket) = issued;
        let latency_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.record(kind, bytes, latency_ns, ok);
        if let (Some((history, _)), Some(ticket)) = (&self.history, ticket) {
            // The wall clock only for the history: the start is now less the latency.
            history.complete(ticket, started_unix_nanos(latency_ns), latency_ns, ok);
        }
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("inner", &self.inner)
            .finish()
    }
}

impl BlockDevice for Counted {
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }

    fn can_discard(&self) -> bool {
        self.inner.can_discard()
    }

    fn discard_zeroes(&self) -> bool {
        self.inner.discard_zeroes()
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let issued = self.issue(IoKind::Read, offset, buf.len() as u64);
        let r = self.inner.read_at(buf, offset);
        self.note(IoKind::Read, buf.len() as u64, issued, r.is_ok());
        r
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let issued = self.issue(IoKind::Write, offset, buf.len() as u64);
        let r = self.inner.write_at(buf, offset);
        self.note(IoKind::Write, buf.len() as u64, issued, r.is_ok());
        r
    }

    /// Counted as a write: what it moves is a write's, and its latency includes the sync.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let issued = self.issue(IoKind::Write, offset, buf.len() as u64);
        let r = self.inner.write_fua(buf, offset);
        self.note(IoKind::Write, buf.len() as u64, issued, r.is_ok());
        r
    }

    fn flush(&self) -> io::Result<()> {
        let issued = self.issue(IoKind::Flush, 0, 0);
        let r = self.inner.flush();
        self.note(IoKind::Flush, 0, issued, r.is_ok());
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AlignedBuf, SECTOR_BYTES};

    /// A drive in memory, refusing requests past its end as a real one does.
    #[derive(Debug)]
    struct Memory(Mutex<Vec<u8>>);

    impl BlockDevice for Memory {
        fn name(&self) -> &str {
            "memory"
        }
        fn size_bytes(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let d = self.0.lock().unwrap();
            let range = offset as usize..offset as usize + buf.len();
            let src = d.get(range).ok_or(io::ErrorKind::UnexpectedEof)?;
            buf.copy_from_slice(src);
            Ok(())
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            let mut d = self.0.lock().unwrap();
            let range = offset as usize..offset as usize + buf.len();
            d.get_mut(range)
                .ok_or(io::ErrorKind::UnexpectedEof)?
                .copy_from_slice(buf);
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn requests_noted_by_hand_wait_then_join_the_history_with_whom_they_were_for() {
        let history = IoHistory::new(4);
        let ticket = history.begin(
            IoKind::Read,
            Arc::from("d1"),
            8192,
            4096,
            Some(Arc::from("node3")),
        );
        let waiting = history.waiters();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].served_for.as_deref(), Some("node3"));
        assert!(history.recent().is_empty());
        history.end(ticket, false);
        assert!(history.waiters().is_empty());
        let done = history.recent();
        assert_eq!(done.len(), 1);
        let r = &done[0];
        assert_eq!(
            (r.kind, &*r.device, r.offset, r.bytes, r.ok),
            (IoKind::Read, "d1", 8192, 4096, false)
        );
        assert_eq!(r.served_for.as_deref(), Some("node3"));
    }

    #[test]
    fn counts_requests_bytes_errors_and_latency() {
        let drive = Memory(Mutex::new(vec![0; 64 * SECTOR_BYTES as usize]));
        let stats = Arc::new(IoStats::default());
        let dev = Counted::wrap(Arc::new(drive), Arc::clone(&stats));
        let mut buf = AlignedBuf::zeroed(2 * SECTOR_BYTES as usize);
        dev.write_at(&buf, 0).unwrap();
        dev.write_at(&buf[..SECTOR_BYTES as usize], SECTOR_BYTES)
            .unwrap();
        dev.read_at(&mut buf, 0).unwrap();
        dev.flush().unwrap();
        // Past the end: refused, counted as an error without bytes.
        assert!(dev.read_at(&mut buf, 64 * SECTOR_BYTES).is_err());
        let w = stats.snapshot(IoKind::Write);
        assert_eq!((w.requests, w.bytes, w.errors), (2, 3 * SECTOR_BYTES, 0));
        assert_eq!(w.buckets.iter().sum::<u64>(), 2);
        let r = stats.snapshot(IoKind::Read);
        assert_eq!((r.requests, r.bytes, r.errors), (2, 2 * SECTOR_BYTES, 1));
        assert_eq!(stats.snapshot(IoKind::Flush).requests, 1);
        assert!(w.sum_seconds > 0.0 && w.sum_seconds < 10.0);
    }

    /// A drive whose writes wait until the test lets them go.
    #[derive(Debug)]
    struct Gated(Mutex<std::sync::mpsc::Receiver<()>>);

    impl BlockDevice for Gated {
        fn name(&self) -> &str {
            "gated"
        }
        fn size_bytes(&self) -> u64 {
            1 << 20
        }
        fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<()> {
            Ok(())
        }
        fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
            let _ = self.0.lock().unwrap().recv();
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_request_in_flight_is_a_waiter_until_it_completes() {
        let (go, gate) = std::sync::mpsc::channel();
        let history = Arc::new(IoHistory::new(8));
        let dev = Counted::wrap_with_history(
            Arc::new(Gated(Mutex::new(gate))),
            Arc::new(IoStats::default()),
            Arc::clone(&history),
            "nsdG",
        );
        let writer = std::thread::spawn(move || {
            let buf = AlignedBuf::zeroed(SECTOR_BYTES as usize);
            dev.write_at(&buf, 4 * SECTOR_BYTES).unwrap();
        });
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let waiters = loop {
            let w = history.waiters();
            if !w.is_empty() || Instant::now() > deadline {
                break w;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let seen: Vec<(&str, IoKind, u64, u64)> = waiters
            .iter()
            .map(|w| (&*w.device, w.kind, w.offset, w.bytes))
            .collect();
        assert_eq!(
            seen,
            [("nsdG", IoKind::Write, 4 * SECTOR_BYTES, SECTOR_BYTES)]
        );
        assert!(
            history.recent().is_empty(),
            "not in the history before it completes"
        );
        go.send(()).unwrap();
        writer.join().unwrap();
        assert!(history.waiters().is_empty());
        assert_eq!(history.recent().len(), 1);
    }

    #[test]
    fn the_history_keeps_the_last_requests_in_order() {
        let history = Arc::new(IoHistory::new(3));
        let mem = |n| Arc::new(Memory(Mutex::new(vec![0; n]))) as Arc<dyn BlockDevice>;
        let a = Counted::wrap_with_history(
            mem(16 * SECTOR_BYTES as usize),
            Arc::new(IoStats::default()),
            Arc::clone(&history),
            "nsdA",
        );
        let b = Counted::wrap_with_history(
            mem(16 * SECTOR_BYTES as usize),
            Arc::new(IoStats::default()),
            Arc::clone(&history),
            "nsdB",
        );
        let buf = AlignedBuf::zeroed(SECTOR_BYTES as usize);
        a.write_at(&buf, 0).unwrap();
        b.write_at(&buf, SECTOR_BYTES).unwrap();
        a.flush().unwrap();
        assert!(b.write_at(&buf, 99 * SECTOR_BYTES).is_err());
        let recent = history.recent();
        let seen: Vec<(&str, IoKind, u64, bool)> = recent
            .iter()
            .map(|r| (&*r.device, r.kind, r.offset, r.ok))
            .collect();
        assert_eq!(
            seen,
            [
                ("nsdB", IoKind::Write, SECTOR_BYTES, true),
                ("nsdA", IoKind::Flush, 0, true),
                ("nsdB", IoKind::Write, 99 * SECTOR_BYTES, false),
            ]
        );
        assert!(recent
            .windows(2)
            .all(|w| w[0].start_unix_nanos <= w[1].start_unix_nanos));
    }

    #[test]
    fn buckets_hold_their_bounds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(50_000), 0);
        assert_eq!(latency_bucket(50_001), 1);
        assert_eq!(latency_bucket(1_000_000_000), 11);
        assert_eq!(latency_bucket(u64::MAX), 12);
    }
}
