//! `mount`, `umount`, `df` and `fsck` [mmmount, mmumount, mmdf, mmfsck].

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use super::lifecycle::Plan;
use super::nsd::absolute;
use super::{call, unexpected};
use crate::cli::NodeSelectArgs;
use crate::config::Home;
use crate::output::{percent, yes_no, YRecord};
use crate::rpc::{Reply, Request};
use tessera_cluster::state::NodeRecord;
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

/// How long one node's part of `mount -a` or `umount -a` may take through the remote
/// shell: a mount that takes a dead owner's file system over replays its log first.
const NODE_MOUNT_WAIT: Duration = Duration::from_secs(600);

/// Which nodes have `name` mounted: the owner (file system manager) first, then its
/// clients, by node name.
fn mounted_nodes(home: &Home, name: &str) -> Result<Vec<crate::rpc::MountedNode>> {
    Ok(mount_rows(home, name)?
        .into_iter()
        .flat_map(|r| r.nodes)
        .collect())
}

fn mount_rows(home: &Home, name: &str) -> Result<Vec<crate::rpc::MountRow>> {
    let request = Request::MountList {
        name: Some(name.to_string()),
    };
    match call(home, &request)? {
        Reply::Mounts(rows) => Ok(rows),
        other => Err(unexpected(other)),
    }
}

/// Runs one command on the local node (`local`, through this node's daemon) and on
/// `remote` nodes (through the remote shell) at once; returns the names of those whose
/// part failed.
fn on_nodes(
    plan: &Plan,
    local: Option<(&NodeRecord, &dyn Fn() -> Result<()>)>,
    remote: &[NodeRecord],
    args: &[&str],
) -> Result<Vec<String>> {
    let (remote_results, local_result) = std::thread::scope(|scope| {
        let remote_results = scope.spawn(|| plan.run_on(remote, args, NODE_MOUNT_WAIT));
        let local_result = local.map(|(node, run)| (node, run()));
        (
            remote_results.join().expect("remote runs do not panic"),
            local_result,
        )
    });
    let mut failed: Vec<String> = remote
        .iter()
        .zip(remote_results?)
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| n.name.clone())
        .collect();
    if let Some((node, Err(e))) = local_result {
        println!("tessera {}: {}: failed: {e:#}", args[0], node.name);
        failed.insert(0, node.name.clone());
    }
    Ok(failed)
}

/// `mount DEVICE -a|-N NODES` [mmmount -a|-N]: on every node selected that does not have
/// it mounted yet. When no node has it mounted, the first of them (this one if selected)
/// mounts it alone first and owns its metadata; the others then join as its clients at
/// once.
pub fn mount_nodes(
    home: &Home,
    name: &str,
    mount_point: Option<&Path>,
    select: &NodeSelectArgs,
) -> Result<()> {
    if !select.all && select.nodes.is_none() {
        return mount(home, name, mount_point);
    }
    let plan = Plan::new(home, select)?;
    let mount_point = match mount_point {
        Some(p) => Some(absolute(p)?.display().to_string()),
        None => None,
    };
    let mut args = vec!["mount", name];
    if let Some(p) = &mount_point {
        args.extend(["-T", p.as_str()]);
    }
    let mounted: Vec<String> = mounted_nodes(home, name)?
        .into_iter()
        .map(|n| n.node)
        .collect();
    let todo = |n: &NodeRecord| {
        let already = mounted.contains(&n.name);
        if already {
            println!("tessera mount: {}: {name} is mounted already", n.name);
        }
        !already
    };
    let mut local = plan.local.clone().filter(todo);
    let mut remote: Vec<NodeRecord> = plan.remote.iter().filter(|n| todo(n)).cloned().collect();
    let mount_here = || mount(home, name, mount_point.as_deref().map(Path::new));
    let mut failed = Vec::new();
    let total = usize::from(local.is_some()) + remote.len();
    if mounted.is_empty() {
        // The first mount owns the metadata; the others need it to be there.
        let first = if let Some(node) = local.take() {
            on_nodes(&plan, Some((&node, &mount_here)), &[], &args)?
        } else if !remote.is_empty() {
            let node = remote.remove(0);
            on_nodes(&plan, None, std::slice::from_ref(&node), &args)?
        } else {
            Vec::new()
        };
        if !first.is_empty() {
            bail!(
                "the first mount of {name}, on {}, failed; the other nodes were not asked",
                first.join(", ")
            );
        }
    }
    let local = local
        .as_ref()
        .map(|n| (n, &mount_here as &dyn Fn() -> Result<()>));
    failed.extend(on_nodes(&plan, local, &remote, &args)?);
    if !failed.is_empty() {
        // A node whose own mount (at its start) was made meanwhile has it as asked.
        let now: Vec<String> = mounted_nodes(home, name)?
            .into_iter()
            .map(|n| n.node)
            .collect();
        failed.retain(|node| {
            let mounted = now.contains(node);
            if mounted {
                println!("tessera mount: {node}: {name} is mounted already");
            }
            !mounted
        });
    }
    if failed.is_empty() {
        return Ok(());
    }
    bail!(
        "{name} was not mounted on {} of {total} nodes: {}",
        failed.len(),
        failed.join(", ")
    )
}

