//! `nsd create`, `nsd ls`, `nsd delete`, `nsd discover` and `nsd change` [mmcrnsd, mmlsnsd,
//! mmdelnsd, mmnsddiscover, mmchnsd].

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use tessera_nsd::{format_nsd_stanza, parse_nsd_stanzas, NsdStanza};

use super::{call, unexpected, yes_no};
use crate::config::{write_atomic, Home, NsdRecord};
use crate::output::{Table, YRecord};
use crate::rpc::{NsdSpec, Reply, Request};

/// A stanza's device as an absolute path: `nvme0n1` is `/dev/nvme0n1`, a relative path
/// with a slash is relative to the current directory (the daemon runs elsewhere), and
/// `vdisk:NAME` and `nvme:NAME` stay as they are.
pub fn resolve_device(device: &str) -> Result<String> {
    // `vdisk:NAME` names a vdisk of a declustered array on this node, `nvme:NAME` a
    // namespace connected over NVMe/TCP (`tessera nvme list`).
    if device.starts_with('/') || device.starts_with("vdisk:") || device.starts_with("nvme:") {
        return Ok(device.to_string());
    }
    if !device.contains('/') {
        return Ok(format!("/dev/{device}"));
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    // Collecting the components drops the `.` ones: `./d2` becomes `/cwd/d2`.
    let path: PathBuf = cwd.join(device).components().collect();
    Ok(path.display().to_string())
}

pub fn read_stanza_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read stanza file {}", path.display()))
}

pub fn create(home: &Home, file: &Path, verify: &str) -> Result<()> {
    let verify = yes_no("-v", verify)?;
    let text = read_stanza_file(file)?;
    let stanzas = parse_nsd_stanzas(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    if stanzas.is_empty() {
        bail!(
            "{}: no %nsd stanzas found; write one `%nsd: device=... nsd=...` per disk",
            file.display()
        );
    }
    let mut specs = Vec::new();
    for s in &stanzas {
        specs.push(NsdSpec {
            device_text: s.device.clone(),
            device_path: resolve_device(&s.device)?,
            nsd: s.nsd.clone(),
            usage: s.usage,
            failure_group: s.failure_group,
            pool: s.pool.clone(),
            thin_disk_type: s.thin_disk_type,
            servers: s.servers.clone(),
        });
    }
    let names = match call(
        home,
        &Request::NsdCreate {
            nsds: specs,
            verify,
        },
    )? {
        Reply::NsdsCreated(names) => names,
        other => return Err(unexpected(other)),
    };
    if stanzas.iter().any(|s| s.nsd.is_none()) {
        let rewritten = rewrite_stanzas(&text, &stanzas, &names);
        write_atomic(file, rewritten.as_bytes())?;
        println!(
            "tessera nsd create: {} rewritten with the NSD names",
            file.display()
        );
    }
    Ok(())
}

/// The stanza file with every `%nsd` stanza that had no `nsd=` commented out and followed
/// by the full stanza with its new name, as mmcrnsd rewrites its input so it can be given
/// to `fs create` unchanged. Other stanzas and comments stay as they were.
fn rewrite_stanzas(text: &str, stanzas: &[NsdStanza], names: &[String]) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let is_header = |l: &str| l.trim_start().starts_with('%');
    let mut out = String::new();
    let mut at = 0; // Next line (0-based) to copy.
    for (s, name) in stanzas.iter().zip(names) {
        if s.nsd.is_some() {
            continue;
        }
        let start = s.line - 1;
        let end = (start + 1..lines.len())
            .find(|i| is_header(lines[*i]))
            .unwrap_or(lines.len());
        for l in &lines[at..start] {
            out.push_str(l);
            out.push('\n');
        }
        for l in &lines[start..end] {
            out.push_str("# ");
            out.push_str(l);
            out.push('\n');
        }
        let mut named = s.clone();
        named.nsd = Some(name.clone());
        out.push_str(&format_nsd_stanza(&named));
        at = end;
    }
    for l in &lines[at..] {
        out.push_str(l);
        out.push('\n');
    }
    out
}

fn devtype(device: &str) -> &'static str {
    if device.starts_with("vdisk:") {
        return "vdisk";
    }
    if device.starts_with("nvme:") {
        return "nvme-tcp";
    }
    let block = std::fs::metadata(device)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    match (block, device.contains("nvme")) {
        (true, true) => "nvme",
        (true, false) => "generic",
        (false, _) => "file",
    }
}

fn list(home: &Home) -> Result<Vec<NsdRecord>> {
    match call(home, &Request::NsdList)? {
        Reply::Nsds(mut nsds) => {
            nsds.sort_by(|a, b| (&a.file_system, &a.name).cmp(&(&b.file_system, &b.name)));
            Ok(nsds)
        }
        other => Err(unexpected(other)),
    }
}

