//! `da`, `vdisk` and `pdisk`: declustered arrays and the erasure-coded vdisks carved from
//! them, in the manner of the ESS `mmvdisk` workflow (pdisks in enclosures, arrays of
//! pdisks, vdisks with a code and a block size, then NSDs on the vdisks).

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use tessera_ec::Code;
use tessera_nsd::parse_pdisk_stanzas;

use super::nsd::{read_stanza_file, resolve_device};
use super::units::{parse_block_size, parse_size};
use super::{call, unexpected, yes_no};
use crate::cli::DaSettingsArgs;
use crate::config::Home;
use crate::output::{Table, YRecord};
use crate::rpc::{
    DaRow, DaSettings, PdiskAction, PdiskRow, PdiskSpecWire, Reply, Request, TaskRow, VdiskRow,
};

/// Bytes in binary units with one decimal, as capacity columns show them (`1.5 TiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn duration_text(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One line per background task: `rebuild  1234/5000 stripes (24%)  1.2 GiB/s  35s left`.
fn task_text(t: &TaskRow) -> String {
    let pct = (t.done * 100).checked_div(t.total).unwrap_or(100);
    let mut text = format!("{} {}/{} stripes ({pct}%)", t.task, t.done, t.total);
    if t.finished {
        text += ", finished";
    } else {
        text += &format!(", {}/s", human_bytes(t.rate_bytes_s as u64));
        if let Some(eta) = t.eta_seconds {
            text += &format!(", {} left", duration_text(eta));
        }
    }
    if !t.remark.is_empty() {
        text += &format!("; {}", t.remark);
    }
    text
}

fn settings(args: &DaSettingsArgs) -> DaSettings {
    DaSettings {
        foreground_io_share: args.foreground_io_share,
        scrub_rate_mb_s: args.scrub_rate,
        pdisk_error_limit: args.pdisk_error_limit,
    }
}

