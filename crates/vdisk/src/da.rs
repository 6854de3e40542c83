//! [`DeclusteredArray`]: creating and opening arrays, vdisk management, pdisk
//! administration and status.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use tessera_drive::{AlignedBuf, BlockDevice};
use tessera_ec::{Code, Codec};

use crate::core::{now_unix, CoreInit, DaCore, VdiskCore};
use crate::error::{check_name, VdiskError};
use crate::layout::{self, Label, PdiskLayout, SECTOR, SECTOR_USIZE};
use crate::meta::{self, DaConfig, MetaImage, PdiskRecord, PdiskState, VdiskRecord};
use crate::pdisk::{file_opener, DeviceOpener, Pdisk};
use crate::placement::{self, Candidate, Tolerance};
use crate::status::{DaState, DaStatus, PdiskStatus, RecoveryReport, ScrubReport, VdiskStatus};
use crate::vdisk::Vdisk;
use crate::{dirty, worker};

/// Most pdisk records in an array (including replaced ones); pdisk numbers are 16 bits.
pub const PDISKS_MAX: usize = 1024;
/// Most vdisks in an array; bounds the dirty-region bitmap.
pub const VDISKS_MAX: usize = 64;
/// Largest strip: bounds buffers (a stripe is read into memory whole when degraded).
pub const STRIP_BYTES_MAX: u64 = 16 << 20;

/// One drive of a new array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PdiskSpec {
    pub name: String,
    pub device: PathBuf,
    pub enclosure: String,
    pub slot: u32,
}

/// Options of [`DeclusteredArray::create`] (and the device opener of `open`).
#[derive(Clone)]
pub struct DaOptions {
    /// Spare capacity, in pdisks' worth, spread over all pdisks; default
    /// `max(1, ceil(pdisks / 12))`.
    pub spare_pdisks: Option<u32>,
    /// Percent of I/O time left to foreground I/O while rebuild runs (0..=95, default 50).
    pub rebuild_io_share: u8,
    /// Background scrub rate in MB/s (read from all pdisks together; default 200).
    pub scrub_rate_mb_s: u32,
    /// I/O errors after which a pdisk is declared dead (default 8).
    pub pdisk_error_limit: u32,
    /// Overwrite devices that already carry a pdisk label or an NSD descriptor.
    pub force: bool,
    /// Opens device paths; default: O_DIRECT files and block devices.
    pub opener: Option<DeviceOpener>,
}

impl Default for DaOptions {
    fn default() -> DaOptions {
        DaOptions {
            spare_pdisks: None,
            rebuild_io_share: 50,
            scrub_rate_mb_s: 200,
            pdisk_error_limit: 8,
            force: false,
            opener: None,
        }
    }
}

impl std::fmt::Debug for DaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaOptions")
            .field("spare_pdisks", &self.spare_pdisks)
            .field("rebuild_io_share", &self.rebuild_io_share)
            .field("scrub_rate_mb_s", &self.scrub_rate_mb_s)
            .field("pdisk_error_limit", &self.pdisk_error_limit)
            .field("force", &self.force)
            .finish_non_exhaustive()
    }
}

/// The size of a new vdisk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VdiskSize {
    /// Bytes, rounded down to whole blocks.
    Bytes(u64),
    /// Percent of the array's remaining usable (non-spare) capacity.
    Percent(u8),
}

/// A declustered array: pdisks, spare space, and the vdisks carved from them.
pub struct DeclusteredArray {
    core: Arc<DaCore>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    scrubber: Mutex<Option<JoinHandle<()>>>,
    recovery: RecoveryReport,
    closed: AtomicBool,
}

impl std::fmt::Debug for DeclusteredArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeclusteredArray({})", self.core.name)
    }
}

fn uuid_hex(u: &[u8; 16]) -> String {
    u.iter().map(|b| format!("{b:02x}")).collect()
}

/// The identity of the file behind a path: (device, inode), or the device number of a
/// block device, so two paths to one drive are caught.
fn device_identity(path: &Path) -> Option<(u64, u64)> {
    // A name that is not a path (`nvme:nvme0n1`, a remote namespace) is known only to the
    // opener; the name itself identifies it, as the host gives each namespace one name.
    if !path.is_absolute() {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        path.hash(&mut h);
        return Some((u64::MAX - 1, h.finish()));
    }
    let m = std::fs::metadata(path).ok()?;
    use std::os::unix::fs::FileTypeExt;
    if m.file_type().is_block_device() {
        Some((u64::MAX, m.rdev()))
    } else {
        Some((m.dev(), m.ino()))
    }
}

fn open_device(opener: &DeviceOpener, path: &Path) -> Result<Arc<dyn BlockDevice>, VdiskError> {
    opener(path).map_err(|e| VdiskError::io(&path.display().to_string(), "opening the device", e))
}

fn read_sector0(dev: &dyn BlockDevice, path: &Path) -> Result<AlignedBuf, VdiskError> {
    let mut s = AlignedBuf::zeroed(SECTOR_USIZE);
    dev.read_at(&mut s, layout::LABEL_OFFSET)
        .map_err(|e| VdiskError::io(&path.display().to_string(), "reading the pdisk label", e))?;
    Ok(s)
}

fn write_label(dev: &dyn BlockDevice, path: &Path, label: &Label) -> Result<(), VdiskError> {
    let name = path.display().to_string();
    let buf = AlignedBuf::from_slice(&label.encode());
    dev.write_at(&buf, layout::LABEL_OFFSET)
        .map_err(|e| VdiskError::io(&name, "writing the pdisk label", e))?;
    dev.flush()
        .map_err(|e| VdiskError::io(&name, "flushing the pdisk label", e))
}

/// Refuses devices that already belong to something, unless forced.
fn check_unused(
    dev: &dyn BlockDevice,
    path: &Path,
    force: bool,
    how_to_force: &'static str,
) -> Result<(), VdiskError> {
    if force {
        return Ok(());
    }
    let s = read_sector0(dev, path)?;
    let device = path.display().to_string();
    match Label::decode(&s) {
        Ok(Some(l)) => {
            return Err(VdiskError::DeviceInUse {
                device,
                da: l.da_name,
                how_to_force,
            })
        }
        Err(_) => {
            return Err(VdiskError::DeviceInUse {
                device,
                da: "(damaged label)".into(),
                how_to_force,
            })
        }
        Ok(None) => {}
    }
    if &s[..8] == b"TSRNSD01" {
        return Err(VdiskError::Invalid(format!(
            "{device}: holds an NSD descriptor (the device is an NSD, maybe with a file \
             system); if its data is no longer needed, {how_to_force}"
        )));
    }
    Ok(())
}

