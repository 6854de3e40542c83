//! `nsd create`, `nsd delete`, `nsd discover` and `nsd change` in the daemon. Every stanza
//! is checked before anything is written, so a bad stanza leaves every device and the
//! registry as they were. NSDs are found by the id in their descriptor: a path that no
//! longer holds its NSD makes the daemon search the candidate devices for it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use tessera_drive::{BlockDevice, FileDrive};
use tessera_nsd::{
    check_device_size, check_name, erase_descriptor, probe_in_use, read_descriptor, scan,
    write_descriptor, InUse, NsdDescriptor, NsdId, NAME_RULE,
};
use tessera_nvme::host::Host;
use tessera_vdisk::read_pdisk_label;

use super::da_admin::vdisk_device_name;
use super::nvme_admin::{nvme_device_name, NVME_DEVICE_PREFIX};
use super::{Daemon, Reporter};
use crate::config::{now_unix, NsdRecord, NsdRegistry};
use crate::rpc::{NsdDiscoverRow, NsdSpec, Reply};

impl Daemon {
    /// Opens a device for NSD work: `vdisk:NAME` is a vdisk of an open declustered array,
    /// anything else a drive path (the drive layer's error already names the path). A
    /// device another process holds is refused with what is on it.
    pub(super) fn open_device(&self, path: &str) -> Result<Arc<dyn BlockDevice>> {
        self.open_device_as(path, Claim::Exclusive)
    }

    /// Opens a device with the claim `claim` (see [`Claim`]).
    pub(super) fn open_device_as(&self, path: &str, claim: Claim) -> Result<Arc<dyn BlockDevice>> {
        if let Some(name) = vdisk_device_name(path) {
            let vdisk = self.find_vdisk(name).ok_or_else(|| {
                anyhow!(
                    "{path}: no vdisk {name} is open on this node; `tessera vdisk ls` lists \
                     the vdisks (an array that failed to open at startup is in the daemon log)"
                )
            })?;
            return Ok(vdisk);
        }
        let cluster = self.cluster_identity();
        open_claimed(&self.nvme, &cluster, path, claim).map_err(|e| anyhow!("{e}"))
    }

    pub(super) fn cluster_identity(&self) -> ClusterIdentity {
        ClusterIdentity {
            id: self.cluster.cluster_id_bytes(),
            name: self.cluster.name.clone(),
        }
    }

    /// Opens the device of a registered NSD and checks that it still carries that NSD's
    /// descriptor: the descriptor, not the path, says which NSD a device is. When the
    /// recorded path no longer holds it, the candidate devices are searched for its id and
    /// the registry records where it was found.
    pub(super) fn open_nsd(&self, rec: &NsdRecord) -> Result<Arc<dyn BlockDevice>> {
        self.open_nsd_as(rec, Claim::Exclusive)
    }

    /// [`Self::open_nsd`] on this node's own path to the device, with the claim `claim`;
    /// an NSD this node serves is the device its NSD server holds.
    pub(super) fn open_nsd_local(
        &self,
        rec: &NsdRecord,
        claim: Claim,
    ) -> Result<Arc<dyn BlockDevice>> {
        if let Some(dev) = self.nsd_service.served_device(&rec.name, &rec.id) {
            return Ok(dev);
        }
        let first_try = self
            .open_device_as(&rec.device, claim)
            .and_then(|dev| open_checked(rec, dev));
        let err = match first_try {
            Ok(dev) => return Ok(dev),
            Err(e) if vdisk_device_name(&rec.device).is_some() => return Err(e),
            Err(e) => e,
        };
        let found = self.search_nsd(rec, &self.candidates(&self.nsds()?));
        if found.as_deref() == Some(rec.device.as_str()) {
            // The NSD is where the registry says, and that device did not open (another
            // process holds it): nothing moved, and recording a "move" to the same place
            // would only rewrite the registry.
            return Err(err);
        }
        let Some(found) = found else {
            return Err(err.context(format!(
                "NSD {} was not found on any other device of this node either; \
                 `tessera nsd change {} --device PATH` records where it is",
                rec.name, rec.name
            )));
        };
        self.record_moved_nsd(&rec.name, &rec.device, &found)?;
        open_checked(rec, self.open_device_as(&found, claim)?)
    }

