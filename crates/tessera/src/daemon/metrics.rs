//! Prometheus metrics over HTTP: the node daemon serves `/metrics` on `metricsAddress` (a
//! per-node parameter, `no` by default) in the OpenMetrics text format that Prometheus
//! scrapes.
//!
//! Nothing is counted for the exporter: a scrape reads the counters the file systems keep
//! anyway (pmon's, the metadata caches', the allocation map's free space) and encodes
//! them, so the I/O path pays nothing for being watched, and memory does not grow with
//! scrapers. The server is read-only and has no other paths (unknown ones get a 404 with a
//! JSON body).
//!
//! Off by default: a fixed default port would collide between daemons of one host (tests,
//! several one-node clusters), and an admin who wants the metrics names the address
//! (`127.0.0.1:9710` keeps them on the host, `0.0.0.0:9710` offers them to the network).

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use anyhow::{anyhow, Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tessera_drive::stats::IoKind;
use tessera_fs::{FileSystem, LATENCY_BUCKETS_NS, SIZE_BOUNDS_BYTES};

use super::mounts::NsdStats;
use super::Daemon;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Starts the metrics server if this node's `metricsAddress` names one. The address is
/// bound before this returns, so a port in use stops the daemon's start with an error that
/// says what to do.
pub(super) fn start(daemon: &Arc<Daemon>) -> Result<Option<SocketAddr>> {
    let value = daemon
        .member
        .state()
        .params
        .get("metricsAddress", Some(daemon.member.me()));
    if value == "no" {
        return Ok(None);
    }
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| anyhow!("metricsAddress `{value}` is not IP:PORT"))?;
    let listener = std::net::TcpListener::bind(addr).with_context(|| {
        format!(
            "cannot serve metrics on {addr} (metricsAddress): is another program using the \
             port? choose another with `tessera config set metricsAddress=IP:PORT -N \
             {}` or turn it off with `metricsAddress=no`, then start again",
            daemon.cluster.node_name
        )
    })?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DaemonCollector {
        daemon: Arc::downgrade(daemon),
    }));
    let registry = Arc::new(registry);
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("metrics server: cannot start its runtime: {e}");
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("metrics server on {bound}: {e}");
                        return;
                    }
                };
                let app = router(registry);
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!("metrics server on {bound} stopped: {e}");
                }
            });
        })?;
    tracing::info!("serving Prometheus metrics on http://{bound}/metrics");
    Ok(Some(bound))
}

fn router(registry: Arc<Registry>) -> axum::Router {
    use axum::http::{header, StatusCode, Uri};
    use axum::routing::get;
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = Arc::clone(&registry);
                async move {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &registry) {
                        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], body),
                        Err(e) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                            format!("encoding the metrics failed: {e}\n"),
                        ),
                    }
                }
            }),
        )
        .fallback(|uri: Uri| async move {
            let body = serde_json::json!({
                "error": format!("no such path: {}; this daemon serves /metrics", uri.path()),
            });
            (StatusCode::NOT_FOUND, axum::Json(body))
        })
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

type Labels = Vec<(&'static str, String)>;
type MountedFs = (String, Arc<FileSystem>);

/// One family of samples: its descriptor once, then each labelled sample.
fn family<T>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: &[(Labels, T)],
    mut each: impl FnMut(&mut prometheus_client::encoding::MetricEncoder, &T) -> fmt::Result,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            // A family of one sample without labels: `name 1`, not `name{} 1`.
            each(&mut metric, value)?;
        } else {
            let mut sample = metric.encode_family(labels)?;
            each(&mut sample, value)?;
        }
    }
    Ok(())
}

fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    s: &[(Labels, u64)],
) -> fmt::Result {
    family(enc, name, help, MetricType::Counter, s, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

fn gauges(enc: &mut DescriptorEncoder, name: &str, help: &str, s: &[(Labels, i64)]) -> fmt::Result {
    family(enc, name, help, MetricType::Gauge, s, |m, v| {
        m.encode_gauge(v)
    })
}

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
    let mut hist = Vec::new();
    let mut size = Vec::new();
    let mut free = Vec::new();
    let mut inodes_used = Vec::new();
    let mut inodes_max = Vec::new();
    let mut pages = Vec::new();
    let mut page_reads = Vec::new();
    let mut evictions = Vec::new();
    let mut inode_cache = Vec::new();
    for (name, fs) in mounted {
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
        page_reads.push((with(name, "result", "hit"), c.hits));
        page_reads.push((with(name, "result", "miss"), c.misses));
        evictions.push((fs_label(name), c.evictions));
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
    gauges(
        enc,
        "tessera_fs_inode_cache_entries",
        "Inodes cached whole (maxFilesToCache) and attributes only (maxStatCache)",
        &inode_cache,
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
        // Copy the list out: encoding must not hold the mount table's lock.
        let (mounted, nsds): (Vec<MountedFs>, Vec<(String, NsdStats)>) = daemon
            .mounts
            .lock()
            .iter()
            .map(|(name, m)| {
                (
                    (name.clone(), Arc::clone(&m.fs)),
                    (name.clone(), m.nsd_stats.clone()),
                )
            })
            .unzip();
        gauges(
            &mut enc,
            "tessera_fs_mounted",
            "File systems mounted on this node",
            &[(Vec::new(), mounted.len() as i64)],
        )?;
        fs_samples(&mut enc, &mounted)?;
        nsd_samples(&mut enc, &nsds)
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
