//! The read-only JSON API, `/api/v1/...` on the daemon's HTTP port. Most paths answer
//! with exactly what the admin CLI's request for the same objects returns (the same
//! `Request` goes through the same handler), so the API and `tessera ... -Y` cannot
//! disagree; the rest (usage, throughput, health, events) read what the monitor keeps.
//!
//! | path                                   | what                                     | CLI            |
//! |----------------------------------------|------------------------------------------|----------------|
//! | `/api/v1`                              | this table: the paths served             |                |
//! | `/api/v1/cluster`                      | identity, nodes, manager, parameters     | `cluster ls`   |
//! | `/api/v1/nodes`                        | each node's state and the quorum summary | `state -a -s`  |
//! | `/api/v1/nsds`                         | NSDs                                     | `nsd ls`       |
//! | `/api/v1/filesystems`                  | file systems, mount state and usage      | `fs ls`, `df`  |
//! | `/api/v1/filesystems/NAME`             | descriptor, disks and their availability | `fs ls NAME`   |
//! | `/api/v1/filesystems/NAME/df`          | usage by disk and pool (mounted here)    | `df NAME`      |
//! | `/api/v1/filesystems/NAME/pmon`        | fs_io_s counters and rhist (mounted)     | `pmon NAME`    |
//! | `/api/v1/filesystems/NAME/throughput`  | rates per second, last hour; `?since=MS` |                |
//! | `/api/v1/das`, `/pdisks`, `/vdisks`    | arrays with rebuild/scrub tasks, drives  | `da ls` ...    |
//! | `/api/v1/nvme`                         | NVMe/TCP namespaces and paths            | `nvme ls`      |
//! | `/api/v1/iohist`                       | the last disk I/Os                       | `diag --iohist`|
//! | `/api/v1/health`                       | component states                         | `health show`  |
//! | `/api/v1/events`                       | recent events, oldest first              | `health eventlog` |
//! | `/api/v1/metrics`                      | the counters of `/metrics` as JSON       |                |

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{Daemon, Reporter};
use crate::rpc::{Reply, Request};

pub(super) enum ApiError {
    NotFound(String),
    /// The object exists but cannot answer this (a file system not mounted here).
    Conflict(String),
    BadRequest(String),
    Failed(String),
}

const PATHS: &[(&str, &str)] = &[
    (
        "/api/v1/cluster",
        "cluster identity, nodes, manager and parameters (cluster ls)",
    ),
    (
        "/api/v1/nodes",
        "each node's state and the quorum summary (state -a -s)",
    ),
    ("/api/v1/nsds", "NSDs (nsd ls)"),
    (
        "/api/v1/filesystems",
        "file systems with mount state and usage",
    ),
    (
        "/api/v1/filesystems/NAME",
        "descriptor and disks (fs ls NAME, disk ls NAME)",
    ),
    (
        "/api/v1/filesystems/NAME/df",
        "usage by disk and pool, when mounted here (df NAME)",
    ),
    (
        "/api/v1/filesystems/NAME/pmon",
        "fs_io_s counters and rhist, when mounted here",
    ),
    (
        "/api/v1/filesystems/NAME/throughput",
        "bytes and operations per second and latency percentiles, one sample a second \
         for the last hour; ?since=UNIX_MS for newer samples only",
    ),
    (
        "/api/v1/das",
        "declustered arrays with their rebuild and scrub tasks (da ls)",
    ),
    (
        "/api/v1/pdisks",
        "pdisks with states and error counts (pdisk ls)",
    ),
    ("/api/v1/vdisks", "vdisks (vdisk ls)"),
    (
        "/api/v1/nvme",
        "NVMe/TCP namespaces and their paths (nvme ls)",
    ),
    (
        "/api/v1/iohist",
        "the last disk I/Os of this node (diag --iohist)",
    ),
    ("/api/v1/health", "component states (health show)"),
    (
        "/api/v1/events",
        "recent events, oldest first (health eventlog)",
    ),
    ("/api/v1/metrics", "the counters of /metrics, as JSON"),
];

/// The payload of a reply: `Reply::Das(rows)` answers `rows`.
fn payload(reply: Reply) -> Result<Value, ApiError> {
    let value = serde_json::to_value(reply).map_err(|e| ApiError::Failed(e.to_string()))?;
    Ok(match value {
        Value::Object(mut map) if map.len() == 1 => {
            let key = map.keys().next().cloned().unwrap_or_default();
            map.remove(&key).unwrap_or(Value::Null)
        }
        other => other,
    })
}

