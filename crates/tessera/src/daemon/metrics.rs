//! Prometheus metrics: what the node daemon's `/metrics` (served by `http`) encodes, in the
//! OpenMetrics text format that Prometheus scrapes.
//!
//! Nothing is counted for the exporter: a scrape reads the counters the file systems keep
//! anyway (pmon's, the metadata caches', the allocation map's free space) and encodes
//! them, so the I/O path pays nothing for being watched, and memory does not grow with
//! scrapers.

use std::fmt;
use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tessera_drive::stats::IoKind;
use tessera_fs::{FileSystem, LATENCY_BUCKETS_NS, SIZE_BOUNDS_BYTES};

use super::mounts::{MountedView, NsdStats};
use super::Daemon;
use crate::openmetrics::{counters, counters_f64, family, gauges, Labels};

/// The registry a scrape encodes: one collector that reads the daemon's counters.
pub(super) fn registry(daemon: &Arc<Daemon>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DaemonCollector {
        daemon: Arc::downgrade(daemon),
    }));
    registry
}

/// Reads the daemon's counters at each scrape.
struct DaemonCollector {
    daemon: Weak<Daemon>,
}

impl fmt::Debug for DaemonCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DaemonCollector")
    }
}

type MountedFs = (String, Arc<FileSystem>);

/// The label of a request-size range of `SIZE_BOUNDS_BYTES` (as pmon's `rhist` ranges).
fn size_label(range: usize) -> String {
    fn short(bytes: u64) -> String {
        if bytes >= 1 << 20 {
            format!("{}M", bytes >> 20)
        } else {
            format!("{}K", bytes >> 10)
        }
    }
    match (range.checked_sub(1), SIZE_BOUNDS_BYTES.get(range)) {
        (None, Some(hi)) => format!("0-{}", short(*hi)),
        (Some(lo), Some(hi)) => format!("{}-{}", short(SIZE_BOUNDS_BYTES[lo]), short(*hi)),
        _ => format!("{}+", short(SIZE_BOUNDS_BYTES[SIZE_BOUNDS_BYTES.len() - 1])),
    }
}

