//! `fs create`, `fs ls`, `fs delete` and `disk ls` [mmcrfs, mmlsfs, mmdelfs, mmlsdisk].

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use tessera_nsd::{check_name, parse_pool_stanzas, parse_stanzas, DiskUsage, NAME_RULE};

use super::nsd::{absolute, read_stanza_file};
use super::units::{parse_block_size, parse_inode_limit, parse_inode_size, parse_size};
use super::{call, unexpected, yes_no};
use crate::cli::{
    DiskAction, DiskAddArgs, DiskChangeArgs, DiskDeleteArgs, FsCreateArgs, RestripeArgs,
};
use crate::config::Home;
use crate::output::{local_time, yes_no as yn, Table, YRecord};
use crate::rpc::{FsCreateSpec, FsDiskSpec, FsShow, Reply, Request, RestripeDone};

/// Highest replica count `-M`/`-R` accept, as in GPFS.
const REPLICAS_MAX: u32 = 3;
const SHARDS_MAX: u32 = 1024;

/// The NSDs named by a `%nsd` stanza file; only `nsd=` is required, and `usage=`,
/// `failureGroup=` and `pool=` override what the NSD was created with.
fn disks_from_stanzas(file: &Path, text: &str) -> Result<Vec<FsDiskSpec>> {
    let at = |line: usize, msg: String| anyhow!("{}: line {line}: {msg}", file.display());
    if !text.lines().any(|l| l.trim_start().starts_with('%')) {
        return disks_from_descriptors(file, text);
    }
    let stanzas = parse_stanzas(text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    let mut disks = Vec::new();
    for s in stanzas.iter().filter(|s| s.kind == "nsd") {
        let Some(nsd) = s.get("nsd") else {
            return Err(at(
                s.line,
                "%nsd stanza without nsd=; fs create takes existing NSDs by name (run \
                 `tessera nsd create -F FILE` first, which fills the names in)"
                    .into(),
            ));
        };
        let usage = match s.get("usage") {
            Some(a) => Some(
                a.value
                    .parse::<DiskUsage>()
                    .map_err(|e| at(a.line, e.to_string()))?,
            ),
            None => None,
        };
        let failure_group = match s.get("failureGroup") {
            Some(a) => Some(a.value.parse::<i32>().map_err(|_| {
                at(
                    a.line,
                    format!("failureGroup={}: not a number; use -1 to 4000", a.value),
                )
            })?),
            None => None,
        };
        let pool = s.get("pool").map(|a| a.value.clone());
        disks.push(FsDiskSpec {
            nsd: nsd.value.clone(),
            usage,
            failure_group,
            pool,
        });
    }
    if disks.is_empty() {
        bail!(
            "{}: no %nsd stanzas found; list the NSDs of the file system",
            file.display()
        );
    }
    Ok(disks)
}

/// The old colon form that mmcrnsd wrote (`name:::dataAndMetadata:4005::pool`).
fn disks_from_descriptors(file: &Path, text: &str) -> Result<Vec<FsDiskSpec>> {
    let mut disks = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(':').collect();
        let field = |n: usize| f.get(n).copied().filter(|v| !v.is_empty());
        let bad = |what: &str| anyhow!("{}: line {}: {what}", file.display(), i + 1);
        let nsd = field(0).ok_or_else(|| bad("empty NSD name"))?.to_string();
        let usage = match field(3) {
            Some(u) => Some(u.parse::<DiskUsage>().map_err(|e| bad(&e.to_string()))?),
            None => None,
        };
        let failure_group = match field(4) {
            Some(g) => Some(
                g.parse::<i32>()
                    .map_err(|_| bad("failure group is not a number"))?,
            ),
            None => None,
        };
        let pool = field(6).map(str::to_string);
        disks.push(FsDiskSpec {
            nsd,
            usage,
            failure_group,
            pool,
        });
    }
    if disks.is_empty() {
        bail!(
            "{}: no disks listed; use %nsd stanzas naming the NSDs",
            file.display()
        );
    }
    Ok(disks)
}

