//! `fs create`, `fs ls` and `fs delete` in the daemon. `fs create` checks every NSD before
//! formatting and erases whatever formatting wrote if it fails, so an error leaves the
//! NSDs free and the registry unchanged.

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use tessera_drive::BlockDevice;
use tessera_fs::{AtimeMode, DiskSpec, FormatOptions, Placement};
use tessera_nsd::{check_name, probe_in_use, InUse, ThinDiskType, NAME_RULE};

use super::da_admin::vdisk_device_name;
use super::{Daemon, Reporter};
use crate::config::{FsRecord, NsdRegistry};
use crate::rpc::{FsCreateSpec, FsDiskSpec, FsShow, Reply};

/// The default inode limit: a quarter of the metadata capacity filled with inodes, and
/// never fewer than this.
const DEFAULT_MAX_INODES_MIN: u64 = 100_000;

/// Resolves the stanza's NSDs against the registry and opens them with `claim`; collects
/// every problem. `outcome` ends the error ("file system X was not created").
fn resolve_disks(
    daemon: &Daemon,
    wanted: &[FsDiskSpec],
    block_size: u32,
    verify: bool,
    nsds: &NsdRegistry,
    outcome: &str,
    claim: super::nsd_admin::Claim,
) -> Result<Vec<DiskSpec>> {
    let mut disks = Vec::new();
    let mut problems = Vec::new();
    for d in wanted {
        let Some(rec) = nsds.get(&d.nsd) else {
            problems.push(format!(
                "NSD {} does not exist; run `tessera nsd create -F FILE` first",
                d.nsd
            ));
            continue;
        };
        if let Some(fs) = &rec.file_system {
            problems.push(format!("NSD {} already belongs to file system {fs}", d.nsd));
            continue;
        }
        let device = match daemon.open_nsd_as(rec, claim) {
            Ok(dev) => dev,
            Err(e) => {
                problems.push(format!("NSD {}: {e:#}", d.nsd));
                continue;
            }
        };
        // One file-system block must be one full stripe, or every block write would be a
        // read-modify-write of parity.
        if let Some(vdisk) = vdisk_device_name(&rec.device).and_then(|v| daemon.find_vdisk(v)) {
            if vdisk.block_size() != u64::from(block_size) {
                problems.push(format!(
                    "NSD {} is vdisk {} with block size {} KiB, but the file system block \
                     size (-B) is {} KiB; one file-system block must be one full stripe: \
                     use -B {}K or a vdisk created with --block-size {}K",
                    d.nsd,
                    vdisk.name(),
                    vdisk.block_size() >> 10,
                    block_size >> 10,
                    vdisk.block_size() >> 10,
                    block_size >> 10
                ));
                continue;
            }
        }
        if verify {
            match probe_in_use(device.as_ref()) {
                Ok(InUse::FileSystem) => problems.push(format!(
                    "NSD {} holds (or held) a file system; if its data is no longer needed, \
                     rerun with `-v no`",
                    d.nsd
                )),
                Ok(_) => {}
                Err(e) => problems.push(format!("NSD {}: {e}", d.nsd)),
            }
        }
        disks.push(DiskSpec {
            nsd_name: rec.name.clone(),
            nsd_id: rec.id,
            usage: d.usage.unwrap_or(rec.usage),
            failure_group: d.failure_group.unwrap_or(rec.failure_group),
            pool: d.pool.clone().unwrap_or_else(|| rec.pool.clone()),
            device,
        });
    }
    if !problems.is_empty() {
        bail!("{outcome}:\n  {}", problems.join("\n  "));
    }
    Ok(disks)
}

/// `-L` when not given, for metadata disks of 4 GiB or more: as GPFS's larger default
/// (32 MiB), leaving the checkpoint, which frees log space, rare under bursts of creates.
const DEFAULT_LOG_BYTES: u64 = 64 << 20;
/// The smallest `-L` when not given (metadata disks of 256 MiB or less), as GPFS's default
/// for small block sizes.
const DEFAULT_LOG_BYTES_MIN: u64 = 4 << 20;

