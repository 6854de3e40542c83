//! Mounting and unmounting, and the operations that need a file system opened: `df`,
//! `fsck` and `pmon`. A mount is the core `FileSystem` plus its FUSE session; unmount
//! stops FUSE first so no request reaches a file system that is being checkpointed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use tessera_drive::stats::{Counted, IoStats};
use tessera_drive::BlockDevice;
use tessera_fs::{Fence, FileSystem};
use tessera_fuse::{FuseOptions, KernelCache};
use tessera_nsd::{NsdId, ThinDiskType};

use super::lease_gate::LeaseGated;
use super::{Daemon, Mounted};
use crate::config::{ClientMount, FsRecord, NsdRegistry};

/// Claims tried again after losing the compare-and-set to a change not yet applied here
/// (each waits for this node to apply it: [`Daemon::until_saved`]).
const CLAIM_RETRIES: usize = 3;
/// How long a mount of a file system this node does not know waits for this node to apply
/// the configuration the cluster manager has (see `Member::catch_up`).
const CATCH_UP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a file system manager's unmount waits for one of its clients to take the file
/// system over.
const HAND_OVER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
use crate::rpc::{IoHistoryEntry, MountedNode, PmonEntry, Reply, Request};

/// What node `node` is to file system `record` in `mount ls -L`: `role`, and the owner
/// slots it serves (`metadataSlots`).
fn role_of(record: &FsRecord, node: &str, role: &str) -> String {
    let mut slots: Vec<u32> = record
        .slot_holders
        .iter()
        .filter(|h| h.node == node && h.incarnation.is_some())
        .map(|h| h.slot)
        .collect();
    slots.sort_unstable();
    let slots: Vec<String> = slots.iter().map(u32::to_string).collect();
    match slots.len() {
        0 => role.to_string(),
        1 => format!("{role}, owner slot {}", slots[0]),
        _ => format!("{role}, owner slots {}", slots.join(", ")),
    }
}

/// The NSDs of a file system this node opened, by id.
type OpenedDisks = Vec<(NsdId, Arc<dyn BlockDevice>)>;

/// The opened device of each NSD of a file system, `None` where it cannot be opened.
pub type FsDevices = Vec<Option<(NsdId, Arc<dyn BlockDevice>)>>;

/// The request counters of a mounted file system's NSDs, by NSD name.
pub type NsdStats = Vec<(String, Arc<IoStats>)>;

/// A mounted file system as the monitoring paths read it (metrics, API, diag, health),
/// copied out of the mount table so that they do not hold its lock while they read it.
pub(super) struct MountedView {
    pub name: String,
    pub fs: Arc<FileSystem>,
    pub nsds: NsdStats,
    /// The FUSE connection's queue when the view was taken.
    pub fuse: tessera_fuse::FuseQueue,
}

/// Where this node mounts `record` when not told: the file system's mount point (`-T` at
/// create), the same on every node as in GPFS, unless the daemon runs with
/// `TESSERA_MOUNT_ROOT` (several nodes on one machine, as in the network-namespace
/// cluster, where each node needs a directory of its own): then `ROOT/DEVICE`.
pub(super) fn default_mount_point(record: &FsRecord) -> PathBuf {
    match std::env::var_os("TESSERA_MOUNT_ROOT").filter(|r| !r.is_empty()) {
        Some(root) => PathBuf::from(root).join(&record.name),
        None => PathBuf::from(&record.default_mount_point),
    }
}

/// Processes whose working directory, root or open files are under `mount_point`.
fn busy_processes(mount_point: &Path) -> Vec<String> {
    let mut users = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return users;
    };
    let me = std::process::id().to_string();
    for entry in procs.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let dir = entry.path();
        let mut links = vec![dir.join("cwd"), dir.join("root")];
        if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
            links.extend(fds.flatten().map(|fd| fd.path()));
        }
        let uses = links
            .iter()
            .filter_map(|l| std::fs::read_link(l).ok())
            .any(|target| target.starts_with(mount_point));
        if uses {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            users.push(format!("{pid} ({})", comm.trim()));
        }
    }
    users
}

impl Daemon {
    /// Opens the NSDs of `record`; also says, per NSD, whether it could be opened.
    pub(super) fn open_fs_devices(
        &self,
        record: &FsRecord,
        nsds: &NsdRegistry,
    ) -> (FsDevices, Vec<bool>) {
        // Bound to this incarnation: see `Member::incarnation_check`.
        let check = self.member.incarnation_check();
        let devices: FsDevices = record
            .nsds
            .iter()
            .map(|name| {
                let rec = nsds.get(name)?;
                match self.open_nsd_as(rec, super::nsd_admin::Claim::Shared) {
                    Ok(dev) => Some((rec.id, LeaseGated::wrap(dev, check.clone()))),
                    Err(e) => {
                        tracing::warn!("{}: NSD {name}: {e:#}", record.name);
                        None
                    }
                }
            })
            .collect();
        let up = devices.iter().map(Option::is_some).collect();
        (devices, up)
    }

    /// How a mount of file system `fs` here opens a disk `disk add` added on its manager
    /// after it mounted: by NSD name, as the mount opened the others (lease-gated, counted
    /// for the metrics).
    pub(super) fn disk_opener(&self, fs: &str) -> tessera_fs::DiskOpener {
        let this = self.this.clone();
        let fs = fs.to_string();
        Box::new(move |disk| {
            let refuse = |why: String| tessera_fs::FsError::MissingDisk {
                fs: fs.clone(),
                nsd: disk.nsd_name.clone(),
                reason: why,
            };
            let daemon = this
                .upgrade()
                .ok_or_else(|| refuse("the daemon is stopping".into()))?;
            let nsds = daemon.nsds().map_err(|e| refuse(format!("{e:#}")))?;
            let rec = nsds
                .get(&disk.nsd_name)
                .ok_or_else(|| refuse("the NSD registry of the cluster does not list it".into()))?;
            let dev = daemon
                .open_nsd_as(rec, super::nsd_admin::Claim::Shared)
                .map_err(|e| refuse(format!("{e:#}; check that this node reaches it")))?;
            let dev = LeaseGated::wrap(dev, daemon.member.incarnation_check());
            let counts = Arc::new(IoStats::default());
            let dev = Counted::wrap_with_history(
                dev,
                Arc::clone(&counts),
                Arc::clone(&daemon.io_history),
                &disk.nsd_name,
            );
            // Not waited for: an I/O that met the disk may come from a thread that holds
            // the mount table (the disk then goes uncounted until the next mount).
            if let Some(mut mounts) = daemon.mounts.try_lock() {
                if let Some(m) = mounts.get_mut(&fs) {
                    m.nsd_stats.push((disk.nsd_name.clone(), counts));
                }
            }
            Ok(dev)
        })
    }

    /// Mounts the core file system without FUSE, for `df` and checks on an unmounted one;
    /// each NSD's requests are counted (`NsdStats`, for the metrics).
    pub(super) fn open_core(&self, record: &FsRecord) -> Result<(Arc<FileSystem>, NsdStats)> {
        let nsds = self.nsds()?;
        let (available, nsd_stats) = self.open_disks(record, &nsds)?;
        // Under live clients, inodes unlinked while open wait for their fences (which say
        // what is open there) before they are freed: `Daemon::fence_clients`.
        let fs = if record.clients.is_empty() {
            FileSystem::mount(available)
        } else {
            FileSystem::mount_keeping_orphans(available)
        }
        .map_err(|e| {
            let said = format!("file system {}: {e}", record.name);
            match e {
                // Damage a takeover must not try again and again (`DamagedSlot`).
                tessera_fs::FsError::Corrupt(_) => {
                    anyhow::Error::new(super::slots::DamagedSlot(said))
                }
                _ => anyhow!(said),
            }
        })?;
        self.configure_owner(&fs, record, &nsds)?;
        Ok((fs, nsd_stats))
    }