fn one_of<'a>(option: &str, value: &str, accepted: &[&'a str]) -> Result<&'a str> {
    let lower = value.to_ascii_lowercase();
    accepted
        .iter()
        .find(|a| **a == lower)
        .copied()
        .ok_or_else(|| anyhow!("{option} {value}: use one of {}", accepted.join(", ")))
}

fn check_replicas(a: &FsCreateArgs, problems: &mut Vec<String>) {
    for (opt, max) in [("-M", a.max_metadata_replicas), ("-R", a.max_data_replicas)] {
        if !(1..=REPLICAS_MAX).contains(&max) {
            problems.push(format!(
                "{opt} {max}: the maximum number of replicas must be 1, 2 or 3"
            ));
        }
    }
    for (opt, n, max) in [
        ("-m", a.metadata_replicas, a.max_metadata_replicas),
        ("-r", a.data_replicas, a.max_data_replicas),
    ] {
        if n == 0 {
            problems.push(format!(
                "{opt} 0: at least one replica is needed; use {opt} 1"
            ));
        } else if n > 2 && opt == "-m" {
            problems.push(format!(
                "-m {n}: at most two metadata copies are supported; use -m 2"
            ));
        } else if n > max {
            problems.push(format!(
                "{opt} {n} is above the maximum set with {}",
                opt.to_uppercase()
            ));
        }
    }
}

/// The value of `result`, or `None` with its error added to `problems`: every bad option
/// is reported at once.
fn keep<T>(problems: &mut Vec<String>, result: Result<T>) -> Option<T> {
    result.map_err(|e| problems.push(format!("{e:#}"))).ok()
}

/// `%pool` stanzas: checked like every stanza, and refused where they ask for what is not
/// implemented (pools with their own block size or layout, write affinity).
fn check_pools(
    file: &Path,
    text: &str,
    block_size: Option<u32>,
    placement: Option<&str>,
) -> Result<()> {
    let at = |line: usize, msg: String| anyhow!("{}: line {line}: {msg}", file.display());
    for pool in parse_pool_stanzas(text).map_err(|e| anyhow!("{}: {e}", file.display()))? {
        if let (Some(text), Some(bytes)) = (&pool.block_size, pool.block_size_bytes()) {
            if block_size.is_some_and(|b| u64::from(b) != bytes) {
                return Err(at(
                    pool.line,
                    format!(
                        "pool={}: blockSize={text}: a pool block size other than the file \
                         system's (-B) is not implemented yet; remove blockSize= or make it \
                         equal to -B",
                        pool.pool
                    ),
                ));
            }
        }
        if let Some(map) = pool.layout_map {
            if placement.is_some_and(|p| p != map.as_str()) {
                return Err(at(
                    pool.line,
                    format!(
                        "pool={}: layoutMap={}: a pool layout other than the file system's \
                         (-j) is not implemented yet; remove layoutMap= or make it equal to -j",
                        pool.pool,
                        map.as_str()
                    ),
                ));
            }
        }
        let unimplemented = [
            ("usage", pool.usage.is_some()),
            ("allowWriteAffinity", pool.allow_write_affinity.is_some()),
            ("writeAffinityDepth", pool.write_affinity_depth.is_some()),
            ("blockGroupFactor", pool.block_group_factor.is_some()),
        ];
        if let Some((key, _)) = unimplemented.iter().find(|(_, given)| *given) {
            return Err(at(
                pool.line,
                format!(
                    "pool={}: {key}= is not implemented yet; remove it from the %pool stanza",
                    pool.pool
                ),
            ));
        }
    }
    Ok(())
}

