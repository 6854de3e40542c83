//! Declustered arrays, vdisks and pdisks in the daemon. The daemon opens every array of
//! `da.json` at startup (before remounting file systems, whose NSDs may be vdisks) and
//! closes them cleanly at shutdown, after the file systems.
//!
//! A vdisk becomes an NSD through a `%nsd` stanza with `device=vdisk:NAME`; the NSD layer
//! then writes its descriptor on the vdisk like on any drive.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use tessera_drive::BlockDevice;
use tessera_vdisk::{
    Code, DaOptions, DaStatus, DeclusteredArray, PdiskSpec, PdiskState, Progress, Tolerance, Vdisk,
    VdiskSize,
};

use super::lease_gate::LeaseGated;
use super::nsd_admin::{open_claimed, Claim};
use super::nvme_admin::nvme_device_name;
use super::pdisk_fence::{key_owner, release, reservation_key, KeyNamer, ReservedPdisk, TakeCheck};
use super::registry::arrays_in;
use super::{Daemon, Reporter};
use crate::config::{DaRecord, PdiskRecord};
use crate::rpc::{DaRow, PdiskAction, PdiskRow, Reply, Request, TaskRow, VdiskRow};

/// How an NSD device string names a vdisk.
pub const VDISK_DEVICE_PREFIX: &str = "vdisk:";

/// The vdisk an NSD device string names, if it names one.
pub fn vdisk_device_name(device: &str) -> Option<&str> {
    device.strip_prefix(VDISK_DEVICE_PREFIX)
}

fn tolerance_text(t: Tolerance) -> String {
    let pdisks = match t.pdisks {
        1 => "1 pdisk".to_string(),
        n => format!("{n} pdisks"),
    };
    match t.enclosures {
        0 => format!("{pdisks}, no enclosure"),
        1 => format!("{pdisks} or 1 enclosure"),
        n => format!("{pdisks} or {n} enclosures"),
    }
}

fn task_row(task: &str, p: &Progress) -> Option<TaskRow> {
    if !p.active && p.passes == 0 {
        return None;
    }
    let mut remark = Vec::new();
    if p.repaired > 0 {
        remark.push(format!("{} repaired", p.repaired));
    }
    if p.parity_mismatches > 0 {
        remark.push(format!("{} parity mismatches fixed", p.parity_mismatches));
    }
    if p.unrecoverable > 0 {
        remark.push(format!("{} stripes unrecoverable", p.unrecoverable));
    }
    Some(TaskRow {
        task: task.to_string(),
        done: p.done,
        total: p.total,
        bytes: p.bytes,
        rate_bytes_s: p.rate_bytes_s as f64,
        eta_seconds: p.eta_s,
        finished: !p.active,
        remark: remark.join(", "),
    })
}

fn da_row(s: &DaStatus) -> DaRow {
    let mut enclosures: Vec<&str> = s.pdisks.iter().map(|p| p.enclosure.as_str()).collect();
    enclosures.sort_unstable();
    enclosures.dedup();
    let state = match s.state {
        tessera_vdisk::DaState::Ok => "ok",
        tessera_vdisk::DaState::Degraded => "degraded",
        tessera_vdisk::DaState::DataLoss => "data loss",
    };
    DaRow {
        name: s.name.clone(),
        pdisks: s.pdisks.len() as u32,
        enclosures: enclosures.len() as u32,
        state: state.to_string(),
        capacity_bytes: s.capacity_bytes,
        free_bytes: s.free_bytes,
        spare_bytes: s.spare_bytes,
        vdisks: s.vdisks.len() as u32,
        foreground_io_share: s.rebuild_io_share,
        scrub_rate_mb_s: s.scrub_rate_mb_s,
        pdisk_error_limit: s.pdisk_error_limit,
        tasks: [task_row("rebuild", &s.rebuild), task_row("scrub", &s.scrub)]
            .into_iter()
            .flatten()
            .collect(),
        server: String::new(),
        servers: Vec::new(),
        open_here: true,
    }
}

/// Gives every array whose server is not live (`live`) to the live node of its `servers`
/// that serves the fewest arrays, counting those given so far, first in the list on a
/// tie; returns (array, old server, new server) for each. An array with fewer than two
/// servers, or none live, stays where it is.
fn failover_plan(
    arrays: &mut [DaRecord],
    live: &dyn Fn(&str) -> bool,
) -> Vec<(String, String, String)> {
    let mut changed = Vec::new();
    for i in 0..arrays.len() {
        let Some(server) = arrays[i].server.clone() else {
            continue;
        };
        if live(&server) || arrays[i].servers.len() < 2 {
            continue;
        }
        let load = |n: &str| {
            arrays
                .iter()
                .filter(|a| a.server.as_deref() == Some(n))
                .count()
        };
        let Some(to) = arrays[i]
            .servers
            .iter()
            .filter(|s| **s != server && live(s))
            .min_by_key(|s| load(s))
            .cloned()
        else {
            continue;
        };
        changed.push((arrays[i].name.clone(), server, to.clone()));
        arrays[i].server = Some(to);
    }
    changed
}