fn format_options(spec: &FsCreateSpec, disks: &[DiskSpec]) -> FormatOptions {
    let meta_disks = disks.iter().filter(|d| d.usage.holds_metadata());
    let meta_bytes: u64 = meta_disks.clone().map(|d| d.device.size_bytes()).sum();
    let largest_meta = meta_disks.map(|d| d.device.size_bytes()).max().unwrap_or(0);
    let bs = u64::from(spec.block_size);
    // Every node holding an owner slot gets a log of the same size, so on a small file
    // system a fixed 64 MiB would leave little else (three nodes on 256 MiB: 192 MiB of
    // logs). A 64th of the metadata capacity keeps them to a few percent.
    let wanted = spec
        .log_bytes
        .unwrap_or((meta_bytes / 64).clamp(DEFAULT_LOG_BYTES_MIN, DEFAULT_LOG_BYTES));
    // The log is one contiguous run on one metadata disk; keep it to a quarter of the
    // largest so that inodes and directories still have room.
    let log_bytes = (wanted.min(largest_meta / 4) / bs).max(1) * bs;
    let max_inodes = spec.max_inodes.unwrap_or_else(|| {
        (meta_bytes / 4 / u64::from(spec.inode_size)).max(DEFAULT_MAX_INODES_MIN)
    });
    let atime = match spec.suppress_atime.as_str() {
        "yes" => AtimeMode::Suppress,
        "relatime" => AtimeMode::Relatime,
        _ => AtimeMode::Update,
    };
    FormatOptions {
        name: spec.name.clone(),
        block_size: spec.block_size,
        inode_size: spec.inode_size,
        placement: if spec.cluster_placement {
            Placement::Cluster
        } else {
            Placement::Scatter
        },
        max_inodes,
        prealloc_inodes: spec.prealloc_inodes,
        shard_count: spec.shard_count,
        default_mount_point: spec.mount_point.clone(),
        automount: spec.automount,
        atime,
        exact_mtime: spec.exact_mtime,
        estimated_nodes: spec.estimated_nodes,
        max_metadata_replicas: spec.max_metadata_replicas,
        max_data_replicas: spec.max_data_replicas,
        metadata_replicas: spec.metadata_replicas.clamp(1, 2) as u8,
        replication: tessera_fs::Replication {
            data: spec.data_replicas.clamp(1, 3) as u8,
            strict: tessera_fs::StrictReplication::parse(&spec.strict_replicas)
                .unwrap_or(tessera_fs::StrictReplication::WhenPossible),
        },
        log_bytes,
    }
}