/// DEVICE, or MOUNTPOINT DEVICE in the old mmcrfs form.
fn device_and_mount_point(a: &FsCreateArgs) -> Result<(String, Option<String>)> {
    let (device, old_mount) = match a.positional.as_slice() {
        [device] => (device.clone(), None),
        [mount, device] if mount.starts_with('/') => (device.clone(), Some(mount.clone())),
        [first, _] => bail!(
            "{first}: two names given but the first is not a mount point; write \
             `tessera fs create DEVICE -F FILE` or `tessera fs create /MOUNTPOINT DEVICE -F FILE`"
        ),
        _ => bail!("give the file system name: `tessera fs create DEVICE -F FILE`"),
    };
    let device = device.strip_prefix("/dev/").unwrap_or(&device).to_string();
    check_name(&device)
        .map_err(|p| anyhow!("{device}: invalid file system name: {p}; {NAME_RULE}"))?;
    if device == "all" || device == "ls" {
        bail!(
            "{device}: reserved, not a file system name (`tessera mount ls all` lists every \
             file system); choose another name"
        );
    }
    if old_mount.is_some() && a.mount_point.is_some() {
        bail!("the mount point is given twice (positional and -T); keep one");
    }
    let mount = match (&a.mount_point, old_mount) {
        (Some(t), _) => Some(absolute(t)?.display().to_string()),
        (None, m) => m,
    };
    Ok((device, mount))
}

pub fn create(home: &Home, a: &FsCreateArgs) -> Result<()> {
    let spec = create_spec(a)?;
    call(home, &Request::FsCreate(Box::new(spec)))?;
    Ok(())
}

/// Checks every option and the stanza file, and reports every problem at once.
fn create_spec(a: &FsCreateArgs) -> Result<FsCreateSpec> {
    let mut p = Vec::new();
    let names = keep(&mut p, device_and_mount_point(a));
    let block_size = keep(&mut p, parse_block_size(&a.block_size));
    let inode_size = keep(&mut p, parse_inode_size(&a.inode_size));
    let placement = keep(&mut p, one_of("-j", &a.placement, &["scatter", "cluster"]));
    check_replicas(a, &mut p);
    if a.nodes == 0 {
        p.push("-n 0: estimate at least 1 node".into());
    }
    if !(1..=SHARDS_MAX).contains(&a.shards) {
        p.push(format!("--shards {}: use 1 to {SHARDS_MAX}", a.shards));
    }
    let log_min = u64::from(block_size.unwrap_or(1 << 20)).min(1 << 20);
    // `Some(None)`: not given, sized by the daemon from the metadata disks.
    let log_bytes = match &a.log_size {
        None => Some(None),
        Some(text) => match parse_size(text).filter(|b| *b >= log_min) {
            Some(bytes) => Some(Some(bytes)),
            None => {
                p.push(format!(
                    "-L {text}: use a size of at least 1M, such as 16M or 64M"
                ));
                None
            }
        },
    };
    let inode_limit = match &a.inode_limit {
        Some(text) => keep(&mut p, parse_inode_limit(text)).map(|(max, pre)| (Some(max), pre)),
        None => Some((None, 0)),
    };
    let automount = keep(&mut p, yes_no("-A", &a.automount));
    let suppress_atime = keep(
        &mut p,
        one_of("-S", &a.suppress_atime, &["no", "yes", "relatime"]),
    );
    let exact_mtime = keep(&mut p, yes_no("-E", &a.exact_mtime));
    let strict_replicas = keep(
        &mut p,
        one_of("-K", &a.strict_replicas, &["no", "whenpossible", "always"]),
    );
    let verify = keep(&mut p, yes_no("-v", &a.verify));
    let disks = keep(&mut p, read_stanza_file(&a.stanza_file)).and_then(|text| {
        keep(
            &mut p,
            check_pools(&a.stanza_file, &text, block_size, placement),
        )?;
        keep(&mut p, disks_from_stanzas(&a.stanza_file, &text))
    });
    match p.len() {
        0 => {}
        1 => bail!("{}", p[0]),
        n => bail!("{n} problems:\n  {}", p.join("\n  ")),
    }
    let (
        Some((name, mount_point)),
        Some(block_size),
        Some(inode_size),
        Some(placement),
        Some(log_bytes),
        Some((max_inodes, prealloc_inodes)),
        Some(automount),
        Some(suppress_atime),
        Some(exact_mtime),
        Some(strict_replicas),
        Some(verify),
        Some(disks),
    ) = (
        names,
        block_size,
        inode_size,
        placement,
        log_bytes,
        inode_limit,
        automount,
        suppress_atime,
        exact_mtime,
        strict_replicas,
        verify,
        disks,
    )
    else {
        unreachable!("every None added a problem");
    };
    Ok(FsCreateSpec {
        mount_point: mount_point.unwrap_or_else(|| format!("/gpfs/{name}")),
        name,
        disks,
        block_size,
        inode_size,
        cluster_placement: placement == "cluster",
        estimated_nodes: a.nodes,
        automount,
        suppress_atime: suppress_atime.into(),
        exact_mtime,
        strict_replicas: strict_replicas.into(),
        log_bytes,
        max_inodes,
        prealloc_inodes,
        max_metadata_replicas: a.max_metadata_replicas,
        max_data_replicas: a.max_data_replicas,
        data_replicas: a.data_replicas,
        metadata_replicas: a.metadata_replicas,
        verify,
        shard_count: a.shards,
    })
}