    /// Notes in the registry that NSD `name` moved from `before` to `now`.
    fn record_moved_nsd(&self, name: &str, before: &str, now: &str) -> Result<()> {
        self.change_nsds_and_file_systems(&mut |registry, _| {
            if let Some(r) = registry.get_mut(name) {
                r.device = now.to_string();
            }
            Ok(())
        })?;
        tracing::warn!("NSD {name}: device changed from {before} to {now}");
        Ok(())
    }

    /// Where an NSD or pdisk may be now: the recorded paths, every connected NVMe/TCP
    /// namespace (by its stable name), every block device of this machine and the entries
    /// of `$TESSERA_HOME/nsddevices`, each once.
    pub(super) fn candidates(&self, registry: &NsdRegistry) -> Vec<String> {
        let mut all: Vec<String> = registry
            .nsds
            .iter()
            .filter(|n| vdisk_device_name(&n.device).is_none())
            .map(|n| n.device.clone())
            .collect();
        if let Ok(arrays) = self.arrays() {
            all.extend(
                arrays
                    .arrays
                    .iter()
                    .flat_map(|a| a.pdisks.iter().map(|p| p.device.clone())),
            );
        }
        all.extend(
            self.nvme
                .list()
                .iter()
                .map(|ns| format!("{NVME_DEVICE_PREFIX}{}", ns.stable_name)),
        );
        all.extend(
            scan::local_block_devices()
                .iter()
                .map(|p| p.display().to_string()),
        );
        let list = self.home.root().join(NSDDEVICES_FILE);
        match scan::search_list(&list) {
            Ok(paths) => all.extend(paths.iter().map(|p| p.display().to_string())),
            Err(e) => tracing::warn!("{e}; the search list is ignored until it is fixed"),
        }
        let mut seen = HashSet::new();
        all.retain(|c| seen.insert(c.clone()));
        all
    }

    fn probe(&self, candidate: &str) -> Option<Arc<dyn BlockDevice>> {
        probe(&self.nvme, candidate)
    }

    /// The first candidate whose descriptor carries `rec`'s NSD id and this cluster's id.
    fn search_nsd(&self, rec: &NsdRecord, candidates: &[String]) -> Option<String> {
        let cluster = self.cluster.cluster_id_bytes();
        candidates.iter().find_map(|c| {
            let d = read_descriptor(self.probe(c)?.as_ref()).ok()??;
            (d.id == rec.id && d.cluster_id == cluster).then(|| c.clone())
        })
    }

    /// `nsd discover` and the startup scan: finds every NSD by its descriptor and records
    /// new paths. An NSD still at its path is not searched for.
    pub(super) fn discover_nsds(&self) -> Result<Vec<NsdDiscoverRow>> {
        let registry = self.nsds()?;
        let mut candidates: Option<Vec<String>> = None;
        let mut rows = Vec::new();
        for rec in &registry.nsds {
            let dev = match vdisk_device_name(&rec.device) {
                // A vdisk's name is its identity; it is reachable once its array is open.
                Some(v) => self.find_vdisk(v).map(|v| v as Arc<dyn BlockDevice>),
                None => self.probe(&rec.device),
            };
            let here = dev
                .and_then(|d| read_descriptor(d.as_ref()).ok().flatten())
                .is_some_and(|d| d.id == rec.id);
            if here || vdisk_device_name(&rec.device).is_some() {
                let status = if here { "found" } else { "vdisk not open" };
                rows.push(discover_row(rec, here.then(|| rec.device.clone()), status));
                continue;
            }
            let list = candidates.get_or_insert_with(|| self.candidates(&registry));
            match self.search_nsd(rec, list) {
                Some(now) => {
                    self.record_moved_nsd(&rec.name, &rec.device, &now)?;
                    rows.push(discover_row(rec, Some(now), "moved"));
                }
                None => rows.push(discover_row(rec, None, "not found")),
            }
        }
        Ok(rows)
    }