    /// What a mount that owns metadata (the manager's, or an owner slot's) takes from this
    /// node's configuration and daemon: cache sizes, read policy, thin disks, and the ways
    /// its metanode revokes what other nodes hold.
    pub(super) fn configure_owner(
        &self,
        fs: &FileSystem,
        record: &FsRecord,
        nsds: &NsdRegistry,
    ) -> Result<()> {
        // A slot's owner learns the disks added on the manager (the manager never needs to).
        fs.set_disk_opener(self.disk_opener(&record.name));
        // GPFS's cache parameters, as this node's configuration has them.
        let params = self.member.state().params;
        let me = Some(self.member.me());
        let files = params.count("maxFilesToCache", me);
        let stats = params.count("maxStatCache", me);
        let pagepool = params.bytes("pagepool", me);
        fs.set_inode_cache(usize::try_from(files).unwrap_or(usize::MAX));
        fs.set_stat_cache(usize::try_from(stats).unwrap_or(usize::MAX));
        fs.set_metadata_cache_bytes(pagepool);
        let read_policy = params.get("readReplicaPolicy", me);
        fs.set_read_replica_policy(
            tessera_fs::replication::ReadReplicaPolicy::parse(&read_policy)
                .unwrap_or(tessera_fs::replication::ReadReplicaPolicy::Default),
        );
        // For `readReplicaPolicy=local`: the disks this node reaches through NSD servers
        // as it opened them (an `asneeded` disk that moves to its servers later stays
        // counted as local until the next mount).
        match self.nsd_access() {
            Ok(rows) => fs.set_remote_disks(
                &rows
                    .into_iter()
                    .filter(|r| r.access.contains("through servers"))
                    .map(|r| r.nsd)
                    .collect::<Vec<_>>(),
            ),
            Err(e) => tracing::warn!("{}: how its NSDs are reached: {e:#}", record.name),
        }
        self.set_thin_disks(fs, nsds, &record.name)?;
        fs.on_lock_holder_check(self.member.lock_holder_check());
        fs.on_serve_check(self.member.serve_check());
        fs.on_read_revoke(self.revoker(&record.name, Fence::drop_held, "views"));
        fs.on_data_revoke(self.revoker(&record.name, Fence::give_back_data, "data tokens"));
        tracing::info!(
            "{}: maxFilesToCache={files} maxStatCache={stats} pagepool={} readReplicaPolicy={}",
            record.name,
            params.get("pagepool", me),
            read_policy
        );
        Ok(())
    }

    /// Opens the NSDs of `record` that this node can reach, each counted for the metrics.
    pub(super) fn open_disks(
        &self,
        record: &FsRecord,
        nsds: &NsdRegistry,
    ) -> Result<(OpenedDisks, NsdStats)> {
        let (devices, _) = self.open_fs_devices(record, nsds);
        let mut nsd_stats = NsdStats::new();
        let available: Vec<_> = devices
            .into_iter()
            .zip(&record.nsds)
            .filter_map(|(dev, name)| {
                let (id, dev) = dev?;
                let counts = Arc::new(IoStats::default());
                nsd_stats.push((name.clone(), Arc::clone(&counts)));
                let dev =
                    Counted::wrap_with_history(dev, counts, Arc::clone(&self.io_history), name);
                Some((id, dev))
            })
            .collect();
        if available.is_empty() {
            bail!(
                "file system {}: none of its NSDs can be opened; see the daemon log",
                record.name
            );
        }
        Ok((available, nsd_stats))
    }

    /// Turns on deallocation of freed blocks on the disks whose NSD says `thinDiskType`
    /// other than `no`. `auto` deallocates where the device can and says so where it cannot;
    /// `nvme` and `scsi` promise a device that can, so one that cannot fails the mount.
    fn set_thin_disks(&self, fs: &FileSystem, nsds: &NsdRegistry, fs_name: &str) -> Result<()> {
        for (disk, name) in fs.disk_names().iter().enumerate() {
            let Some(nsd) = nsds.get(name) else { continue };
            let disk = u16::try_from(disk).expect("disk index fits u16");
            match nsd.thin_disk_type {
                ThinDiskType::No => {}
                ThinDiskType::Auto => {
                    if let Err(e) = fs.set_discard(disk, true) {
                        tracing::info!(
                            "{fs_name}: NSD {name} (thinDiskType=auto): freed space stays \
                             allocated on the device: {e}"
                        );
                    }
                }
                t @ (ThinDiskType::Nvme | ThinDiskType::Scsi) => {
                    fs.set_discard(disk, true).map_err(|e| {
                        let _ = fs.unmount();
                        anyhow!(
                            "file system {fs_name}: NSD {name} has thinDiskType={} but {e}; \
                             change it to thinDiskType=auto or no",
                            t.as_str()
                        )
                    })?;
                }
            }
        }
        Ok(())
    }

    /// What the kernel may cache of a mount here. In a cluster where other nodes may mount
    /// the file system, names, attributes and pages of what this node's own metanode
    /// serves (it drops from the kernel what other nodes change there), and names and
    /// attributes this mount holds under other owners' read tokens (their revocations drop
    /// them from the kernel first). Small writes are gathered (by the daemon, or the kernel's
    /// writeback cache) only when no other node can mount the file system (a one-node
    /// cluster): gathered writes are seen by this node alone.
    fn kernel_cache(&self, client_of: Option<&str>) -> KernelCache {
        match client_of {
            None if self.member.state().nodes.len() <= 1 => KernelCache::Private,
            _ => KernelCache::Shared,
        }
    }

    /// Mounts the core file system as a client of node `owner`'s metanode: this node reads
    /// and writes the disks itself (it must reach all of them) and sends every metadata
    /// request over the node transport.
    fn open_client(&self, record: &FsRecord, owner: &str) -> Result<(Arc<FileSystem>, NsdStats)> {
        let nsds = self.nsds()?;
        let (available, nsd_stats) = self.open_disks(record, &nsds)?;
        if available.len() < record.nsds.len() {
            let reached: std::collections::HashSet<NsdId> =
                available.iter().map(|(id, _)| *id).collect();
            let missing: Vec<&str> = record
                .nsds
                .iter()
                .filter(|n| nsds.get(n).is_none_or(|r| !reached.contains(&r.id)))
                .map(String::as_str)
                .collect();
            bail!(
                "file system {}: this node cannot open NSD {} ({} of its {} NSDs reached; the \
                 daemon log says why for each); a node mounting it beside {owner} must reach \
                 every disk: make the device visible on this node and run `tessera nsd \
                 discover`, or give the NSD servers (`tessera nsd change -F` with `%nsd: \
                 nsd=NAME servers=NODE,...`) so that this node reaches it through them",
                record.name,
                missing.join(", "),
                available.len(),
                record.nsds.len()
            );
        }
        let Some(target) = self.target_of(owner) else {
            bail!(
                "file system {} is recorded as mounted on node {owner}, which is not in the \
                 cluster",
                record.name
            );
        };
        let channel = self.following_channel(&record.name, 0, target);
        if self.metadata_slots() {
            // The owner of a slot of its own, and the manager's client for the rest.
            let mounted = self.slot_of_this_node(record, &channel).and_then(|slot| {
                FileSystem::mount_slot(available.clone(), slot)
                    .map_err(|e| anyhow!("file system {}: owner slot {slot}: {e}", record.name))
            });
            match mounted {
                Ok(fs) => {
                    fs.route_metadata_through(Box::new(channel));
                    self.configure_owner(&fs, record, &nsds)?;
                    // What this node's previous incarnation acknowledged and the slot's
                    // clients do not know durable is handed over before it serves.
                    self.fence_clients(record, &fs, fs.owner_slot());
                    return Ok((fs, nsd_stats));
                }
                Err(e) => tracing::warn!(
                    "{e:#}; this node mounts {} as a client of the manager only",
                    record.name
                ),
            }
        }
        let fs = FileSystem::mount_client(available, Box::new(channel))
            .map_err(|e| anyhow!("file system {}: {e}", record.name))?;
        fs.set_disk_opener(self.disk_opener(&record.name));
        Ok((fs, nsd_stats))
    }

    /// Mounts `record` at `mount_point` through FUSE and adds it to the mount table; as the
    /// owner of its metadata, or as a client of node `client_of`.
    fn mount_fs(
        &self,
        record: &FsRecord,
        mount_point: &Path,
        client_of: Option<&str>,
    ) -> Result<()> {
        // A mount left by a killed daemon answers every request with ENOTCONN, even the
        // stat that creating the directory needs, so it goes first.
        match tessera_fuse::cleanup_stale_mount(mount_point) {
            Ok(true) => tracing::info!("{}: detached a stale mount", mount_point.display()),
            Ok(false) => {}
            Err(e) => tracing::warn!("{}: stale mount cleanup: {e}", mount_point.display()),
        }
        std::fs::create_dir_all(mount_point)
            .with_context(|| format!("cannot create mount point {}", mount_point.display()))?;
        let (fs, nsd_stats) = match client_of {
            None => self.open_core(record)?,
            Some(owner) => self.open_client(record, owner)?,
        };
        if client_of.is_none() && !record.clients.is_empty() {
            // An owner mounting again after a takeover of a dead node: its clients first
            // stop writing on what the dead owner said.
            self.fence_clients(record, &fs, 0);
        }
        let cache = self.kernel_cache(client_of);
        if self.metadata_slots() {
            fs.route_slots_through(self.slot_router(&record.name));
        }
        let opts = FuseOptions {
            fs_name: record.name.clone(),
            allow_other: true,
            cache,
            ..FuseOptions::default()
        };
        let fuse = match tessera_fuse::mount(Arc::clone(&fs), mount_point, &opts) {
            Ok(f) => f,
            Err(e) => {
                let _ = fs.unmount();
                bail!(
                    "cannot mount {} at {}: {e}; check that /dev/fuse exists and fuse3 is \
                     installed (`apt-get install fuse3`)",
                    record.name,
                    mount_point.display()
                );
            }
        };
        match client_of {
            None => tracing::info!("{}: mounted at {}", record.name, mount_point.display()),
            Some(owner) => tracing::info!(
                "{}: mounted at {} as a client of node {owner}, which owns its metadata",
                record.name,
                mount_point.display()
            ),
        }
        let mounted = Mounted {
            fs,
            fuse,
            mount_point: mount_point.to_path_buf(),
            nsd_stats,
            client_of: client_of.map(str::to_string),
        };
        let fs = Arc::clone(&mounted.fs);
        self.mounts.lock().insert(record.name.clone(), mounted);
        if client_of.is_none()
            && std::env::var_os("TESSERA_METANODE_VIA_TRANSPORT").is_some_and(|v| v == "1")
        {
            // A check of the node transport's file-system path: this mount's client sends
            // its metanode requests to this node's own daemon port, as a client on another
            // node will (see `metanode_service.rs`).
            let me = self.member.me();
            let address = self.member.bound_address().to_string();
            let channel = self
                .member
                .metanode_channel(me, address, record.name.clone(), 0);
            fs.route_own_metadata_through(Box::new(channel));
            tracing::info!(
                "{}: metanode requests go over the node transport",
                record.name
            );
        }
        Ok(())
    }