impl Daemon {
    pub(super) fn fs_create(&self, spec: FsCreateSpec, r: &mut Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        check_name(&spec.name)
            .map_err(|p| anyhow!("{}: invalid file system name: {p}; {NAME_RULE}", spec.name))?;
        let fss = self.file_systems()?;
        if fss.get(&spec.name).is_some() {
            bail!(
                "file system {0} already exists; choose another name or delete it with \
                 `tessera fs delete {0}`",
                spec.name
            );
        }
        let nsds = self.nsds()?;
        let outcome = format!("file system {} was not created", spec.name);
        let disks = resolve_disks(
            self,
            &spec.disks,
            spec.block_size,
            spec.verify,
            &nsds,
            &outcome,
            super::nsd_admin::Claim::Exclusive,
        )?;
        let opts = format_options(&spec, &disks);
        // Refused input is reported before anything is announced as being formatted.
        opts.check(&disks)
            .map_err(|e| anyhow!("{e}; file system {} was not created", spec.name))?;
        let devices: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|d| d.device.clone()).collect();
        let names: Vec<String> = disks.iter().map(|d| d.nsd_name.clone()).collect();
        r.info(format!(
            "The following disks of {} will be formatted on node {}:",
            spec.name, self.cluster.node_name
        ));
        for d in &disks {
            r.info(format!(
                "    {}: size {} KB",
                d.nsd_name,
                d.device.size_bytes() >> 10
            ));
        }
        r.info("Formatting file system ...");
        let result =
            tessera_fs::format(disks, &opts, &mut |p| r.progress(&p.phase, p.done, p.total));
        if let Err(e) = result {
            let _ = tessera_fs::erase(&devices);
            bail!("{e}; file system {} was not created", spec.name);
        }
        let record = FsRecord {
            name: spec.name.clone(),
            nsds: names.clone(),
            default_mount_point: spec.mount_point.clone(),
            automount: spec.automount,
            created_unix: crate::config::now_unix(),
            created_unix_ms: crate::config::now_unix_ms(),
            mounted: false,
            mounted_on: None,
            clients: Vec::new(),
            private_cache: false,
            slot_holders: Vec::new(),
            mount_point: spec.mount_point.clone(),
            strict_replicas: spec.strict_replicas.clone(),
            log_bytes: opts.log_bytes,
        };
        // On the tables as they are now: a mount or an NSD created elsewhere during the
        // format is no reason to throw the format away.
        let saved = self.change_nsds_and_file_systems(&mut |nsds, fss| {
            if fss.get(&spec.name).is_some() {
                bail!(
                    "another command created a file system named {} meanwhile",
                    spec.name
                );
            }
            claim_nsds(nsds, &spec.name, &names)?;
            fss.file_systems.push(record.clone());
            Ok(())
        });
        if let Err(e) = saved {
            self.release_unrecorded_claims(&spec.name, &names);
            // A disk another file system took meanwhile is that one's now.
            let taken_meanwhile = self.nsds().map_or(true, |nsds| {
                names.iter().any(|n| {
                    nsds.get(n)
                        .and_then(|r| r.file_system.as_ref())
                        .is_some_and(|f| *f != spec.name)
                })
            });
            if !taken_meanwhile {
                let _ = tessera_fs::erase(&devices);
            }
            return Err(e.context(format!("file system {} was not created", spec.name)));
        }
        r.info(format!("Completed creation of file system {}.", spec.name));
        Ok(Reply::Done)
    }

    pub(super) fn fs_show(&self, name: &str) -> Result<Reply> {
        let fss = self.file_systems()?;
        let record = fss.require(name)?.clone();
        let nsds = self.nsds()?;
        let mounted = self
            .mounts
            .lock()
            .get(name)
            .map(|m| (m.fs.clone(), m.mount_point.clone()));
        let (devices, up) = self.open_fs_devices(&record, &nsds);
        let descriptor = match &mounted {
            Some((fs, _)) => fs.descriptor(),
            None => {
                let available: Vec<_> = devices.iter().flatten().map(|(_, d)| d.clone()).collect();
                tessera_fs::read_descriptor(&available)
                    .map_err(|e| self.unreadable_descriptor(&record, &nsds, &e.to_string()))?
            }
        };
        // A mounted file system knows which disks it took out (missing at mount, stopped,
        // failed a write).
        let taken_out: Vec<String> = match &mounted {
            Some((fs, _)) => fs
                .disk_availability()
                .into_iter()
                .filter(|(_, up)| !up)
                .map(|(n, _)| n)
                .collect(),
            None => Vec::new(),
        };
        let disks_up = descriptor
            .disks
            .iter()
            .map(|d| {
                !taken_out.contains(&d.nsd_name)
                    && record
                        .nsds
                        .iter()
                        .position(|n| *n == d.nsd_name)
                        .is_some_and(|i| up[i])
            })
            .collect();
        let disks_lost = descriptor
            .disks
            .iter()
            .map(|d| {
                let rec = nsds.get(&d.nsd_name)?;
                self.data_lost_on(&rec.device)
            })
            .collect();
        let mounted_at = mounted.map(|(_, mp)| mp.display().to_string());
        Ok(Reply::Fs(Box::new(FsShow {
            record,
            descriptor,
            disks_up,
            disks_lost,
            mounted_at,
        })))
    }

    /// The error for a file system whose descriptor cannot be read, naming the NSDs that
    /// are down because their vdisk lost data, and the way out.
    fn unreadable_descriptor(
        &self,
        record: &FsRecord,
        nsds: &NsdRegistry,
        error: &str,
    ) -> anyhow::Error {
        let name = &record.name;
        let lost: Vec<String> = record
            .nsds
            .iter()
            .filter_map(|n| {
                let why = self.data_lost_on(&nsds.get(n)?.device)?;
                Some(format!("NSD {n} is down: {why}"))
            })
            .collect();
        if lost.is_empty() {
            return anyhow!("file system {name}: {error}");
        }
        anyhow!(
            "file system {name}: cannot read its descriptor ({error}); {}. If the data cannot \
             be brought back, delete it with `tessera fs delete {name} -p`",
            lost.join("; ")
        )
    }

    /// Why part of the NSD on `device` cannot be read although it opens: a vdisk with
    /// stripes that lost more strips than its code tolerates.
    fn data_lost_on(&self, device: &str) -> Option<String> {
        let vdisk = vdisk_device_name(device)?;
        let arrays = self.arrays.lock();
        arrays.values().find_map(|da| {
            let v = da.status().vdisks.into_iter().find(|v| v.name == vdisk)?;
            (v.critical_stripes > 0).then(|| {
                format!(
                    "vdisk {vdisk} lost data: {} stripes have fewer readable strips than \
                     {} needs; reads of them fail",
                    v.critical_stripes, v.code
                )
            })
        })
    }

    pub(super) fn fs_delete(
        &self,
        name: &str,
        unreadable_ok: bool,
        r: &mut Reporter,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        let fss = self.file_systems()?;
        let record = fss.require(name)?.clone();
        if let Some(m) = self.mounts.lock().get(name) {
            bail!(
                "file system {name} is mounted at {}; unmount it on every node first with \
                 `tessera umount {name} -a`",
                m.mount_point.display()
            );
        }
        self.check_not_mounted_elsewhere(&record, "deleting it")?;
        let nsds = self.nsds()?;
        let (devices, _) = self.open_fs_devices(&record, &nsds);
        let available: Vec<_> = devices.iter().flatten().map(|(_, d)| d.clone()).collect();
        let unreachable: Vec<&String> = record
            .nsds
            .iter()
            .zip(&devices)
            .filter(|(_, dev)| dev.is_none())
            .map(|(nsd, _)| nsd)
            .collect();
        if !unreadable_ok {
            let down: Vec<String> = record
                .nsds
                .iter()
                .filter_map(|n| {
                    let lost = nsds.get(n).and_then(|rec| self.data_lost_on(&rec.device));
                    match lost {
                        Some(why) => Some(format!("NSD {n} is down: {why}")),
                        None => unreachable
                            .contains(&n)
                            .then(|| format!("NSD {n} cannot be opened (see the daemon log)")),
                    }
                })
                .collect();
            if !down.is_empty() {
                bail!(
                    "file system {name}: {}; nothing was deleted. If the disks cannot be \
                     repaired, delete it anyway with `tessera fs delete {name} -p`",
                    down.join("; ")
                );
            }
        }
        for nsd in unreachable {
            r.info(format!(
                "tessera fs delete: warning: NSD {nsd} cannot be reached; its copy of the \
                 file system descriptor stays (use `tessera nsd create -v no` to reuse it)"
            ));
        }
        r.info(format!(
            "All data on the following disks of {name} will be destroyed:"
        ));
        for nsd in &record.nsds {
            r.info(format!("    {nsd}"));
        }
        if unreadable_ok {
            erase_what_can_be(name, &record.nsds, &devices, r);
        } else {
            tessera_fs::erase(&available).map_err(|e| {
                anyhow!(
                    "file system {name}: {e}; nothing was deleted. If the disks cannot be \
                     repaired, delete it anyway with `tessera fs delete {name} -p`"
                )
            })?;
        }
        self.change_nsds_and_file_systems(&mut |nsds, fss| {
            release_claims(nsds, name, &record.nsds);
            fss.file_systems.retain(|f| f.name != name);
            Ok(())
        })?;
        r.info(format!("Completed deletion of file system {name}."));
        Ok(Reply::Done)
    }
}

