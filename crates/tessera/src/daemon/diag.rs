//! What `tessera diag` [mmdiag] and `tessera health` [mmhealth] ask the daemon: one report
//! with every diag section (the CLI prints the ones asked for), and the health monitor's
//! component states and events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Result;
use parking_lot::Mutex;
use tessera_drive::stats::IoKind;

use super::mounts::MountedView;
use super::Daemon;
use crate::rpc::{
    DiagReport, FsMemoryRow, FsStatsRow, HealthReport, MemoryReport, NetworkNodeRow, NetworkReport,
    NsdStatsRow, Reply, Request, WaiterRow,
};

/// Admin requests being served, for `diag --waiters`.
#[derive(Default)]
pub(super) struct RequestsInFlight {
    next: AtomicU64,
    serving: Mutex<HashMap<u64, (Instant, String)>>,
}

/// Removes its request from the table when the request ends, however it ends.
pub(super) struct Serving<'a> {
    table: &'a RequestsInFlight,
    ticket: u64,
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.table.serving.lock().remove(&self.ticket);
    }
}

impl RequestsInFlight {
    pub(super) fn enter(&self, request: &Request) -> Serving<'_> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        self.serving
            .lock()
            .insert(ticket, (Instant::now(), request_name(request)));
        Serving {
            table: self,
            ticket,
        }
    }

    fn waiters(&self) -> Vec<(f64, String)> {
        self.serving
            .lock()
            .values()
            .map(|(at, what)| (at.elapsed().as_secs_f64(), what.clone()))
            .collect()
    }
}

/// The request's kind without its arguments (`FsCreate`), which may be large.
fn request_name(request: &Request) -> String {
    let debug = format!("{request:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Fields of /proc/self/status in bytes (`VmRSS` and the like are given in kB) or counts.
fn proc_status() -> HashMap<String, u64> {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (key, rest) = line.split_once(':')?;
            let mut words = rest.split_whitespace();
            let value: u64 = words.next()?.parse().ok()?;
            let scale = if words.next() == Some("kB") { 1024 } else { 1 };
            Some((key.to_string(), value * scale))
        })
        .collect()
}

/// The counters of each mounted file system: pmon's, the metadata page cache's, and
/// each NSD's by request kind (`diag --stats`, `/api/v1/metrics`).
pub(super) fn fs_stats_rows(mounted: &[MountedView]) -> Vec<FsStatsRow> {
    mounted
        .iter()
        .map(|m| {
            let c = m.fs.metadata_cache_stats();
            let nsds = m
                .nsds
                .iter()
                .flat_map(|(nsd, s)| {
                    IoKind::ALL.into_iter().map(move |kind| {
                        let k = s.snapshot(kind);
                        NsdStatsRow {
                            nsd: nsd.clone(),
                            op: kind.name().into(),
                            requests: k.requests,
                            bytes: k.bytes,
                            errors: k.errors,
                            seconds: k.sum_seconds,
                        }
                    })
                })
                .collect();
            FsStatsRow {
                fs: m.name.clone(),
                pmon: m.fs.pmon(),
                fuse_waiting: m.fuse.waiting,
                fuse_active: m.fuse.active,
                fuse_served: m.fuse.served,
                discarded_bytes: m.fs.discard_stats().0,
                discard_errors: m.fs.discard_stats().1,
                metadata_pages_clean: c.cached_pages as u64,
                metadata_pages_dirty: c.dirty_pages as u64,
                metadata_page_hits: c.hits,
                metadata_page_misses: c.misses,
                metadata_page_evictions: c.evictions,
                nsds,
            }
        })
        .collect()
}

impl Daemon {
    pub(super) fn health_report(&self) -> Reply {
        Reply::Health(HealthReport {
            node: self.cluster.node_name.clone(),
            components: self.health.states(),
            events: self.health.events(),
        })
    }

    pub(super) fn diag_report(&self) -> Result<Reply> {
        let mounted = self.mounted_list();
        let mut waiters: Vec<WaiterRow> = self
            .io_history
            .waiters()
            .into_iter()
            .map(|w| WaiterRow {
                waiting_seconds: w.waiting.as_secs_f64(),
                kind: "disk I/O".into(),
                waiting_for: match w.kind {
                    IoKind::Flush => format!("for a cache flush of NSD {}", w.device),
                    kind => format!(
                        "for I/O completion: {} of {} bytes at sector {} of NSD {}{}",
                        kind.name(),
                        w.bytes,
                        w.offset / 512,
                        w.device,
                        w.served_for
                            .map(|n| format!(", served for {n}"))
                            .unwrap_or_default()
                    ),
                },
            })
            .collect();
        // Not the diag request asking.
        let others = self
            .requests
            .waiters()
            .into_iter()
            .filter(|(_, what)| what != "Diag");
        waiters.extend(others.map(|(s, what)| WaiterRow {
            waiting_seconds: s,
            kind: "admin request".into(),
            waiting_for: format!("serving {what}"),
        }));
        waiters.sort_by(|a, b| b.waiting_seconds.total_cmp(&a.waiting_seconds));

        let status = proc_status();
        let field = |k: &str| status.get(k).copied().unwrap_or(0);
        let params = self.member.state().params;
        let me = Some(self.member.me());
        let mut memory_rows = Vec::new();
        for MountedView { name, fs, .. } in &mounted {
            let c = fs.metadata_cache_stats();
            let (inodes, stats) = fs.inode_cache_len();
            memory_rows.push(FsMemoryRow {
                fs: name.clone(),
                metadata_pages_clean: c.cached_pages as u64,
                metadata_pages_dirty: c.dirty_pages as u64,
                metadata_memory_bytes: (c.cached_bytes + c.dirty_bytes) as u64,
                page_bytes: u64::from(fs.descriptor().checkpoint.page_bytes),
                pagepool_bytes: params.bytes("pagepool", me),
                inodes_cached: inodes as u64,
                stats_cached: stats as u64,
                max_files_to_cache: params.count("maxFilesToCache", me),
                max_stat_cache: params.count("maxStatCache", me),
            });
        }
        let stats_rows = fs_stats_rows(&mounted);

        let state = self.member.state();
        let nodes = match self.cluster_states(&[]) {
            Ok(states) => states
                .rows
                .into_iter()
                .map(|row| NetworkNodeRow {
                    address: state
                        .nodes
                        .get(&row.number)
                        .map(|n| n.address.clone())
                        .unwrap_or_default(),
                    name: row.name,
                    state: row.state,
                    epoch: row.epoch,
                })
                .collect(),
            Err(e) => {
                tracing::warn!("diag --network: {e:#}");
                Vec::new()
            }
        };
        let manager = self
            .member
            .status()
            .manager
            .and_then(|m| state.nodes.get(&m).map(|n| n.name.clone()));
        let nvme = match self.nvme_request(Request::NvmeList, &mut super::Reporter::quiet())? {
            Reply::NvmeNamespaces(rows) => rows,
            _ => Vec::new(),
        };
        Ok(Reply::Diag(Box::new(DiagReport {
            node: self.cluster.node_name.clone(),
            pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs(),
            waiters,
            memory: MemoryReport {
                rss_bytes: field("VmRSS"),
                peak_rss_bytes: field("VmHWM"),
                virtual_bytes: field("VmSize"),
                threads: field("Threads"),
                filesystems: memory_rows,
            },
            stats: stats_rows,
            network: NetworkReport {
                manager,
                nodes,
                nvme,
            },
        })))
    }
}
