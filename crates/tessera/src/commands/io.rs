//! `mount`, `umount`, `df` and `fsck` [mmmount, mmumount, mmdf, mmfsck].

use std::path::Path;

use anyhow::{bail, Result};

use super::nsd::absolute;
use super::{call, unexpected};
use crate::config::Home;
use crate::output::{percent, yes_no, YRecord};
use crate::rpc::{Reply, Request};
use tessera_fs::DfReport;

pub fn mount(home: &Home, name: &str, mount_point: Option<&Path>) -> Result<()> {
    let mount_point = match mount_point {
        Some(p) => Some(absolute(p)?.display().to_string()),
        None => None,
    };
    println!(
        "{}: tessera mount: Mounting file systems ...",
        crate::output::local_time(crate::config::now_unix(), true)
    );
    match call(
        home,
        &Request::Mount {
            name: name.to_string(),
            mount_point,
        },
    )? {
        Reply::Mounted { mount_point } => {
            println!("File system {name} is mounted at {mount_point}");
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

/// `mount ls [DEVICE|all] [-L] [-Y]` [mmlsmount].
pub fn mount_ls(home: &Home, device: Option<&str>, long: bool, machine: bool) -> Result<()> {
    let name = device.filter(|d| *d != "all").map(str::to_string);
    let rows = match call(home, &Request::MountList { name })? {
        Reply::Mounts(rows) => rows,
        other => return Err(unexpected(other)),
    };
    if machine {
        let y = YRecord::new("mount", "");
        println!(
            "{}",
            y.header(&[
                "deviceName",
                "nodeName",
                "nodeAddress",
                "mountPoint",
                "role"
            ])
        );
        for r in &rows {
            for n in &r.nodes {
                println!(
                    "{}",
                    y.data(&[
                        r.file_system.clone(),
                        n.node.clone(),
                        n.address.clone(),
                        n.mount_point.clone(),
                        n.role.clone(),
                    ])
                );
            }
            if r.nodes.is_empty() {
                let mut empty = vec![String::new(); 5];
                empty[0] = r.file_system.clone();
                println!("{}", y.data(&empty));
            }
        }
        return Ok(());
    }
    if rows.is_empty() {
        println!("No file systems were found.");
    }
    for r in &rows {
        let count = match r.nodes.len() {
            0 => {
                println!("File system {} is not mounted.", r.file_system);
                continue;
            }
            1 => "1 node".to_string(),
            n => format!("{n} nodes"),
        };
        if !long {
            println!("File system {} is mounted on {count}.", r.file_system);
            continue;
        }
        println!("File system {} is mounted on {count}:", r.file_system);
        let mut t = crate::output::Table::new(&["address", "node", "mount point", "role"]);
        for n in &r.nodes {
            t.row(vec![
                n.address.clone(),
                n.node.clone(),
                n.mount_point.clone(),
                n.role.clone(),
            ]);
        }
        print!("{}", t.render());
    }
    Ok(())
}

pub fn umount(home: &Home, name: &str) -> Result<()> {
    let request = Request::Umount {
        name: name.to_string(),
    };
    match call(home, &request)? {
        Reply::Unmounted {
            checkpoint_error: None,
        } => {
            println!("File system {name} is unmounted");
            Ok(())
        }
        Reply::Unmounted {
            checkpoint_error: Some(e),
        } => Err(crate::output::PartlyDone {
            code: 2,
            message: format!(
                "file system {name} is unmounted, but its final checkpoint could not be \
                 written ({e}); nothing acknowledged by fsync is lost: the next mount \
                 replays the recovery log (see `tessera disk ls {name}` if it fails too)"
            ),
        }
        .into()),
        other => Err(super::unexpected(other)),
    }
}

fn kb(bytes: u64) -> u64 {
    bytes >> 10
}

fn df_text(df: &DfReport) -> String {
    let w = df
        .disks
        .iter()
        .map(|d| d.nsd_name.len())
        .max()
        .unwrap_or(0)
        .max(15);
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(format!(
        "{:<w$} {:>13} {:>8} {:<8} {:<5} {:>20} {:>19}",
        "disk", "disk size", "failure", "holds", "holds", "free in KB", "free in KB"
    ));
    line(format!(
        "{:<w$} {:>13} {:>8} {:<8} {:<5} {:>20} {:>19}",
        "name", "in KB", "group", "metadata", "data", "in full blocks", "in fragments"
    ));
    line(format!(
        "{} {} {} {} {} {} {}",
        "-".repeat(w),
        "-".repeat(13),
        "-".repeat(8),
        "-".repeat(8),
        "-".repeat(5),
        "-".repeat(20),
        "-".repeat(19)
    ));
    let free = |full: u64, frag: u64, size: u64| {
        format!(
            "{:>13} {:>6} {:>12} {:>6}",
            kb(full),
            percent(full, size),
            kb(frag),
            percent(frag, size)
        )
    };
    for pool in &df.pools {
        line(format!("Disks in storage pool: {}", pool.pool));
        for d in df.disks.iter().filter(|d| d.pool == pool.pool) {
            line(format!(
                "{:<w$} {:>13} {:>8} {:<8} {:<5} {}",
                d.nsd_name,
                kb(d.size_bytes),
                d.failure_group,
                yes_no(d.holds_metadata),
                yes_no(d.holds_data),
                free(d.free_full_block_bytes, d.free_fragment_bytes, d.size_bytes)
            ));
        }
        line(format!(
            "{:<w$} {} {:23} {} {}",
            "",
            "-".repeat(13),
            "",
            "-".repeat(20),
            "-".repeat(19)
        ));
        line(format!(
            "{:<w$} {:>13} {:23} {}",
            "(pool total)",
            kb(pool.size_bytes),
            "",
            free(
                pool.free_full_block_bytes,
                pool.free_fragment_bytes,
                pool.size_bytes
            )
        ));
        line(String::new());
    }
    let size: u64 = df.pools.iter().map(|p| p.size_bytes).sum();
    let full: u64 = df.pools.iter().map(|p| p.free_full_block_bytes).sum();
    let frag: u64 = df.pools.iter().map(|p| p.free_fragment_bytes).sum();
    line(format!(
        "{:<w$} {} {:23} {} {}",
        "",
        "=".repeat(13),
        "",
        "=".repeat(20),
        "=".repeat(19)
    ));
    line(format!(
        "{:<w$} {:>13} {:23} {}",
        "(total)",
        kb(size),
        "",
        free(full, frag, size)
    ));
    line(String::new());
    line("Inode Information".into());
    line("-----------------".into());
    line(format!(
        "Number of used inodes:      {:>12}",
        df.inodes.used
    ));
    line(format!(
        "Number of free inodes:      {:>12}",
        df.inodes.free
    ));
    line(format!(
        "Number of allocated inodes: {:>12}",
        df.inodes.allocated
    ));
    line(format!("Maximum number of inodes:   {:>12}", df.inodes.max));
    out
}

fn df_machine(name: &str, df: &DfReport) {
    let y = YRecord::new("df", "nsd");
    println!(
        "{}",
        y.header(&[
            "fileSystem",
            "nsdName",
            "storagePool",
            "diskSizeKB",
            "failureGroup",
            "metadata",
            "data",
            "freeBlocksKB",
            "freeBlocksPct",
            "freeFragmentsKB",
            "freeFragmentsPct",
        ])
    );
    let pct = |part: u64, whole: u64| (part * 100).checked_div(whole).unwrap_or(0).to_string();
    for d in &df.disks {
        println!(
            "{}",
            y.data(&[
                name.into(),
                d.nsd_name.clone(),
                d.pool.clone(),
                kb(d.size_bytes).to_string(),
                d.failure_group.to_string(),
                yes_no(d.holds_metadata).into(),
                yes_no(d.holds_data).into(),
                kb(d.free_full_block_bytes).to_string(),
                pct(d.free_full_block_bytes, d.size_bytes),
                kb(d.free_fragment_bytes).to_string(),
                pct(d.free_fragment_bytes, d.size_bytes),
            ])
        );
    }
    let y = YRecord::new("df", "poolTotal");
    println!(
        "{}",
        y.header(&[
            "fileSystem",
            "poolName",
            "poolSizeKB",
            "freeBlocksKB",
            "freeFragmentsKB"
        ])
    );
    for p in &df.pools {
        println!(
            "{}",
            y.data(&[
                name.into(),
                p.pool.clone(),
                kb(p.size_bytes).to_string(),
                kb(p.free_full_block_bytes).to_string(),
                kb(p.free_fragment_bytes).to_string(),
            ])
        );
    }
    let y = YRecord::new("df", "inode");
    println!(
        "{}",
        y.header(&[
            "fileSystem",
            "usedInodes",
            "freeInodes",
            "allocatedInodes",
            "maxInodes"
        ])
    );
    println!(
        "{}",
        y.data(&[
            name.into(),
            df.inodes.used.to_string(),
            df.inodes.free.to_string(),
            df.inodes.allocated.to_string(),
            df.inodes.max.to_string(),
        ])
    );
}

pub fn df(home: &Home, name: &str, machine: bool) -> Result<()> {
    let df = match call(
        home,
        &Request::Df {
            name: name.to_string(),
        },
    )? {
        Reply::Df(df) => df,
        other => return Err(unexpected(other)),
    };
    if machine {
        df_machine(name, &df);
    } else {
        print!("{}", df_text(&df));
    }
    Ok(())
}

pub fn fsck(home: &Home, name: &str, repair: bool) -> Result<()> {
    let report = match call(
        home,
        &Request::Fsck {
            name: name.to_string(),
            repair,
        },
    )? {
        Reply::Fsck(r) => r,
        other => return Err(unexpected(other)),
    };
    for p in &report.problems {
        println!("  {p}");
    }
    println!();
    println!("{:>12} inodes", report.inodes);
    println!("{:>12} directories", report.directories);
    println!("{:>12} blocks in use", report.blocks);
    println!("{:>12} problems found", report.problems.len());
    if repair {
        println!("{:>12} repaired", report.repaired);
    }
    let remaining = if repair {
        (report.problems.len() as u64).saturating_sub(report.repaired)
    } else {
        report.problems.len() as u64
    };
    if remaining > 0 {
        let hint = if repair {
            "see the list above"
        } else {
            "run `tessera fsck DEVICE -y` to repair"
        };
        bail!("file system {name} has {remaining} problem(s); {hint}");
    }
    println!("File system {name} is clean.");
    Ok(())
}