    pub(super) fn mount_request(&self, name: &str, mount_point: Option<String>) -> Result<Reply> {
        let _admin = self.admin.lock();
        let record = match self.file_systems()?.require(name) {
            Ok(record) => record.clone(),
            // `mount -a|-N` right after `fs create` reaches nodes that may not have applied
            // the create yet (one restarted a moment ago): such a node catches up first.
            Err(e) if self.member.catch_up(CATCH_UP_WAIT) => {
                self.file_systems()?.require(name).map_err(|_| e)?.clone()
            }
            Err(e) => return Err(e),
        };
        if let Some(m) = self.mounts.lock().get(name) {
            bail!(
                "file system {name} is already mounted at {}",
                m.mount_point.display()
            );
        }
        let mount_point = mount_point.map_or_else(|| default_mount_point(&record), PathBuf::from);
        self.mount_here(&record, &mount_point)?;
        Ok(Reply::Mounted {
            mount_point: mount_point.display().to_string(),
        })
    }

    /// Mounts `record` at `mount_point` on this node: as a client of the live node that
    /// has it mounted, else as its owner (claimed in the table first, taking it over from
    /// an expelled owner).
    fn mount_here(&self, record: &FsRecord, mount_point: &Path) -> Result<()> {
        if let Some(owner) = self.mounted_elsewhere(record) {
            if self.node_is_live(owner) {
                return self.join_as_client(record, owner, mount_point);
            }
        }
        let Err(e) = self.claim_and_mount(&record.name, mount_point) else {
            return Ok(());
        };
        // This node's copy of the table lagged (just after a restart): another live node
        // had mounted it meanwhile (or took it over from this node while it was down), so
        // this mount joins it.
        let now = self.file_systems()?.require(&record.name)?.clone();
        match self.mounted_elsewhere(&now) {
            Some(owner) if self.node_is_live(owner) => {
                self.join_as_client(&now, owner, mount_point)
            }
            _ => Err(e),
        }
    }

    /// The file system manager of `name` when it is another node: a request only the
    /// manager runs ([`manager_only`]) is answered with its name, and the CLI sends it there.
    pub(super) fn manager_elsewhere(&self, name: &str) -> Result<Option<String>> {
        let fss = self.file_systems()?;
        Ok(fss
            .get(name)
            .and_then(|record| self.mounted_elsewhere(record))
            .map(str::to_string))
    }