pub fn change(home: &Home, name: &str, args: &DaSettingsArgs) -> Result<()> {
    let s = settings(args);
    if s.foreground_io_share.is_none()
        && s.scrub_rate_mb_s.is_none()
        && s.pdisk_error_limit.is_none()
    {
        bail!(
            "nothing to change; give --foreground-io-share, --scrub-rate or \
             --pdisk-error-limit"
        );
    }
    let request = Request::DaChange {
        name: name.to_string(),
        settings: s,
    };
    match call(home, &request)? {
        Reply::Das(rows) => {
            print!("{}", da_table(&rows));
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

pub fn create(
    home: &Home,
    name: &str,
    file: &Path,
    spares: Option<u32>,
    args: &DaSettingsArgs,
    verify: &str,
    servers: Vec<String>,
) -> Result<()> {
    let verify = yes_no("-v", verify)?;
    let text = read_stanza_file(file)?;
    let stanzas = parse_pdisk_stanzas(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
    if stanzas.is_empty() {
        bail!(
            "{}: no %pdisk stanzas found; write one \
             `%pdisk: pdisk=NAME device=PATH enclosure=ENCLOSURE slot=N` per drive",
            file.display()
        );
    }
    let mut pdisks = Vec::new();
    for s in &stanzas {
        pdisks.push(PdiskSpecWire {
            name: s.pdisk.clone(),
            device_text: s.device.clone(),
            device_path: resolve_device(&s.device)?,
            enclosure: s.enclosure.clone(),
            slot: s.slot,
        });
    }
    let request = Request::DaCreate {
        name: name.to_string(),
        pdisks,
        spare_pdisks: spares,
        settings: settings(args),
        verify,
        servers,
    };
    match call(home, &request)? {
        Reply::Das(rows) => {
            print!("{}", da_table(&rows));
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

fn da_table(rows: &[DaRow]) -> String {
    let mut table = Table::new(&[
        "da",
        "pdisks",
        "enclosures",
        "state",
        "capacity",
        "free",
        "spare",
        "vdisks",
        "foreground share",
        "scrub rate",
        "server",
        "servers",
    ])
    .right(&[1, 2, 4, 5, 6, 7, 8, 9]);
    for r in rows {
        let servers = if r.servers.is_empty() {
            r.server.clone()
        } else {
            r.servers.join(",")
        };
        if !r.open_here {
            // Served elsewhere: only the registry's facts are known on this node.
            let dash = || "-".to_string();
            table.row(vec![
                r.name.clone(),
                r.pdisks.to_string(),
                dash(),
                r.state.clone(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                r.server.clone(),
                servers,
            ]);
            continue;
        }
        table.row(vec![
            r.name.clone(),
            r.pdisks.to_string(),
            r.enclosures.to_string(),
            r.state.clone(),
            human_bytes(r.capacity_bytes),
            human_bytes(r.free_bytes),
            human_bytes(r.spare_bytes),
            r.vdisks.to_string(),
            format!("{}%", r.foreground_io_share),
            format!("{} MB/s", r.scrub_rate_mb_s),
            r.server.clone(),
            servers,
        ]);
    }
    let mut out = table.render();
    for r in rows {
        for t in &r.tasks {
            out += &format!("{}: {}\n", r.name, task_text(t));
        }
    }
    out
}

fn das(home: &Home) -> Result<Vec<DaRow>> {
    match call(home, &Request::DaList)? {
        Reply::Das(rows) => Ok(rows),
        other => Err(unexpected(other)),
    }
}

pub fn ls(home: &Home, name: Option<&str>, machine: bool) -> Result<()> {
    let mut rows = das(home)?;
    if let Some(name) = name {
        rows.retain(|r| r.name == name);
        if rows.is_empty() {
            bail!("declustered array {name} does not exist; list them with `tessera da ls`");
        }
    }
    if !machine {
        if rows.is_empty() {
            println!("no declustered arrays; create one with `tessera da create NAME -F STANZA`");
        } else {
            print!("{}", da_table(&rows));
        }
        return Ok(());
    }
    let y = YRecord::new("da", "");
    println!(
        "{}",
        y.header(&[
            "da",
            "pdisks",
            "enclosures",
            "state",
            "capacityBytes",
            "freeBytes",
            "spareBytes",
            "vdisks",
            "foregroundIoShare",
            "scrubRateMBps",
            "pdiskErrorLimit",
            "server",
            "servers",
        ])
    );
    for r in &rows {
        println!(
            "{}",
            y.data(&[
                r.name.clone(),
                r.pdisks.to_string(),
                r.enclosures.to_string(),
                r.state.clone(),
                r.capacity_bytes.to_string(),
                r.free_bytes.to_string(),
                r.spare_bytes.to_string(),
                r.vdisks.to_string(),
                r.foreground_io_share.to_string(),
                r.scrub_rate_mb_s.to_string(),
                r.pdisk_error_limit.to_string(),
                r.server.clone(),
                r.servers.join(","),
            ])
        );
    }
    let y = YRecord::new("da", "task");
    println!(
        "{}",
        y.header(&[
            "da",
            "task",
            "done",
            "total",
            "bytes",
            "rateBytesPerSec",
            "etaSeconds",
            "finished"
        ])
    );
    for r in &rows {
        for t in &r.tasks {
            println!(
                "{}",
                y.data(&[
                    r.name.clone(),
                    t.task.clone(),
                    t.done.to_string(),
                    t.total.to_string(),
                    t.bytes.to_string(),
                    format!("{:.0}", t.rate_bytes_s),
                    t.eta_seconds.map(|s| s.to_string()).unwrap_or_default(),
                    t.finished.to_string(),
                ])
            );
        }
    }
    Ok(())
}

pub fn move_to(home: &Home, name: &str, server: &str) -> Result<()> {
    let request = Request::DaMove {
        name: name.to_string(),
        server: server.to_string(),
    };
    match call(home, &request)? {
        Reply::Done => {
            println!(
                "tessera da move: declustered array {name} closed here and given to {server}, \
                 which opens it"
            );
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

pub fn delete(home: &Home, name: &str) -> Result<()> {
    let request = Request::DaDelete {
        name: name.to_string(),
    };
    match call(home, &request)? {
        Reply::Done => {
            println!("tessera da delete: declustered array {name} deleted");
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

pub fn scrub(home: &Home, name: &str) -> Result<()> {
    match call(
        home,
        &Request::DaScrub {
            name: name.to_string(),
        },
    )? {
        Reply::Done => {
            println!(
                "tessera da scrub: scrub of {name} started; follow it with `tessera da ls {name}`"
            );
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

pub fn vdisk_create(
    home: &Home,
    name: &str,
    da: &str,
    code: &str,
    block_size: &str,
    size: &str,
) -> Result<()> {
    let parsed = Code::parse(code).map_err(|e| anyhow!("--code {code}: {e}"))?;
    let block_bytes = u64::from(parse_block_size(block_size)?);
    let (size_bytes, size_percent) = match size.strip_suffix('%') {
        Some(pct) => match pct.parse::<u8>() {
            Ok(p) if (1..=100).contains(&p) => (None, Some(p)),
            _ => bail!("--size {size}: use a percentage from 1% to 100%, or a size such as 500G"),
        },
        None => match parse_size(size) {
            Some(n) if n > 0 => (Some(n), None),
            _ => bail!("--size {size}: use a size such as 500G or 2T, or a percentage such as 80%"),
        },
    };
    let request = Request::VdiskCreate {
        name: name.to_string(),
        da: da.to_string(),
        code: parsed.to_string(),
        block_size: block_bytes,
        size_bytes,
        size_percent,
    };
    match call(home, &request)? {
        Reply::Vdisks(rows) => {
            print!("{}", vdisk_table(&rows));
            println!(
                "To use it as an NSD, add to a stanza file:\n  %nsd: device=vdisk:{name} nsd={name} \
                 usage=dataAndMetadata failureGroup=1 pool=system"
            );
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

fn vdisk_table(rows: &[VdiskRow]) -> String {
    let mut table = Table::new(&[
        "vdisk",
        "da",
        "code",
        "block size",
        "strip",
        "capacity",
        "state",
        "tolerates",
        "nsd",
    ])
    .right(&[3, 4, 5]);
    for r in rows {
        table.row(vec![
            r.name.clone(),
            r.da.clone(),
            r.code.clone(),
            human_bytes(r.block_size),
            human_bytes(r.strip_size),
            human_bytes(r.capacity_bytes),
            r.state.clone(),
            r.tolerance.clone(),
            r.nsd.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    table.render()
}

pub fn vdisk_ls(home: &Home, machine: bool) -> Result<()> {
    let rows = match call(home, &Request::VdiskList)? {
        Reply::Vdisks(rows) => rows,
        other => return Err(unexpected(other)),
    };
    if !machine {
        if rows.is_empty() {
            println!("no vdisks; create one with `tessera vdisk create NAME --da DA`");
        } else {
            print!("{}", vdisk_table(&rows));
        }
        return Ok(());
    }
    let y = YRecord::new("vdisk", "");
    println!(
        "{}",
        y.header(&[
            "vdisk",
            "da",
            "code",
            "blockSize",
            "stripSize",
            "capacityBytes",
            "state",
            "tolerates",
            "nsd",
        ])
    );
    for r in &rows {
        println!(
            "{}",
            y.data(&[
                r.name.clone(),
                r.da.clone(),
                r.code.clone(),
                r.block_size.to_string(),
                r.strip_size.to_string(),
                r.capacity_bytes.to_string(),
                r.state.clone(),
                r.tolerance.clone(),
                r.nsd.clone().unwrap_or_default(),
            ])
        );
    }
    Ok(())
}

pub fn vdisk_delete(home: &Home, name: &str) -> Result<()> {
    match call(
        home,
        &Request::VdiskDelete {
            name: name.to_string(),
        },
    )? {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// How a pdisk whose drive was replaced is listed; the record stays in the array's
/// metadata, but is no drive to look after.
const REPLACED: &str = "replaced";

pub fn pdisk_ls(home: &Home, not_ok: bool, all: bool, machine: bool) -> Result<()> {
    let mut rows: Vec<PdiskRow> = match call(home, &Request::PdiskList)? {
        Reply::Pdisks(rows) => rows,
        other => return Err(unexpected(other)),
    };
    if !all {
        rows.retain(|r| r.state != REPLACED);
    }
    if not_ok {
        rows.retain(|r| r.state != "ok");
    }
    if machine {
        let y = YRecord::new("pdisk", "");
        println!(
            "{}",
            y.header(&[
                "pdisk",
                "da",
                "enclosure",
                "slot",
                "device",
                "state",
                "capacityBytes",
                "freeBytes",
                "readErrors",
                "writeErrors",
                "checksumErrors",
            ])
        );
        for r in &rows {
            println!(
                "{}",
                y.data(&[
                    r.name.clone(),
                    r.da.clone(),
                    r.enclosure.clone(),
                    r.slot.to_string(),
                    r.device.clone(),
                    r.state.clone(),
                    r.capacity_bytes.to_string(),
                    r.free_bytes.to_string(),
                    r.read_errors.to_string(),
                    r.write_errors.to_string(),
                    r.checksum_errors.to_string(),
                ])
            );
        }
        return Ok(());
    }
    if rows.is_empty() {
        println!(
            "{}",
            if not_ok {
                "every pdisk is ok"
            } else {
                "no pdisks; create a declustered array with `tessera da create`"
            }
        );
        return Ok(());
    }
    let mut table = Table::new(&[
        "pdisk",
        "da",
        "enclosure",
        "slot",
        "state",
        "capacity",
        "free",
        "errors r/w/cksum",
        "device",
    ])
    .right(&[3, 5, 6, 7]);
    for r in &rows {
        table.row(vec![
            r.name.clone(),
            r.da.clone(),
            r.enclosure.clone(),
            r.slot.to_string(),
            r.state.clone(),
            human_bytes(r.capacity_bytes),
            human_bytes(r.free_bytes),
            format!("{}/{}/{}", r.read_errors, r.write_errors, r.checksum_errors),
            r.device.clone(),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

pub fn pdisk_change(home: &Home, name: &str, action: PdiskAction, force: bool) -> Result<()> {
    let request = Request::PdiskChange {
        name: name.to_string(),
        action,
        force,
    };
    match call(home, &request)? {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

pub fn pdisk_replace(home: &Home, name: &str, device: &str) -> Result<()> {
    let request = Request::PdiskReplace {
        name: name.to_string(),
        device_path: resolve_device(device)?,
    };
    match call(home, &request)? {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(4 << 30), "4.0 GiB");
    }

    #[test]
    fn task_lines() {
        let t = TaskRow {
            task: "rebuild".into(),
            done: 25,
            total: 100,
            bytes: 1 << 30,
            rate_bytes_s: (512 << 20) as f64,
            eta_seconds: Some(125),
            finished: false,
            remark: String::new(),
        };
        assert_eq!(
            task_text(&t),
            "rebuild 25/100 stripes (25%), 512.0 MiB/s, 2m05s left"
        );
    }
}