/// `fs delete -p`: erases the descriptor copy on every NSD that takes it; one that does
/// not keeps its copy, which only `nsd create -v no` overwrites.
fn erase_what_can_be(
    name: &str,
    nsds: &[String],
    devices: &super::mounts::FsDevices,
    r: &mut Reporter,
) {
    for (nsd, dev) in nsds.iter().zip(devices) {
        let Some((_, dev)) = dev else { continue };
        if let Err(e) = tessera_fs::erase(std::slice::from_ref(dev)) {
            r.info(format!(
                "tessera fs delete: warning: NSD {nsd}: {e}; its copy of the descriptor of \
                 {name} stays (use `tessera nsd create -v no` to reuse it)"
            ));
        }
    }
}

impl Daemon {
    /// `disk add` [mmadddisk]: the NSDs join the file system, mounted here or not, and new
    /// allocations use them at once; `rebalance` (-r) then runs `restripe -b`. The NSDs are
    /// claimed in the registry first: a daemon that dies between that and the file system's
    /// descriptor leaves them claimed but unused (mount ignores NSDs its descriptor does not
    /// name), never a disk of the file system that the registry would hand out again.
    pub(super) fn disk_add(
        &self,
        name: &str,
        wanted: &[FsDiskSpec],
        verify: bool,
        rebalance: bool,
        r: &mut Reporter,
    ) -> Result<Reply> {
        {
            let _admin = self.admin.lock();
            let outcome = format!("no disk was added to file system {name}");
            self.with_fs(name, "opening it here to add disks", |fs| {
                let block_size = fs.descriptor().block_size;
                let nsds = self.nsds()?;
                // Shared, as the mount holds the other disks: every node that mounts the
                // file system opens the new ones too.
                let disks = resolve_disks(
                    self,
                    wanted,
                    block_size,
                    verify,
                    &nsds,
                    &outcome,
                    super::nsd_admin::Claim::Shared,
                )?;
                check_thin_disks(&disks, &nsds, &outcome)?;
                let names: Vec<String> = disks.iter().map(|d| d.nsd_name.clone()).collect();
                // Counted like the disks the mount opened, so metrics and iohist see them.
                let mut stats = Vec::new();
                let disks: Vec<DiskSpec> = disks
                    .into_iter()
                    .map(|mut d| {
                        let counts = Arc::new(tessera_drive::stats::IoStats::default());
                        stats.push((d.nsd_name.clone(), Arc::clone(&counts)));
                        d.device = tessera_drive::stats::Counted::wrap_with_history(
                            d.device,
                            counts,
                            Arc::clone(&self.io_history),
                            &d.nsd_name,
                        );
                        d
                    })
                    .collect();
                self.change_nsds_and_file_systems(&mut |nsds, fss| {
                    claim_nsds(nsds, name, &names)?;
                    let Some(rec) = fss.file_systems.iter_mut().find(|f| f.name == name) else {
                        bail!("file system {name} was deleted meanwhile");
                    };
                    for n in &names {
                        if !rec.nsds.contains(n) {
                            rec.nsds.push(n.clone());
                        }
                    }
                    Ok(())
                })
                .map_err(|e| {
                    self.release_unrecorded_claims(name, &names);
                    e.context(outcome.clone())
                })?;
                r.info(format!(
                    "Adding {} to file system {name} ...",
                    names.join(", ")
                ));
                let added = match fs.add_disks(disks) {
                    Ok(added) => added,
                    Err(e) => {
                        if !matches!(e, tessera_fs::FsError::Corrupt(_)) {
                            // Refused before anything was written: give the NSDs back.
                            self.release_nsds(name, &names);
                        }
                        bail!("file system {name}: {e}");
                    }
                };
                for (&disk, n) in added.iter().zip(&names) {
                    if nsds
                        .get(n)
                        .is_some_and(|rec| rec.thin_disk_type != ThinDiskType::No)
                    {
                        // Checked above: a device that cannot deallocate only has `auto`.
                        if let Err(e) = fs.set_discard(disk, true) {
                            tracing::info!(
                                "{name}: NSD {n} (thinDiskType=auto): freed space stays \
                                 allocated on the device: {e}"
                            );
                        }
                    }
                }
                if let Some(m) = self.mounts.lock().get_mut(name) {
                    m.nsd_stats.extend(stats);
                }
                tracing::info!("{name}: disks {} added", names.join(", "));
                r.info(format!(
                    "Completed adding disks to file system {name}; new data is spread over \
                     them from now on{}.",
                    if rebalance {
                        ""
                    } else {
                        " (`tessera restripe` with -b moves existing data onto them)"
                    }
                ));
                Ok(())
            })?;
        }
        for refused in self.tell_nodes_descriptor_changed(name) {
            r.info(format!(
                "Not yet in use on {refused}; that node opens the new disks when it first \
                 needs one, or at its next mount."
            ));
        }
        if rebalance {
            return self.restripe(name, tessera_fs::restripe::RestripeMode::Balance, r);
        }
        Ok(Reply::Done)
    }

