//! `nsd create`, `nsd ls`, `nsd delete`, `nsd discover` and `nsd change` [mmcrnsd, mmlsnsd,
//! mmdelnsd, mmnsddiscover, mmchnsd].

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use tessera_nsd::{format_nsd_stanza, parse_nsd_servers_changes, parse_nsd_stanzas, NsdStanza};

use super::{call, unexpected, yes_no};
use crate::config::{write_atomic, Home, NsdRecord};
use crate::output::{Table, YRecord};
use crate::rpc::{NsdAccessRow, NsdSpec, Reply, Request};

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
    let served: Vec<(String, Vec<String>)> = stanzas
        .iter()
        .zip(&names)
        .filter(|(s, _)| !s.servers.is_empty())
        .map(|(s, n)| (n.clone(), s.servers.clone()))
        .collect();
    if !served.is_empty() {
        check_servers_serve(home, &served);
    }
    Ok(())
}

/// How long `nsd create` waits for the listed servers to serve the new NSDs: each server's
/// daemon sees the NSD at its next configuration change and opens the device.
const SERVERS_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks every listed server (through the remote shell, as `nsd ls -M`) whether it serves
/// the new NSDs, for up to [`SERVERS_SETTLE`], and says which ones do not and why: a
/// server that cannot open the device, or whose daemon is down. The NSDs stay created
/// (a server may be down now and serve later); `nsd ls -M` shows the same at any time.
fn check_servers_serve(home: &Home, served: &[(String, Vec<String>)]) {
    let deadline = std::time::Instant::now() + SERVERS_SETTLE;
    loop {
        let views = match access_views(home, Mapping::Everywhere) {
            Ok(v) => v,
            Err(e) => {
                println!("tessera nsd create: cannot ask the servers whether they serve: {e:#}");
                return;
            }
        };
        let mut missing = Vec::new();
        for (nsd, servers) in served {
            for server in servers {
                let how =
                    views
                        .iter()
                        .find(|(node, _)| node == server)
                        .map(|(_, rows)| match rows {
                            Err(why) => Err(why.clone()),
                            Ok(rows) => Ok(rows
                                .iter()
                                .find(|a| a.nsd == *nsd)
                                .map(|a| a.access.clone())
                                .unwrap_or_else(|| "not known there yet".into())),
                        });
                match how {
                    // A vdisk NSD's standby servers take over with its array.
                    Some(Ok(a)) if a == "server node" || a.starts_with("standby server") => {}
                    Some(Ok(a)) => missing.push(format!("NSD {nsd}: server {server}: {a}")),
                    Some(Err(why)) => {
                        missing.push(format!("NSD {nsd}: server {server} not asked: {why}"))
                    }
                    None => missing.push(format!("NSD {nsd}: server {server}: not a node")),
                }
            }
        }
        if missing.is_empty() {
            return;
        }
        if std::time::Instant::now() >= deadline {
            for m in missing {
                println!("tessera nsd create: warning: {m}");
            }
            println!(
                "tessera nsd create: clients reach those NSDs through the servers that serve \
                 them; `tessera nsd ls -M` shows each node's view"
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
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

/// Which nodes' view of the NSDs `nsd ls` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// The NSDs and their servers only.
    None,
    /// How this node reaches each NSD (-m, -X).
    Local,
    /// How every node reaches each NSD (-M), asked through the remote shell.
    Everywhere,
}

/// This node's daemon's view: how it reaches each NSD now.
pub(crate) fn local_access(home: &Home) -> Result<Vec<NsdAccessRow>> {
    match call(home, &Request::NsdAccess)? {
        Reply::NsdAccess(rows) => Ok(rows),
        other => Err(unexpected(other)),
    }
}

/// `nsd ls -m -Y` of another node, read back into rows.
fn parse_access(text: &str) -> Vec<NsdAccessRow> {
    let unescape = |v: &str| v.replace("%3A", ":").replace("%25", "%");
    text.lines()
        .filter(|l| l.starts_with("nsd:access:") && !l.contains(":HEADER:"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            // nsd:access:0:1:::diskName:nodeName:access:device:paths:
            let paths = f.get(10).copied().unwrap_or("");
            Some(NsdAccessRow {
                nsd: unescape(f.get(6)?),
                access: unescape(f.get(8)?),
                device: unescape(f.get(9)?),
                paths: paths
                    .split(';')
                    .filter(|p| !p.is_empty())
                    .filter_map(|p| {
                        let (server, rest) = p.split_once('=')?;
                        let (ana, state) = rest.split_once('/')?;
                        Some((server.into(), unescape(ana), unescape(state)))
                    })
                    .collect(),
            })
        })
        .collect()
}

/// One node's view: its name, and its rows or why it could not be asked.
type AccessView = (String, Result<Vec<NsdAccessRow>, String>);

/// Each node's view, in node order.
fn access_views(home: &Home, mapping: Mapping) -> Result<Vec<AccessView>> {
    let me = home.cluster()?.node_name;
    match mapping {
        Mapping::None => Ok(Vec::new()),
        Mapping::Local => Ok(vec![(me, Ok(local_access(home)?))]),
        Mapping::Everywhere => {
            let known = super::cluster::known_nodes(home)?;
            let rsh = super::remote::RemoteShell::parse(&known.identity.remote_shell)?;
            let line = super::remote::tessera_command_line(&["nsd", "ls", "-m", "-Y"])?;
            let views = super::remote::for_each_parallel(&known.nodes, |node| {
                let rows = if node.name == me {
                    local_access(home).map_err(|e| format!("{e:#}"))
                } else {
                    rsh.run(&node.name, &line, None, std::time::Duration::from_secs(30))
                        .map(|out| parse_access(&out.stdout))
                };
                (node.name.clone(), rows)
            });
            Ok(views)
        }
    }
}

pub fn ls(home: &Home, mapping: Mapping, extended: bool, machine: bool) -> Result<()> {
    let nsds = list(home)?;
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
    let mapping = if extended && mapping == Mapping::None {
        Mapping::Local
    } else {
        mapping
    };
    let views = access_views(home, mapping)?;
    let node = home.cluster()?.node_name;
    if machine && mapping != Mapping::None {
        let y = YRecord::new("nsd", "access");
        println!(
            "{}",
            y.header(&["diskName", "nodeName", "access", "device", "paths"])
        );
        for (node, rows) in &views {
            let Ok(rows) = rows else { continue };
            for a in rows {
                let paths: Vec<String> = a
                    .paths
                    .iter()
                    .map(|(server, ana, state)| format!("{server}={ana}/{state}"))
                    .collect();
                println!(
                    "{}",
                    y.data(&[
                        a.nsd.clone(),
                        node.clone(),
                        a.access.clone(),
                        a.device.clone(),
                        paths.join(";")
                    ])
                );
            }
        }
        return Ok(());
    }
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
    if mapping == Mapping::None {
        let mut t = Table::new(&["File system", "Disk name", "NSD servers"]);
        for n in &nsds {
            t.row(vec![fs_name(n), n.name.clone(), servers(n)]);
        }
        print!("{}", t.render());
        return Ok(());
    }
    let mut header = vec!["Disk name", "NSD volume ID", "Device"];
    if extended {
        header.push("Devtype");
    }
    header.extend(["Node name", "Remarks"]);
    let mut t = Table::new(&header);
    for n in &nsds {
        for (node, rows) in &views {
            let (device, remarks) = match rows {
                // The reason is long (the other node's own error): it goes below the table.
                Err(_) => ("-".to_string(), "node not asked (see below)".to_string()),
                Ok(rows) => match rows.iter().find(|a| a.nsd == n.name) {
                    None => (n.device.clone(), "not known on that node".to_string()),
                    Some(a) => (a.device.clone(), a.remarks()),
                },
            };
            let mut row = vec![n.name.clone(), volume_id(n), device.clone()];
            if extended {
                row.push(devtype(&device).to_string());
            }
            row.extend([node.clone(), remarks]);
            t.row(row);
        }
    }
    print!("{}", t.render());
    for (node, rows) in &views {
        if let Err(why) = rows {
            println!("{node} was not asked: {}", unquoted_remote_error(why));
        }
    }
    Ok(())
}

/// What another node's `tessera` said when it failed, without the command's name it put
/// in front and the exit status the remote shell put after it.
fn unquoted_remote_error(why: &str) -> &str {
    let why = why.trim();
    let why = why.strip_prefix("tessera nsd ls: ").unwrap_or(why);
    match why.rfind(" (exit status: ") {
        Some(at) if why.ends_with(')') => &why[..at],
        _ => why,
    }
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

/// `perf nsd`: one NSD's throughput and latency as this node reaches it.
pub fn perf(
    home: &Home,
    nsd: &str,
    op: &str,
    size: u32,
    threads: u32,
    seconds: u32,
    machine: bool,
) -> Result<()> {
    let write = match op {
        "read" => false,
        "write" => true,
        other => bail!("--op {other}: use read or write"),
    };
    let request = Request::PerfNsd {
        nsd: nsd.to_string(),
        write,
        size,
        threads,
        seconds,
    };
    let r = match call(home, &request)? {
        Reply::PerfNsd(r) => r,
        other => return Err(unexpected(other)),
    };
    let mb_s = r.bytes as f64 / r.seconds / 1e6;
    let ops = r.requests as f64 / r.seconds;
    if machine {
        let y = YRecord::new("perfNsd", "");
        println!(
            "{}",
            y.header(&[
                "nsd",
                "op",
                "sizeBytes",
                "threads",
                "MBps",
                "opsPerSec",
                "latencyUsP50",
                "latencyUsP99",
                "latencyUsMax",
                "path",
            ])
        );
        println!(
            "{}",
            y.data(&[
                nsd.to_string(),
                op.to_string(),
                size.to_string(),
                threads.to_string(),
                format!("{mb_s:.1}"),
                format!("{ops:.0}"),
                r.latency_us_p50.to_string(),
                r.latency_us_p99.to_string(),
                r.latency_us_max.to_string(),
                r.path.clone(),
            ])
        );
        return Ok(());
    }
    let mut t = Table::new(&[
        "NSD", "op", "MB/s", "ops/s", "p50 us", "p99 us", "max us", "path",
    ])
    .right(&[2, 3, 4, 5, 6]);
    t.row(vec![
        nsd.to_string(),
        op.to_string(),
        format!("{mb_s:.1}"),
        format!("{ops:.0}"),
        r.latency_us_p50.to_string(),
        r.latency_us_p99.to_string(),
        r.latency_us_max.to_string(),
        r.path,
    ]);
    print!("{}", t.render());
    Ok(())
}

/// `nsd change -F FILE`: new server lists.
pub fn change_servers(home: &Home, file: &Path) -> Result<()> {
    let text = read_stanza_file(file)?;
    let changes =
        parse_nsd_servers_changes(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    if changes.is_empty() {
        bail!(
            "{}: no %nsd stanzas found; write one `%nsd: nsd=NAME servers=NODE[,NODE...]` per NSD",
            file.display()
        );
    }
    let changes = changes.into_iter().map(|c| (c.nsd, c.servers)).collect();
    call(home, &Request::NsdChangeServers { changes })?;
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