pub fn ls(home: &Home, mapping: bool, extended: bool, machine: bool) -> Result<()> {
    let nsds = list(home)?;
    let node = home.cluster()?.node_name;
    let fs_name = |n: &NsdRecord| {
        n.file_system
            .clone()
            .unwrap_or_else(|| "(free disk)".into())
    };
    let servers = |n: &NsdRecord| {
        if n.servers.is_empty() {
            "(directly attached)".to_string()
        } else {
            n.servers.join(",")
        }
    };
    let volume_id = |n: &NsdRecord| n.id.to_hex().to_uppercase();
    if machine {
        let y = YRecord::new("nsd", "");
        println!(
            "{}",
            y.header(&[
                "fileSystem",
                "diskName",
                "volumeId",
                "device",
                "devType",
                "nodeName",
                "servers",
                "usage",
                "failureGroup",
                "storagePool",
                "thinDiskType",
                "sizeBytes",
            ])
        );
        for n in &nsds {
            let file_system = n.file_system.clone().unwrap_or_default();
            println!(
                "{}",
                y.data(&[
                    file_system,
                    n.name.clone(),
                    volume_id(n),
                    n.device.clone(),
                    devtype(&n.device).into(),
                    node.clone(),
                    n.servers.join(","),
                    n.usage.to_string(),
                    n.failure_group.to_string(),
                    n.pool.clone(),
                    n.thin_disk_type.to_string(),
                    n.size_bytes.to_string(),
                ])
            );
        }
        return Ok(());
    }
    let remarks = |n: &NsdRecord| {
        if n.servers.is_empty() {
            "directly attached"
        } else {
            "server node"
        }
    };
    let table = if extended {
        let mut t = Table::new(&[
            "Disk name",
            "NSD volume ID",
            "Device",
            "Devtype",
            "Node name",
            "Remarks",
        ]);
        for n in &nsds {
            let d = devtype(&n.device).to_string();
            t.row(vec![
                n.name.clone(),
                volume_id(n),
                n.device.clone(),
                d,
                node.clone(),
                remarks(n).into(),
            ]);
        }
        t
    } else if mapping {
        let mut t = Table::new(&[
            "Disk name",
            "NSD volume ID",
            "Device",
            "Node name",
            "Remarks",
        ]);
        for n in &nsds {
            t.row(vec![
                n.name.clone(),
                volume_id(n),
                n.device.clone(),
                node.clone(),
                remarks(n).into(),
            ]);
        }
        t
    } else {
        let mut t = Table::new(&["File system", "Disk name", "NSD servers"]);
        for n in &nsds {
            t.row(vec![fs_name(n), n.name.clone(), servers(n)]);
        }
        t
    };
    print!("{}", table.render());
    Ok(())
}

pub fn delete(home: &Home, names: &[String]) -> Result<()> {
    call(
        home,
        &Request::NsdDelete {
            names: names.to_vec(),
        },
    )?;
    println!("tessera nsd delete: Command successfully completed");
    Ok(())
}

/// `nsd discover` [mmnsddiscover]: one row per NSD, with where it was and where it is.
pub fn discover(home: &Home) -> Result<()> {
    let rows = match call(home, &Request::NsdDiscover)? {
        Reply::NsdDiscovery(rows) => rows,
        other => return Err(unexpected(other)),
    };
    if rows.is_empty() {
        println!("no NSDs; create them with `tessera nsd create -F STANZA`");
        return Ok(());
    }
    let mut t = Table::new(&["NSD", "device before", "device now", "status"]);
    for r in &rows {
        let now = r.device_now.clone().unwrap_or_else(|| "-".into());
        t.row(vec![
            r.nsd.clone(),
            r.device_before.clone(),
            now,
            r.status.clone(),
        ]);
    }
    print!("{}", t.render());
    let lost = rows.iter().filter(|r| r.device_now.is_none()).count();
    if lost > 0 {
        bail!(
            "{lost} NSD(s) not found on any device of this node; attach the device (or list \
             its path in {}) and rerun, or record it with `tessera nsd change NSD --device PATH`",
            home.root().join("nsddevices").display()
        );
    }
    Ok(())
}

/// `nsd change NSD --device PATH` [mmchnsd]: the daemon checks the descriptor first.
pub fn change(home: &Home, name: &str, device: &str) -> Result<()> {
    let device = resolve_device(device)?;
    call(
        home,
        &Request::NsdChange {
            name: name.to_string(),
            device,
        },
    )?;
    println!("tessera nsd change: Command successfully completed");
    Ok(())
}

/// Absolute form of a path given on the command line.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir()
        .context("cannot read the current directory")?
        .join(path))
}