    /// The node other than this one that has `record` mounted, if any.
    pub(super) fn mounted_elsewhere<'r>(&self, record: &'r FsRecord) -> Option<&'r str> {
        let on = record.mounted_on.as_deref()?;
        (record.mounted && on != self.cluster.node_name).then_some(on)
    }

    /// `mount ls` [mmlsmount]: which node has each file system mounted, from the replicated
    /// file-system table (one node at a time until shared mounts exist).
    pub(super) fn mount_list(&self, name: Option<&str>) -> Result<Reply> {
        let fss = self.file_systems()?;
        if let Some(name) = name {
            fss.require(name)?;
        }
        let nodes = self.member.state().nodes;
        let address = |node: &str| {
            nodes
                .values()
                .find(|n| n.name == node)
                .map_or_else(String::new, |n| n.address.clone())
        };
        let rows = fss
            .file_systems
            .iter()
            .filter(|r| name.is_none_or(|n| n == r.name))
            .map(|r| {
                let mut rows = Vec::new();
                let owner = r.mounted.then(|| {
                    r.mounted_on
                        .clone()
                        .unwrap_or_else(|| self.cluster.node_name.clone())
                });
                if let Some(owner) = &owner {
                    rows.push(MountedNode {
                        address: address(owner),
                        node: owner.clone(),
                        // A node that took the file system over from a dead owner
                        // mounts it where its client mount is.
                        mount_point: r
                            .clients
                            .iter()
                            .find(|c| c.node == *owner)
                            .map_or_else(|| r.mount_point.clone(), |c| c.mount_point.clone()),
                        role: role_of(r, owner, "manager"),
                    });
                }
                // A client whose node is down (or was deleted) mounts nothing; its entry
                // goes when the owner unmounts or the node starts again. Nor does one whose
                // mount is still being made, or whose node restarted and has not mounted it
                // again yet. Live clients are listed even when no node owns the file system
                // (a manager's mount failed under them, its log damaged): they still have
                // it mounted, and `umount -a` must reach them before fsck may run.
                let live = r
                    .clients
                    .iter()
                    .filter(|c| Some(&c.node) != owner.as_ref() && self.client_is_mounted(c));
                rows.extend(live.map(|c| MountedNode {
                    node: c.node.clone(),
                    address: address(&c.node),
                    mount_point: c.mount_point.clone(),
                    role: role_of(r, &c.node, "client"),
                }));
                let state = self.member.state();
                let mounting = r
                    .clients
                    .iter()
                    .filter(|c| client_mount(c, &state) == ClientMountState::Mounting)
                    .map(|c| c.node.clone())
                    .collect();
                crate::rpc::MountRow {
                    file_system: r.name.clone(),
                    nodes: rows,
                    mounting,
                }
            })
            .collect();
        Ok(Reply::Mounts(rows))
    }

    /// Whether node `name` runs a live incarnation: joined, and not expelled since.
    pub(super) fn node_is_live(&self, name: &str) -> bool {
        let state = self.member.state();
        state
            .nodes
            .values()
            .find(|n| n.name == name)
            .is_some_and(|n| state.incarnations.contains_key(&n.number))
    }

    /// Refuses an operation on `record` while another node has it mounted.
    pub(super) fn check_not_mounted_elsewhere(&self, record: &FsRecord, what: &str) -> Result<()> {
        if let Some(node) = self.mounted_elsewhere(record) {
            bail!(
                "file system {} is mounted, node {node} is its file system manager; {what} \
                 while it is mounted would race the writes of the nodes that mount it: \
                 unmount it on every node first (`tessera umount {} -a`). If {node} is \
                 dead, a mount here takes the file system over once the cluster has \
                 expelled {node} (after failureDetectionTime; `tessera state -a` shows it \
                 down)",
                record.name,
                record.name
            );
        }
        Ok(())
    }

    /// Records this node's claim on `name` in the replicated file-system table (see
    /// [`Self::claim_and_mount`]) and returns the record as it was before the claim.
    fn claim(&self, name: &str, mount_point: &Path) -> Result<FsRecord> {
        let claimed = std::cell::RefCell::new(None);
        let private_cache = self.kernel_cache(None) == KernelCache::Private;
        self.change_fs_record(name, &|rec| {
            match self.mounted_elsewhere(rec) {
                Some(node) if !self.node_is_live(node) => {
                    tracing::warn!(
                        "{name}: taking over from node {node}, which was mounting it and lost \
                         its lease (expelled); this mount replays its recovery log"
                    );
                    keep_dead_owner_as_client(rec, &self.cluster.node_name);
                }
                _ => self.check_not_mounted_elsewhere(rec, "mounting it here")?,
            }
            *claimed.borrow_mut() = Some(rec.clone());
            rec.mounted = true;
            rec.mounted_on = Some(self.cluster.node_name.clone());
            rec.mount_point = mount_point.display().to_string();
            rec.private_cache = private_cache;
            Ok(())
        })?;
        Ok(claimed
            .into_inner()
            .expect("set by the change that was saved"))
    }

    /// Records in the replicated file-system table that this node mounts `name`, then
    /// mounts it. The record goes first: of two nodes that try at once, the
    /// compare-and-set lets one win before either touches the disks.
    ///
    /// A file system recorded as mounted on a node that lost its lease (expelled: the
    /// cluster manager waited for the lease to run out, so that node does no more disk
    /// I/O) is taken over: this mount replays its recovery log, as any mount after a
    /// crash does. The compare-and-set of the record goes through the Raft leader, so a
    /// node whose copy of the configuration is stale cannot take over a node that came
    /// back: the record changed, or the write finds no quorum.
    fn claim_and_mount(&self, name: &str, mount_point: &Path) -> Result<()> {
        let record = self.claim(name, mount_point)?;
        if let Err(e) = self.mount_fs(&record, mount_point, None) {
            let undone = self.change_fs_record(name, &|rec| {
                rec.mounted = false;
                rec.mounted_on = None;
                Ok(())
            });
            if let Err(undo) = undone {
                tracing::error!("{name}: cannot record that the mount failed: {undo:#}");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Changes the record of file system `name` in the replicated table with `change`, by
    /// compare-and-set: a write that lost to a change this node had not applied yet is
    /// made again on the newer table (this node's copy of the configuration lags for a
    /// moment after a restart), so that the answer reflects it ("mounted on node X")
    /// instead of asking the admin to run the command again.
    pub(super) fn change_fs_record(
        &self,
        name: &str,
        change: &dyn Fn(&mut FsRecord) -> Result<()>,
    ) -> Result<()> {
        self.until_saved(
            CLAIM_RETRIES + 1,
            &|| Ok(vec![self.file_systems()?.version]),
            &mut || {
                let mut fss = self.file_systems()?;
                change(fss.require_mut(name)?)?;
                self.save_file_systems(&fss)
            },
        )
    }

    /// Mounts `record` on this node as a client of node `owner`, which has it mounted and
    /// owns its metadata [mmmount on a second node]: the record names this node among the
    /// clients first (so that the owner will not unmount under it), then the mount is
    /// made; a failed mount takes the name out again.
    fn join_as_client(&self, record: &FsRecord, owner: &str, mount_point: &Path) -> Result<()> {
        let me = self.cluster.node_name.clone();
        let at = mount_point.display().to_string();
        let incarnation = self.my_incarnation();
        self.change_fs_record(&record.name, &|rec| {
            if rec.mounted_on.as_deref() != Some(owner) || !rec.mounted {
                bail!(
                    "file system {} changed owner while this mount ran (was node {owner}); \
                     run the mount again",
                    rec.name
                );
            }
            if rec.private_cache {
                bail!(
                    "file system {} is mounted on node {owner} with a private cache (it was \
                     the only node of the cluster when it mounted): it gathers writes no other \
                     node sees and would never see this node's changes of file sizes; unmount \
                     it there and mount it \
                     again (`tessera umount {}; tessera mount {}` on {owner}), then mount it \
                     here",
                    rec.name,
                    rec.name,
                    rec.name
                );
            }
            rec.clients.retain(|c| c.node != me);
            rec.clients.push(ClientMount {
                node: me.clone(),
                mount_point: at.clone(),
                incarnation,
                pending: true,
            });
            Ok(())
        })?;
        slow_client_mount_for_tests(&record.name);
        if let Err(e) = self.mount_fs(record, mount_point, Some(owner)) {
            self.leave_as_client(&record.name);
            return Err(e);
        }
        let made = self.change_fs_record(&record.name, &|rec| {
            if let Some(c) = rec
                .clients
                .iter_mut()
                .find(|c| c.node == me && c.incarnation == incarnation)
            {
                c.pending = false;
            }
            Ok(())
        });
        if let Err(e) = made {
            // The mount works; only `mount ls` does not list this node until it mounts
            // again.
            tracing::warn!(
                "{}: mounted, but the table could not record it: {e:#}",
                record.name
            );
        }
        Ok(())
    }

    /// This node's incarnation (the epoch it was given when it joined), if it is live.
    fn my_incarnation(&self) -> Option<u64> {
        let state = self.member.state();
        state.incarnations.get(&self.member.me()).copied()
    }

    fn client_is_mounted(&self, client: &ClientMount) -> bool {
        client_is_mounted(client, &self.member.state())
    }

    /// Takes this node out of the clients of `name` in the replicated table.
    fn leave_as_client(&self, name: &str) {
        let me = self.cluster.node_name.clone();
        let left = self.change_fs_record(name, &|rec| {
            rec.clients.retain(|c| c.node != me);
            Ok(())
        });
        if let Err(e) = left {
            tracing::error!("{name}: cannot record that this node no longer mounts it: {e:#}");
        }
    }

    /// The live nodes other than this one that mount `record` as clients.
    pub(super) fn live_clients(&self, record: &FsRecord) -> Vec<String> {
        record
            .clients
            .iter()
            .filter(|c| c.node != self.cluster.node_name && self.node_is_live(&c.node))
            .map(|c| c.node.clone())
            .collect()
    }

    /// Records `name` as being unmounted here until the guard is dropped.
    fn unmounting(&self, name: &str) -> impl Drop + '_ {
        struct Unmounting<'a>(&'a Daemon, String);
        impl Drop for Unmounting<'_> {
            fn drop(&mut self) {
                self.0.unmounting.lock().remove(&self.1);
            }
        }
        self.unmounting.lock().insert(name.to_string());
        Unmounting(self, name.to_string())
    }

    /// Whether this node is unmounting `name` (see `Daemon::unmounting`).
    pub(super) fn is_unmounting(&self, name: &str) -> bool {
        self.unmounting.lock().contains(name)
    }

    pub(super) fn umount(&self, name: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        let fss = self.file_systems()?;
        fss.require(name)?;
        let mut mounts = self.mounts.lock();
        let Some(m) = mounts.get(name) else {
            drop(mounts);
            if self.owned.lock().contains_key(name) {
                // Serving it without mounting it (taken over for its clients): let go, and
                // one of the clients takes the manager's role over.
                let checkpoint_error = self.release_owned(name)?;
                return Ok(Reply::Unmounted { checkpoint_error });
            }
            if self.waiting_mounts.lock().remove(name) {
                // Its mount at start is still being tried: the admin wants it unmounted,
                // so it is not mounted later either.
                tracing::info!("{name}: mount at start cancelled by umount");
                return Ok(Reply::MountCancelled);
            }
            bail!("file system {name} is not mounted");
        };
        let record = fss.require(name)?.clone();
        let clients = self.live_clients(&record);
        // An owner mount whose file system another node took over (this node was expelled
        // meanwhile) is stale: its clients are the new owner's.
        let stale = record
            .mounted_on
            .as_deref()
            .is_some_and(|o| o != self.cluster.node_name);
        // The file system manager unmounting under live clients hands the role over, as
        // GPFS moves it: its final checkpoint first, then the table says it let go and
        // one of the clients takes the file system over (its log is clean, so nothing
        // waits for a replay or an expel).
        let handing_over = m.client_of.is_none() && !stale && !clients.is_empty();
        let users = busy_processes(&m.mount_point);
        if !users.is_empty() {
            bail!(
                "file system {name} is busy at {}: in use by process {}; stop them or leave the \
                 directory (`fuser -m {}` lists them)",
                m.mount_point.display(),
                users.join(", "),
                m.mount_point.display()
            );
        }
        let m = mounts.remove(name).expect("checked above");
        let _unmounting = self.unmounting(name);
        drop(mounts);
        if let Some(owner) = m.client_of.clone() {
            return self.umount_client(name, &owner, m);
        }
        m.fuse.unmount().map_err(|e| {
            anyhow!(
                "cannot unmount {name} from {}: {e}; `fuser -m {}` lists the processes using it",
                m.mount_point.display(),
                m.mount_point.display()
            )
        })?;
        // The kernel mount is gone whatever the checkpoint does, so the registry must say
        // unmounted, or the next start would mount it again behind the admin's back.
        let checkpoint_error = match m.fs.unmount() {
            Ok(()) => {
                tracing::info!("{name}: unmounted from {}", m.mount_point.display());
                None
            }
            Err(e) => {
                tracing::error!(
                    "{name}: unmounted from {}, but the final checkpoint was not written: {e}",
                    m.mount_point.display()
                );
                Some(e.to_string())
            }
        };
        self.release_slots(name);
        self.let_go_in_table(name)?;
        if handing_over {
            self.wait_for_new_manager(name, &clients);
        }
        Ok(Reply::Unmounted { checkpoint_error })
    }

    /// The table says `name` is mounted nowhere, its live clients kept: one of them takes
    /// the file system over (`Daemon::adopt_let_go_file_systems`) and the others follow it.
    /// A stale mount (this node was expelled and another took the file system over
    /// meanwhile) leaves the new owner's record alone.
    fn let_go_in_table(&self, name: &str) -> Result<()> {
        let me = self.cluster.node_name.clone();
        self.change_fs_record(name, &|rec| {
            if rec.mounted_on.as_deref().is_some_and(|o| o != me) {
                return Ok(());
            }
            rec.mounted = false;
            rec.mounted_on = None;
            let live: Vec<String> = self.live_clients(rec);
            rec.clients.retain(|c| live.contains(&c.node));
            Ok(())
        })
    }

    /// After this node, the file system manager, unmounted `name` under live clients: waits
    /// (bounded) until one of them has taken it over, so that the listings right after the
    /// unmount name the new manager.
    fn wait_for_new_manager(&self, name: &str, clients: &[String]) {
        let deadline = std::time::Instant::now() + HAND_OVER_WAIT;
        loop {
            let owner = self.file_systems().ok().and_then(|f| {
                f.get(name)
                    .filter(|r| r.mounted)
                    .and_then(|r| r.mounted_on.clone())
            });
            if let Some(owner) = owner {
                tracing::info!("{name}: node {owner} is its file system manager now");
                return;
            }
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    "{name}: none of its clients ({}) took it over within {HAND_OVER_WAIT:?}; \
                     the first of them to send a metadata request does",
                    clients.join(", ")
                );
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A file system this node mounts as a client whose manager unmounted it (the table
    /// says mounted nowhere, this node among its clients) is taken over by this node, as
    /// after the death of its owner but without a replay to wait for. Of several clients
    /// that try at once, the table's compare-and-set lets one win; the others follow it.
    fn adopt_let_go_file_systems(&self) {
        if !self.member.holds_lease() {
            return;
        }
        let clients_of: Vec<String> = self
            .mounts
            .lock()
            .iter()
            .filter(|(_, m)| m.client_of.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        if clients_of.is_empty() {
            return;
        }
        let Ok(fss) = self.file_systems() else {
            return;
        };
        let me = self.cluster.node_name.as_str();
        for name in clients_of {
            let Some(record) = fss.get(&name) else {
                continue;
            };
            if record.mounted || !record.clients.iter().any(|c| c.node == me) {
                continue;
            }
            // Off the lease watch's thread: opening the file system takes a while.
            let daemon = self.this.clone();
            let record = record.clone();
            let spawned = std::thread::Builder::new()
                .name("adopt".into())
                .spawn(move || {
                    if let Some(d) = daemon.upgrade() {
                        if let Err(e) = d.take_over(&record) {
                            tracing::info!("{}: not taken over here: {e:#}", record.name);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("{name}: cannot take over the file system: {e}");
            }
        }
    }

    /// Unmounts a client mount: its data and metadata updates are durable on the owner
    /// first (`FileSystem::unmount` commits them there), then this node leaves the clients.
    fn umount_client(&self, name: &str, owner: &str, m: Mounted) -> Result<Reply> {
        m.fuse.unmount().map_err(|e| {
            anyhow!(
                "cannot unmount {name} from {}: {e}; `fuser -m {}` lists the processes using it",
                m.mount_point.display(),
                m.mount_point.display()
            )
        })?;
        let sync_error = m.fs.unmount().err().map(|e| {
            tracing::error!(
                "{name}: unmounted from {}, but its last changes could not be committed on \
                 node {owner}: {e}",
                m.mount_point.display()
            );
            format!("its last changes could not be committed on node {owner}: {e}")
        });
        if sync_error.is_none() {
            tracing::info!("{name}: unmounted from {}", m.mount_point.display());
        }
        self.leave_as_client(name);
        self.release_slots(name);
        let checkpoint_error = sync_error.or(self.release_owned(name)?);
        Ok(Reply::Unmounted { checkpoint_error })
    }

    /// A file system this node took over for its clients (see `metanode_service.rs`) is
    /// let go when this node unmounts it or stops: final checkpoint, and unmounted in the
    /// table. Other live nodes that still mount it stay its clients, and one of them takes
    /// the manager's role over, as when the first manager unmounts (`umount`).
    pub(super) fn release_owned(&self, name: &str) -> Result<Option<String>> {
        let Some(fs) = self.owned.lock().get(name).map(Arc::clone) else {
            return Ok(None);
        };
        let record = self.file_systems()?.require(name)?.clone();
        let clients = self.live_clients(&record);
        self.owned.lock().remove(name);
        let error = fs.unmount().err().map(|e| e.to_string());
        if !clients.is_empty() {
            self.let_go_in_table(name)?;
            self.wait_for_new_manager(name, &clients);
            return Ok(error);
        }
        self.change_fs_record(name, &|rec| {
            rec.mounted = false;
            rec.mounted_on = None;
            rec.clients.clear();
            Ok(())
        })?;
        tracing::info!("{name}: no node mounts it any more; its metadata is checkpointed");
        Ok(error)
    }

    /// `tessera fs reclaimspace`: on the mounted file system, or opened here for it.
    pub(super) fn reclaim_space(&self, name: &str, r: &mut super::Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        let record = self.file_systems()?.require(name)?.clone();
        let mounted = self.manager_mount(name);
        let (fs, opened) = match mounted {
            Some(fs) => (fs, false),
            None => {
                self.check_not_mounted_elsewhere(&record, "opening it here to reclaim space")?;
                (self.open_core(&record)?.0, true)
            }
        };
        let result = fs.reclaim_space(&mut |done, total| {
            r.progress("reclaiming free space", done, total);
        });
        if opened {
            fs.unmount()
                .map_err(|e| anyhow!("file system {name}: {e}"))?;
        }
        let given_back = result.map_err(|e| anyhow!("file system {name}: {e}"))?;
        if given_back.is_empty() {
            bail!(
                "file system {name} has no NSD with thinDiskType other than no (or none whose \
                 device can deallocate); nothing to reclaim"
            );
        }
        let names = fs.disk_names();
        Ok(Reply::ReclaimSpace(
            given_back
                .into_iter()
                .map(|(disk, bytes)| (names[usize::from(disk)].clone(), bytes))
                .collect(),
        ))
    }

    /// The file system manager's instance of `name` on this node, for the requests only
    /// the manager runs ([`manager_only`]): the one this node took over from a dead manager
    /// (this node's own mount, if it has one, is then that manager's client, and may own a
    /// slot), else this node's mount.
    pub(super) fn manager_mount(&self, name: &str) -> Option<Arc<FileSystem>> {
        if let Some(fs) = self.owned.lock().get(name) {
            return Some(Arc::clone(fs));
        }
        self.mounts.lock().get(name).map(|m| Arc::clone(&m.fs))
    }

    /// Runs `f` on file system `name`: the manager's instance here
    /// ([`Daemon::manager_mount`]), or one opened here for the purpose (and closed after)
    /// when it is mounted nowhere.
    pub(super) fn with_fs<T>(
        &self,
        name: &str,
        why: &str,
        f: impl FnOnce(&Arc<FileSystem>) -> Result<T>,
    ) -> Result<T> {
        let record = self.file_systems()?.require(name)?.clone();
        let mounted = self.manager_mount(name);
        if let Some(fs) = mounted {
            return f(&fs);
        }
        self.check_not_mounted_elsewhere(&record, why)?;
        let (fs, _) = self.open_core(&record)?;
        let result = f(&fs);
        let closed = fs.unmount().map_err(|e| anyhow!("file system {name}: {e}"));
        let value = result?;
        closed?;
        Ok(value)
    }

    /// `disk change` [mmchdisk]: the status goes into the file-system descriptor, and the
    /// allocator of a mounted file system follows at once, the owner slots' on other nodes
    /// too (they are told before this returns).
    pub(super) fn disk_change(
        &self,
        name: &str,
        nsds: &[String],
        status: tessera_fs::DiskStatus,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        self.with_fs(name, "opening it here to change its disks", |fs| {
            fs.set_disk_status(nsds, status)
                .map_err(|e| anyhow!("file system {name}: {e}"))
        })?;
        tracing::info!("{name}: disks {} now {}", nsds.join(", "), status.as_str());
        self.followed_everywhere(
            name,
            &format!("disks {} {}", nsds.join(", "), status.as_str()),
        )?;
        Ok(Reply::Done)
    }

    /// After an administrative change the manager committed in the descriptor of `name`
    /// (`what`, as the error says it): every other node that mounts it follows it
    /// ([`Daemon::tell_nodes_descriptor_changed`]), or the command fails naming those that
    /// did not, which follow at their next mount.
    pub(super) fn followed_everywhere(&self, name: &str, what: &str) -> Result<()> {
        let refused = self.tell_nodes_descriptor_changed(name);
        if !refused.is_empty() {
            bail!(
                "file system {name}: {what} is committed, but {}; those nodes follow at their \
                 next mount, or run the command again",
                refused.join("; ")
            );
        }
        Ok(())
    }

    /// `disk change stop|start` [mmchdisk]: I/O to the disks of a mounted file system
    /// stops (their copies are read from the other failure groups) or starts again, on
    /// this node and every other node that mounts it. For the mounts: a file system mounted
    /// again finds every disk whose device answers up, which is safe because writes drop
    /// the copies they miss from the block map.
    pub(super) fn disk_availability(&self, name: &str, nsds: &[String], up: bool) -> Result<Reply> {
        let _admin = self.admin.lock();
        self.file_systems()?.require(name)?;
        let Some(fs) = self.manager_mount(name) else {
            bail!(
                "file system {name} is not mounted on this node; `disk change stop|start` acts \
                 on a mounted file system (mount it with `tessera mount {name}`; a replicated \
                 file system whose data disk is missing mounts with that disk down)"
            );
        };
        if up {
            fs.start_disks(nsds)
        } else {
            fs.stop_disks(nsds)
        }
        .map_err(|e| anyhow!("file system {name}: {e}"))?;
        tracing::info!(
            "{name}: disks {} {}",
            nsds.join(", "),
            if up { "started" } else { "stopped" }
        );
        // Every other node that mounts it stops (or starts) its own I/O to them too: a
        // client or slot owner writing a stopped disk's copies would defeat the stop.
        let refused = self.tell_mounting_nodes(
            name,
            tessera_fs::Fence::disk_availability(nsds.to_vec(), up),
        );
        if !refused.is_empty() {
            bail!(
                "file system {name}: disks {} {} here, but not on {}; run the command again \
                 (or remount there)",
                nsds.join(", "),
                if up { "started" } else { "stopped" },
                refused.join("; ")
            );
        }
        Ok(Reply::Done)
    }

    /// `restripe` [mmrestripefs -m|-b], with progress; stops cleanly when the client goes
    /// away, and running it again continues. Holds the admin lock throughout, so other
    /// administration of this node waits for it.
    pub(super) fn restripe(
        &self,
        name: &str,
        mode: tessera_fs::restripe::RestripeMode,
        r: &mut super::Reporter,
    ) -> Result<Reply> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tessera_fs::restripe::RestripeMode;
        let _admin = self.admin.lock();
        let stop = AtomicBool::new(false);
        let report = self.with_fs(name, "opening it here to restripe it", |fs| {
            fs.restripe(mode, &stop, &mut |p| {
                r.progress(&restripe_phase(p), p.shards_done, p.shards);
                if r.client_gone() {
                    stop.store(true, Ordering::Relaxed);
                }
            })
            .map_err(|e| anyhow!("file system {name}: restripe: {e}; what moved so far stays moved, run it again to continue"))
        })?;
        tracing::info!(
            "{name}: restripe {}: {} of {} blocks moved ({} bytes), {} metadata pages and {} \
             allocation-map regions moved{}{}",
            match mode {
                RestripeMode::Placement => "-p",
                RestripeMode::Balance => "-b",
                RestripeMode::Migrate => "-m",
                RestripeMode::Replicate => "-r",
                RestripeMode::Check => "-c",
            },
            report.progress.blocks_moved,
            report.progress.blocks_scanned,
            report.progress.bytes_moved,
            report.progress.metadata_pages_moved,
            report.progress.map_regions_moved,
            if report.progress.log_moved {
                ", the recovery log moved"
            } else {
                ""
            },
            if report.stopped {
                ", stopped by the client"
            } else {
                ""
            }
        );
        if !report.unreached_slots.is_empty() {
            // The other slots' owners restripe their own files; one that did not answer
            // leaves its files as they were, which the administrator must hear of (after a
            // `-r`, they may still have too few copies).
            let holders = self
                .file_systems()
                .ok()
                .and_then(|f| f.file_systems.iter().find(|r| r.name == name).cloned())
                .map(|r| r.slot_holders)
                .unwrap_or_default();
            let slots: Vec<String> = report
                .unreached_slots
                .iter()
                .map(|(slot, why)| {
                    let node = holders
                        .iter()
                        .find(|h| h.slot == *slot)
                        .map_or("no node", |h| h.node.as_str());
                    format!("owner slot {slot} (held by {node}): {why}")
                })
                .collect();
            bail!(
                "file system {name}: restripe: the files of {} were not restriped (the rest \
                 was: {} of {} blocks moved); run it again once their owners answer",
                slots.join("; "),
                report.progress.blocks_moved,
                report.progress.blocks_scanned
            );
        }
        Ok(Reply::Restripe(restripe_done(&report)))
    }

    pub(super) fn df(&self, name: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        let record = self.file_systems()?.require(name)?.clone();
        let mounted = self.manager_mount(name);
        let report = match mounted {
            Some(fs) => fs.df().map_err(|e| anyhow!("file system {name}: {e}"))?,
            None => {
                self.check_not_mounted_elsewhere(&record, "opening it here for df")?;
                let (fs, _) = self.open_core(&record)?;
                let report = fs.df().map_err(|e| anyhow!("file system {name}: {e}"));
                fs.unmount()
                    .map_err(|e| anyhow!("file system {name}: {e}"))?;
                report?
            }
        };
        Ok(Reply::Df(report))
    }

    pub(super) fn fsck(&self, name: &str, repair: bool, r: &mut super::Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        let record = self.file_systems()?.require(name)?.clone();
        if let Some(m) = self.mounts.lock().get(name) {
            bail!(
                "file system {name} is mounted at {}; fsck runs offline: unmount it on every \
                 node first with `tessera umount {name} -a`",
                m.mount_point.display()
            );
        }
        self.check_not_mounted_elsewhere(&record, "checking it offline")?;
        let nsds = self.nsds()?;
        let (devices, _) = self.open_fs_devices(&record, &nsds);
        let available: Vec<_> = devices.into_iter().flatten().collect();
        r.info(format!("Checking \"{name}\""));
        let report =
            tessera_fs::fsck(available, repair).map_err(|e| anyhow!("file system {name}: {e}"))?;
        Ok(Reply::Fsck(report))
    }

    /// The last disk I/Os of the mounted file systems, oldest first.
    /// The file systems mounted here with their NSDs' counters and FUSE queues.
    /// Watches this node's disk lease: when it runs out, every mount here drops what
    /// other owners granted it, from its daemon and its kernel (`FileSystem::lease_lost`).
    /// The owners change those inodes without this node once the cluster expelled it,
    /// which is `leaseRecoveryWait` after the lease ran out at the earliest; the watch
    /// looks far more often than that.
    pub(super) fn start_lease_watch(self: &Arc<Self>) -> std::io::Result<()> {
        const LEASE_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);
        // Every half second: a client looks for a file system its manager let go.
        const ADOPT_EVERY: u64 = 5;
        let daemon = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("lease-watch".into())
            .spawn(move || {
                let mut held = false;
                let mut ticks = 0u64;
                loop {
                    let Some(d) = daemon.upgrade() else { return };
                    let now = d.member.holds_lease();
                    if held && !now {
                        let mounted: Vec<Arc<FileSystem>> = d
                            .mounts
                            .lock()
                            .values()
                            .map(|m| Arc::clone(&m.fs))
                            .collect();
                        if !mounted.is_empty() {
                            tracing::warn!(
                                "this node's disk lease ran out: its mounts keep nothing \
                                 other nodes granted, and their requests wait for a lease"
                            );
                        }
                        for fs in mounted {
                            fs.lease_lost();
                        }
                    }
                    held = now;
                    ticks += 1;
                    if ticks.is_multiple_of(ADOPT_EVERY) {
                        d.adopt_let_go_file_systems();
                    }
                    drop(d);
                    std::thread::sleep(LEASE_WATCH_INTERVAL);
                }
            })?;
        Ok(())
    }

    pub(super) fn mounted_list(&self) -> Vec<MountedView> {
        self.mounts
            .lock()
            .iter()
            .map(|(n, m)| MountedView {
                name: n.clone(),
                fs: Arc::clone(&m.fs),
                nsds: m.nsd_stats.clone(),
                fuse: m.fuse.queue(),
            })
            .collect()
    }

    pub(super) fn io_history(&self) -> Reply {
        let entries = self
            .io_history
            .recent()
            .into_iter()
            .map(|r| IoHistoryEntry {
                start_unix_nanos: r.start_unix_nanos,
                op: r.kind.name().to_string(),
                nsd: r.device.to_string(),
                offset: r.offset,
                bytes: r.bytes,
                latency_ns: r.latency_ns,
                ok: r.ok,
                served_for: r.served_for.map(|n| n.to_string()),
            })
            .collect();
        Reply::IoHistory(entries)
    }

    pub(super) fn pmon(&self, name: Option<&str>) -> Result<Reply> {
        if let Some(name) = name {
            self.file_systems()?.require(name)?;
            if !self.mounts.lock().contains_key(name) {
                bail!("file system {name} is not mounted; pmon counts I/O of mounted file systems");
            }
        }
        let mounts = self.mounts.lock();
        let entries = mounts
            .iter()
            .filter(|(n, _)| name.is_none_or(|want| want == n.as_str()))
            .map(|(n, m)| PmonEntry {
                fs_name: n.clone(),
                disks: m.fs.descriptor().disks.len(),
                snapshot: m.fs.pmon(),
            })
            .collect();
        Ok(Reply::Pmon(entries))
    }

    /// Mounts again every file system that was mounted when the daemon stopped, and those
    /// with automount. A failure is logged and the rest go on.
    pub(super) fn remount_at_start(&self) {
        let _admin = self.admin.lock();
        // A node started a moment ago may not have applied the newest configuration yet:
        // disks added or deleted while it was down, or its file system taken over. It
        // mounts by the cluster's tables, not by its older copy (which would mount without
        // the new disks, as if they were down, or fail on the deleted ones).
        let deadline = std::time::Instant::now() + CATCH_UP_WAIT;
        while !self.member.catch_up(CATCH_UP_WAIT) {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    "mounting at start before this node caught up with the cluster's \
                     configuration (no cluster manager answered within {CATCH_UP_WAIT:?})"
                );
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let fss = match self.file_systems() {
            Ok(f) => f,
            Err(e) => {
                tracing::error!("cannot read the file system list: {e:#}");
                return;
            }
        };
        let me = self.cluster.node_name.as_str();
        let started = std::time::SystemTime::now()
            .checked_sub(self.started.elapsed())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .unwrap_or_default();
        let mut waiting = Vec::new();
        for record in &fss.file_systems {
            let client_at = record.clients.iter().find(|c| c.node == me);
            // `-A yes` [mmcrfs -A]: mounted on every node whose daemon starts, as GPFS
            // does, not only where it was mounted when the daemon stopped: the first node
            // up owns it, the others join it as clients. Not one created after this daemon
            // started (`fs create` mounts nothing, here as on the other nodes).
            let automount = record.automount && created_before(record, started);
            if let (Some(client), false) = (client_at, automount) {
                self.rejoin_as_client(record, &client.mount_point);
                continue;
            }
            let ours = record.mounted && record.mounted_on.as_deref().is_none_or(|n| n == me);
            if !ours && client_at.is_none() && !automount {
                continue;
            }
            let mount_point = match client_at {
                Some(client) => PathBuf::from(&client.mount_point),
                None if ours => PathBuf::from(&record.mount_point),
                None => default_mount_point(record),
            };
            if let Err(e) = self.mount_here(record, &mount_point) {
                waiting.push((record.name.clone(), mount_point, format!("{e:#}")));
            }
        }
        self.mount_later(waiting);
    }

    /// Whether this node reaches some NSD of `record` through NSD servers (its mount can
    /// fail only because they are not up yet).
    fn reaches_nsds_through_servers(&self, record: &FsRecord) -> bool {
        let Ok(nsds) = self.nsds() else {
            return false;
        };
        let me = self.cluster.node_name.as_str();
        record
            .nsds
            .iter()
            .filter_map(|name| nsds.get(name))
            .any(|n| !n.servers.is_empty() && n.servers.iter().any(|s| s != me))
    }

    /// The NSDs of `record` with servers none of which is up (an active node of the
    /// cluster) now.
    fn nsd_servers_down(&self, record: &FsRecord) -> Vec<String> {
        let Ok(nsds) = self.nsds() else {
            return Vec::new();
        };
        record
            .nsds
            .iter()
            .filter_map(|name| nsds.get(name))
            .filter(|n| !n.servers.is_empty() && !n.servers.iter().any(|s| self.node_is_live(s)))
            .map(|n| n.name.clone())
            .collect()
    }

    /// File systems whose mount at start failed are tried again for a while: when a
    /// cluster starts, nodes come up in any order, so a node may find the file system's
    /// owner still mounting it, or (reaching disks through NSD servers) its NSD servers
    /// not up yet. A file system reached through NSD servers is not tried while every
    /// server of one of its NSDs is down, and is tried for `nsdServerWaitTimeForMount`
    /// [GPFS's parameter]; any other for [`START_MOUNT_RETRY`].
    fn mount_later(&self, waiting: Vec<(String, PathBuf, String)>) {
        let state = self.member.state();
        let servers_wait = state
            .params
            .seconds("nsdServerWaitTimeForMount", Some(self.member.me()));
        let fss = self.file_systems().unwrap_or_default();
        let mut left = Vec::new();
        for (name, at, e) in waiting {
            let through_servers = fss
                .get(&name)
                .is_some_and(|r| self.reaches_nsds_through_servers(r));
            let (wait, why) = if through_servers {
                (
                    servers_wait,
                    "its NSD servers may not be up yet; tried again as they come up",
                )
            } else {
                (START_MOUNT_RETRY, "tried again while the cluster starts")
            };
            if wait.is_zero() {
                tracing::error!("{name}: mount at start failed: {e}");
                continue;
            }
            tracing::warn!(
                "{name}: mount at start failed ({e}); {why}, for up to {} s",
                wait.as_secs()
            );
            let until = std::time::Instant::now() + wait;
            left.push(LaterMount {
                name,
                at,
                error: e,
                until,
                through_servers,
            });
        }
        if left.is_empty() {
            return;
        }
        self.waiting_mounts
            .lock()
            .extend(left.iter().map(|m| m.name.clone()));
        let daemon = self.this.clone();
        let spawned = std::thread::Builder::new()
            .name("mount-wait".into())
            .spawn(move || {
                // Every failed try may claim the file system and give it back in the
                // replicated table: tries thin out to one per 10 s.
                let mut pause = std::time::Duration::from_secs(2);
                while !left.is_empty() {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_secs(10));
                    let Some(d) = daemon.upgrade() else { return };
                    let _admin = d.admin.lock();
                    let fss = d.file_systems().unwrap_or_default();
                    let now = std::time::Instant::now();
                    // The admin lock orders these tries with `umount`, which cancels one
                    // by taking its name out of `waiting_mounts`.
                    left.retain_mut(|m| {
                        let wanted = d.waiting_mounts.lock().contains(&m.name);
                        let keep = d.try_mount_later(m, &fss, now, wanted);
                        if !keep {
                            d.waiting_mounts.lock().remove(&m.name);
                        }
                        keep
                    });
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot try the mounts at start again: {e}");
        }
    }

    /// One try of a mount at start that failed ([`Daemon::mount_later`]), under the admin
    /// lock; `still_wanted` is false once an `umount` cancelled it. Returns whether it is
    /// to be tried again.
    fn try_mount_later(
        &self,
        m: &mut LaterMount,
        fss: &crate::config::FsRegistry,
        now: std::time::Instant,
        still_wanted: bool,
    ) -> bool {
        if !still_wanted || self.mounts.lock().contains_key(&m.name) {
            return false;
        }
        let Some(record) = fss.get(&m.name) else {
            return false;
        };
        if now >= m.until {
            m.give_up();
            return false;
        }
        if m.through_servers && !self.nsd_servers_down(record).is_empty() {
            return true;
        }
        // Another node may have mounted it meanwhile (one starting with the file system on
        // automount): this node joins it.
        match self.mount_here(record, &m.at) {
            Ok(()) if m.through_servers => {
                tracing::info!("{}: mounted once its NSD servers came up", m.name);
                false
            }
            Ok(()) => {
                tracing::info!("{}: mounted at start after a retry", m.name);
                false
            }
            Err(e) => {
                tracing::info!("{}: not mounted yet: {e:#}", m.name);
                m.error = format!("{e:#}");
                true
            }
        }
    }
}

/// How long a file system whose mount at start failed is tried again when its disks are
/// not reached through NSD servers: long enough for the other nodes of a cluster started
/// together (`tessera startup -a`) to come up and its owner to finish mounting it.
const START_MOUNT_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// A mount at start that failed and is tried again ([`Daemon::mount_later`]).
struct LaterMount {
    name: String,
    at: PathBuf,
    error: String,
    until: std::time::Instant,
    through_servers: bool,
}

impl LaterMount {
    fn give_up(&self) {
        let name = &self.name;
        let e = &self.error;
        if self.through_servers {
            tracing::error!(
                "{name}: not mounted: its NSD servers did not answer within \
                 nsdServerWaitTimeForMount ({e}); `tessera mount {name}` mounts it"
            );
        } else {
            tracing::error!("{name}: not mounted at start ({e}); `tessera mount {name}` mounts it");
        }
    }
}

impl Daemon {
    /// At start: this node was a client of `record`'s owner when it stopped. It mounts
    /// again as a client if that owner still has the file system mounted and is live;
    /// otherwise it leaves the clients (an admin mounts it again, which then takes it
    /// over if the owner is gone).
    fn rejoin_as_client(&self, record: &FsRecord, mount_point: &str) {
        let owner = record
            .mounted
            .then_some(record.mounted_on.as_deref())
            .flatten()
            .filter(|o| *o != self.cluster.node_name && self.node_is_live(o));
        match owner {
            Some(owner) => {
                let at = PathBuf::from(mount_point);
                if let Err(e) = self.join_as_client(record, owner, &at) {
                    tracing::error!(
                        "{}: mount at start as a client of node {owner} failed: {e:#}",
                        record.name
                    );
                }
            }
            None => {
                tracing::warn!(
                    "{}: was mounted here as a client, but its owner is not mounting it now; \
                     not mounted again (`tessera mount {}` mounts it)",
                    record.name,
                    record.name
                );
                self.leave_as_client(&record.name);
            }
        }
    }
}

/// Whether file system `r` was created before `started` (since the epoch), in
/// milliseconds: `fs create` and a daemon restarted just before or just after it often fall
/// in the same second. Records from before milliseconds were kept compare whole seconds.
fn created_before(r: &FsRecord, started: std::time::Duration) -> bool {
    match r.created_unix_ms {
        0 => r.created_unix <= started.as_secs(),
        ms => u128::from(ms) < started.as_millis(),
    }
}

/// A daemon started with `TESSERA_TEST_SLOW_CLIENT_MOUNT_MS=N` waits N ms between
/// recording a client mount as being made and making it: how the tests hold a mount in
/// that state (a cluster start with many nodes or slow disks does it by itself).
fn slow_client_mount_for_tests(name: &str) {
    let Some(ms) = std::env::var("TESSERA_TEST_SLOW_CLIENT_MOUNT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    tracing::warn!("{name}: client mount recorded as being made; waiting {ms} ms (TESSERA_TEST_SLOW_CLIENT_MOUNT_MS)");
    std::thread::sleep(std::time::Duration::from_millis(ms));
}

/// Whether `client`'s entry stands for a mount that is made and whose node still runs
/// the incarnation that made it (what `mount ls` lists).
fn client_is_mounted(client: &ClientMount, state: &tessera_cluster::state::ConfigState) -> bool {
    client_mount(client, state) == ClientMountState::Mounted
}

/// Where a client's entry in the file-system table stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientMountState {
    /// Made, by the incarnation its node runs.
    Mounted,
    /// Being made now by the incarnation its node runs (`umount -a|-N` reaches it too: its
    /// unmount waits for the mount under the node's admin lock).
    Mounting,
    /// Nothing mounted there: its node is down, restarted since, gone, or the entry is
    /// kept for a dead owner to mount again at its start.
    Not,
}

fn client_mount(
    client: &ClientMount,
    state: &tessera_cluster::state::ConfigState,
) -> ClientMountState {
    let Some(node) = state.nodes.values().find(|n| n.name == client.node) else {
        return ClientMountState::Not;
    };
    let live = match (state.incarnations.get(&node.number), client.incarnation) {
        (None, _) => false,
        (Some(_), None) => !client.pending,
        (Some(now), Some(then)) => *now == then,
    };
    match (live, client.pending) {
        (false, _) => ClientMountState::Not,
        (true, false) => ClientMountState::Mounted,
        (true, true) => ClientMountState::Mounting,
    }
}

/// Before another node takes file system `rec` over from its expelled owner: the old owner
/// is listed among the clients, at its mount point, so that its daemon mounts the file
/// system again at its next start, as a client of the new owner, as any client does
/// (`Daemon::rejoin_as_client`). While it is down the entry is only that: `mount ls` and
/// the unmount checks count live clients.
pub(super) fn keep_dead_owner_as_client(rec: &mut FsRecord, new_owner: &str) {
    let Some(owner) = rec.mounted.then(|| rec.mounted_on.clone()).flatten() else {
        return;
    };
    if owner == new_owner {
        return;
    }
    if !rec.clients.iter().any(|c| c.node == owner) {
        rec.clients.push(ClientMount {
            node: owner,
            mount_point: rec.mount_point.clone(),
            incarnation: None,
            pending: true,
        });
    }
}

/// The progress phase of a restripe (also of the one inside `disk delete`).
pub(super) fn restripe_phase(p: &tessera_fs::restripe::RestripeProgress) -> String {
    format!(
        "shards scanned; {} blocks ({:.1} MiB) moved{}",
        p.blocks_moved,
        p.bytes_moved as f64 / 1048576.0,
        if p.metadata_pages_moved > 0 {
            format!(", {} metadata pages moved", p.metadata_pages_moved)
        } else {
            String::new()
        }
    )
}

pub(super) fn restripe_done(
    report: &tessera_fs::restripe::RestripeReport,
) -> crate::rpc::RestripeDone {
    crate::rpc::RestripeDone {
        blocks_scanned: report.progress.blocks_scanned,
        blocks_moved: report.progress.blocks_moved,
        bytes_moved: report.progress.bytes_moved,
        metadata_pages_moved: report.progress.metadata_pages_moved,
        map_regions_moved: report.progress.map_regions_moved,
        log_moved: report.progress.log_moved,
        slot_regions_moved: report.progress.slot_regions_moved,
        metadata_copies_checked: report.progress.metadata_copies_checked,
        metadata_copies_repaired: report.progress.metadata_copies_repaired,
        blocks_changed: report.blocks_changed,
        stopped: report.stopped,
    }
}

/// The file system a request names when only its file system manager runs it: those that
/// change the descriptor (disks, replication, policy) or work on every shard and allocation
/// region (df, restripe, reclaim, policy runs), as `FileSystem::manager_here` refuses them
/// elsewhere.
pub(super) fn manager_only(request: &Request) -> Option<&str> {
    match request {
        Request::Df { name }
        | Request::ReclaimSpace { name }
        | Request::PolicyChange { name, .. }
        | Request::PolicyApply { name, .. }
        | Request::FsReplicationSet { name, .. }
        | Request::FsMetadataReplicationSet { name, .. }
        | Request::DiskAdd { name, .. }
        | Request::DiskDelete { name, .. }
        | Request::DiskChange { name, .. }
        | Request::DiskAvailability { name, .. }
        | Request::Restripe { name, .. } => Some(name),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::node::Designation;
    use tessera_cluster::state::{ConfigState, NodeRecord};

    #[test]
    fn a_file_system_counts_as_created_before_a_start_in_the_same_second_by_its_milliseconds() {
        let mut r: FsRecord = serde_json::from_value(serde_json::json!({
            "name": "fs1", "nsds": ["n1"], "default_mount_point": "/gpfs/fs1",
            "automount": true, "mounted": false, "mount_point": "/gpfs/fs1",
            "strict_replicas": "whenpossible", "log_bytes": 0,
            "created_unix": 1_700_000_000u64, "created_unix_ms": 1_700_000_000_400u64
        }))
        .unwrap();
        let at = |ms: u64| std::time::Duration::from_millis(ms);
        assert!(created_before(&r, at(1_700_000_000_900)));
        assert!(!created_before(&r, at(1_700_000_000_100)));
        assert!(!created_before(&r, at(1_700_000_000_400)));
        // A record from before milliseconds were kept: by the second, as before.
        r.created_unix_ms = 0;
        assert!(created_before(&r, at(1_700_000_000_100)));
        assert!(!created_before(&r, at(1_699_999_999_999)));
    }

    fn entry(incarnation: Option<u64>, pending: bool) -> ClientMount {
        ClientMount {
            node: "c1".into(),
            mount_point: "/gpfs/fs1".into(),
            incarnation,
            pending,
        }
    }

    #[test]
    fn a_client_is_listed_only_once_its_mount_is_made_by_the_incarnation_running() {
        let mut state = ConfigState::default();
        state.nodes.insert(
            7,
            NodeRecord {
                number: 7,
                name: "c1".into(),
                address: "10.0.0.7:1191".into(),
                designation: Designation::default(),
            },
        );
        // Down (never joined, or expelled): nothing is mounted there.
        assert!(!client_is_mounted(&entry(Some(3), false), &state));
        state.incarnations.insert(7, 3);
        assert!(client_is_mounted(&entry(Some(3), false), &state));
        // Still being made (`umount -a|-N` reaches it all the same), or kept for a dead
        // owner to mount again at its start.
        assert!(!client_is_mounted(&entry(Some(3), true), &state));
        assert_eq!(
            client_mount(&entry(Some(3), true), &state),
            ClientMountState::Mounting
        );
        assert!(!client_is_mounted(&entry(None, true), &state));
        assert_eq!(
            client_mount(&entry(None, true), &state),
            ClientMountState::Not
        );
        // The node restarted (a new incarnation) and has not mounted it again yet.
        state.incarnations.insert(7, 9);
        assert!(!client_is_mounted(&entry(Some(3), false), &state));
        assert_eq!(
            client_mount(&entry(Some(3), true), &state),
            ClientMountState::Not
        );
        // An entry from before incarnations were recorded counts while the node is live.
        assert!(client_is_mounted(&entry(None, false), &state));
        // A node no longer in the cluster.
        let gone = ClientMount {
            node: "c2".into(),
            ..entry(None, false)
        };
        assert!(!client_is_mounted(&gone, &state));
    }
}