struct Histogram {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

fn fs_samples(enc: &mut DescriptorEncoder, mounted: &[(String, Arc<FileSystem>)]) -> fmt::Result {
    let fs_label = |name: &str| -> Labels { vec![("fs", name.to_string())] };
    let with = |name: &str, key: &'static str, value: &str| -> Labels {
        vec![("fs", name.to_string()), (key, value.to_string())]
    };
    let mut ops = Vec::new();
    let mut bytes = Vec::new();
    let mut checksum = Vec::new();
    let mut repaired = Vec::new();
    let mut disks_down = Vec::new();
    let mut hist = Vec::new();
    let mut size = Vec::new();
    let mut free = Vec::new();
    let mut inodes_used = Vec::new();
    let mut inodes_max = Vec::new();
    let mut pages = Vec::new();
    let mut page_memory = Vec::new();
    let mut gathered = Vec::new();
    let mut page_reads = Vec::new();
    let mut evictions = Vec::new();
    let mut second_copy_reads = Vec::new();
    let mut inode_cache = Vec::new();
    let mut journal_records = Vec::new();
    let mut journal_commits = Vec::new();
    let mut discarded = Vec::new();
    let mut discard_errors = Vec::new();
    for (name, fs) in mounted {
        let (given_back, refused) = fs.discard_stats();
        discarded.push((fs_label(name), given_back));
        discard_errors.push((fs_label(name), refused));
        let j = fs.journal_stats();
        journal_records.push((fs_label(name), j.records));
        journal_commits.push((fs_label(name), j.commits));
        let p = fs.pmon();
        for (op, v) in [
            ("read", p.reads),
            ("write", p.writes),
            ("open", p.opens),
            ("close", p.closes),
            ("readdir", p.readdirs),
            ("inode_update", p.inode_updates),
        ] {
            ops.push((with(name, "op", op), v));
        }
        bytes.push((with(name, "op", "read"), p.bytes_read));
        bytes.push((with(name, "op", "write"), p.bytes_written));
        checksum.push((fs_label(name), p.checksum_errors));
        repaired.push((fs_label(name), p.copies_repaired));
        let down = fs.disk_availability().iter().filter(|(_, up)| !up).count();
        disks_down.push((fs_label(name), down as i64));
        let h = fs.latency_histograms();
        for (op, ranges) in [("read", &h.read), ("write", &h.write)] {
            for (range, r) in ranges.iter().enumerate() {
                let mut labels = with(name, "op", op);
                labels.push(("size", size_label(range)));
                hist.push((labels, histogram(&r.buckets, r.sum_seconds)));
            }
        }
        let st = fs.statfs();
        let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        size.push((
            fs_label(name),
            as_i64(st.fragments_total * st.fragment_bytes),
        ));
        free.push((
            fs_label(name),
            as_i64(st.fragments_free * st.fragment_bytes),
        ));
        inodes_used.push((fs_label(name), as_i64(st.inodes_total - st.inodes_free)));
        inodes_max.push((fs_label(name), as_i64(st.inodes_total)));
        let c = fs.metadata_cache_stats();
        pages.push((with(name, "state", "clean"), as_i64(c.cached_pages as u64)));
        pages.push((with(name, "state", "dirty"), as_i64(c.dirty_pages as u64)));
        gathered.push((fs_label(name), as_i64(fs.gathered_bytes())));
        page_memory.push((with(name, "state", "clean"), as_i64(c.cached_bytes as u64)));
        page_memory.push((with(name, "state", "dirty"), as_i64(c.dirty_bytes as u64)));
        page_reads.push((with(name, "result", "hit"), c.hits));
        page_reads.push((with(name, "result", "miss"), c.misses));
        evictions.push((fs_label(name), c.evictions));
        second_copy_reads.push((fs_label(name), c.second_copy_reads));
        let (records, stats) = fs.inode_cache_len();
        inode_cache.push((with(name, "cache", "records"), as_i64(records as u64)));
        inode_cache.push((with(name, "cache", "stat"), as_i64(stats as u64)));
    }
    counters(
        enc,
        "tessera_fs_operations",
        "File-system operations by type (mmpmon fs_io_s: reads, writes, opens, closes, \
         readdirs, inode updates)",
        &ops,
    )?;
    counters(
        enc,
        "tessera_fs_io_bytes",
        "Bytes read and written by applications",
        &bytes,
    )?;
    counters(
        enc,
        "tessera_fs_checksum_errors",
        "Blocks whose checksum did not match when read",
        &checksum,
    )?;
    counters(
        enc,
        "tessera_fs_metadata_second_copy_reads",
        "Metadata pages read from their second copy because the first failed to read or \
         verify (-m 2; the first copy is then written again)",
        &second_copy_reads,
    )?;
    counters(
        enc,
        "tessera_fs_copies_repaired",
        "Damaged copies of data blocks written again from a good copy",
        &repaired,
    )?;
    gauges(
        enc,
        "tessera_fs_disks_down",
        "Disks of the file system taken out (missing, failed or stopped); their copies are read from other failure groups",
        &disks_down,
    )?;
    family(
        enc,
        "tessera_fs_request_seconds",
        "Read and write latency by request size (mmpmon rhist ranges)",
        MetricType::Histogram,
        &hist,
        |m, h| m.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None),
    )?;
    gauges(
        enc,
        "tessera_fs_size_bytes",
        "Data capacity of the file system",
        &size,
    )?;
    gauges(
        enc,
        "tessera_fs_free_bytes",
        "Free data space of the file system",
        &free,
    )?;
    gauges(enc, "tessera_fs_inodes_used", "Inodes in use", &inodes_used)?;
    gauges(
        enc,
        "tessera_fs_inodes_max",
        "The file system's inode limit",
        &inodes_max,
    )?;
    gauges(
        enc,
        "tessera_fs_metadata_pages",
        "Metadata pages in memory: clean (cached, bounded by pagepool) and dirty (waiting \
         for a checkpoint)",
        &pages,
    )?;
    gauges(
        enc,
        "tessera_fs_metadata_memory_bytes",
        "Memory of the metadata pages as pagepool bounds it: clean pages' nodes, and \
         changed pages at 1.25 times their size",
        &page_memory,
    )?;
    gauges(
        enc,
        "tessera_fs_gathered_bytes",
        "Bytes of small writes gathered in memory and not yet written to the disks \
         (write-behind)",
        &gathered,
    )?;
    counters(
        enc,
        "tessera_fs_metadata_page_lookups",
        "Metadata page lookups served from memory (hit) or read from disk (miss)",
        &page_reads,
    )?;
    counters(
        enc,
        "tessera_fs_metadata_page_evictions",
        "Clean metadata pages evicted from the cache",
        &evictions,
    )?;
    counters(
        enc,
        "tessera_fs_discarded_bytes",
        "Bytes of freed blocks given back to thin-provisioned disks (thinDiskType) since the \
         mount",
        &discarded,
    )?;
    counters(
        enc,
        "tessera_fs_discard_errors",
        "Deallocations of freed blocks that the disk refused (the blocks stay free)",
        &discard_errors,
    )?;
    counters(
        enc,
        "tessera_fs_journal_records",
        "Metadata transactions appended to the recovery log since the mount",
        &journal_records,
    )?;
    counters(
        enc,
        "tessera_fs_journal_commits",
        "Group commits of the recovery log (one device write and flush for every waiting \
         transaction) since the mount",
        &journal_commits,
    )?;
    gauges(
        enc,
        "tessera_fs_inode_cache_entries",
        "Inodes cached whole (maxFilesToCache) and attributes only (maxStatCache)",
        &inode_cache,
    )
}