    /// At startup, before arrays open and file systems mount: NSDs whose device was
    /// renamed (a loop device attached under another number, NVMe namespaces that came
    /// back in another order) are found again by their descriptors.
    pub(super) fn discover_nsds_at_start(&self) {
        match self.discover_nsds() {
            Ok(rows) => {
                // Vdisks are checked when their arrays open, after this scan.
                let lost = rows.iter().filter(|r| {
                    r.device_now.is_none() && vdisk_device_name(&r.device_before).is_none()
                });
                for r in lost {
                    tracing::error!(
                        "NSD {}: not found at {} nor on any other device of this node; \
                         `tessera nsd change {} --device PATH` records where it is",
                        r.nsd,
                        r.device_before,
                        r.nsd
                    );
                }
            }
            Err(e) => tracing::error!("NSD discovery: {e:#}"),
        }
    }

    /// The devices to open the declustered array `rec` from: every candidate whose pdisk
    /// label names this array, each pdisk (by label uuid) once, recorded paths first. A
    /// pdisk whose path changed is found wherever its label now is.
    pub(super) fn pdisk_devices(&self, rec: &crate::config::DaRecord) -> Vec<PathBuf> {
        let registry = self.nsds().unwrap_or_default();
        let mut candidates: Vec<String> = rec
            .pdisks
            .iter()
            .map(|p| self.stable_device_name(&p.device))
            .collect();
        candidates.extend(self.candidates(&registry));
        let mut da_uuid = None;
        let mut pdisks = HashSet::new();
        let mut devices = Vec::new();
        let mut seen = HashSet::new();
        // Recorded pdisks on remote drives without a path now (their enclosure is down):
        // given to the array as they are, which suspends them until they answer.
        let mut silent = Vec::new();
        let recorded = rec.pdisks.len();
        for (i, c) in candidates
            .into_iter()
            .filter(|c| seen.insert(c.clone()))
            .enumerate()
        {
            let unreachable = nvme_device_name(&c)
                .and_then(|n| self.nvme.namespace(n))
                .is_some_and(|ns| !ns.has_live_path());
            if unreachable {
                if i < recorded {
                    silent.push(PathBuf::from(c));
                }
                continue;
            }
            let Some(label) = self.probe(&c).and_then(|d| read_pdisk_label(d.as_ref())) else {
                continue;
            };
            if label.da_name != rec.name || *da_uuid.get_or_insert(label.da_uuid) != label.da_uuid {
                continue;
            }
            if pdisks.insert(label.pdisk_uuid) {
                devices.push(PathBuf::from(c));
            }
        }
        if !devices.is_empty() {
            devices.extend(silent);
        } else {
            // Nothing answers: let the array report the recorded paths it could not open.
            return rec
                .pdisks
                .iter()
                .map(|p| PathBuf::from(&p.device))
                .collect();
        }
        devices
    }

    /// `nvme:nvme0n1` (a counter that changes with connection order) as `nvme:eui.<NGUID>`;
    /// anything else unchanged.
    pub(super) fn stable_device_name(&self, device: &str) -> String {
        nvme_device_name(device)
            .and_then(|name| self.nvme.namespace(name))
            .map_or_else(
                || device.to_string(),
                |ns| format!("{NVME_DEVICE_PREFIX}{}", ns.stable_name()),
            )
    }

    /// `nsd change NSD --device PATH` [mmchnsd]: records a device that scanning cannot
    /// find, after checking that it carries the NSD's descriptor.
    pub(super) fn nsd_change(&self, name: &str, device: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        let registry = self.nsds()?;
        let Some(rec) = registry.get(name) else {
            bail!("NSD {name} does not exist; `tessera nsd ls` lists the NSDs");
        };
        let device = self.stable_device_name(device);
        let dev = self.open_device(&device)?;
        match read_descriptor(dev.as_ref())? {
            Some(d) if d.id == rec.id && d.cluster_id == self.cluster.cluster_id_bytes() => {}
            Some(d) => bail!(
                "--device {device}: holds NSD {} (id {}), not NSD {name} (id {}); \
                 give the device that holds NSD {name}",
                d.name,
                d.id,
                rec.id
            ),
            None => bail!(
                "--device {device}: carries no NSD descriptor, so it is not NSD {name}; \
                 give the device that holds it (`tessera nsd discover` searches for it)"
            ),
        }
        if rec.device != device {
            self.record_moved_nsd(name, &rec.device.clone(), &device)?;
        }
        Ok(Reply::Done)
    }
}