fn check_specs(name: &str, specs: &[PdiskSpec]) -> Result<(), VdiskError> {
    check_name("declustered array", name)?;
    if specs.is_empty() {
        return Err(VdiskError::Invalid(format!(
            "declustered array `{name}`: no pdisks given"
        )));
    }
    if specs.len() > PDISKS_MAX {
        return Err(VdiskError::Limit {
            da: name.into(),
            what: "pdisks",
            max: PDISKS_MAX,
        });
    }
    let mut names = HashMap::new();
    let mut ids: HashMap<(u64, u64), &Path> = HashMap::new();
    let mut slots = HashMap::new();
    for s in specs {
        check_name("pdisk", &s.name)?;
        check_name("enclosure", &s.enclosure)?;
        if names.insert(s.name.as_str(), ()).is_some() {
            return Err(VdiskError::Invalid(format!(
                "declustered array `{name}`: pdisk name `{}` is used twice",
                s.name
            )));
        }
        if let Some(other) = slots.insert((s.enclosure.as_str(), s.slot), s.name.as_str()) {
            return Err(VdiskError::Invalid(format!(
                "pdisks `{other}` and `{}` both claim enclosure {} slot {}",
                s.name, s.enclosure, s.slot
            )));
        }
        let id = device_identity(&s.device).ok_or_else(|| {
            VdiskError::io(
                &s.device.display().to_string(),
                "looking up the device",
                std::io::Error::from(std::io::ErrorKind::NotFound),
            )
        })?;
        if let Some(other) = ids.insert(id, &s.device) {
            return Err(VdiskError::DuplicateDevice {
                device: s.device.display().to_string(),
                other: other.display().to_string(),
            });
        }
    }
    Ok(())
}

impl DeclusteredArray {
    /// Creates an array on `pdisks`: writes every label and the first metadata. Devices
    /// that already carry a pdisk label or an NSD descriptor are refused unless
    /// `opts.force`.
    pub fn create(
        name: &str,
        pdisks: &[PdiskSpec],
        opts: DaOptions,
    ) -> Result<Arc<DeclusteredArray>, VdiskError> {
        check_specs(name, pdisks)?;
        check_settings(name, &opts)?;
        let opener = opts.opener.clone().unwrap_or_else(file_opener);
        let mut devs = Vec::new();
        for s in pdisks {
            let dev = open_device(&opener, &s.device)?;
            if dev.size_bytes() < layout::PDISK_BYTES_MIN {
                return Err(VdiskError::TooSmall {
                    device: s.device.display().to_string(),
                    size_bytes: dev.size_bytes(),
                    min_bytes: layout::PDISK_BYTES_MIN,
                });
            }
            check_unused(
                dev.as_ref(),
                &s.device,
                opts.force,
                "create the array with `-v no` (DaOptions::force)",
            )?;
            devs.push(dev);
        }
        let count = pdisks.len() as u32;
        let spare = opts.spare_pdisks.unwrap_or(count.div_ceil(12).max(1));
        if spare >= count {
            return Err(VdiskError::Invalid(format!(
                "declustered array `{name}`: {spare} spare pdisks' worth leaves nothing \
                 usable with {count} pdisks; use fewer spares or more pdisks"
            )));
        }
        let smallest = devs
            .iter()
            .map(|d| d.size_bytes())
            .min()
            .expect("non-empty");
        let config = DaConfig {
            uuid: rand::random(),
            name: name.to_string(),
            created_unix: now_unix(),
            meta_slot_bytes: layout::meta_slot_bytes_for(smallest),
            spare_pdisks: spare,
            rebuild_io_share: opts.rebuild_io_share,
            scrub_rate_mb_s: opts.scrub_rate_mb_s,
            pdisk_error_limit: opts.pdisk_error_limit,
            next_vdisk_id: 1,
        };
        let mut runtime = Vec::new();
        for (i, (s, dev)) in pdisks.iter().zip(devs).enumerate() {
            let record = PdiskRecord {
                uuid: rand::random(),
                name: s.name.clone(),
                device: s.device.display().to_string(),
                enclosure: s.enclosure.clone(),
                slot: s.slot,
                device_bytes: dev.size_bytes(),
                state: PdiskState::Ok,
            };
            let label = label_for(&config, &record, i as u32);
            write_label(dev.as_ref(), &s.device, &label)?;
            let lay = PdiskLayout::new(record.device_bytes, config.meta_slot_bytes);
            runtime.push(Arc::new(Pdisk::new(i as u16, &record, lay, Some(dev))));
        }
        let core = Arc::new(DaCore::new(CoreInit {
            config,
            pdisks: runtime,
            vdisks: Vec::new(),
            stale: Vec::new(),
            write_epoch: 1,
            meta_generation: 0,
            dirty_generation: 0,
            opener,
        }));
        core.persist_meta()?;
        core.persist_dirty(u64::MAX)?;
        core.event(format!(
            "created with {count} pdisks, {spare} pdisks' worth of spare"
        ));
        Ok(DeclusteredArray::start(core, RecoveryReport::default()))
    }

    /// Opens an array from its devices (in any order, under any paths): finds the labels,
    /// takes the newest metadata, marks pdisks not found as missing, resynchronises dirty
    /// regions after an unclean shutdown, and starts the background workers (rebuild
    /// starts by itself if a pdisk is missing or dead). `name_hint` may be empty when the
    /// devices hold only one array.
    pub fn open(name_hint: &str, devices: &[PathBuf]) -> Result<Arc<DeclusteredArray>, VdiskError> {
        DeclusteredArray::open_with(name_hint, devices, &DaOptions::default())
    }