/// What each mount asked other nodes' metanodes, by owner and request kind: how many and
/// how long it waited for the answers (the owner's work, its log commit, its revocations
/// of other nodes, and the network), so that a benchmark can say where a client's time
/// goes.
fn metanode_samples(enc: &mut DescriptorEncoder, mounted: &[MountedFs]) -> fmt::Result {
    let mut requests = Vec::new();
    let mut seconds = Vec::new();
    for (name, fs) in mounted {
        for (owner, kind, count, waited) in fs.metanode_requests() {
            let labels: Labels = vec![
                ("fs", name.clone()),
                (
                    "owner",
                    if owner == 0 {
                        "manager".into()
                    } else {
                        format!("slot {owner}")
                    },
                ),
                ("request", kind.to_string()),
            ];
            requests.push((labels.clone(), count));
            seconds.push((labels, waited));
        }
    }
    counters(
        enc,
        "tessera_metanode_requests",
        "Metadata requests this node's mount sent to another node's metanode, by owner \
         (the file system manager or an owner slot) and kind",
        &requests,
    )?;
    counters_f64(
        enc,
        "tessera_metanode_request_seconds",
        "Seconds this node's mount waited for other nodes' metanodes to answer, by owner \
         and kind",
        &seconds,
    )
}

/// The FUSE queue of each mount: what the kernel holds for it and what the daemon serves.
fn fuse_samples(enc: &mut DescriptorEncoder, mounted: &[MountedView]) -> fmt::Result {
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut waiting = Vec::new();
    let mut active = Vec::new();
    let mut served = Vec::new();
    for m in mounted {
        let fs: Labels = vec![("fs", m.name.clone())];
        if let Some(w) = m.fuse.waiting {
            waiting.push((fs.clone(), as_i64(w)));
        }
        active.push((fs.clone(), as_i64(m.fuse.active)));
        served.push((fs, m.fuse.served));
    }
    gauges(
        enc,
        "tessera_fuse_requests_waiting",
        "FUSE queue depth: requests the kernel holds for the mount, queued for the daemon \
         or being served (fusectl's waiting)",
        &waiting,
    )?;
    gauges(
        enc,
        "tessera_fuse_requests_active",
        "FUSE requests the daemon's threads are serving now",
        &active,
    )?;
    counters(
        enc,
        "tessera_fuse_requests",
        "FUSE requests the daemon answered since the mount",
        &served,
    )
}

