//! `nsd create` and `nsd delete` in the daemon. Every stanza is checked before anything is
//! written, so a bad stanza leaves every device and the registry as they were.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use tessera_drive::BlockDevice;
use tessera_nsd::{
    check_device_size, check_name, erase_descriptor, probe_in_use, read_descriptor,
    write_descriptor, InUse, NsdDescriptor, NsdId, NAME_RULE,
};

use super::da_admin::vdisk_device_name;
use super::{Daemon, Reporter};
use crate::config::{now_unix, NsdRecord, NsdRegistry};
use crate::rpc::{NsdSpec, Reply};

impl Daemon {
    /// Opens a device for NSD work: `vdisk:NAME` is a vdisk of an open declustered array,
    /// anything else a drive path (the drive layer's error already names the path).
    pub(super) fn open_device(&self, path: &str) -> Result<Arc<dyn BlockDevice>> {
        if let Some(name) = vdisk_device_name(path) {
            let vdisk = self.find_vdisk(name).ok_or_else(|| {
                anyhow!(
                    "{path}: no vdisk {name} is open on this node; `tessera vdisk ls` lists \
                     the vdisks (an array that failed to open at startup is in the daemon log)"
                )
            })?;
            return Ok(vdisk);
        }
        super::nvme_admin::open_drive(&self.nvme, path).map_err(|e| anyhow!("{e}"))
    }

    /// How the declustered arrays of this node open their pdisks: local paths with
    /// O_DIRECT, `nvme:NAME` through the NVMe/TCP host.
    pub(super) fn device_opener(&self) -> tessera_vdisk::DeviceOpener {
        let host = Arc::clone(&self.nvme);
        Arc::new(move |path: &Path| super::nvme_admin::open_drive(&host, &path.to_string_lossy()))
    }

    /// Opens the device of a registered NSD and checks that it still carries that NSD's
    /// descriptor: the descriptor, not the path, says which NSD a device is.
    pub(super) fn open_nsd(&self, rec: &NsdRecord) -> Result<Arc<dyn BlockDevice>> {
        open_checked(rec, self.open_device(&rec.device)?)
    }
}

fn open_checked(rec: &NsdRecord, dev: Arc<dyn BlockDevice>) -> Result<Arc<dyn BlockDevice>> {
    match read_descriptor(dev.as_ref())? {
        Some(d) if d.id == rec.id => Ok(dev),
        Some(d) => bail!(
            "{}: holds NSD {} (id {}), not NSD {} (id {}); the device path changed — \
             put NSD {} back at {}",
            rec.device,
            d.name,
            d.id,
            rec.name,
            rec.id,
            rec.name,
            rec.device
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
    if let Some(existing) = registry.nsds.iter().find(|n| n.device == spec.device_path) {
        bail!(
            "device={}: already NSD {} of this cluster; delete it first with \
             `tessera nsd delete {}`",
            spec.device_text,
            existing.name,
            existing.name
        );
    }
    let dev = daemon.open_device(&spec.device_path)?;
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
        let mut registry = self.home.nsds()?;
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
                device: spec.device_path.clone(),
                size_bytes: dev.size_bytes(),
                usage: spec.usage,
                failure_group: spec.failure_group,
                pool: spec.pool.clone(),
                thin_disk_type: spec.thin_disk_type,
                servers: spec.servers.clone(),
                file_system: None,
            });
        }
        registry.nsds.extend(records);
        if let Err(e) = self.home.save_nsds(&registry) {
            for dev in &written {
                let _ = erase_descriptor(dev.as_ref());
            }
            return Err(e.context("no NSD was created"));
        }
        Ok(Reply::NsdsCreated(names))
    }

    pub(super) fn nsd_delete(&self, names: &[String], r: &mut Reporter) -> Result<Reply> {
        let _admin = self.admin.lock();
        let mut registry = self.home.nsds()?;
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
            registry.nsds.retain(|n| n.name != *name);
            self.home.save_nsds(&registry)?;
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