/// This node's cluster, to tell its NSDs from another cluster's in messages.
pub(super) struct ClusterIdentity {
    id: [u8; 16],
    name: String,
}

/// Opens and claims a drive; a device another process holds is refused with what it
/// holds, so the admin knows whose it is.
/// How a daemon claims a local drive or drive file against other processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Claim {
    /// No other process may open it (an NSD being written, a pdisk of an array).
    Exclusive,
    /// The disks of a mounted file system: every node of the cluster that reaches them
    /// opens them at once (SAN mode, as GPFS nodes share their disks), and the replicated
    /// file-system table says which node owns the metadata; a process that wants a drive
    /// for itself (an NSD create elsewhere, an array) is still refused.
    Shared,
}

pub(super) fn open_claimed(
    host: &Host,
    cluster: &ClusterIdentity,
    path: &str,
    claim: Claim,
) -> std::io::Result<Arc<dyn BlockDevice>> {
    super::nvme_admin::open_drive(host, path, claim == Claim::Shared).map_err(|e| {
        if e.kind() != std::io::ErrorKind::ResourceBusy {
            return e;
        }
        let what = describe_contents(host, cluster, path);
        std::io::Error::new(e.kind(), format!("{e}; {what}"))
    })
}

/// Reads sector 0 of a candidate without claiming it (it may be another daemon's).
fn probe(host: &Host, candidate: &str) -> Option<Arc<dyn BlockDevice>> {
    if let Some(name) = nvme_device_name(candidate) {
        let ns: Arc<dyn BlockDevice> = host.namespace(name)?;
        return Some(ns);
    }
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open_for_probe(Path::new(candidate)).ok()?);
    Some(dev)
}

/// What a busy device holds, for the refusal: its NSD (and cluster), file system or
/// declustered array, read without claiming it.
fn describe_contents(host: &Host, cluster: &ClusterIdentity, path: &str) -> String {
    let Some(dev) = probe(host, path) else {
        return "its contents cannot be read".into();
    };
    if let Some(label) = read_pdisk_label(dev.as_ref()) {
        return format!(
            "it is pdisk {} of declustered array {}; stop the process that holds it before \
             reusing the device",
            label.pdisk_name, label.da_name
        );
    }
    let mut what = match read_descriptor(dev.as_ref()) {
        Ok(Some(d)) => {
            let whose = if d.cluster_id == cluster.id {
                format!("this cluster ({})", cluster.name)
            } else {
                format!("cluster {}", hex(&d.cluster_id))
            };
            format!("it holds NSD {} of {whose}", d.name)
        }
        _ => "it holds no NSD descriptor".into(),
    };
    if let Ok(fs) = tessera_fs::read_descriptor(&[Arc::clone(&dev)]) {
        what += &format!(" and is a disk of file system {}", fs.name);
    }
    what + "; stop the process that holds it before reusing the device"
}

/// The search list an administrator keeps in `$TESSERA_HOME`: one path or glob per line.
pub const NSDDEVICES_FILE: &str = "nsddevices";