impl Daemon {
    /// How array `da` opens its pdisks: local paths with O_DIRECT, `nvme:NAME` through
    /// the NVMe/TCP host under this node's reservation (`pdisk_fence`: the drive refuses
    /// the array's earlier server).
    ///
    /// Their I/O is gated by this node's lease, bound to the incarnation that opens them:
    /// an array's server that was cut off and expelled touches its pdisks no more, so the
    /// server the cluster manager gives the array to is alone on them (the array is closed
    /// here and opened again if it is still this node's: `open_arrays_given_here`). A
    /// refused request looks like an unreachable drive, which the array suspends, not
    /// fails.
    pub(super) fn device_opener(&self, da: &str) -> tessera_vdisk::DeviceOpener {
        let host = Arc::clone(&self.nvme);
        let cluster = self.cluster_identity();
        let check = self.member.incarnation_check();
        let key = self
            .member
            .io_epoch()
            .map(|epoch| reservation_key(self.member.me(), epoch));
        let state = Arc::new(self.member.state_reader());
        let me = self.cluster.node_name.clone();
        let da = da.to_string();
        Arc::new(move |path: &Path| {
            let shown = path.to_string_lossy();
            let dev = match (nvme_device_name(&shown), key) {
                (Some(name), Some(key)) => {
                    let Some(ns) = host.namespace(name) else {
                        return open_claimed(&host, &cluster, &shown, Claim::Exclusive);
                    };
                    let (applied, me, da, lease) =
                        (Arc::clone(&state), me.clone(), da.clone(), check.clone());
                    let may_take: TakeCheck = Arc::new(move || {
                        lease()?;
                        let registry = arrays_in(&applied()).map_err(|e| format!("{e:#}"))?;
                        match registry.get(&da).and_then(|r| r.server.as_deref()) {
                            Some(server) if server != me => {
                                Err(format!("declustered array {da} is served by {server} now"))
                            }
                            _ => Ok(()),
                        }
                    });
                    let names = Arc::clone(&state);
                    let namer: KeyNamer = Arc::new(move |key| {
                        let (node, epoch) = key_owner(key);
                        let state = names();
                        let name = state
                            .nodes
                            .get(&node)
                            .map_or_else(|| format!("node number {node}"), |n| n.name.clone());
                        format!("{name}, incarnation {epoch}")
                    });
                    let dev: Arc<dyn BlockDevice> = ReservedPdisk::open(ns, key, may_take, namer);
                    dev
                }
                _ => open_claimed(&host, &cluster, &shown, Claim::Exclusive)?,
            };
            Ok(LeaseGated::wrap(dev, check.clone()))
        })
    }