pub fn show(home: &Home, name: &str) -> Result<FsShow> {
    match call(
        home,
        &Request::FsShow {
            name: name.to_string(),
        },
    )? {
        Reply::Fs(show) => Ok(*show),
        other => Err(unexpected(other)),
    }
}

/// The rows of `fs ls`: flag, -Y field name, value, description.
fn fs_rows(s: &FsShow) -> Vec<(&'static str, &'static str, String, String)> {
    let d = &s.descriptor;
    let disks: Vec<&str> = d.disks.iter().map(|x| x.nsd_name.as_str()).collect();
    let placement = format!("{:?}", d.placement).to_lowercase();
    vec![
        (
            "-f",
            "minFragmentSize",
            d.sub_block_size.to_string(),
            "Minimum fragment (subblock) size in bytes".into(),
        ),
        (
            "-i",
            "inodeSize",
            d.inode_size.to_string(),
            "Inode size in bytes".into(),
        ),
        (
            "-m",
            "defaultMetadataReplicas",
            d.metadata_replicas().to_string(),
            "Default number of metadata replicas".into(),
        ),
        (
            "-M",
            "maxMetadataReplicas",
            d.max_metadata_replicas.to_string(),
            "Maximum number of metadata replicas".into(),
        ),
        (
            "-r",
            "defaultDataReplicas",
            d.replication().data.to_string(),
            "Default number of data replicas".into(),
        ),
        (
            "-R",
            "maxDataReplicas",
            d.max_data_replicas.to_string(),
            "Maximum number of data replicas".into(),
        ),
        (
            "-j",
            "blockAllocationType",
            placement,
            "Block allocation type".into(),
        ),
        (
            "-n",
            "numNodes",
            d.estimated_nodes.to_string(),
            "Estimated number of nodes that will mount file system".into(),
        ),
        (
            "-B",
            "blockSize",
            d.block_size.to_string(),
            "Block size".into(),
        ),
        (
            "-L",
            "logfileSize",
            d.log.region.bytes.to_string(),
            "Logfile size".into(),
        ),
        (
            "-E",
            "exactMtime",
            yn(d.exact_mtime).into(),
            "Exact mtime mount option".into(),
        ),
        (
            "-S",
            "suppressAtime",
            d.atime.as_flag().into(),
            "Suppress atime mount option".into(),
        ),
        (
            "-K",
            "strictReplication",
            d.replication().strict.as_str().into(),
            "Strict replica allocation option".into(),
        ),
        (
            "--create-time",
            "creationTime",
            local_time(d.created_unix, false),
            "File system creation time".into(),
        ),
        (
            "--inode-limit",
            "inodeLimit",
            d.max_inodes.to_string(),
            format!(
                "Maximum number of inodes ({} preallocated)",
                d.prealloc_inodes
            ),
        ),
        (
            "--shards",
            "shards",
            d.shard_count.to_string(),
            "Number of inode shards".into(),
        ),
        (
            "-P",
            "storagePools",
            d.pools.join(";"),
            "Disk storage pools in file system".into(),
        ),
        (
            "-d",
            "disks",
            disks.join(";"),
            "Disks in file system".into(),
        ),
        (
            "-A",
            "automaticMountOption",
            yn(d.automount).into(),
            "Automatic mount option".into(),
        ),
        (
            "-T",
            "defaultMountPoint",
            d.default_mount_point.clone(),
            "Default mount point".into(),
        ),
        (
            "-V",
            "filesystemVersion",
            format!("1 (Tessera {})", env!("CARGO_PKG_VERSION")),
            "File system version".into(),
        ),
        ("--uuid", "uuid", d.uuid_hex(), "File system UUID".into()),
        (
            "--manager",
            "fileSystemManager",
            match (&s.record.mounted, &s.record.mounted_on) {
                (true, Some(node)) => node.clone(),
                _ => "none (not mounted)".into(),
            },
            "File system manager while mounted: metanode of the shards no owner slot \
             holds [mmlsmgr]"
                .into(),
        ),
        (
            "--slots",
            "ownerSlots",
            owner_slots(&s.record.slot_holders, d),
            "Owner slots, the nodes serving them and the allocation regions they hold \
             (metadataSlots)"
                .into(),
        ),
    ]
}