    /// After an administrative change of the descriptor on the file system manager (`disk
    /// add`, `disk change`, `policy change`, `fs change -r`): every other node that mounts
    /// the file system opens new disks now, and an owner slot's node allocates and creates
    /// as the descriptor says (its regions' part of new disks; nothing new on a suspended
    /// disk; the policy and replication of new files). A node that misses this learns new
    /// disks at the first block address it meets on one, or at its next mount. Returns what
    /// each node that could not follow said.
    pub(super) fn tell_nodes_descriptor_changed(&self, name: &str) -> Vec<String> {
        self.tell_mounting_nodes(name, tessera_fs::Fence::descriptor_changed())
    }

    /// Sends `request` (an owner's message to its clients) to every other node that mounts
    /// file system `name`, each until it answers or leaves the cluster; returns what each
    /// node that refused said.
    pub(super) fn tell_mounting_nodes(&self, name: &str, request: Vec<u8>) -> Vec<String> {
        let Ok(fss) = self.file_systems() else {
            return Vec::new();
        };
        let Some(record) = fss.file_systems.iter().find(|f| f.name == name) else {
            return Vec::new();
        };
        let mut refused = Vec::new();
        // This node's own mount is told too when it is a client of the manager instance
        // this node took over from a dead manager: it follows the descriptor like any
        // other client.
        let manager_taken_over = self.owned.lock().contains_key(name);
        for client in &record.clients {
            if client.node == self.cluster.node_name && !manager_taken_over {
                continue;
            }
            let told = self
                .ask_client(record, &client.node, request.clone())
                .map(|reply| tessera_fs::Fence::check(&reply));
            if let Some(Err(e)) = told {
                tracing::warn!("{name}: node {}: {e}", client.node);
                refused.push(format!("node {}: {e}", client.node));
            }
        }
        // And the owner slots this node took over from others, as their nodes would be.
        if tessera_fs::Fence::is_for_every_metanode(&request) {
            if let Some(Err(e)) = self
                .tell_taken_slots(name, &request)
                .map(|reply| tessera_fs::Fence::check(&reply))
            {
                refused.push(format!(
                    "node {} (an owner slot taken over): {e}",
                    self.cluster.node_name
                ));
            }
        }
        refused
    }