/// Requests, bytes, errors and latencies of each NSD of each mounted file system, as this
/// node issued them.
fn nsd_samples(enc: &mut DescriptorEncoder, mounted: &[(String, NsdStats)]) -> fmt::Result {
    let mut requests = Vec::new();
    let mut bytes = Vec::new();
    let mut errors = Vec::new();
    let mut hist = Vec::new();
    for (fs, nsds) in mounted {
        for (nsd, stats) in nsds {
            for kind in IoKind::ALL {
                let s = stats.snapshot(kind);
                let labels: Labels = vec![
                    ("fs", fs.clone()),
                    ("nsd", nsd.clone()),
                    ("op", kind.name().to_string()),
                ];
                requests.push((labels.clone(), s.requests));
                errors.push((labels.clone(), s.errors));
                if kind != IoKind::Flush {
                    bytes.push((labels.clone(), s.bytes));
                }
                hist.push((labels, histogram(&s.buckets, s.sum_seconds)));
            }
        }
    }
    counters(
        enc,
        "tessera_nsd_requests",
        "Requests this node sent to each NSD",
        &requests,
    )?;
    counters(
        enc,
        "tessera_nsd_io_bytes",
        "Bytes this node read from and wrote to each NSD",
        &bytes,
    )?;
    counters(
        enc,
        "tessera_nsd_errors",
        "Requests to each NSD that failed (I/O error, unreachable, no disk lease)",
        &errors,
    )?;
    family(
        enc,
        "tessera_nsd_request_seconds",
        "Latency of the requests to each NSD",
        MetricType::Histogram,
        &hist,
        |m, h| m.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None),
    )
}