/// `slot 1 node2 3 regions; slot 2 node3 1 region (free)`: which node serves each owner
/// slot (free: its holder unmounted; the first node that needs it takes it) and how many
/// allocation regions the owner map gives it (the file system manager holds the rest; a
/// slot gives back regions it emptied when the manager needs them), and whether a move of
/// its region (records and log) is left to settle.
fn owner_slots(holders: &[crate::config::SlotHolder], desc: &tessera_fs::FsDescriptor) -> String {
    if holders.is_empty() {
        return "none".into();
    }
    let owners = desc
        .slots
        .as_ref()
        .map(|s| s.region_owners.as_slice())
        .unwrap_or_default();
    let regions = |slot: u32| match owners.iter().filter(|o| **o == slot).count() {
        1 => "1 region".to_string(),
        n => format!("{n} regions"),
    };
    // A move of a slot's records and log that a disk delete or restripe left reserved
    // (the manager died, or the slot's node did not answer): the next one settles it.
    let moving = |slot: u32| match desc.slot_move(slot) {
        Some(_) => " (region moving: the next disk delete or restripe -m ends it)",
        None => "",
    };
    let mut holders = holders.to_vec();
    holders.sort_by_key(|h| h.slot);
    holders
        .iter()
        .map(|h| {
            let free = if h.incarnation.is_some() {
                ""
            } else {
                " (free)"
            };
            let (slot, node) = (h.slot, &h.node);
            format!("slot {slot} {node} {}{free}{}", regions(slot), moving(slot))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `fs ls DEVICE|all [-Y]` [mmlsfs]: with `all`, every file system of the cluster in
/// turn, each under a line naming it (one header for all with -Y).
pub fn ls(home: &Home, name: &str, machine: bool) -> Result<()> {
    if name != "all" {
        return ls_one(home, name, machine, true);
    }
    let names: Vec<String> = match call(home, &Request::MountList { name: None })? {
        Reply::Mounts(rows) => rows.into_iter().map(|r| r.file_system).collect(),
        other => return Err(unexpected(other)),
    };
    if names.is_empty() {
        bail!("there are no file systems yet (create one with `tessera fs create`)");
    }
    for (i, name) in names.iter().enumerate() {
        if !machine {
            if i > 0 {
                println!();
            }
            println!("File system attributes for {name}:");
            println!("{}", "=".repeat(26 + name.len()));
        }
        ls_one(home, name, machine, i == 0)?;
    }
    Ok(())
}

fn ls_one(home: &Home, name: &str, machine: bool, header: bool) -> Result<()> {
    let s = show(home, name)?;
    let rows = fs_rows(&s);
    if machine {
        let y = YRecord::new("fs", "");
        if header {
            println!(
                "{}",
                y.header(&["deviceName", "fieldName", "data", "remarks"])
            );
        }
        for (_, field, value, _) in rows {
            println!(
                "{}",
                y.data(&[name.to_string(), field.into(), value, String::new()])
            );
        }
        return Ok(());
    }
    let mut t = Table::new(&["flag", "value", "description"]);
    for (flag, _, value, description) in rows {
        t.row(vec![flag.into(), value, description]);
    }
    print!("{}", t.render());
    Ok(())
}

pub fn delete(home: &Home, name: &str, unreadable_ok: bool) -> Result<()> {
    call(
        home,
        &Request::FsDelete {
            name: name.to_string(),
            unreadable_ok,
        },
    )?;
    Ok(())
}

pub fn disk_ls(home: &Home, name: &str, long: bool, machine: bool) -> Result<()> {
    let s = show(home, name)?;
    // -L: how this node reaches each disk (its device, or the NSD servers' paths).
    let access = if long {
        Some(super::nsd::local_access(home)?)
    } else {
        None
    };
    let reach = |nsd: &str| -> Vec<String> {
        let Some(rows) = &access else {
            return Vec::new();
        };
        match rows.iter().find(|a| a.nsd == nsd) {
            Some(a) => vec![a.device.clone(), a.remarks()],
            None => vec!["-".into(), "not known on this node".into()],
        }
    };
    let d = &s.descriptor;
    let lost = |i: usize| s.disks_lost.get(i).cloned().flatten();
    let rows: Vec<Vec<String>> = d
        .disks
        .iter()
        .zip(&s.disks_up)
        .enumerate()
        .map(|(i, (disk, up))| {
            // A disk part of which cannot be read is down, as mmlsdisk shows a disk whose
            // data cannot be reached: `up` would promise reads that fail.
            let up = *up && lost(i).is_none();
            let status = disk.status.as_str();
            let mut row = vec![
                disk.nsd_name.clone(),
                "nsd".into(),
                tessera_drive::SECTOR_BYTES.to_string(),
                disk.failure_group.to_string(),
                yn(disk.usage.holds_metadata()).into(),
                yn(disk.usage.holds_data()).into(),
                status.into(),
                if up { "up" } else { "down" }.into(),
                d.pool_name(disk.pool).to_string(),
            ];
            row.extend(reach(&disk.nsd_name));
            row
        })
        .collect();
    if machine {
        let y = YRecord::new("disk", "");
        let mut header = vec![
            "fileSystem",
            "diskName",
            "driverType",
            "sectorSize",
            "failureGroup",
            "metadata",
            "data",
            "status",
            "availability",
            "storagePool",
        ];
        if long {
            header.extend(["device", "access"]);
        }
        println!("{}", y.header(&header));
        for row in rows {
            let mut values = vec![name.to_string()];
            values.extend(row);
            println!("{}", y.data(&values));
        }
        return Ok(());
    }
    let mut header = vec![
        "disk name",
        "driver type",
        "sector size",
        "failure group",
        "holds metadata",
        "holds data",
        "status",
        "availability",
        "storage pool",
    ];
    if long {
        header.extend(["device", "path in use"]);
    }
    let mut t = Table::new(&header).right(&[2, 3]);
    for row in rows {
        t.row(row);
    }
    print!("{}", t.render());
    for (i, disk) in d.disks.iter().enumerate() {
        if let Some(why) = lost(i) {
            println!("{}: down: {why}", disk.nsd_name);
        }
    }
    Ok(())
}

/// `tessera fs reclaimspace DEVICE` [mmreclaimspace].
pub fn reclaimspace(home: &Home, name: &str) -> Result<()> {
    let rows = match call(
        home,
        &Request::ReclaimSpace {
            name: name.to_string(),
        },
    )? {
        Reply::ReclaimSpace(rows) => rows,
        other => return Err(unexpected(other)),
    };
    let mut t = Table::new(&["NSD", "given back (MiB)"]).right(&[1]);
    for (nsd, bytes) in &rows {
        t.row(vec![
            nsd.clone(),
            format!("{:.1}", *bytes as f64 / 1048576.0),
        ]);
    }
    print!("{}", t.render());
    let total: u64 = rows.iter().map(|(_, b)| b).sum();
    println!(
        "Gave {:.1} MiB of free space back to {} thin-provisioned disks of {name}.",
        total as f64 / 1048576.0,
        rows.len()
    );
    Ok(())
}

/// `tessera disk add DEVICE -F STANZA [-r] [-v yes|no]` [mmadddisk].
pub fn disk_add(home: &Home, a: &DiskAddArgs) -> Result<()> {
    let verify = yes_no("-v", &a.verify)?;
    let text = read_stanza_file(&a.stanza_file)?;
    if let Some(pool) = parse_pool_stanzas(&text)
        .map_err(|e| anyhow!("{}: {e}", a.stanza_file.display()))?
        .first()
    {
        bail!(
            "{}: line {}: %pool stanzas define storage pools, and adding a pool to an existing \
             file system is not implemented yet; remove the stanza and put the disks in one of \
             the file system's pools (`tessera fs show {}` lists them)",
            a.stanza_file.display(),
            pool.line,
            a.device
        );
    }
    let disks = disks_from_stanzas(&a.stanza_file, &text)?;
    if disks.is_empty() {
        bail!(
            "{}: no %nsd stanza; name the NSDs to add as `%nsd: nsd=NAME`",
            a.stanza_file.display()
        );
    }
    let names: Vec<String> = disks.iter().map(|d| d.nsd.clone()).collect();
    let reply = call(
        home,
        &Request::DiskAdd {
            name: a.device.clone(),
            disks,
            verify,
            rebalance: a.rebalance,
        },
    )?;
    println!("{} added to {}.", names.join(", "), a.device);
    match reply {
        Reply::Done => Ok(()),
        Reply::Restripe(done) => {
            print_restripe(&a.device, &done, "moved");
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

/// `tessera disk delete DEVICE "NSD[;NSD...]"` [mmdeldisk].
pub fn disk_delete(home: &Home, a: &DiskDeleteArgs) -> Result<()> {
    let nsds = nsd_list(&a.disks, &a.device)?;
    let done = match call(
        home,
        &Request::DiskDelete {
            name: a.device.clone(),
            nsds: nsds.clone(),
        },
    )? {
        Reply::Restripe(done) => done,
        other => return Err(unexpected(other)),
    };
    print_restripe(&a.device, &done, "moved");
    if !done.stopped {
        println!(
            "{} deleted from {}; the NSDs are free (`tessera nsd ls`).",
            nsds.join(", "),
            a.device
        );
    }
    Ok(())
}

/// NSD names separated by ';' or ',' [mmchdisk -d "nsd1;nsd2"].
fn nsd_list(text: &str, device: &str) -> Result<Vec<String>> {
    let nsds: Vec<String> = text
        .split([';', ','])
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    if nsds.is_empty() {
        bail!("no disk named; give NSD names separated by ';' (see `tessera disk ls {device}`)");
    }
    Ok(nsds)
}

/// `tessera disk change DEVICE ACTION -d "NSD[;NSD...]"` [mmchdisk].
pub fn disk_change(home: &Home, a: &DiskChangeArgs) -> Result<()> {
    let nsds = nsd_list(&a.disks, &a.device)?;
    let status = match a.action {
        DiskAction::Suspend => tessera_fs::DiskStatus::Suspended,
        DiskAction::Empty => tessera_fs::DiskStatus::ToBeEmptied,
        DiskAction::Resume => tessera_fs::DiskStatus::Ready,
        DiskAction::Stop | DiskAction::Start => {
            let up = a.action == DiskAction::Start;
            call(
                home,
                &Request::DiskAvailability {
                    name: a.device.clone(),
                    nsds: nsds.clone(),
                    up,
                },
            )?;
            if up {
                println!(
                    "{} of {} started. `tessera restripe {} -r` gives the blocks written while \
                     they were down their copies back.",
                    nsds.join(", "),
                    a.device,
                    a.device
                );
            } else {
                println!(
                    "{} of {} stopped: no I/O goes to them until `tessera disk change {} start \
                     -d {}` or the next mount; their copies are read from the other failure \
                     groups, and writes meanwhile leave files ill-replicated.",
                    nsds.join(", "),
                    a.device,
                    a.device,
                    a.disks
                );
            }
            return Ok(());
        }
    };
    call(
        home,
        &Request::DiskChange {
            name: a.device.clone(),
            nsds: nsds.clone(),
            status,
        },
    )?;
    println!(
        "{} of {} now {}.",
        nsds.join(", "),
        a.device,
        status.as_str()
    );
    if status != tessera_fs::DiskStatus::Ready {
        println!(
            "No new data goes there; `tessera restripe {} -m` moves what it holds to the ready disks.",
            a.device
        );
    }
    Ok(())
}

/// `tessera restripe DEVICE -m|-b` [mmrestripefs].
pub fn restripe(home: &Home, a: &RestripeArgs) -> Result<()> {
    if [a.migrate, a.balance, a.placement, a.replication, a.check]
        .iter()
        .filter(|x| **x)
        .count()
        > 1
    {
        bail!("restripe: give one of -m, -b, -p, -r and -c");
    }
    let done = match call(
        home,
        &Request::Restripe {
            name: a.device.clone(),
            balance: a.balance,
            placement: a.placement,
            replication: a.replication,
            check: a.check,
        },
    )? {
        Reply::Restripe(done) => done,
        other => return Err(unexpected(other)),
    };
    let verb = if a.replication {
        "given their copies"
    } else if a.check {
        "with a damaged copy repaired"
    } else {
        "moved"
    };
    print_restripe(&a.device, &done, verb);
    Ok(())
}

/// What a restripe did; `verb` says what happened to the blocks it counts.
fn print_restripe(device: &str, done: &RestripeDone, verb: &str) {
    let RestripeDone {
        blocks_scanned,
        blocks_moved,
        bytes_moved,
        metadata_pages_moved,
        map_regions_moved,
        log_moved,
        slot_regions_moved,
        metadata_copies_checked,
        metadata_copies_repaired,
        blocks_changed,
        stopped,
    } = done.clone();
    println!(
        "{}: {blocks_moved} of {blocks_scanned} data blocks {verb} ({:.1} MiB){}{}.",
        device,
        bytes_moved as f64 / 1048576.0,
        match (metadata_pages_moved, map_regions_moved) {
            (0, 0) => String::new(),
            (p, 0) => format!(", {p} metadata pages moved"),
            (p, r) => format!(
                ", {p} metadata pages and {r} allocation-map region{} moved",
                if r == 1 { "" } else { "s" }
            ),
        },
        if blocks_changed > 0 {
            format!(", {blocks_changed} changed while the restripe ran (written anew wherever the allocator chose)")
        } else {
            String::new()
        }
    );
    if log_moved {
        println!("The recovery log moved to another disk.");
    }
    if slot_regions_moved > 0 {
        println!(
            "{slot_regions_moved} owner slot region{} moved to other disks.",
            if slot_regions_moved == 1 { "" } else { "s" }
        );
    }
    if metadata_copies_checked > 0 {
        println!(
            "{device}: {metadata_copies_checked} copies of metadata pages checked, \
             {metadata_copies_repaired} rewritten from their other copy."
        );
    }
    if stopped {
        println!("Stopped before the end; run the same command again to continue.");
    }
}

/// `tessera fs change DEVICE -r N | -m N` [mmchfs].
pub fn change(home: &Home, a: &crate::cli::FsChangeArgs) -> Result<()> {
    if let Some(copies) = a.metadata_replicas {
        let copies = u8::try_from(copies)
            .ok()
            .filter(|c| (1..=2).contains(c))
            .ok_or_else(|| anyhow!("-m {copies}: give 1 or 2"))?;
        call(
            home,
            &Request::FsMetadataReplicationSet {
                name: a.device.clone(),
                copies,
            },
        )?;
        println!(
            "{} keeps {copies} copies of its metadata from now on; `tessera restripe {} -r` \
             gives the metadata already on disk its second copy.",
            a.device, a.device
        );
        if a.data_replicas.is_none() {
            return Ok(());
        }
    }
    let Some(copies) = a.data_replicas else {
        bail!(
            "fs change {}: give what to change (-r N: data copies of new files; -m 2: a \
             second copy of the metadata)",
            a.device
        );
    };
    let copies = u8::try_from(copies)
        .ok()
        .filter(|c| (1..=3).contains(c))
        .ok_or_else(|| anyhow!("-r {copies}: give 1, 2 or 3"))?;
    call(
        home,
        &Request::FsReplicationSet {
            name: a.device.clone(),
            copies,
        },
    )?;
    println!(
        "Files created in {} from now on get {copies} data copies; existing files keep theirs \
         (`tessera file attr set --replication {copies} PATH` and `tessera restripe {} -r` \
         change them).",
        a.device, a.device
    );
    Ok(())
}