    /// [`DeclusteredArray::open`] with a device opener (only `opts.opener` is used).
    pub fn open_with(
        name_hint: &str,
        devices: &[PathBuf],
        opts: &DaOptions,
    ) -> Result<Arc<DeclusteredArray>, VdiskError> {
        let opener = opts.opener.clone().unwrap_or_else(file_opener);
        let (found, unanswered) = find_labels(name_hint, devices, &opener)?;
        let (uuid, da_name) = (found[0].1.da_uuid, found[0].1.da_name.clone());
        let mut best: Option<(u64, MetaImage)> = None;
        for (_, label, dev) in &found {
            let lay = PdiskLayout::new(label.device_bytes, label.meta_slot_bytes);
            if let Some((g, image)) = meta::read_newest(dev.as_ref(), &lay, uuid) {
                if best.as_ref().is_none_or(|(bg, _)| g > *bg) {
                    best = Some((g, image));
                }
            }
        }
        let Some((generation, image)) = best else {
            return Err(VdiskError::NoMetadata {
                da: da_name,
                devices: found
                    .iter()
                    .map(|(p, _, _)| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let (core, dirty_bits) = build_core(image, generation, found, unanswered, opener)?;
        let core = Arc::new(core);
        core.persist_meta()?;
        let recovery = resync_dirty(&core, &dirty_bits)?;
        Ok(DeclusteredArray::start(core, recovery))
    }

    fn start(core: Arc<DaCore>, recovery: RecoveryReport) -> Arc<DeclusteredArray> {
        let workers = worker::spawn_workers(&core);
        core.kick();
        Arc::new(DeclusteredArray {
            core,
            workers: Mutex::new(workers),
            scrubber: Mutex::new(None),
            recovery,
            closed: AtomicBool::new(false),
        })
    }

    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// What opening the array did to dirty regions (all zero after a clean shutdown).
    pub fn recovery_report(&self) -> RecoveryReport {
        self.recovery
    }

    /// What a vdisk of `code` would survive in this array's current layout.
    pub fn tolerance(&self, code: Code) -> Tolerance {
        let sizes = enclosure_sizes(&self.core, |p| p.state() == PdiskState::Ok);
        let cap = placement::enclosure_cap(code.total_strips(), &sizes).unwrap_or(usize::MAX);
        placement::tolerance(code.parity_strips(), cap)
    }

    /// Carves a vdisk out of the array. The block size is the vdisk's I/O unit: one block
    /// is one full stripe of `k` data strips (`block_bytes / k` each, a multiple of 4 KiB);
    /// for n-way replication a strip is the whole block.
    pub fn create_vdisk(
        &self,
        name: &str,
        code: Code,
        block_bytes: u64,
        size: VdiskSize,
    ) -> Result<Arc<Vdisk>, VdiskError> {
        let core = &self.core;
        check_name("vdisk", name)?;
        let codec = Codec::new(code)?;
        let n = code.total_strips();
        let strip_bytes = check_block(name, code, block_bytes)?;
        let ok_pdisks = core
            .pdisks
            .read()
            .iter()
            .filter(|p| p.state() == PdiskState::Ok && p.dev.is_some())
            .count();
        if n > ok_pdisks {
            return Err(VdiskError::CodeDoesNotFit {
                da: core.name.clone(),
                code: code.to_string(),
                needed: n,
                have: ok_pdisks,
            });
        }
        let mut vdisks = core.vdisks.write();
        if vdisks.contains_key(name) {
            return Err(VdiskError::VdiskExists {
                da: core.name.clone(),
                vdisk: name.into(),
            });
        }
        if vdisks.len() >= VDISKS_MAX {
            return Err(VdiskError::Limit {
                da: core.name.clone(),
                what: "vdisks",
                max: VDISKS_MAX,
            });
        }
        let shape = Shape {
            n,
            block_bytes,
            strip_bytes,
        };
        let (stripes, slot_sectors, map_pdisk, map_sector) = layout_vdisk(core, name, shape, size)?;
        let id = core.settings.lock().next_vdisk_id;
        let record = VdiskRecord {
            id,
            name: name.to_string(),
            code: code.into(),
            codec_id: codec.id(),
            block_bytes,
            strip_bytes,
            stripes,
            region_stripes: dirty::region_stripes(stripes, block_bytes),
            map_pdisk,
            map_sector,
        };
        let release = |r: &VdiskRecord| {
            let pdisks = core.pdisks.read();
            for (&p, &s) in r.map_pdisk.iter().zip(&r.map_sector) {
                pdisks[usize::from(p)].space.lock().release(s, slot_sectors);
            }
        };
        let mut image = core.image_with(&vdisks);
        image.vdisks.push(record.clone());
        if let Err(e) = core.encode_meta(&image) {
            release(&record);
            return Err(e);
        }
        let vd = Arc::new(VdiskCore::from_record(&record)?);
        core.settings.lock().next_vdisk_id = id + 1;
        core.dirty.add_vdisk(vd.id, vd.regions());
        vdisks.insert(name.to_string(), vd.clone());
        drop(vdisks);
        core.rebalance_stuck.store(false, Ordering::Release);
        if let Err(e) = core.persist_meta() {
            core.vdisks.write().remove(name);
            core.dirty.remove_vdisk(id);
            release(&record);
            return Err(e);
        }
        core.event(format!(
            "vdisk {name} created: {code}, block {block_bytes}, {} bytes",
            vd.capacity_bytes()
        ));
        Ok(Arc::new(Vdisk::new(core, vd)))
    }

    /// A handle to a vdisk.
    pub fn vdisk(&self, name: &str) -> Option<Arc<Vdisk>> {
        let vd = self.core.vdisks.read().get(name).cloned()?;
        Some(Arc::new(Vdisk::new(&self.core, vd)))
    }

    /// Handles to every vdisk, by name.
    pub fn vdisks(&self) -> Vec<Arc<Vdisk>> {
        let list: Vec<Arc<VdiskCore>> = self.core.vdisks.read().values().cloned().collect();
        list.into_iter()
            .map(|vd| Arc::new(Vdisk::new(&self.core, vd)))
            .collect()
    }

    /// Deletes a vdisk and frees its space. Existing handles fail from then on; the caller
    /// makes sure nothing is still writing to it.
    pub fn delete_vdisk(&self, name: &str) -> Result<(), VdiskError> {
        let core = &self.core;
        let vd = core
            .vdisks
            .write()
            .remove(name)
            .ok_or_else(|| VdiskError::NoSuchVdisk {
                da: core.name.clone(),
                vdisk: name.into(),
            })?;
        vd.deleted.store(true, Ordering::Release);
        core.dirty.remove_vdisk(vd.id);
        core.forget_stale_of_vdisk(vd.id);
        // Each stripe's slots are read under its lock: a rebuild or drain moving one of
        // its strips either finished (the new slot is freed here, the old one by the move)
        // or sees `deleted` and moves nothing.
        for s in 0..vd.stripes {
            let _exclusive = core.stripe_lock(vd.id, s).write();
            for i in 0..vd.n {
                core.free_after_persist(vd.loc(s, i), vd.slot_sectors);
            }
        }
        core.persist_meta()?;
        core.event(format!("vdisk {name} deleted"));
        Ok(())
    }

    /// The vdisks that would lose data if pdisk `name` failed now, with the number of
    /// stripes each would lose, counting the pdisks that are already down (dead, missing,
    /// suspended, catching up) and stale strips. Empty when the failure is survivable.
    pub fn loss_if_failed(&self, name: &str) -> Result<Vec<(String, u64)>, VdiskError> {
        let core = &self.core;
        let pd = core.pdisk_by_name(name)?;
        let pdisks = core.pdisks.read().clone();
        let stale = core.stale_list();
        let vdisks: Vec<Arc<VdiskCore>> = core.vdisks.read().values().cloned().collect();
        let mut lost: Vec<(String, u64)> = vdisks
            .iter()
            .map(|vd| {
                (
                    vd.name.clone(),
                    stripes_lost_without(vd, pd.index, &pdisks, &stale),
                )
            })
            .filter(|(_, stripes)| *stripes > 0)
            .collect();
        lost.sort();
        Ok(lost)
    }

    /// Declares a pdisk dead: it is no longer read or written and its strips are rebuilt
    /// into spare space.
    pub fn pdisk_fail(&self, name: &str) -> Result<(), VdiskError> {
        let pd = self.core.pdisk_by_name(name)?;
        if !pd.state().in_service() {
            return Err(state_error(&pd, "fail it"));
        }
        pd.catching_up.store(false, Ordering::Release);
        self.core
            .set_pdisk_state(&pd, PdiskState::Dead, "failed by the administrator");
        self.core.persist_meta()
    }

    /// Takes a pdisk out of service temporarily (maintenance): reads are served degraded
    /// and writes skip it until `pdisk_resume`.
    pub fn pdisk_suspend(&self, name: &str) -> Result<(), VdiskError> {
        let pd = self.core.pdisk_by_name(name)?;
        if !pd.state().readable() {
            return Err(state_error(&pd, "suspend it"));
        }
        self.core
            .set_pdisk_state(&pd, PdiskState::Suspended, "suspended by the administrator");
        self.core.persist_meta()
    }

    /// Returns a suspended pdisk to service: it receives writes at once, and is read again
    /// once every strip that a write skipped has been brought up to date (in the
    /// background; see `status`).
    pub fn pdisk_resume(&self, name: &str) -> Result<(), VdiskError> {
        let pd = self.core.pdisk_by_name(name)?;
        if pd.state() != PdiskState::Suspended || pd.dev.is_none() {
            return Err(state_error(
                &pd,
                "resume it (only a suspended pdisk can be resumed; \
                                         a dead or missing one is replaced)",
            ));
        }
        *pd.unreachable.lock() = None;
        pd.catching_up.store(true, Ordering::Release);
        self.core.event(format!(
            "pdisk {name}: resuming, catching up skipped writes"
        ));
        self.core.kick();
        Ok(())
    }

    /// Empties a healthy pdisk (it stays readable while its strips move), for example
    /// before removing it.
    pub fn pdisk_drain(&self, name: &str) -> Result<(), VdiskError> {
        let pd = self.core.pdisk_by_name(name)?;
        if pd.state() != PdiskState::Ok {
            return Err(state_error(&pd, "drain it"));
        }
        self.core
            .set_pdisk_state(&pd, PdiskState::Draining, "drain requested");
        self.core.persist_meta()
    }

    /// Replaces pdisk `name` by a new device in the same enclosure slot: the old pdisk is
    /// retired (its strips, if any remain, are rebuilt from the others) and strips are
    /// rebalanced onto the new one. The new device must not carry a label of another
    /// array (see [`DeclusteredArray::pdisk_replace_with`]).
    pub fn pdisk_replace(&self, name: &str, device: &Path) -> Result<(), VdiskError> {
        self.pdisk_replace_with(name, device, false)
    }

    /// [`DeclusteredArray::pdisk_replace`], with `force` to overwrite a device that
    /// carries a label of another array or an NSD descriptor.
    pub fn pdisk_replace_with(
        &self,
        name: &str,
        device: &Path,
        force: bool,
    ) -> Result<(), VdiskError> {
        let core = &self.core;
        let old = core.pdisk_by_name(name)?;
        if old.state() == PdiskState::Replaced {
            return Err(state_error(&old, "replace it again"));
        }
        if core.pdisks.read().len() >= PDISKS_MAX {
            return Err(VdiskError::Limit {
                da: core.name.clone(),
                what: "pdisk records (including replaced ones)",
                max: PDISKS_MAX,
            });
        }
        let dev = self.check_replacement(device, force)?;
        let record = PdiskRecord {
            uuid: rand::random(),
            name: old.name.clone(),
            device: device.display().to_string(),
            enclosure: old.enclosure.clone(),
            slot: old.slot,
            device_bytes: dev.size_bytes(),
            state: PdiskState::Ok,
        };
        let config = core.image().da;
        let index = core.pdisks.read().len();
        write_label(
            dev.as_ref(),
            device,
            &label_for(&config, &record, index as u32),
        )?;
        let lay = PdiskLayout::new(record.device_bytes, core.meta_slot_bytes);
        let new = Arc::new(Pdisk::new(index as u16, &record, lay, Some(dev)));
        old.catching_up.store(false, Ordering::Release);
        core.pdisks.write().push(new);
        core.set_pdisk_state(
            &old,
            PdiskState::Replaced,
            &format!("replaced by {}", device.display()),
        );
        core.persist_meta()?;
        core.kick();
        Ok(())
    }

    fn check_replacement(
        &self,
        device: &Path,
        force: bool,
    ) -> Result<Arc<dyn BlockDevice>, VdiskError> {
        let core = &self.core;
        let shown = device.display().to_string();
        let id = device_identity(device);
        for p in core.pdisks.read().iter() {
            if p.dev.is_some()
                && p.state().in_service()
                && device_identity(Path::new(&p.device_path)) == id
                && id.is_some()
            {
                return Err(VdiskError::DuplicateDevice {
                    device: shown,
                    other: format!("pdisk {} of this array", p.name),
                });
            }
        }
        let dev = open_device(&core.opener, device)?;
        if dev.size_bytes() < layout::PDISK_BYTES_MIN {
            return Err(VdiskError::TooSmall {
                device: shown,
                size_bytes: dev.size_bytes(),
                min_bytes: layout::PDISK_BYTES_MIN,
            });
        }
        let s = read_sector0(dev.as_ref(), device)?;
        if let Ok(Some(l)) = Label::decode(&s) {
            if l.da_uuid == core.uuid {
                let pdisks = core.pdisks.read();
                let same = pdisks.iter().find(|p| p.uuid == l.pdisk_uuid);
                if same.is_some_and(|p| p.state().in_service()) {
                    return Err(VdiskError::DuplicateDevice {
                        device: shown,
                        other: format!("pdisk {} of this array", l.pdisk_name),
                    });
                }
                // A retired pdisk of this array being reused: allowed.
                return Ok(dev);
            }
        }
        check_unused(
            dev.as_ref(),
            device,
            force,
            "wipe the start of the drive or use another one (pdisk_replace_with with force \
             overrides this check)",
        )?;
        Ok(dev)
    }

    /// Changes the rebuild share, scrub rate and error limit of an open array.
    pub fn set_options(
        &self,
        rebuild_io_share: u8,
        scrub_rate_mb_s: u32,
        pdisk_error_limit: u32,
    ) -> Result<(), VdiskError> {
        let opts = DaOptions {
            rebuild_io_share,
            scrub_rate_mb_s,
            pdisk_error_limit,
            ..DaOptions::default()
        };
        check_settings(&self.core.name, &opts)?;
        {
            let mut s = self.core.settings.lock();
            s.rebuild_io_share = rebuild_io_share;
            s.scrub_rate_mb_s = scrub_rate_mb_s;
            s.pdisk_error_limit = pdisk_error_limit;
        }
        self.core.persist_meta()
    }

    /// Starts a background scrub pass at the configured rate (no-op if one is running).
    pub fn start_scrub(&self) {
        let mut s = self.scrubber.lock();
        if s.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        *s = Some(worker::spawn_scrub(&self.core));
    }

    /// Runs a complete scrub pass now, unthrottled, and returns what it found.
    pub fn scrub_now(&self) -> Result<ScrubReport, VdiskError> {
        worker::scrub_pass(&self.core, None)
    }

    /// Waits until no rebuild, catch-up, stale repair or rebalance is pending, or the
    /// timeout passes; true when idle.
    pub fn wait_idle(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if worker::pending_work(&self.core).is_none() && !self.core.rebuild.lock().active {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }

    /// What background work is pending ("stale strips", "catch-up", "rebuild",
    /// "rebalance"), if any.
    pub fn pending_work(&self) -> Option<&'static str> {
        worker::pending_work(&self.core)
    }

    /// The array, its pdisks and vdisks, and background work.
    pub fn status(&self) -> DaStatus {
        status(&self.core)
    }

    /// Clean shutdown: stops the workers, flushes every pdisk, clears the dirty-region
    /// bitmap and writes the metadata. Vdisk handles fail afterwards.
    pub fn close(&self) -> Result<(), VdiskError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop_workers();
        let core = &self.core;
        core.closed.store(true, Ordering::Release);
        core.flush_pdisks(usize::MAX)?;
        let ticket = core.dirty.clean_candidates(true);
        core.dirty.clear(&ticket);
        core.persist_dirty(u64::MAX)?;
        core.persist_meta()?;
        core.event("closed cleanly".into());
        Ok(())
    }

    /// Deletes the array: refused while it holds vdisks. Closes it and wipes the label of
    /// every pdisk whose drive answers, so the drives count as unused again and the array
    /// cannot be opened any more. Returns the pdisks whose label could not be wiped.
    pub fn destroy(&self) -> Result<Vec<String>, VdiskError> {
        let core = &self.core;
        let vdisks: Vec<String> = core.vdisks.read().keys().cloned().collect();
        if !vdisks.is_empty() {
            return Err(VdiskError::Invalid(format!(
                "declustered array `{}` still holds vdisks {}; delete them first",
                core.name,
                vdisks.join(", ")
            )));
        }
        // A failed close (a drive that no longer answers) must not keep the array alive:
        // its metadata is about to become unreachable anyway.
        if let Err(e) = self.close() {
            tracing::warn!(da = %core.name, "deleting: close failed: {e}");
        }
        let mut kept = Vec::new();
        for p in core.pdisks.read().iter() {
            if p.state() == PdiskState::Replaced {
                continue;
            }
            if let Err(e) = self.wipe_label(p) {
                kept.push(format!("{} ({}): {e}", p.name, p.device_path));
            }
        }
        Ok(kept)
    }

    /// Zeroes the label of pdisk `p` if its drive still carries it. A pdisk that failed
    /// has no open drive: its path is opened again, and wiped only if the label there is
    /// still this pdisk's (the path may name another drive by now).
    fn wipe_label(&self, p: &Pdisk) -> Result<(), String> {
        let path = Path::new(&p.device_path);
        let dev = match &p.dev {
            Some(dev) => Arc::clone(dev),
            None => open_device(&self.core.opener, path).map_err(|e| e.to_string())?,
        };
        let sector = read_sector0(dev.as_ref(), path).map_err(|e| e.to_string())?;
        match Label::decode(&sector) {
            Ok(Some(l)) if l.da_uuid == self.core.uuid && l.pdisk_uuid == p.uuid => {}
            _ => return Err("the drive no longer carries this pdisk's label".into()),
        }
        let zero = AlignedBuf::zeroed(layout::SECTOR_USIZE);
        dev.write_at(&zero, layout::LABEL_OFFSET)
            .and_then(|()| dev.flush())
            .map_err(|e| e.to_string())
    }

    fn stop_workers(&self) {
        self.core.stop.store(true, Ordering::Release);
        self.core.kick();
        for h in self.workers.lock().drain(..) {
            let _ = h.join();
        }
        if let Some(h) = self.scrubber.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for DeclusteredArray {
    /// Without `close`, only the workers stop: the dirty bitmap stays set, as after a crash.
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            self.stop_workers();
            self.core.closed.store(true, Ordering::Release);
        }
    }
}

fn state_error(pd: &Pdisk, action: &'static str) -> VdiskError {
    VdiskError::PdiskState {
        pdisk: pd.name.clone(),
        state: pd.state().to_string(),
        action,
    }
}

fn check_settings(name: &str, opts: &DaOptions) -> Result<(), VdiskError> {
    if opts.rebuild_io_share > 95 {
        return Err(VdiskError::Invalid(format!(
            "declustered array `{name}`: foreground I/O share {}% (the rebuild I/O share: \
             percent of I/O time kept for foreground I/O while a rebuild runs) leaves the \
             rebuild too little; use 0 to 95",
            opts.rebuild_io_share
        )));
    }
    if opts.scrub_rate_mb_s == 0 || opts.pdisk_error_limit == 0 {
        return Err(VdiskError::Invalid(format!(
            "declustered array `{name}`: scrub rate and pdisk error limit must be positive"
        )));
    }
    Ok(())
}

/// Validates a block size for a code and returns the strip size.
fn check_block(name: &str, code: Code, block_bytes: u64) -> Result<u64, VdiskError> {
    let k = code.data_strips() as u64;
    let unit = k * SECTOR;
    let bad = |reason: String| VdiskError::BadBlockSize {
        vdisk: name.into(),
        block_bytes,
        reason,
    };
    if block_bytes == 0 || !block_bytes.is_multiple_of(unit) {
        return Err(bad(format!(
            "{code} splits a block into {k} strips of whole 4 KiB sectors, so the block size \
             must be a positive multiple of {unit} bytes ({} KiB)",
            unit >> 10
        )));
    }
    let strip = block_bytes / k;
    if strip > STRIP_BYTES_MAX {
        return Err(bad(format!(
            "strips of {strip} bytes exceed the maximum of {STRIP_BYTES_MAX}; use a smaller \
             block size"
        )));
    }
    Ok(strip)
}

/// The geometry of a vdisk being created.
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    block_bytes: u64,
    strip_bytes: u64,
}

/// Chooses the stripes of a new vdisk and allocates their slots: (stripes, sectors per
/// strip slot, stripe map pdisks, stripe map sectors). A percentage that the placement
/// cannot meet exactly (enclosure caps near full pdisks) is reduced step by step.
fn layout_vdisk(
    core: &DaCore,
    name: &str,
    shape: Shape,
    size: VdiskSize,
) -> Result<(u64, u64, Vec<u16>, Vec<u64>), VdiskError> {
    let Shape {
        n,
        block_bytes,
        strip_bytes,
    } = shape;
    let header_bytes = layout::strip_header_bytes(n, (strip_bytes / SECTOR) as usize) as u64;
    let slot_sectors = (header_bytes + strip_bytes) / SECTOR;
    let cands = candidates(core, slot_sectors);
    let room: u64 = cands.iter().map(|c| c.capacity).sum();
    let free_bytes = room / n as u64 * block_bytes;
    let wanted = match size {
        VdiskSize::Bytes(b) => b / block_bytes,
        VdiskSize::Percent(p) => room / n as u64 * u64::from(p.min(100)) / 100,
    };
    let no_space = |what: String, needed_bytes: u64| VdiskError::NoSpace {
        da: core.name.clone(),
        what,
        needed_bytes,
        free_bytes,
    };
    if wanted == 0 {
        return Err(no_space(
            format!("vdisk `{name}` (at least one {block_bytes}-byte block)"),
            block_bytes,
        ));
    }
    let seed: u64 = rand::random();
    let shrink = matches!(size, VdiskSize::Percent(_));
    let mut stripes = wanted;
    let placed = loop {
        match placement::place(&cands, n, stripes, seed) {
            Ok(p) => break p,
            Err(_) if shrink && stripes > 1 && stripes > wanted / 2 => {
                stripes -= (stripes / 50).max(1);
            }
            Err(_) => return Err(no_space(format!("vdisk `{name}`"), wanted * block_bytes)),
        }
    };
    let (map_pdisk, map_sector) = allocate(core, &placed, slot_sectors).ok_or_else(|| {
        no_space(
            format!("vdisk `{name}` (free space is fragmented)"),
            stripes * block_bytes,
        )
    })?;
    Ok((stripes, slot_sectors, map_pdisk, map_sector))
}

fn label_for(config: &DaConfig, record: &PdiskRecord, index: u32) -> Label {
    Label {
        da_uuid: config.uuid,
        da_name: config.name.clone(),
        pdisk_uuid: record.uuid,
        pdisk_index: index,
        pdisk_name: record.name.clone(),
        enclosure: record.enclosure.clone(),
        slot: record.slot,
        device_bytes: record.device_bytes,
        created_unix: now_unix(),
        meta_slot_bytes: config.meta_slot_bytes,
    }
}

type Found = Vec<(PathBuf, Label, Arc<dyn BlockDevice>)>;
/// Devices that opened but did not answer (their enclosure or network is down), with why.
type Unanswered = Vec<(PathBuf, Arc<dyn BlockDevice>, String)>;

/// Opens the devices and reads their labels; every device must be a pdisk of the array
/// named `name_hint` (or of one single array when it is empty).
fn find_labels(
    name_hint: &str,
    devices: &[PathBuf],
    opener: &DeviceOpener,
) -> Result<(Found, Unanswered), VdiskError> {
    let mut found: Found = Vec::new();
    let mut unanswered: Unanswered = Vec::new();
    let mut unopened = Vec::new();
    for path in devices {
        let dev = match opener(path) {
            Ok(d) => d,
            Err(e) => {
                unopened.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let shown = path.display().to_string();
        let sector = match read_sector0(dev.as_ref(), path) {
            Ok(s) => s,
            Err(e) => {
                if let VdiskError::Io { error, .. } = &e {
                    if tessera_drive::is_unreachable(error) {
                        unanswered.push((path.clone(), Arc::clone(&dev), e.to_string()));
                    }
                }
                unopened.push(e.to_string());
                continue;
            }
        };
        match Label::decode(&sector) {
            Ok(Some(l)) => found.push((path.clone(), l, dev)),
            Ok(None) => return Err(VdiskError::NotAPdisk { device: shown }),
            Err(reason) => unopened.push(format!("{shown}: corrupt pdisk label: {reason}")),
        }
    }
    let Some(first) = found.first() else {
        return Err(VdiskError::NoMetadata {
            da: name_hint.to_string(),
            devices: if unopened.is_empty() {
                "no devices given".into()
            } else {
                unopened.join("; ")
            },
        });
    };
    let target = if name_hint.is_empty() {
        (first.1.da_uuid, first.1.da_name.clone())
    } else {
        let Some(m) = found.iter().find(|(_, l, _)| l.da_name == name_hint) else {
            return Err(VdiskError::ForeignPdisk {
                device: first.0.display().to_string(),
                other_da: first.1.da_name.clone(),
                other_uuid: uuid_hex(&first.1.da_uuid),
                da: name_hint.into(),
            });
        };
        (m.1.da_uuid, m.1.da_name.clone())
    };
    for (path, l, _) in &found {
        if l.da_uuid != target.0 {
            return Err(VdiskError::ForeignPdisk {
                device: path.display().to_string(),
                other_da: l.da_name.clone(),
                other_uuid: uuid_hex(&l.da_uuid),
                da: target.1.clone(),
            });
        }
    }
    let mut seen: HashMap<[u8; 16], &PathBuf> = HashMap::new();
    for (path, l, _) in &found {
        if let Some(other) = seen.insert(l.pdisk_uuid, path) {
            return Err(VdiskError::DuplicateDevice {
                device: path.display().to_string(),
                other: other.display().to_string(),
            });
        }
    }
    for u in unopened {
        tracing::warn!("opening declustered array {}: {u}", target.1);
    }
    Ok((found, unanswered))
}

/// Builds the runtime state from the newest metadata and the devices found; returns it
/// with the union of the dirty bitmaps.
fn build_core(
    image: MetaImage,
    generation: u64,
    found: Found,
    unanswered: Unanswered,
    opener: DeviceOpener,
) -> Result<(DaCore, dirty::Bits), VdiskError> {
    let config = image.da.clone();
    let mut by_uuid: HashMap<[u8; 16], (PathBuf, Arc<dyn BlockDevice>)> = found
        .into_iter()
        .map(|(p, l, d)| (l.pdisk_uuid, (p, d)))
        .collect();
    let mut pdisks = Vec::new();
    let mut notes = Vec::new();
    for (i, rec) in image.pdisks.iter().enumerate() {
        let mut rec = rec.clone();
        let lay = PdiskLayout::new(rec.device_bytes, config.meta_slot_bytes);
        let silent = unanswered
            .iter()
            .find(|(path, _, _)| path.display().to_string() == rec.device);
        let mut unreachable = false;
        let dev = match (by_uuid.remove(&rec.uuid), rec.state.in_service()) {
            (Some((path, dev)), true) => {
                rec.device = path.display().to_string();
                Some(dev)
            }
            (Some((path, _)), false) => {
                if rec.state == PdiskState::Missing {
                    notes.push(format!(
                        "pdisk {}: device {} found again, but its strips were rebuilt \
                         elsewhere; `pdisk replace {} {}` reuses the drive",
                        rec.name,
                        path.display(),
                        rec.name,
                        path.display()
                    ));
                }
                None
            }
            (None, true) if silent.is_some() => {
                // Its drive is there but does not answer now (an enclosure or its network
                // is down, as when an array fails over to another server at the same
                // time): suspended as unreachable like a drive lost while open, probed,
                // and caught up when it answers with this pdisk's label; not rebuilt.
                let (_, dev, why) = silent.expect("matched");
                notes.push(format!(
                    "pdisk {}: its device does not answer ({why}); written around, probed \
                     every {} s, resumed when it answers",
                    rec.name,
                    crate::worker::PROBE_INTERVAL.as_secs()
                ));
                rec.state = PdiskState::Suspended;
                unreachable = true;
                Some(Arc::clone(dev))
            }
            (None, true) => {
                notes.push(format!(
                    "pdisk {}: device not found (last seen at {}); marked missing, its \
                     strips are rebuilt into spare space",
                    rec.name, rec.device
                ));
                rec.state = PdiskState::Missing;
                None
            }
            (None, false) => None,
        };
        let pd = Pdisk::new(i as u16, &rec, lay, dev);
        if unreachable {
            let now = std::time::Instant::now();
            *pd.unreachable.lock() = Some(crate::pdisk::Unreachable {
                since: now,
                last_probe: now,
                failed_probes: 0,
            });
        }
        pdisks.push(Arc::new(pd));
    }
    for (path, _) in by_uuid.values() {
        notes.push(format!(
            "device {} carries a pdisk label of this array that its metadata does not list \
             (a later generation was not found?); ignored",
            path.display()
        ));
    }
    let mut vdisks = Vec::new();
    for r in &image.vdisks {
        let vd = VdiskCore::from_record(r)?;
        for s in 0..vd.stripes {
            for i in 0..vd.n {
                let loc = vd.loc(s, i);
                let pd = &pdisks[usize::from(loc.pdisk)];
                if !pd.space.lock().take(loc.sector, vd.slot_sectors) {
                    return Err(VdiskError::Invalid(format!(
                        "declustered array `{}`: metadata is inconsistent: vdisk {} stripe \
                         {s} strip {i} overlaps another strip on pdisk {} (sector {})",
                        config.name, vd.name, pd.name, loc.sector
                    )));
                }
            }
        }
        vdisks.push(Arc::new(vd));
    }
    let (dirty_generation, bits) = read_dirty(&pdisks, config.uuid);
    let core = DaCore::new(CoreInit {
        config,
        pdisks,
        vdisks,
        stale: image.stale,
        write_epoch: image.write_epoch + 1,
        meta_generation: generation,
        dirty_generation,
        opener,
    });
    for n in notes {
        core.event(n);
    }
    Ok((core, bits))
}

/// The newest dirty bitmap found on any pdisk, with its generation.
fn read_dirty(pdisks: &[Arc<Pdisk>], uuid: [u8; 16]) -> (u64, dirty::Bits) {
    let mut copies = Vec::new();
    for p in pdisks.iter().filter(|p| p.dev.is_some()) {
        let dev = p.dev.as_ref().expect("checked");
        for slot in 0..2 {
            let at = p.layout.dirty_slot(slot);
            let Some((g, u, payload)) = meta::read_slot(
                dev.as_ref(),
                layout::DIRTY_MAGIC,
                at,
                layout::DIRTY_SLOT_BYTES,
            ) else {
                continue;
            };
            if u == uuid {
                if let Some(bits) = dirty::decode(&payload) {
                    copies.push((g, bits));
                }
            }
        }
    }
    let newest = copies.iter().map(|(g, _)| *g).max().unwrap_or(0);
    let bits = copies
        .into_iter()
        .find(|(g, _)| *g == newest)
        .map(|(_, b)| b)
        .unwrap_or_default();
    (newest, bits)
}

/// Resynchronises every stripe of every dirty region, then writes a clean bitmap.
fn resync_dirty(core: &DaCore, bits: &[(u32, u32, Vec<u8>)]) -> Result<RecoveryReport, VdiskError> {
    let mut report = RecoveryReport::default();
    let vdisks: Vec<Arc<VdiskCore>> = core.vdisks.read().values().cloned().collect();
    for vd in &vdisks {
        let mut regions = dirty::regions_of(bits, vd.id);
        regions.sort_unstable();
        regions.dedup();
        for r in regions.into_iter().filter(|&r| r < vd.regions()) {
            report.dirty_regions += 1;
            let first = r * vd.region_stripes;
            for s in first..(first + vd.region_stripes).min(vd.stripes) {
                core.resync_stripe(vd, s, &mut report)?;
            }
        }
    }
    if report.dirty_regions > 0 {
        core.event(format!(
            "unclean shutdown: {} dirty regions, {} stripes checked, {} resynchronised, {} \
             torn sectors accepted, {} strips lost, {} rolled-back strips of unwritten \
             stripes zeroed",
            report.dirty_regions,
            report.stripes_checked,
            report.stripes_resynced,
            report.torn_sectors,
            report.lost_strips,
            report.rolled_back_strips
        ));
    }
    core.flush_pdisks(usize::MAX)?;
    core.persist_dirty(u64::MAX)?;
    Ok(report)
}

/// Enclosure sizes (pdisk counts) of the pdisks selected by `keep`.
fn enclosure_sizes(core: &DaCore, keep: impl Fn(&Pdisk) -> bool) -> Vec<usize> {
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for p in core.pdisks.read().iter().filter(|p| keep(p)) {
        *sizes.entry(p.enclosure.clone()).or_default() += 1;
    }
    sizes.into_values().collect()
}

/// Dense enclosure numbers of every pdisk.
pub fn enclosure_ids(pdisks: &[Arc<Pdisk>]) -> Vec<u32> {
    let mut ids: BTreeMap<&str, u32> = BTreeMap::new();
    for p in pdisks {
        let next = ids.len() as u32;
        ids.entry(p.enclosure.as_str()).or_insert(next);
    }
    pdisks.iter().map(|p| ids[p.enclosure.as_str()]).collect()
}

/// Sectors of pdisk `p` kept free as spare. Every pdisk that left service without a
/// replacement (dead, missing) has its strips rebuilt into the reserve, so it uses up one
/// pdisk's worth of it: the reserve left shrinks, and the space new vdisks may use stays
/// what it was. A replacement drive brings the reserve back.
pub fn spare_sectors(core: &DaCore, p: &Pdisk) -> u64 {
    let pdisks = core.pdisks.read();
    let in_service = pdisks
        .iter()
        .filter(|p| p.state().in_service())
        .count()
        .max(1) as u64;
    let consumed = pdisks
        .iter()
        .filter(|p| matches!(p.state(), PdiskState::Dead | PdiskState::Missing))
        .count() as u64;
    drop(pdisks);
    let spare = u64::from(core.settings.lock().spare_pdisks)
        .saturating_sub(consumed)
        .min(in_service);
    p.layout.data_sectors() * spare / in_service
}

/// Placement candidates for new vdisks: Ok pdisks, with capacity outside the spare reserve.
fn candidates(core: &DaCore, slot_sectors: u64) -> Vec<Candidate> {
    let pdisks = core.pdisks.read().clone();
    let enc = enclosure_ids(&pdisks);
    pdisks
        .iter()
        .zip(enc)
        .filter(|(p, _)| p.state() == PdiskState::Ok && p.dev.is_some())
        .map(|(p, e)| {
            let spare = spare_sectors(core, p);
            let space = p.space.lock();
            let limit = space.total_sectors().saturating_sub(spare);
            let room = limit.saturating_sub(space.used_sectors()) / slot_sectors;
            Candidate {
                pdisk: p.index,
                enclosure: e,
                capacity: room.min(space.slots_free(slot_sectors)),
                load: space.used_sectors() / slot_sectors,
            }
        })
        .collect()
}

/// Allocates slots for a placement; `None` (and nothing allocated) if any pdisk runs out.
fn allocate(core: &DaCore, placed: &[u16], slot_sectors: u64) -> Option<(Vec<u16>, Vec<u64>)> {
    let pdisks = core.pdisks.read();
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for &p in placed {
        *counts.entry(p).or_default() += 1;
    }
    let mut slots: HashMap<u16, std::vec::IntoIter<u64>> = HashMap::new();
    let mut taken: Vec<(u16, u64)> = Vec::new();
    for (&p, &count) in &counts {
        let mut space = pdisks[usize::from(p)].space.lock();
        let mut mine = Vec::with_capacity(count);
        for _ in 0..count {
            match space.alloc(slot_sectors) {
                Some(s) => mine.push(s),
                None => break,
            }
        }
        let short = mine.len() < count;
        taken.extend(mine.iter().map(|&s| (p, s)));
        slots.insert(p, mine.into_iter());
        if short {
            drop(space);
            for (p, s) in taken {
                pdisks[usize::from(p)].space.lock().release(s, slot_sectors);
            }
            return None;
        }
    }
    let sectors = placed
        .iter()
        .map(|p| slots.get_mut(p).and_then(Iterator::next).expect("counted"))
        .collect();
    Some((placed.to_vec(), sectors))
}

/// One row per pdisk, with the totals of the pdisks in service: (rows, capacity, free
/// outside the spare reserve, spare), in bytes.
fn pdisk_rows(
    core: &DaCore,
    pdisks: &[Arc<Pdisk>],
    strips: &[u64],
) -> (Vec<PdiskStatus>, u64, u64, u64) {
    let (mut capacity, mut free, mut spare_total) = (0u64, 0u64, 0u64);
    let rows = pdisks
        .iter()
        .map(|p| {
            let space = p.space.lock();
            let (total, free_sectors) = (space.total_sectors(), space.free_sectors());
            drop(space);
            if p.state().in_service() {
                let spare = spare_sectors(core, p);
                capacity += total * SECTOR;
                spare_total += spare * SECTOR;
                free += free_sectors.saturating_sub(spare) * SECTOR;
            }
            PdiskStatus {
                name: p.name.clone(),
                device: p.device_path.clone(),
                enclosure: p.enclosure.clone(),
                slot: p.slot,
                state: p.state(),
                catching_up: p.catching_up.load(Ordering::Acquire),
                capacity_bytes: total * SECTOR,
                free_bytes: free_sectors * SECTOR,
                strips: strips[usize::from(p.index)],
                read_errors: p.read_errors.load(Ordering::Relaxed),
                write_errors: p.write_errors.load(Ordering::Relaxed),
                checksum_errors: p.checksum_errors.load(Ordering::Relaxed),
                io: tessera_drive::stats::IoKind::ALL
                    .iter()
                    .map(|&k| p.io.snapshot(k))
                    .collect(),
            }
        })
        .collect();
    (rows, capacity, free, spare_total)
}

/// Whether strip `i` of stripe `s` cannot be read now: its pdisk is not readable or the
/// strip waits to be rewritten after a failed write.
fn strip_unavailable(
    vd: &VdiskCore,
    s: u64,
    i: usize,
    pdisks: &[Arc<Pdisk>],
    stale: &[crate::meta::StaleStrip],
) -> bool {
    let is_stale = !stale.is_empty()
        && stale
            .binary_search_by_key(&(vd.id, s, i as u16), |x| (x.vdisk_id, x.stripe, x.strip))
            .is_ok();
    is_stale || !pdisks[usize::from(vd.loc(s, i).pdisk)].readable()
}

/// Stripes of `vd` that are readable now and would not be if pdisk `index` stopped being
/// read: they already miss as many strips as the code tolerates and hold one on it.
fn stripes_lost_without(
    vd: &VdiskCore,
    index: u16,
    pdisks: &[Arc<Pdisk>],
    stale: &[crate::meta::StaleStrip],
) -> u64 {
    let mut lost = 0;
    for s in 0..vd.stripes {
        let (mut down, mut on_it) = (0, 0);
        for i in 0..vd.n {
            if strip_unavailable(vd, s, i, pdisks, stale) {
                down += 1;
            } else if vd.loc(s, i).pdisk == index {
                on_it += 1;
            }
        }
        lost += u64::from(down <= vd.m && down + on_it > vd.m);
    }
    lost
}

/// A vdisk's stripes with unavailable strips, with more than the code tolerates, and its
/// actual enclosure spread (the most strips of one stripe in one enclosure).
fn stripe_health(
    vd: &VdiskCore,
    pdisks: &[Arc<Pdisk>],
    enc: &[u32],
    stale: &[crate::meta::StaleStrip],
) -> (u64, u64, usize) {
    let (mut degraded, mut critical, mut worst_enclosure) = (0, 0, 1usize);
    let mut per_enc: HashMap<u32, usize> = HashMap::new();
    for s in 0..vd.stripes {
        per_enc.clear();
        let mut down = 0;
        for i in 0..vd.n {
            let loc = vd.loc(s, i);
            if strip_unavailable(vd, s, i, pdisks, stale) {
                down += 1;
            }
            *per_enc.entry(enc[usize::from(loc.pdisk)]).or_default() += 1;
        }
        worst_enclosure = worst_enclosure.max(per_enc.values().copied().max().unwrap_or(1));
        degraded += u64::from(down > 0);
        critical += u64::from(down > vd.m);
    }
    (degraded, critical, worst_enclosure)
}

/// A vdisk's row, from its stripe health.
fn vdisk_row(vd: &VdiskCore, health: (u64, u64, usize)) -> VdiskStatus {
    let (degraded, critical, worst_enclosure) = health;
    VdiskStatus {
        name: vd.name.clone(),
        code: vd.code.to_string(),
        block_bytes: vd.block_bytes,
        strip_bytes: vd.strip_bytes as u64,
        capacity_bytes: vd.capacity_bytes(),
        tolerance: placement::tolerance(vd.m, worst_enclosure),
        degraded_stripes: degraded,
        critical_stripes: critical,
        stats: crate::vdisk::stats_of(vd),
    }
}

/// What a status walk over every strip of every vdisk depends on: the strip maps, which
/// pdisks can be read (and which they are), and the stale strips.
#[derive(Clone, PartialEq, Eq)]
struct WalkKey {
    vdisks: Vec<(u32, u64)>,
    pdisks: Vec<(usize, bool, u32)>,
    stale: Vec<crate::meta::StaleStrip>,
}

/// The last walk: strips per pdisk, and each vdisk's degraded and critical stripes and
/// enclosure spread. The walk is O(strips) (tens of millions on a large array) and the
/// health monitor and every metrics scrape ask for the status: they reuse it until a strip
/// moves, a pdisk changes state or a write fails.
pub(crate) struct StatusWalk {
    key: WalkKey,
    strips: Vec<u64>,
    vdisks: Vec<(u64, u64, usize)>,
}

fn walk_key(
    vdisks: &[Arc<VdiskCore>],
    pdisks: &[Arc<Pdisk>],
    enc: &[u32],
    stale: &[crate::meta::StaleStrip],
) -> WalkKey {
    WalkKey {
        vdisks: vdisks.iter().map(|v| (v.id, v.map_changes())).collect(),
        pdisks: pdisks
            .iter()
            .zip(enc)
            .map(|(p, &e)| (Arc::as_ptr(p) as usize, p.readable(), e))
            .collect(),
        stale: stale.to_vec(),
    }
}

fn status_walk(
    vdisks: &[Arc<VdiskCore>],
    pdisks: &[Arc<Pdisk>],
    enc: &[u32],
    stale: &[crate::meta::StaleStrip],
    key: WalkKey,
) -> StatusWalk {
    let mut strips = vec![0u64; pdisks.len()];
    for vd in vdisks {
        for s in 0..vd.stripes {
            for i in 0..vd.n {
                strips[usize::from(vd.loc(s, i).pdisk)] += 1;
            }
        }
    }
    let vdisks = vdisks
        .iter()
        .map(|vd| stripe_health(vd, pdisks, enc, stale))
        .collect();
    StatusWalk {
        key,
        strips,
        vdisks,
    }
}

fn status(core: &DaCore) -> DaStatus {
    let pdisks = core.pdisks.read().clone();
    let vdisks: Vec<Arc<VdiskCore>> = core.vdisks.read().values().cloned().collect();
    let enc = enclosure_ids(&pdisks);
    let stale = core.stale_list();
    // The key is taken before the walk: a strip that moves during it changes the key, so
    // the next status walks again.
    let key = walk_key(&vdisks, &pdisks, &enc, &stale);
    let mut cached = core.status_walk.lock();
    if cached.as_ref().is_none_or(|w| w.key != key) {
        *cached = Some(status_walk(&vdisks, &pdisks, &enc, &stale, key));
    }
    let walk = cached.as_ref().expect("walked above");
    let (rows, capacity, free, spare_total) = pdisk_rows(core, &pdisks, &walk.strips);
    let vrows: Vec<VdiskStatus> = vdisks
        .iter()
        .zip(&walk.vdisks)
        .map(|(vd, &health)| vdisk_row(vd, health))
        .collect();
    drop(cached);
    let state = if vrows.iter().any(|v| v.critical_stripes > 0) {
        DaState::DataLoss
    } else if vrows.iter().any(|v| v.degraded_stripes > 0) {
        DaState::Degraded
    } else {
        DaState::Ok
    };
    let settings = core.settings.lock().clone();
    DaStatus {
        name: core.name.clone(),
        uuid: uuid_hex(&core.uuid),
        state,
        capacity_bytes: capacity,
        free_bytes: free,
        spare_bytes: spare_total,
        spare_pdisks: settings.spare_pdisks,
        rebuild_io_share: settings.rebuild_io_share,
        scrub_rate_mb_s: settings.scrub_rate_mb_s,
        pdisk_error_limit: settings.pdisk_error_limit,
        pdisks: rows,
        vdisks: vrows,
        stale_strips: stale.len(),
        dirty_regions: core.dirty.dirty_regions(),
        rebuild: core.rebuild.lock().snapshot(),
        scrub: core.scrub.lock().snapshot(),
        events: core.events(),
    }
}