    /// Gives NSDs claimed for a `disk add` that was refused back to the registry.
    /// `disk delete` [mmdeldisk]: empties the disks (with progress; stops cleanly when the
    /// client goes away, and running it again continues), removes them from the file
    /// system, and gives the NSDs back (free for another file system).
    pub(super) fn disk_delete(
        &self,
        name: &str,
        nsds: &[String],
        r: &mut Reporter,
    ) -> Result<Reply> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let _admin = self.admin.lock();
        let stop = AtomicBool::new(false);
        let report = self.with_fs(name, "opening it here to delete disks", |fs| {
            // The other nodes' owner slots move their own blocks and pages, and only off
            // disks they know to be emptied: marked and told before the moves.
            fs.mark_disks_for_delete(nsds)
                .map_err(|e| anyhow!("file system {name}: {e}"))?;
            let refused = self.tell_nodes_descriptor_changed(name);
            if !refused.is_empty() {
                bail!(
                    "file system {name}: disks {} are marked to be emptied, but not every node \
                     that mounts it could follow ({}); run the delete again once they can, or \
                     `tessera disk change {name} resume -d \"{}\"` to give it up",
                    nsds.join(", "),
                    refused.join("; "),
                    nsds.join(";")
                );
            }
            // Announced with the first progress: a delete refused up front moves nothing.
            let mut announced = false;
            fs.delete_disks(nsds, &stop, &mut |p| {
                if !announced {
                    announced = true;
                    r.info(format!(
                        "Deleting {} from file system {name}: moving what they hold to the \
                         other disks ...",
                        nsds.join(", ")
                    ));
                }
                r.progress(&super::mounts::restripe_phase(p), p.shards_done, p.shards);
                if r.client_gone() {
                    stop.store(true, Ordering::Relaxed);
                }
            })
            .map_err(|e| match e {
                // Refused before anything moved: nothing to continue.
                tessera_fs::FsError::Invalid(why) => anyhow!("file system {name}: {why}"),
                e => anyhow!(
                    "file system {name}: disk delete: {e}; what moved so far stays moved, run \
                     it again to continue"
                ),
            })
        })?;
        if !report.deleted.is_empty() {
            // The other nodes let go of the disks (their devices, a slot's bookkeeping).
            for why in self.tell_nodes_descriptor_changed(name) {
                tracing::warn!("{name}: after deleting disks: {why}; it follows at its next mount");
            }
            self.release_nsds(name, nsds);
            if let Some(m) = self.mounts.lock().get_mut(name) {
                m.nsd_stats.retain(|(n, _)| !nsds.contains(n));
            }
            tracing::info!("{name}: disks {} deleted", nsds.join(", "));
        }
        Ok(Reply::Restripe(super::mounts::restripe_done(
            &report.restripe,
        )))
    }

    fn release_nsds(&self, fs_name: &str, names: &[String]) {
        let released = self.change_nsds_and_file_systems(&mut |nsds, fss| {
            release_claims(nsds, fs_name, names);
            if let Some(rec) = fss.file_systems.iter_mut().find(|f| f.name == fs_name) {
                rec.nsds.retain(|n| !names.contains(n));
            }
            Ok(())
        });
        if let Err(e) = released {
            tracing::error!(
                "{fs_name}: NSDs {} stay claimed by the file system in the registry although \
                 it no longer uses them: {e:#}",
                names.join(", ")
            );
        }
    }

    /// After a failed claim: NSDs of `names` that the NSD table gives to `fs_name` while
    /// its record does not list them (an earlier attempt's claim saved, its record not) are
    /// free again.
    fn release_unrecorded_claims(&self, fs_name: &str, names: &[String]) {
        let released = self.change_nsds_and_file_systems(&mut |nsds, fss| {
            let recorded = fss.get(fs_name).map(|f| f.nsds.clone()).unwrap_or_default();
            let unrecorded: Vec<String> = names
                .iter()
                .filter(|n| !recorded.contains(n))
                .cloned()
                .collect();
            release_claims(nsds, fs_name, &unrecorded);
            Ok(())
        });
        if let Err(e) = released {
            tracing::error!(
                "NSDs {} stay claimed by file system {fs_name} in the registry although it \
                 does not use them: {e:#}; `tessera nsd ls` shows them",
                names.join(", ")
            );
        }
    }
}