/// Declustered arrays served here: capacity, background tasks (rebuild, scrub) with their
/// progress and rates, and each pdisk's state and errors.
fn array_samples(enc: &mut DescriptorEncoder, arrays: &[tessera_vdisk::DaStatus]) -> fmt::Result {
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut da_bytes = Vec::new();
    let mut task_active = Vec::new();
    let mut task_done = Vec::new();
    let mut task_total = Vec::new();
    let mut task_rate = Vec::new();
    let mut task_repaired = Vec::new();
    let mut pdisk_state = Vec::new();
    let mut pdisk_bytes = Vec::new();
    let mut pdisk_errors = Vec::new();
    let mut pdisk_requests = Vec::new();
    let mut pdisk_io_bytes = Vec::new();
    let mut pdisk_hist = Vec::new();
    let mut vdisk_ops = Vec::new();
    let mut vdisk_bytes = Vec::new();
    let mut vdisk_writes = Vec::new();
    let mut vdisk_events = Vec::new();
    let mut vdisk_stripes = Vec::new();
    let mut vdisk_capacity = Vec::new();
    for s in arrays {
        let da = || -> Labels { vec![("da", s.name.clone())] };
        for (what, v) in [
            ("capacity", s.capacity_bytes),
            ("free", s.free_bytes),
            ("spare", s.spare_bytes),
        ] {
            let mut l = da();
            l.push(("space", what.into()));
            da_bytes.push((l, as_i64(v)));
        }
        for (task, p) in [("rebuild", &s.rebuild), ("scrub", &s.scrub)] {
            let mut l = da();
            l.push(("task", task.into()));
            task_active.push((l.clone(), i64::from(p.active)));
            task_done.push((l.clone(), as_i64(p.done)));
            task_total.push((l.clone(), as_i64(p.total)));
            task_rate.push((l.clone(), as_i64(p.rate_bytes_s)));
            task_repaired.push((l, p.repaired));
        }
        for p in &s.pdisks {
            let pd = || -> Labels { vec![("da", s.name.clone()), ("pdisk", p.name.clone())] };
            let mut l = pd();
            l.push(("state", p.state.as_str().into()));
            pdisk_state.push((l, 1));
            let mut l = pd();
            l.push(("space", "capacity".into()));
            pdisk_bytes.push((l, as_i64(p.capacity_bytes)));
            let mut l = pd();
            l.push(("space", "free".into()));
            pdisk_bytes.push((l, as_i64(p.free_bytes)));
            for (kind, v) in [
                ("read", p.read_errors),
                ("write", p.write_errors),
                ("checksum", p.checksum_errors),
            ] {
                let mut l = pd();
                l.push(("kind", kind.into()));
                pdisk_errors.push((l, v));
            }
            for (kind, io) in IoKind::ALL.iter().zip(&p.io) {
                let mut l = pd();
                l.push(("op", kind.name().into()));
                pdisk_requests.push((l.clone(), io.requests));
                if *kind != IoKind::Flush {
                    pdisk_io_bytes.push((l.clone(), io.bytes));
                }
                pdisk_hist.push((l, histogram(&io.buckets, io.sum_seconds)));
            }
        }
        for v in &s.vdisks {
            let vd = || -> Labels { vec![("da", s.name.clone()), ("vdisk", v.name.clone())] };
            let with = |key: &'static str, value: &str| -> Labels {
                let mut l = vd();
                l.push((key, value.to_string()));
                l
            };
            let st = &v.stats;
            vdisk_ops.push((with("op", "read"), st.reads));
            vdisk_ops.push((with("op", "write"), st.writes));
            vdisk_bytes.push((with("op", "read"), st.bytes_read));
            vdisk_bytes.push((with("op", "write"), st.bytes_written));
            vdisk_writes.push((with("kind", "full_stripe"), st.full_stripe_writes));
            vdisk_writes.push((with("kind", "read_modify_write"), st.rmw_writes));
            vdisk_writes.push((with("kind", "discard"), st.discarded_stripes));
            vdisk_events.push((with("event", "degraded_read"), st.degraded_reads));
            vdisk_events.push((
                with("event", "checksum_error_repaired"),
                st.checksum_errors_repaired,
            ));
            vdisk_events.push((with("event", "unrecoverable"), st.unrecoverable));
            vdisk_events.push((with("event", "discard_skipped"), st.discards_skipped));
            vdisk_stripes.push((with("state", "degraded"), as_i64(v.degraded_stripes)));
            vdisk_stripes.push((with("state", "critical"), as_i64(v.critical_stripes)));
            vdisk_capacity.push((vd(), as_i64(v.capacity_bytes)));
        }
    }
    gauges(
        enc,
        "tessera_da_bytes",
        "Space of each declustered array: capacity of the pdisks in service, free outside the \
         spare reserve, the spare reserve",
        &da_bytes,
    )?;
    gauges(
        enc,
        "tessera_da_task_active",
        "1 while a background task (rebuild, scrub) of the array runs",
        &task_active,
    )?;
    gauges(
        enc,
        "tessera_da_task_done_units",
        "Units done in the current or last pass of the task (strips for rebuild, stripes for \
         scrub); progress is done / planned",
        &task_done,
    )?;
    gauges(
        enc,
        "tessera_da_task_planned_units",
        "Units planned in the current or last pass of the task",
        &task_total,
    )?;
    gauges(
        enc,
        "tessera_da_task_rate_bytes_per_second",
        "Bytes per second the task moves in its current pass (0 when idle)",
        &task_rate,
    )?;
    counters(
        enc,
        "tessera_da_task_repaired_sectors",
        "Sectors the task found bad and rewrote from redundancy in its current pass",
        &task_repaired,
    )?;
    gauges(
        enc,
        "tessera_pdisk_state",
        "The state of each pdisk (ok, suspended, missing, dead, draining, replaced): 1 for the \
         state it is in",
        &pdisk_state,
    )?;
    gauges(
        enc,
        "tessera_pdisk_bytes",
        "Capacity and free space of each pdisk",
        &pdisk_bytes,
    )?;
    counters(
        enc,
        "tessera_pdisk_errors",
        "Read, write and checksum errors of each pdisk",
        &pdisk_errors,
    )?;
    counters(
        enc,
        "tessera_pdisk_requests",
        "Requests to each pdisk's drive: application I/O, rebuild, scrub and the array's \
         own metadata",
        &pdisk_requests,
    )?;
    counters(
        enc,
        "tessera_pdisk_io_bytes",
        "Bytes read from and written to each pdisk's drive",
        &pdisk_io_bytes,
    )?;
    family(
        enc,
        "tessera_pdisk_request_seconds",
        "Latency of the requests to each pdisk's drive (a slow drive stands out here)",
        MetricType::Histogram,
        &pdisk_hist,
        |m, h| m.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None),
    )?;
    gauges(
        enc,
        "tessera_vdisk_capacity_bytes",
        "Capacity of each vdisk served by this node",
        &vdisk_capacity,
    )?;
    counters(
        enc,
        "tessera_vdisk_operations",
        "Reads and writes each vdisk served",
        &vdisk_ops,
    )?;
    counters(
        enc,
        "tessera_vdisk_io_bytes",
        "Bytes each vdisk served",
        &vdisk_bytes,
    )?;
    counters(
        enc,
        "tessera_vdisk_stripe_writes",
        "Writes of each vdisk by how they reached the pdisks: whole stripes (parity from \
         the new data alone), read-modify-write, or whole stripes deallocated (TRIM)",
        &vdisk_writes,
    )?;
    counters(
        enc,
        "tessera_vdisk_events",
        "Reads that needed reconstruction, sectors repaired after a checksum error, \
         operations that failed for data that could not be recovered, and stripes a \
         discard left allocated (partial or degraded)",
        &vdisk_events,
    )?;
    gauges(
        enc,
        "tessera_vdisk_stripes",
        "Stripes of each vdisk with a strip unavailable (degraded) or more than the code \
         tolerates (critical)",
        &vdisk_stripes,
    )
}