/// `umount DEVICE -a|-N NODES` [mmumount -a|-N]: on every node selected that has it
/// mounted, the clients first and at once, then the node that owns the metadata (which
/// does not unmount under live clients). A node whose client mount is being made is a
/// client here: its unmount waits for the mount, so none is left mounted behind the
/// command.
pub fn umount_nodes(home: &Home, name: &str, select: &NodeSelectArgs) -> Result<()> {
    if !select.all && select.nodes.is_none() {
        return umount(home, name);
    }
    let plan = Plan::new(home, select)?;
    let rows = mount_rows(home, name)?;
    let mounted: Vec<crate::rpc::MountedNode> =
        rows.iter().flat_map(|r| r.nodes.iter().cloned()).collect();
    let mounting: Vec<String> = rows.into_iter().flat_map(|r| r.mounting).collect();
    let owner = mounted.first().map(|n| n.node.clone());
    let is_mounted =
        |n: &NodeRecord| mounted.iter().any(|m| m.node == n.name) || mounting.contains(&n.name);
    let args = ["umount", name];
    let umount_here = || umount(home, name);
    let mut failed = Vec::new();
    let mut total = 0;
    for owners in [false, true] {
        let pick = |n: &NodeRecord| is_mounted(n) && (owner.as_deref() == Some(&n.name)) == owners;
        let local = plan.local.as_ref().filter(|n| pick(n));
        let remote: Vec<NodeRecord> = plan.remote.iter().filter(|n| pick(n)).cloned().collect();
        total += usize::from(local.is_some()) + remote.len();
        let local = local.map(|n| (n, &umount_here as &dyn Fn() -> Result<()>));
        failed.extend(on_nodes(&plan, local, &remote, &args)?);
    }
    if total == 0 {
        println!("tessera umount: {name} is not mounted on any node selected");
    }
    if !failed.is_empty() {
        // A node whose mount, being made when asked, failed meanwhile has nothing mounted.
        let now: Vec<String> = mount_rows(home, name)?
            .into_iter()
            .flat_map(|r| r.nodes.into_iter().map(|n| n.node).chain(r.mounting))
            .collect();
        failed.retain(|node| {
            let unmounted = mounting.contains(node) && !now.contains(node);
            if unmounted {
                println!("tessera umount: {node}: {name} is not mounted (its mount failed)");
            }
            !unmounted
        });
    }
    if failed.is_empty() {
        return Ok(());
    }
    bail!(
        "{name} was not unmounted on {} of {total} nodes: {}",
        failed.len(),
        failed.join(", ")
    )
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
        Reply::MountCancelled => {
            println!(
                "File system {name} was not mounted yet (its mount at start was still being \
                 tried); it is not mounted now and will not be tried again"
            );
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
    if !df.unanswered_slots.is_empty() {
        let slots: Vec<String> = df.unanswered_slots.iter().map(u32::to_string).collect();
        line(String::new());
        line(format!(
            "Owner slot(s) {} did not answer: their regions' free space shows as used and \
             their inodes are not counted (`tessera mount ls` names their nodes)",
            slots.join(", ")
        ));
    }
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
    if report.ill_replicated_blocks > 0 {
        println!(
            "{:>12} blocks with fewer copies than their file asks for (`tessera restripe {name} -r` \
             restores them)",
            report.ill_replicated_blocks
        );
    }
    if report.ill_replicated_metadata > 0 {
        println!(
            "{:>12} metadata pages or regions with one copy, or both in one failure group \
             (`tessera restripe {name} -r` gives them their second copy)",
            report.ill_replicated_metadata
        );
    }
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
            "see the list above".to_string()
        } else {
            format!("run `tessera fsck {name} -y` to repair")
        };
        bail!("file system {name} has {remaining} problem(s); {hint}");
    }
    println!("File system {name} is clean.");
    Ok(())
}