/// Gives NSDs `names` to file system `fs`: each must still exist and be free, or be `fs`'s
/// already (an earlier attempt of the same command saved its claim).
fn claim_nsds(nsds: &mut NsdRegistry, fs: &str, names: &[String]) -> Result<()> {
    for name in names {
        let Some(rec) = nsds.get_mut(name) else {
            bail!("NSD {name} was deleted meanwhile");
        };
        match &rec.file_system {
            Some(f) if f != fs => bail!("NSD {name} was given to file system {f} meanwhile"),
            _ => rec.file_system = Some(fs.to_string()),
        }
    }
    Ok(())
}

/// Frees those of NSDs `names` that are file system `fs`'s (and no other's).
fn release_claims(nsds: &mut NsdRegistry, fs: &str, names: &[String]) {
    for name in names {
        if let Some(rec) = nsds.get_mut(name) {
            if rec.file_system.as_deref() == Some(fs) {
                rec.file_system = None;
            }
        }
    }
}

/// A disk whose NSD promises deallocation (`thinDiskType=nvme|scsi`) on a device that cannot
/// is refused before it joins, as mount refuses it.
fn check_thin_disks(disks: &[DiskSpec], nsds: &NsdRegistry, outcome: &str) -> Result<()> {
    for d in disks {
        let Some(rec) = nsds.get(&d.nsd_name) else {
            continue;
        };
        if matches!(rec.thin_disk_type, ThinDiskType::Nvme | ThinDiskType::Scsi)
            && !d.device.can_discard()
        {
            bail!(
                "{outcome}: NSD {} has thinDiskType={} but {} cannot deallocate space; change \
                 it to thinDiskType=auto or no",
                d.nsd_name,
                rec.thin_disk_type.as_str(),
                d.device.name()
            );
        }
    }
    Ok(())
}