/// NVMe/TCP paths of this node's host: the state of each and its counters.
fn nvme_samples(
    enc: &mut DescriptorEncoder,
    namespaces: &[crate::rpc::NvmeNamespaceRow],
) -> fmt::Result {
    let mut state = Vec::new();
    let mut commands = Vec::new();
    let mut bytes = Vec::new();
    let mut errors = Vec::new();
    let mut retries = Vec::new();
    for ns in namespaces {
        for p in &ns.paths {
            let path = || -> Labels {
                vec![
                    ("namespace", ns.name.clone()),
                    ("subsystem", ns.subnqn.clone()),
                    ("path", p.traddr.clone()),
                ]
            };
            let mut l = path();
            l.push(("state", p.state.clone()));
            l.push(("ana", p.ana_state.clone()));
            state.push((l, 1));
            commands.push((path(), p.commands));
            bytes.push((path(), p.bytes));
            errors.push((path(), p.errors));
            retries.push((path(), p.retries));
        }
    }
    gauges(
        enc,
        "tessera_nvme_path_state",
        "Each NVMe/TCP path of each namespace: 1 with its connection state and ANA state",
        &state,
    )?;
    counters(
        enc,
        "tessera_nvme_path_commands",
        "Commands sent on each path",
        &commands,
    )?;
    counters(
        enc,
        "tessera_nvme_path_io_bytes",
        "Bytes moved on each path",
        &bytes,
    )?;
    counters(
        enc,
        "tessera_nvme_path_errors",
        "Commands on each path that failed",
        &errors,
    )?;
    counters(
        enc,
        "tessera_nvme_path_retries",
        "Commands retried on another path after this one failed them",
        &retries,
    )
}

