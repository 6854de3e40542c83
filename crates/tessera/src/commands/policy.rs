//! `tessera policy change|ls` [mmchpolicy, mmlspolicy] and `tessera file attr ls`
//! [mmlsattr -L].

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::{call, unexpected};
use crate::cli::{PolicyApplyArgs, PolicyChangeArgs};
use crate::config::Home;
use crate::output::Table;
use crate::rpc::{Reply, Request};
use tessera_fs::policy_run::ApplyMode;

/// `tessera policy change DEVICE -P FILE [-I yes|test]` [mmchpolicy].
pub fn change(home: &Home, a: &PolicyChangeArgs) -> Result<()> {
    let test = match a.install.to_ascii_lowercase().as_str() {
        "yes" => false,
        "test" => true,
        other => bail!("-I {other}: expected yes (install) or test (check only)"),
    };
    let text = if a.policy_file.as_os_str() == "DEFAULT" {
        None
    } else {
        let text = std::fs::read_to_string(&a.policy_file)
            .with_context(|| format!("cannot read the policy file {}", a.policy_file.display()))?;
        Some(text)
    };
    let removing = text.is_none();
    let summary = match call(
        home,
        &Request::PolicyChange {
            name: a.device.clone(),
            text,
            test,
        },
    )? {
        Reply::PolicyChanged(s) => s,
        other => return Err(unexpected(other)),
    };
    let counts = format!(
        "{} rules: {} placement, {} migration, {} deletion, {} list",
        summary.rules,
        summary.placement_rules,
        summary.migrate_rules,
        summary.delete_rules,
        summary.list_rules
    );
    match (removing, test) {
        (true, true) => println!("-P DEFAULT is valid: it removes the policy of {}", a.device),
        (true, false) => println!(
            "Policy of {} removed: new files go to the default data pool.",
            a.device
        ),
        (false, true) => println!(
            "Policy file {} is valid for {} ({counts}); not installed (-I test).",
            a.policy_file.display(),
            a.device
        ),
        (false, false) => println!(
            "Policy file {} installed for {} ({counts}); it places files created from now on.",
            a.policy_file.display(),
            a.device
        ),
    }
    Ok(())
}