fn discover_row(rec: &NsdRecord, now: Option<String>, status: &str) -> NsdDiscoverRow {
    NsdDiscoverRow {
        nsd: rec.name.clone(),
        device_before: rec.device.clone(),
        device_now: now,
        status: status.to_string(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn open_checked(
    rec: &NsdRecord,
    dev: Arc<dyn BlockDevice>,
) -> Result<Arc<dyn BlockDevice>> {
    match read_descriptor(dev.as_ref())? {
        Some(d) if d.id == rec.id => Ok(dev),
        Some(d) => bail!(
            "{}: holds NSD {} (id {}), not NSD {} (id {})",
            rec.device,
            d.name,
            d.id,
            rec.name,
            rec.id,
        ),
        None => bail!(
            "{}: no NSD descriptor found; NSD {} is not on this device any more",
            rec.device,
            rec.name
        ),
    }
}

/// Checks one stanza against the registry and the device; returns the opened device.
fn check_spec(
    daemon: &Daemon,
    spec: &NsdSpec,
    verify: bool,
    registry: &NsdRegistry,
) -> Result<Arc<dyn BlockDevice>> {
    if let Some(name) = &spec.nsd {
        check_name(name).map_err(|p| anyhow!("nsd={name}: invalid NSD name: {p}; {NAME_RULE}"))?;
        if let Some(existing) = registry.get(name) {
            bail!(
                "nsd={name}: an NSD of that name already exists (on {}); choose another name \
                 or delete it first with `tessera nsd delete {name}`",
                existing.device
            );
        }
    }
    if let Some(existing) = registry
        .nsds
        .iter()
        .find(|n| n.device == daemon.stable_device_name(&spec.device_path))
    {
        bail!(
            "device={}: already NSD {} of this cluster; delete it first with \
             `tessera nsd delete {}`",
            spec.device_text,
            existing.name,
            existing.name
        );
    }
    let state = daemon.member.state();
    for server in &spec.servers {
        if state.node_by_name(server).is_none() {
            bail!(
                "servers={}: {server} is not a node of this cluster; `tessera cluster ls` \
                 lists the nodes (add it first with `tessera node add`)",
                spec.servers.join(",")
            );
        }
    }
    let me = daemon.member.me_name();
    let dev = daemon.open_device(&spec.device_path).map_err(|e| {
        if spec.servers.is_empty() || spec.servers.contains(&me) {
            return e;
        }
        e.context(format!(
            "device={} is named as NSD server {} sees it; run `tessera nsd create` on {} \
             (this node, {me}, is not one of its servers and cannot open it)",
            spec.device_text, spec.servers[0], spec.servers[0]
        ))
    })?;
    check_device_size(dev.as_ref())?;
    if verify {
        match probe_in_use(dev.as_ref())? {
            InUse::Free => {}
            InUse::Nsd(d) => bail!(
                "device={}: already holds NSD {} (id {}); if that NSD is no longer needed, \
                 rerun with `-v no` to overwrite it",
                spec.device_text,
                d.name,
                d.id
            ),
            InUse::FileSystem => bail!(
                "device={}: holds (or held) a Tessera file system; if its data is no longer \
                 needed, rerun with `-v no` to overwrite it",
                spec.device_text
            ),
        }
    }
    Ok(dev)
}

/// The first `nsdN` names not used by the registry or by `taken`.
fn generate_name(registry: &NsdRegistry, taken: &HashSet<String>) -> String {
    (1..)
        .map(|n| format!("nsd{n}"))
        .find(|n| registry.get(n).is_none() && !taken.contains(n))
        .expect("an unused name exists")
}

impl Daemon {
    pub(super) fn nsd_create(
        &self,
        specs: Vec<NsdSpec>,
        verify: bool,
        r: &mut Reporter,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        let registry = self.nsds()?;
        if specs.is_empty() {
            bail!("the stanza file has no %nsd stanzas; add one per device");
        }
        let mut problems = Vec::new();
        let mut devices = Vec::new();
        for spec in &specs {
            match check_spec(self, spec, verify, &registry) {
                Ok(dev) => devices.push(dev),
                Err(e) => problems.push(format!("{e:#}")),
            }
        }
        if !problems.is_empty() {
            bail!("no NSD was created:\n  {}", problems.join("\n  "));
        }
        let names: Vec<String> = {
            // Keep stanza order: the set above only guarantees uniqueness.
            let mut ordered = Vec::new();
            let mut taken = HashSet::new();
            for spec in &specs {
                let name = match &spec.nsd {
                    Some(n) => n.clone(),
                    None => generate_name(&registry, &taken_with(&taken, &specs)),
                };
                taken.insert(name.clone());
                ordered.push(name);
            }
            ordered
        };
        let cluster_id = self.cluster.cluster_id_bytes();
        let mut written: Vec<&Arc<dyn BlockDevice>> = Vec::new();
        let mut records = Vec::new();
        for ((spec, dev), name) in specs.iter().zip(&devices).zip(&names) {
            r.info(format!(
                "tessera nsd create: Processing disk {}",
                spec.device_text
            ));
            let d = NsdDescriptor {
                id: NsdId::random(),
                name: name.clone(),
                device_bytes: dev.size_bytes(),
                created_unix: now_unix(),
                cluster_id,
            };
            if let Err(e) = write_descriptor(dev.as_ref(), &d) {
                for done in &written {
                    let _ = erase_descriptor(done.as_ref());
                }
                bail!("{e}; no NSD was created (descriptors already written were erased)");
            }
            written.push(dev);
            records.push(NsdRecord {
                name: name.clone(),
                id: d.id,
                device: self.stable_device_name(&spec.device_path),
                size_bytes: dev.size_bytes(),
                usage: spec.usage,
                failure_group: spec.failure_group,
                pool: spec.pool.clone(),
                thin_disk_type: spec.thin_disk_type,
                servers: spec.servers.clone(),
                file_system: None,
            });
        }
        // On the table as it is now: an NSD created or a file system mounted on another node
        // while the descriptors were written is no reason to erase them.
        let saved = self.change_nsds_and_file_systems(&mut |registry, _| {
            for rec in &records {
                match registry.get(&rec.name) {
                    // Saved by an earlier attempt of this command.
                    Some(had) if had.id == rec.id => continue,
                    Some(had) => bail!(
                        "another command created NSD {} (on {}) meanwhile",
                        rec.name,
                        had.device
                    ),
                    None => {}
                }
                if let Some(had) = registry.nsds.iter().find(|n| n.device == rec.device) {
                    bail!(
                        "another command made {} NSD {} meanwhile",
                        rec.device,
                        had.name
                    );
                }
                registry.nsds.push(rec.clone());
            }
            Ok(())
        });
        if let Err(e) = saved {
            for dev in &written {
                let _ = erase_descriptor(dev.as_ref());
            }
            return Err(e.context("no NSD was created"));
        }
        Ok(Reply::NsdsCreated(names))
    }

    pub(super) fn nsd_delete(&self, names: &[String], r: &mut Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        let registry = self.nsds()?;
        for name in names {
            let Some(rec) = registry.get(name) else {
                bail!("NSD {name} does not exist; `tessera nsd ls` lists the NSDs");
            };
            if let Some(fs) = &rec.file_system {
                bail!(
                    "NSD {name} belongs to file system {fs}; delete the file system first \
                     with `tessera fs delete {fs}`"
                );
            }
        }
        for name in names {
            let rec = registry.get(name).expect("checked above").clone();
            r.info(format!("tessera nsd delete: Processing disk {name}"));
            // A descriptor that cannot be erased (a vdisk that lost data) must not keep
            // the NSD, and the file systems and vdisks under it, from being deleted.
            match self
                .open_nsd(&rec)
                .and_then(|dev| Ok(erase_descriptor(dev.as_ref())?))
            {
                Ok(()) => {}
                Err(e) => r.info(format!(
                    "tessera nsd delete: warning: {e:#}; NSD {name} is removed from the \
                     cluster but no descriptor was erased"
                )),
            }
            self.change_nsds_and_file_systems(&mut |registry, _| {
                registry.nsds.retain(|n| n.name != *name);
                Ok(())
            })?;
        }
        Ok(Reply::Done)
    }
}

/// Names given explicitly in the stanzas plus those already generated, so a generated
/// name never collides with a later stanza's `nsd=`.
fn taken_with(taken: &HashSet<String>, specs: &[NsdSpec]) -> HashSet<String> {
    let mut all = taken.clone();
    all.extend(specs.iter().filter_map(|s| s.nsd.clone()));
    all
}