    /// Opens every array of `da.json`. An array that cannot be opened is logged and left
    /// out: its vdisks' NSDs then show as down, and the rest of the node works.
    pub(super) fn open_arrays_at_start(&self) {
        let registry = match self.arrays() {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("cannot read the array registry: {e:#}");
                return;
            }
        };
        let me = self.cluster.node_name.as_str();
        if self.member.io_epoch().is_none() {
            // Pdisk I/O needs the lease (`device_opener`): opened once this node is active.
            tracing::info!("declustered arrays open once this node holds a disk lease");
            return;
        }
        for rec in registry.arrays {
            // Another node serves it: opening it here too would write its stripes twice.
            if rec.server.as_deref().is_some_and(|s| s != me) {
                continue;
            }
            self.open_array(&rec);
        }
    }

    /// Opens array `rec` on this node (its server): recovers its in-flight stripe updates
    /// (dirty regions) and makes its vdisks available to NSDs.
    fn open_array(&self, rec: &DaRecord) -> bool {
        let devices = self.pdisk_devices(rec);
        let opts = DaOptions {
            opener: Some(self.device_opener(&rec.name)),
            ..DaOptions::default()
        };
        match DeclusteredArray::open_with(&rec.name, &devices, &opts) {
            Ok(da) => {
                let report = da.recovery_report();
                if report.dirty_regions > 0 {
                    tracing::info!(
                        "declustered array {}: resynchronised {} dirty regions after an \
                         unclean shutdown ({} stripes, {} torn sectors accepted, {} strips lost)",
                        rec.name,
                        report.dirty_regions,
                        report.stripes_resynced,
                        report.torn_sectors,
                        report.lost_strips
                    );
                }
                tracing::info!("declustered array {} open", rec.name);
                self.arrays.lock().insert(rec.name.clone(), da);
                true
            }
            Err(e) => {
                tracing::error!("declustered array {}: cannot open: {e}", rec.name);
                false
            }
        }
    }

    /// Keeps the arrays where the registry says, at every configuration change (the
    /// storage service thread): the cluster manager gives an expelled server's arrays to
    /// another of their servers; a node closes the arrays the registry gives another node
    /// (one that was given away while this node was cut off: its lease gate refused its
    /// I/O since, see `device_opener`) and opens those given to it.
    pub(super) fn open_arrays_given_here(&self) {
        self.fail_arrays_over();
        let Ok(registry) = self.arrays() else { return };
        let me = self.cluster.node_name.as_str();
        // A new incarnation of this node: the arrays the old one opened are refused I/O
        // by their lease gate; close them all, and open again below what is still ours.
        let now = self.member.io_epoch();
        let seen = *self.arrays_epoch.lock();
        let stale = matches!((now, seen), (Some(n), Some(t)) if n != t);
        if seen.is_none() && now.is_some() {
            *self.arrays_epoch.lock() = now;
        }
        let open: Vec<String> = self.arrays.lock().keys().cloned().collect();
        for name in open {
            let Some(rec) = registry.get(&name) else {
                continue;
            };
            if !stale && rec.server.as_deref().is_none_or(|s| s == me) {
                continue;
            }
            let Some(_admin) = self.admin.try_lock() else {
                return;
            };
            let nsds = self.nsds_on_array(&name);
            self.withdraw_served_nsds(&nsds);
            if let Some(da) = self.arrays.lock().remove(&name) {
                // Its writes would be refused now (another incarnation's lease gate).
                let _ = da.close();
            }
            if stale {
                tracing::warn!(
                    "declustered array {name}: opened by an earlier incarnation of this node; \
                     closed (opened again if it is still this node's)"
                );
            } else {
                tracing::warn!(
                    "declustered array {name}: served by {} now; closed here",
                    rec.server.as_deref().unwrap_or("?")
                );
            }
        }
        if stale {
            *self.arrays_epoch.lock() = now;
        }
        if now.is_none() {
            return;
        }
        for rec in registry.arrays {
            if rec.server.as_deref() != Some(me) || self.arrays.lock().contains_key(&rec.name) {
                continue;
            }
            // Not while an admin command (a `da move` away from here) runs on this node.
            let Some(_admin) = self.admin.try_lock() else {
                return;
            };
            self.open_array(&rec);
        }
    }

    /// On the cluster manager: every array whose server is not a live incarnation (it was
    /// expelled, so its lease ran out and its pdisk I/O stopped) goes to the live server
    /// of its list that serves the fewest arrays, first in the list on a tie.
    fn fail_arrays_over(&self) {
        let state = self.member.state();
        if state.manager != Some(self.member.me()) {
            return;
        }
        let Ok(mut registry) = self.arrays() else {
            return;
        };
        let live = |name: &str| {
            state
                .node_by_name(name)
                .is_some_and(|n| state.incarnations.contains_key(&n.number))
        };
        let changed = failover_plan(&mut registry.arrays, &live);
        if changed.is_empty() {
            return;
        }
        match self.save_arrays(&registry) {
            Ok(()) => {
                for (name, from, to) in changed {
                    tracing::warn!(
                        "declustered array {name}: its server {from} was expelled; given to {to}"
                    );
                }
            }
            Err(e) => tracing::warn!("declustered arrays not failed over yet: {e:#}"),
        }
    }

    /// The NSDs on the vdisks of array `name` (open here).
    fn nsds_on_array(&self, name: &str) -> Vec<String> {
        let Some(da) = self.arrays.lock().get(name).cloned() else {
            return Vec::new();
        };
        let devices: Vec<String> = da
            .vdisks()
            .iter()
            .map(|v| {
                format!(
                    "{VDISK_DEVICE_PREFIX}{}",
                    tessera_drive::BlockDevice::name(v.as_ref())
                )
            })
            .collect();
        self.nsds()
            .map(|r| {
                r.nsds
                    .iter()
                    .filter(|n| devices.contains(&n.device))
                    .map(|n| n.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `da move NAME --server NODE` [mmvdisk recoverygroup change --active]: run on the
    /// array's server, which withdraws the NSDs of its vdisks, closes the array (its
    /// stripes consistent on the pdisks) and then gives it to NODE in the registry; NODE's
    /// storage service opens it and serves the NSDs it is listed for. The order is what
    /// keeps two nodes from writing the array at once.
    fn da_move(&self, name: &str, to: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        let registry = self.arrays()?;
        let Some(rec) = registry.arrays.iter().find(|a| a.name == name).cloned() else {
            bail!("declustered array {name} does not exist; `tessera da ls` lists the arrays");
        };
        let me = self.cluster.node_name.clone();
        let owner = rec.server.clone().unwrap_or_else(|| me.clone());
        let state = self.member.state();
        let Some(target) = state.node_by_name(to) else {
            bail!("--server {to}: not a node of this cluster; `tessera cluster ls` lists them");
        };
        if !state.incarnations.contains_key(&target.number) {
            bail!(
                "--server {to}: that node's daemon is not active; start it first \
                 (`tessera startup -N {to}`)"
            );
        }
        if owner == to {
            return Ok(Reply::Done);
        }
        if owner != me {
            bail!(
                "declustered array {name} is served by {owner}: run `tessera da move {name} \
                 --server {to}` on {owner}, which closes the array before {to} opens it"
            );
        }
        let da = self.array(name)?;
        let nsds = self.nsds_on_array(name);
        let local: Vec<String> = self
            .mounts
            .lock()
            .keys()
            .chain(self.owned.lock().keys())
            .cloned()
            .collect();
        // A file system mounted here goes on through the NSD servers once the array closes
        // (`local_then_servers`), so the array's new server must be one of them.
        let registry_nsds = self.nsds()?;
        for fs in self.file_systems()?.file_systems.iter() {
            if !local.contains(&fs.name) {
                continue;
            }
            for nsd in fs.nsds.iter().filter(|n| nsds.contains(n)) {
                let servers = registry_nsds
                    .get(nsd)
                    .map(|r| r.servers.clone())
                    .unwrap_or_default();
                if !servers.iter().any(|s| s == to) {
                    bail!(
                        "file system {} is mounted on this node and uses NSD {nsd} on the \
                         array, whose servers= ({}) does not list {to}: this node could not \
                         reach it after the move; add {to} to its servers (`tessera nsd \
                         change -F`) or unmount {} here first",
                        fs.name,
                        servers.join(","),
                        fs.name
                    );
                }
            }
        }
        self.withdraw_served_nsds(&nsds);
        self.arrays.lock().remove(name);
        if let Err(e) = da.close() {
            tracing::error!("declustered array {name}: close before the move failed: {e}");
            self.arrays.lock().insert(name.to_string(), da);
            bail!("declustered array {name}: cannot close it before the move: {e}; it stays here");
        }
        drop(da);
        let moved = self.change_arrays(&mut |registry| {
            if let Some(r) = registry.arrays.iter_mut().find(|a| a.name == name) {
                r.server = Some(to.to_string());
            }
            Ok(())
        });
        if let Err(e) = moved {
            self.open_array(&rec);
            return Err(e.context(format!("declustered array {name} stays on {me}")));
        }
        tracing::info!("declustered array {name}: moved to {to}");
        Ok(Reply::Done)
    }

    /// Every array of the registry: those open here with their state, the others with
    /// the node that serves them.
    fn da_rows(&self) -> Result<Vec<DaRow>> {
        let registry = self.arrays()?;
        let open = self.arrays.lock().clone();
        let me = self.cluster.node_name.clone();
        let mut rows = Vec::new();
        for rec in &registry.arrays {
            let server = rec.server.clone().unwrap_or_else(|| me.clone());
            let mut row = match open.get(&rec.name) {
                Some(da) => {
                    let mut row = da_row(&da.status());
                    row.open_here = true;
                    row
                }
                None => DaRow {
                    name: rec.name.clone(),
                    pdisks: rec.pdisks.len() as u32,
                    enclosures: 0,
                    state: if server == me {
                        "not open".into()
                    } else {
                        format!("served by {server}")
                    },
                    capacity_bytes: 0,
                    free_bytes: 0,
                    spare_bytes: 0,
                    vdisks: 0,
                    foreground_io_share: 0,
                    scrub_rate_mb_s: 0,
                    pdisk_error_limit: 0,
                    tasks: Vec::new(),
                    server: String::new(),
                    servers: Vec::new(),
                    open_here: false,
                },
            };
            row.server = server;
            row.servers = rec.servers.clone();
            rows.push(row);
        }
        Ok(rows)
    }

    pub(super) fn close_arrays(&self) {
        let arrays = std::mem::take(&mut *self.arrays.lock());
        for (name, da) in arrays {
            match da.close() {
                Ok(()) => tracing::info!("declustered array {name} closed"),
                Err(e) => tracing::error!("declustered array {name}: close failed: {e}"),
            }
        }
    }

    /// The vdisk of that name, from whichever array holds it.
    pub(super) fn find_vdisk(&self, name: &str) -> Option<Arc<Vdisk>> {
        self.arrays.lock().values().find_map(|da| da.vdisk(name))
    }

    fn array(&self, name: &str) -> Result<Arc<DeclusteredArray>> {
        let arrays = self.arrays.lock();
        if let Some(da) = arrays.get(name) {
            return Ok(Arc::clone(da));
        }
        if self.arrays()?.get(name).is_some() {
            bail!(
                "declustered array {name} is registered but could not be opened at startup; \
                 see the daemon log, fix the drives, and restart the daemon"
            );
        }
        let known: Vec<&str> = arrays.keys().map(String::as_str).collect();
        if known.is_empty() {
            bail!("declustered array {name} does not exist; create one with `tessera da create`");
        }
        bail!(
            "declustered array {name} does not exist; known arrays: {}",
            known.join(", ")
        )
    }

    /// The array holding pdisk `name` (pdisk names are unique on a node).
    fn array_of_pdisk(&self, name: &str) -> Result<Arc<DeclusteredArray>> {
        let arrays = self.arrays.lock();
        arrays
            .values()
            .find(|da| da.status().pdisks.iter().any(|p| p.name == name))
            .cloned()
            .ok_or_else(|| anyhow!("pdisk {name} does not exist; `tessera pdisk ls` lists them"))
    }

    pub(super) fn da_request(&self, request: Request, r: &mut Reporter) -> Result<Reply> {
        match request {
            request @ Request::DaCreate { .. } => self.da_create(request, r),
            Request::DaChange { name, settings } => {
                let _admin = self.admin.lock();
                let da = self.array(&name)?;
                let now = da.status();
                da.set_options(
                    settings.foreground_io_share.unwrap_or(now.rebuild_io_share),
                    settings.scrub_rate_mb_s.unwrap_or(now.scrub_rate_mb_s),
                    settings.pdisk_error_limit.unwrap_or(now.pdisk_error_limit),
                )?;
                Ok(Reply::Das(vec![da_row(&da.status())]))
            }
            Request::DaList => Ok(Reply::Das(self.da_rows()?)),
            Request::DaDelete { name } => self.da_delete(&name, r),
            Request::DaMove { name, server } => self.da_move(&name, &server),
            Request::DaScrub { name } => {
                self.array(&name)?.start_scrub();
                Ok(Reply::Done)
            }
            Request::VdiskCreate {
                name,
                da,
                code,
                block_size,
                size_bytes,
                size_percent,
            } => self.vdisk_create(&name, &da, &code, block_size, size_bytes, size_percent),
            Request::VdiskList => Ok(Reply::Vdisks(self.vdisk_rows(None)?)),
            Request::VdiskDelete { name } => self.vdisk_delete(&name),
            Request::PdiskList => Ok(Reply::Pdisks(self.pdisk_rows())),
            Request::PdiskChange {
                name,
                action,
                force,
            } => {
                let _admin = self.admin.lock();
                let da = self.array_of_pdisk(&name)?;
                match action {
                    PdiskAction::Fail => {
                        if !force {
                            self.refuse_data_loss(&da, &name)?;
                        }
                        da.pdisk_fail(&name)?
                    }
                    PdiskAction::Suspend => da.pdisk_suspend(&name)?,
                    PdiskAction::Resume => da.pdisk_resume(&name)?,
                }
                Ok(Reply::Done)
            }
            Request::PdiskReplace { name, device_path } => self.pdisk_replace(&name, &device_path),
            other => bail!("protocol error: {other:?} is not an array request"),
        }
    }

    fn da_create(&self, request: Request, r: &mut Reporter) -> Result<Reply> {
        let Request::DaCreate {
            name,
            pdisks,
            spare_pdisks,
            settings,
            verify,
            servers,
        } = request
        else {
            bail!("protocol error: not a da create request");
        };
        let (name, pdisks, servers) = (name.as_str(), pdisks.as_slice(), servers.as_slice());
        let _admin = self.admin.lock();
        let registry = self.arrays()?;
        if registry.get(name).is_some() {
            bail!("declustered array {name} already exists; choose another name");
        }
        if !servers.is_empty() {
            let state = self.member.state();
            let me = &self.cluster.node_name;
            if let Some(bad) = servers.iter().find(|s| state.node_by_name(s).is_none()) {
                bail!("--servers: {bad} is not a node of this cluster; `tessera cluster ls` lists them");
            }
            if !servers.contains(me) {
                bail!(
                    "--servers: this node ({me}) writes the array's labels and serves it first, \
                     so it must be one of the servers; run `da create` on one of {}",
                    servers.join(",")
                );
            }
        }
        let nsds = self.nsds()?;
        for p in pdisks {
            if let Some(nsd) = nsds.nsds.iter().find(|n| n.device == p.device_path) {
                bail!(
                    "device={}: is NSD {} of this cluster; a drive is either an NSD or a \
                     pdisk — delete the NSD first with `tessera nsd delete {}`",
                    p.device_text,
                    nsd.name,
                    nsd.name
                );
            }
            for other in &registry.arrays {
                if let Some(q) = other.pdisks.iter().find(|q| q.device == p.device_path) {
                    bail!(
                        "device={}: is already pdisk {} of declustered array {}",
                        p.device_text,
                        q.name,
                        other.name
                    );
                }
                if other.pdisks.iter().any(|q| q.name == p.name) {
                    bail!(
                        "pdisk={}: a pdisk of that name already exists in declustered array \
                         {}; pdisk names are unique on a node",
                        p.name,
                        other.name
                    );
                }
            }
        }
        let specs: Vec<PdiskSpec> = pdisks
            .iter()
            .map(|p| PdiskSpec {
                name: p.name.clone(),
                device: PathBuf::from(self.stable_device_name(&p.device_path)),
                enclosure: p.enclosure.clone(),
                slot: p.slot,
            })
            .collect();
        let defaults = DaOptions::default();
        let opts = DaOptions {
            spare_pdisks,
            rebuild_io_share: settings
                .foreground_io_share
                .unwrap_or(defaults.rebuild_io_share),
            scrub_rate_mb_s: settings.scrub_rate_mb_s.unwrap_or(defaults.scrub_rate_mb_s),
            pdisk_error_limit: settings
                .pdisk_error_limit
                .unwrap_or(defaults.pdisk_error_limit),
            force: !verify,
            opener: Some(self.device_opener(name)),
        };
        r.info(format!(
            "tessera da create: writing labels and metadata on {} pdisks",
            specs.len()
        ));
        let da = DeclusteredArray::create(name, &specs, opts)?;
        let record = DaRecord {
            name: name.to_string(),
            pdisks: pdisks
                .iter()
                .map(|p| PdiskRecord {
                    name: p.name.clone(),
                    device: self.stable_device_name(&p.device_path),
                })
                .collect(),
            server: Some(self.cluster.node_name.clone()),
            servers: servers.to_vec(),
        };
        // On the table as it is now: another node's array command during the labels is no
        // reason to fail this one.
        self.change_arrays(&mut |registry| {
            if registry.get(name).is_some() {
                bail!("another command created a declustered array named {name} meanwhile");
            }
            registry.arrays.push(record.clone());
            Ok(())
        })?;
        let row = da_row(&da.status());
        self.arrays.lock().insert(name.to_string(), da);
        Ok(Reply::Das(vec![row]))
    }

    fn vdisk_create(
        &self,
        name: &str,
        da_name: &str,
        code: &str,
        block_size: u64,
        size_bytes: Option<u64>,
        size_percent: Option<u8>,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        if let Some(existing) = self.find_vdisk(name) {
            bail!(
                "vdisk {name} already exists in declustered array {}; vdisk names are unique \
                 on a node",
                existing.array_name()
            );
        }
        let da = self.array(da_name)?;
        let code = Code::parse(code).map_err(|e| anyhow!("--code {code}: {e}"))?;
        let size = match (size_bytes, size_percent) {
            (Some(b), None) => VdiskSize::Bytes(b),
            (None, Some(p)) => VdiskSize::Percent(p),
            _ => bail!("protocol error: give the vdisk size either in bytes or in percent"),
        };
        da.create_vdisk(name, code, block_size, size)?;
        Ok(Reply::Vdisks(self.vdisk_rows(Some(name))?))
    }

    fn vdisk_rows(&self, only: Option<&str>) -> Result<Vec<VdiskRow>> {
        let nsds = self.nsds()?;
        let mut rows = Vec::new();
        for (da_name, da) in self.arrays.lock().iter() {
            for v in da.status().vdisks {
                if only.is_some_and(|o| o != v.name) {
                    continue;
                }
                let device = format!("{VDISK_DEVICE_PREFIX}{}", v.name);
                let state = if v.critical_stripes > 0 {
                    format!("critical ({} stripes)", v.critical_stripes)
                } else if v.degraded_stripes > 0 {
                    format!("degraded ({} stripes)", v.degraded_stripes)
                } else {
                    "ok".to_string()
                };
                rows.push(VdiskRow {
                    name: v.name.clone(),
                    da: da_name.clone(),
                    code: v.code.clone(),
                    block_size: v.block_bytes,
                    strip_size: v.strip_bytes,
                    capacity_bytes: v.capacity_bytes,
                    state,
                    tolerance: tolerance_text(v.tolerance),
                    nsd: nsds
                        .nsds
                        .iter()
                        .find(|n| n.device == device)
                        .map(|n| n.name.clone()),
                });
            }
        }
        Ok(rows)
    }

    fn vdisk_delete(&self, name: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        let device = format!("{VDISK_DEVICE_PREFIX}{name}");
        if let Some(nsd) = self.nsds()?.nsds.iter().find(|n| n.device == device) {
            bail!(
                "vdisk {name} is NSD {}; delete the NSD first with `tessera nsd delete {}`",
                nsd.name,
                nsd.name
            );
        }
        let Some(vdisk) = self.find_vdisk(name) else {
            bail!("vdisk {name} does not exist; `tessera vdisk ls` lists the vdisks");
        };
        self.array(vdisk.array_name())?.delete_vdisk(name)?;
        Ok(Reply::Done)
    }

    /// Refuses to fail pdisk `name` when a vdisk would lose data, naming the vdisks, the
    /// NSDs and file systems on them, and the pdisks already down.
    fn refuse_data_loss(&self, da: &DeclusteredArray, name: &str) -> Result<()> {
        let lost = da.loss_if_failed(name)?;
        if lost.is_empty() {
            return Ok(());
        }
        let nsds = self.nsds()?;
        let victims: Vec<String> = lost
            .iter()
            .map(|(vdisk, stripes)| {
                let device = format!("{VDISK_DEVICE_PREFIX}{vdisk}");
                let user = match nsds.nsds.iter().find(|n| n.device == device) {
                    Some(n) => match &n.file_system {
                        Some(fs) => format!(", NSD {} of file system {fs}", n.name),
                        None => format!(", NSD {}", n.name),
                    },
                    None => String::new(),
                };
                format!("vdisk {vdisk} ({stripes} stripes{user})")
            })
            .collect();
        let down: Vec<String> = da
            .status()
            .pdisks
            .iter()
            .filter(|p| {
                p.state != PdiskState::Replaced && (p.state != PdiskState::Ok || p.catching_up)
            })
            .map(|p| format!("{} ({})", p.name, p.state))
            .collect();
        let already = if down.is_empty() {
            String::new()
        } else {
            format!(" with {} already down", down.join(", "))
        };
        bail!(
            "failing pdisk {name}{already} loses data: {} would have stripes with fewer \
             readable strips than their code needs; resume or replace the pdisks that are \
             down first, or give --force to fail it anyway",
            victims.join("; ")
        )
    }

    /// The drives of a deleted array are free for any use: this node's reservations on
    /// its NVMe/TCP pdisks go.
    fn release_pdisk_reservations(&self, rec: Option<&DaRecord>) {
        let (Some(rec), Some(epoch)) = (rec, self.member.io_epoch()) else {
            return;
        };
        let key = reservation_key(self.member.me(), epoch);
        for p in &rec.pdisks {
            if let Some(ns) = nvme_device_name(&p.device).and_then(|n| self.nvme.namespace(n)) {
                release(&ns, key);
            }
        }
    }

    /// `da delete`: refused while the array holds vdisks; wipes the pdisk labels so the
    /// drives are free for a new array or NSDs.
    fn da_delete(&self, name: &str, r: &mut Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        let registry = self.arrays()?;
        if registry.get(name).is_none() {
            bail!("declustered array {name} does not exist; `tessera da ls` lists them");
        }
        let open = self.arrays.lock().get(name).cloned();
        let Some(da) = open else {
            return self.forget_unopened_array(name, r);
        };
        let vdisks: Vec<String> = da.status().vdisks.into_iter().map(|v| v.name).collect();
        if !vdisks.is_empty() {
            bail!(
                "declustered array {name} still holds vdisks {}; delete them first with \
                 `tessera vdisk delete NAME` (after `tessera nsd delete` of their NSDs and \
                 `tessera fs delete` of the file systems on those)",
                vdisks.join(", ")
            );
        }
        let kept = da.destroy()?;
        self.arrays.lock().remove(name);
        self.release_pdisk_reservations(registry.get(name));
        self.change_arrays(&mut |registry| {
            registry.arrays.retain(|a| a.name != name);
            Ok(())
        })?;
        for k in &kept {
            r.info(format!(
                "tessera da delete: warning: the label of pdisk {k} was not wiped; reuse that \
                 drive with `-v no`"
            ));
        }
        tracing::info!("declustered array {name} deleted");
        Ok(Reply::Done)
    }

    /// `da delete` of an array that could not be opened: its vdisks are unknown, so it is
    /// removed from the registry only while no NSD names a vdisk that no open array has.
    fn forget_unopened_array(&self, name: &str, r: &mut Reporter) -> Result<Reply> {
        let nsds = self.nsds()?;
        let unknown: Vec<String> = nsds
            .nsds
            .iter()
            .filter(|n| vdisk_device_name(&n.device).is_some_and(|v| self.find_vdisk(v).is_none()))
            .map(|n| n.name.clone())
            .collect();
        if !unknown.is_empty() {
            bail!(
                "declustered array {name} could not be opened at startup, and NSDs {} are on \
                 vdisks that may be in it; delete those NSDs first (`tessera nsd delete`), or \
                 fix the drives and restart the daemon",
                unknown.join(", ")
            );
        }
        self.change_arrays(&mut |registry| {
            registry.arrays.retain(|a| a.name != name);
            Ok(())
        })?;
        r.info(format!(
            "tessera da delete: warning: declustered array {name} could not be opened, so its \
             pdisk labels stay: reuse its drives with `-v no`"
        ));
        Ok(Reply::Done)
    }

    fn pdisk_rows(&self) -> Vec<PdiskRow> {
        let mut rows = Vec::new();
        for (da_name, da) in self.arrays.lock().iter() {
            for p in da.status().pdisks {
                let mut state = p.state.to_string();
                if p.catching_up {
                    state += " (catching up)";
                }
                rows.push(PdiskRow {
                    name: p.name,
                    da: da_name.clone(),
                    device: p.device,
                    enclosure: p.enclosure,
                    slot: p.slot,
                    state,
                    capacity_bytes: p.capacity_bytes,
                    free_bytes: p.free_bytes,
                    read_errors: p.read_errors,
                    write_errors: p.write_errors,
                    checksum_errors: p.checksum_errors,
                });
            }
        }
        rows
    }

    fn pdisk_replace(&self, name: &str, device_path: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        let mut registry = self.arrays()?;
        if let Some(nsd) = self.nsds()?.nsds.iter().find(|n| n.device == device_path) {
            bail!(
                "--device {device_path}: is NSD {} of this cluster; use a free drive",
                nsd.name
            );
        }
        let da = self.array_of_pdisk(name)?;
        da.pdisk_replace(name, std::path::Path::new(device_path))?;
        if let Some(rec) = registry.get_mut(da.name()) {
            if let Some(p) = rec.pdisks.iter_mut().find(|p| p.name == name) {
                p.device = device_path.to_string();
            }
        }
        self.save_arrays(&registry)?;
        Ok(Reply::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_in_words() {
        let t = |pdisks, enclosures| tolerance_text(Tolerance { pdisks, enclosures });
        assert_eq!(t(2, 1), "2 pdisks or 1 enclosure");
        assert_eq!(t(1, 0), "1 pdisk, no enclosure");
        assert_eq!(t(3, 3), "3 pdisks or 3 enclosures");
        assert_eq!(vdisk_device_name("vdisk:vd1"), Some("vd1"));
        assert_eq!(vdisk_device_name("/dev/vd1"), None);
    }
}

#[cfg(test)]
mod failover_tests {
    use super::*;

    fn array(name: &str, server: &str, servers: &[&str]) -> DaRecord {
        DaRecord {
            name: name.into(),
            pdisks: Vec::new(),
            server: Some(server.into()),
            servers: servers.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Any-to-any: four servers, six arrays; whichever server dies, its arrays spread over
    /// the other three (no survivor ends with two more than another), and nothing else
    /// moves.
    #[test]
    fn a_dead_servers_arrays_spread_over_the_least_loaded_survivors() {
        let all = ["n1", "n2", "n3", "n4"];
        for dead in all {
            let mut arrays: Vec<DaRecord> = (0..6)
                .map(|i| array(&format!("a{i}"), all[i % 4], &all))
                .collect();
            let before: Vec<Option<String>> = arrays.iter().map(|a| a.server.clone()).collect();
            let live = |n: &str| n != dead;
            let moved = failover_plan(&mut arrays, &live);
            let had = before.iter().filter(|s| s.as_deref() == Some(dead)).count();
            assert_eq!(moved.len(), had, "{dead}: {moved:?}");
            assert!(arrays.iter().all(|a| a.server.as_deref() != Some(dead)));
            for (a, b) in arrays.iter().zip(&before) {
                if b.as_deref() != Some(dead) {
                    assert_eq!(a.server, *b, "{} moved though its server lives", a.name);
                }
            }
            let loads: Vec<usize> = all
                .iter()
                .filter(|n| **n != dead)
                .map(|n| {
                    arrays
                        .iter()
                        .filter(|a| a.server.as_deref() == Some(*n))
                        .count()
                })
                .collect();
            let (lo, hi) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            assert!(hi - lo <= 1, "{dead}: loads {loads:?}");
        }
    }

    #[test]
    fn arrays_without_a_live_second_server_stay() {
        let mut arrays = vec![
            array("solo", "n1", &[]),
            array("pair", "n1", &["n1", "n2"]),
            array("other", "n3", &["n3", "n1"]),
        ];
        let live = |n: &str| n == "n3";
        let moved = failover_plan(&mut arrays, &live);
        assert!(moved.is_empty(), "{moved:?}");
        let live = |n: &str| n != "n1";
        let moved = failover_plan(&mut arrays, &live);
        assert_eq!(moved, vec![("pair".into(), "n1".into(), "n2".into())]);
        assert_eq!(arrays[0].server.as_deref(), Some("n1"));
    }
}