/// `tessera policy apply DEVICE -P FILE [-I yes|test|defer]` [mmapplypolicy].
pub fn apply(home: &Home, a: &PolicyApplyArgs) -> Result<()> {
    let mode = match a.action.to_ascii_lowercase().as_str() {
        "yes" => ApplyMode::Yes,
        "test" => ApplyMode::Test,
        "defer" => ApplyMode::Defer,
        other => bail!("-I {other}: expected yes, test or defer"),
    };
    let text = std::fs::read_to_string(&a.policy_file)
        .with_context(|| format!("cannot read the policy file {}", a.policy_file.display()))?;
    let report = match call(
        home,
        &Request::PolicyApply {
            name: a.device.clone(),
            text,
            mode,
        },
    )? {
        Reply::PolicyApplied(r) => r,
        other => return Err(unexpected(other)),
    };
    println!(
        "{}: {} files scanned{}.",
        a.device,
        report.files_scanned,
        if mode == ApplyMode::Test {
            " (-I test: nothing changed)"
        } else {
            ""
        }
    );
    let mut t = Table::new(&["rule", "action", "files chosen", "KB chosen", "note"]).right(&[2, 3]);
    for r in &report.rules {
        t.row(vec![
            r.rule.clone(),
            r.action.clone(),
            r.files.to_string(),
            r.kb.to_string(),
            r.note.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", t.render());
    if mode != ApplyMode::Test {
        println!(
            "{} files migrated ({:.1} MiB of data moved{}), {} deleted.",
            report.migrated,
            report.bytes_moved as f64 / 1048576.0,
            if mode == ApplyMode::Defer {
                "; -I defer: tessera restripe -p moves the rest"
            } else {
                ""
            },
            report.deleted
        );
    }
    for e in &report.errors {
        println!("skipped: {e}");
    }
    for (list, paths) in &report.lists {
        println!("LIST '{list}': {} files", paths.len());
        for p in paths {
            println!("  {p}");
        }
    }
    if report.stopped {
        println!("Stopped before the end; run the same command again to continue.");
    }
    Ok(())
}

/// `tessera policy ls DEVICE` [mmlspolicy -L].
pub fn ls(home: &Home, device: &str) -> Result<()> {
    match call(
        home,
        &Request::PolicyLs {
            name: device.to_string(),
        },
    )? {
        Reply::Policy(Some(text)) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
        }
        Reply::Policy(None) => println!(
            "No policy is installed for {device}: new files go to its default data pool \
             (tessera policy change {device} -P FILE installs one)."
        ),
        other => return Err(unexpected(other)),
    }
    Ok(())
}

/// The Tessera mount that holds `path`: its file-system name and mount point.
fn tessera_mount_of(path: &Path) -> Result<(String, PathBuf)> {
    let mounts =
        std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    let mut best: Option<(String, PathBuf)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 3 || f[2] != "fuse.tessera" {
            continue;
        }
        // /proc/self/mounts escapes spaces and the like as octal.
        let point = PathBuf::from(f[1].replace("\\040", " ").replace("\\011", "\t"));
        let longer = best
            .as_ref()
            .is_none_or(|(_, b)| point.as_os_str().len() > b.as_os_str().len());
        if path.starts_with(&point) && longer {
            best = Some((f[0].to_string(), point));
        }
    }
    best.ok_or_else(|| {
        anyhow!(
            "{} is not on a mounted Tessera file system (see tessera mount)",
            path.display()
        )
    })
}

/// `tessera file attr ls PATH...` [mmlsattr -L].
pub fn file_attr_ls(home: &Home, paths: &[PathBuf]) -> Result<()> {
    let mut first = true;
    for path in paths {
        let full = std::fs::canonicalize(path)
            .with_context(|| format!("{}: no such file or directory", path.display()))?;
        let meta = std::fs::symlink_metadata(&full)
            .with_context(|| format!("cannot stat {}", full.display()))?;
        let (fs, _) = tessera_mount_of(&full)?;
        let attr = match call(
            home,
            &Request::FileAttr {
                name: fs.clone(),
                ino: meta.ino(),
            },
        )? {
            Reply::FileAttr(a) => a,
            other => return Err(unexpected(other)),
        };
        if !first {
            println!();
        }
        first = false;
        let blocks = if attr.blocks_per_disk.is_empty() {
            "none (empty, or held in the inode)".to_string()
        } else {
            attr.blocks_per_disk
                .iter()
                .map(|(nsd, n)| format!("{nsd} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let rows = [
            ("file name:", full.display().to_string()),
            ("file system:", fs),
            ("storage pool name:", attr.pool),
            ("fileset name:", tessera_policy::ROOT_FILESET.to_string()),
            (
                "data replication:",
                format!(
                    "{}{}",
                    attr.replication,
                    if attr.ill_replicated {
                        " (ill-replicated: run tessera restripe -r)"
                    } else {
                        ""
                    }
                ),
            ),
            ("data blocks per NSD:", blocks),
        ];
        for (k, v) in rows {
            println!("{k:<22}{v}");
        }
    }
    Ok(())
}

/// `tessera file attr set --replication N PATH...` [mmchattr -r].
pub fn file_attr_set(home: &Home, replication: u32, paths: &[PathBuf]) -> Result<()> {
    let copies = u8::try_from(replication)
        .ok()
        .filter(|c| (1..=3).contains(c))
        .ok_or_else(|| anyhow!("--replication {replication}: give 1, 2 or 3"))?;
    let mut devices = Vec::new();
    for path in paths {
        let full = std::fs::canonicalize(path)
            .with_context(|| format!("{}: no such file or directory", path.display()))?;
        let meta = std::fs::symlink_metadata(&full)
            .with_context(|| format!("cannot stat {}", full.display()))?;
        if !meta.is_file() {
            bail!(
                "{}: not a regular file (only file data has copies)",
                full.display()
            );
        }
        let (fs, _) = tessera_mount_of(&full)?;
        call(
            home,
            &Request::FileReplicationSet {
                name: fs.clone(),
                ino: meta.ino(),
                copies,
            },
        )?;
        println!("{}: {copies} data copies", full.display());
        if !devices.contains(&fs) {
            devices.push(fs);
        }
    }
    for fs in devices {
        println!("`tessera restripe {fs} -r` gives the existing blocks that many copies.");
    }
    Ok(())
}