/// The health monitor's view: 0 healthy, 1 degraded, 2 failed.
fn health_samples(
    enc: &mut DescriptorEncoder,
    states: &[crate::rpc::ComponentHealth],
) -> fmt::Result {
    let samples: Vec<(Labels, i64)> = states
        .iter()
        .map(|c| {
            let labels: Labels = vec![
                ("component", c.component.clone()),
                ("entity", c.entity.clone()),
            ];
            let value = match c.status {
                crate::rpc::Status::Healthy => 0,
                crate::rpc::Status::Degraded => 1,
                crate::rpc::Status::Failed => 2,
            };
            (labels, value)
        })
        .collect();
    gauges(
        enc,
        "tessera_health_status",
        "Health of each component of this node as `tessera health` shows it: 0 healthy, 1 \
         degraded, 2 failed",
        &samples,
    )
}

/// A histogram over `LATENCY_BUCKETS_NS` from per-bucket counts (the last one above them).
fn histogram(counts: &[u64], sum_seconds: f64) -> Histogram {
    let buckets = counts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let le = LATENCY_BUCKETS_NS
                .get(i)
                .map_or(f64::MAX, |ns| *ns as f64 / 1e9);
            (le, *c)
        })
        .collect();
    Histogram {
        buckets,
        sum: sum_seconds,
        count: counts.iter().sum(),
    }
}

impl Collector for DaemonCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let Some(daemon) = self.daemon.upgrade() else {
            return Ok(());
        };
        let info: Labels = vec![
            ("cluster", daemon.cluster.name.clone()),
            ("node", daemon.cluster.node_name.clone()),
            ("version", env!("CARGO_PKG_VERSION").to_string()),
        ];
        gauges(
            &mut enc,
            "tessera_node_info",
            "This node: its cluster, name and Tessera version (always 1)",
            &[(info, 1)],
        )?;
        let active = i64::from(daemon.member.holds_lease());
        gauges(
            &mut enc,
            "tessera_node_active",
            "1 when this node holds its lease and may write, 0 while it arbitrates",
            &[(Vec::new(), active)],
        )?;
        // Copied out: encoding must not hold the mount table's lock.
        let views = daemon.mounted_list();
        let mounted: Vec<MountedFs> = views
            .iter()
            .map(|m| (m.name.clone(), Arc::clone(&m.fs)))
            .collect();
        let nsds: Vec<(String, NsdStats)> = views
            .iter()
            .map(|m| (m.name.clone(), m.nsds.clone()))
            .collect();
        gauges(
            &mut enc,
            "tessera_fs_mounted",
            "File systems mounted on this node",
            &[(Vec::new(), mounted.len() as i64)],
        )?;
        fs_samples(&mut enc, &mounted)?;
        metanode_samples(&mut enc, &mounted)?;
        fuse_samples(&mut enc, &views)?;
        nsd_samples(&mut enc, &nsds)?;
        let arrays: Vec<_> = daemon.arrays.lock().values().cloned().collect();
        let statuses: Vec<_> = arrays.iter().map(|da| da.status()).collect();
        array_samples(&mut enc, &statuses)?;
        let mut quiet = super::Reporter::quiet();
        if let Ok(crate::rpc::Reply::NvmeNamespaces(rows)) =
            daemon.nvme_request(crate::rpc::Request::NvmeList, &mut quiet)
        {
            nvme_samples(&mut enc, &rows)?;
        }
        health_samples(&mut enc, &daemon.health.states())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels_name_pmon_ranges() {
        let labels: Vec<String> = (0..=SIZE_BOUNDS_BYTES.len()).map(size_label).collect();
        assert_eq!(
            labels,
            ["0-4K", "4K-64K", "64K-256K", "256K-1M", "1M-4M", "4M+"]
        );
    }
}