impl Daemon {
    /// Answers one GET of `/api/v1/{path}`.
    pub(super) fn api_get(
        &self,
        path: &str,
        query: &HashMap<String, String>,
    ) -> Result<Value, ApiError> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let request = match parts.as_slice() {
            [] => {
                let paths: Vec<Value> = PATHS
                    .iter()
                    .map(|(p, what)| json!({ "path": p, "description": what }))
                    .collect();
                return Ok(json!({ "version": "v1", "paths": paths }));
            }
            ["cluster"] => Request::ClusterShow,
            ["nodes"] => Request::ClusterState { names: Vec::new() },
            ["nsds"] => Request::NsdList,
            ["filesystems"] => return self.api_filesystems(),
            ["filesystems", name, rest @ ..] => {
                let known = self
                    .file_systems()
                    .map_err(|e| ApiError::Failed(format!("{e:#}")))?
                    .get(name)
                    .is_some();
                if !known {
                    return Err(ApiError::NotFound(format!(
                        "no file system {name}; /api/v1/filesystems lists them"
                    )));
                }
                let mounted = self.mounts.lock().contains_key(*name);
                let need_mounted = || {
                    if mounted {
                        Ok(())
                    } else {
                        Err(ApiError::Conflict(format!(
                            "file system {name} is not mounted on this node; ask a node \
                             that has it mounted"
                        )))
                    }
                };
                match rest {
                    [] => Request::FsShow {
                        name: name.to_string(),
                    },
                    ["df"] => {
                        // Not mounted, `df` would open the file system: not for a reader.
                        need_mounted()?;
                        Request::Df {
                            name: name.to_string(),
                        }
                    }
                    ["pmon"] => {
                        need_mounted()?;
                        Request::Pmon {
                            name: Some(name.to_string()),
                        }
                    }
                    ["throughput"] => {
                        let since = match query.get("since") {
                            None => 0,
                            Some(s) => s.parse::<u64>().map_err(|_| {
                                ApiError::BadRequest(format!(
                                    "since={s}: give a time in milliseconds since the Unix \
                                     epoch"
                                ))
                            })?,
                        };
                        need_mounted()?;
                        let samples = self.history.series(name, since).unwrap_or_default();
                        return Ok(
                            json!({ "fs": name, "interval_seconds": 1, "samples": samples }),
                        );
                    }
                    _ => return Err(ApiError::NotFound(format!("no such path: /api/v1/{path}"))),
                }
            }
            ["das"] => Request::DaList,
            ["pdisks"] => Request::PdiskList,
            ["vdisks"] => Request::VdiskList,
            ["nvme"] => Request::NvmeList,
            ["iohist"] => Request::IoHistory,
            ["health"] => {
                return Ok(json!({
                    "node": self.cluster.node_name,
                    "components": self.health.states(),
                }))
            }
            ["events"] => return Ok(json!({ "events": self.health.events() })),
            ["metrics"] => return Ok(self.api_metrics()),
            _ => {
                return Err(ApiError::NotFound(format!(
                    "no such path: /api/v1/{path}; /api/v1 lists the paths"
                )))
            }
        };
        assert!(is_read_only(&request), "the API sent {request:?}");
        let mut reporter = Reporter::quiet();
        match self.handle(request, &mut reporter) {
            Ok(reply) => payload(reply),
            Err(e) => Err(ApiError::Failed(format!("{e:#}"))),
        }
    }

    /// Every file system of the cluster, whether this node has it mounted, and its usage
    /// when it does.
    fn api_filesystems(&self) -> Result<Value, ApiError> {
        let registry = self
            .file_systems()
            .map_err(|e| ApiError::Failed(format!("{e:#}")))?;
        let mounts = self.mounts.lock();
        let list: Vec<Value> = registry
            .file_systems
            .iter()
            .map(|r| {
                let usage = mounts.get(&r.name).map(|m| {
                    let st = m.fs.statfs();
                    json!({
                        "size_bytes": st.fragments_total * st.fragment_bytes,
                        "free_bytes": st.fragments_free * st.fragment_bytes,
                        "inodes_used": st.inodes_total - st.inodes_free,
                        "inodes_max": st.inodes_total,
                    })
                });
                json!({
                    "name": r.name,
                    "nsds": r.nsds,
                    "mounted_here": usage.is_some(),
                    "mounted_on": if r.mounted { r.mounted_on.clone() } else { None },
                    "mount_point": r.mount_point,
                    "usage": usage,
                })
            })
            .collect();
        Ok(json!({ "node": self.cluster.node_name, "filesystems": list }))
    }

    /// The counters `/metrics` exports, as JSON: pmon's per file system, and requests,
    /// bytes and errors per NSD.
    fn api_metrics(&self) -> Value {
        let rows = super::diag::fs_stats_rows(&self.mounted_list());
        let fss: Vec<Value> = rows
            .iter()
            .map(|r| {
                let p = &r.pmon;
                json!({
                    "fs": r.fs,
                    "bytes_read": p.bytes_read,
                    "bytes_written": p.bytes_written,
                    "reads": p.reads,
                    "writes": p.writes,
                    "opens": p.opens,
                    "closes": p.closes,
                    "readdirs": p.readdirs,
                    "inode_updates": p.inode_updates,
                    "checksum_errors": p.checksum_errors,
                    "metadata_pages_clean": r.metadata_pages_clean,
                    "metadata_pages_dirty": r.metadata_pages_dirty,
                    "metadata_page_hits": r.metadata_page_hits,
                    "metadata_page_misses": r.metadata_page_misses,
                    "fuse_requests_waiting": r.fuse_waiting,
                    "fuse_requests_active": r.fuse_active,
                    "fuse_requests_served": r.fuse_served,
                })
            })
            .collect();
        let nsds: Vec<Value> = rows
            .iter()
            .flat_map(|r| {
                r.nsds.iter().map(|n| {
                    json!({
                        "fs": r.fs,
                        "nsd": n.nsd,
                        "op": n.op,
                        "requests": n.requests,
                        "bytes": n.bytes,
                        "errors": n.errors,
                        "seconds": n.seconds,
                    })
                })
            })
            .collect();
        json!({
            "node": self.cluster.node_name,
            "active": self.member.holds_lease(),
            "filesystems": fss,
            "nsds": nsds,
        })
    }
}

/// The requests the API may send: those that only read.
fn is_read_only(request: &Request) -> bool {
    matches!(
        request,
        Request::ClusterShow
            | Request::ClusterState { .. }
            | Request::NsdList
            | Request::NsdAccess
            | Request::FsShow { .. }
            | Request::Df { .. }
            | Request::Pmon { .. }
            | Request::IoHistory
            | Request::DaList
            | Request::PdiskList
            | Request::VdiskList
            | Request::NvmeList
    )
}
