//! Running management rules [mmapplypolicy]: MIGRATE, DELETE and LIST over the files of a
//! mounted file system.
//!
//! One pass over the namespace (directories depth-first from the root, each file once
//! however many links it has) gives every regular file's attributes; each file goes to the
//! first management rule whose FROM POOL it is in and whose WHERE it matches, as in GPFS.
//! A rule with `THRESHOLD(high, low)` runs only when its pool is at least `high` percent
//! full, and takes its files in decreasing WEIGHT until the pool would be down to `low`; a
//! MIGRATE with `LIMIT(pct)` moves no file that would fill its target past `pct` percent.
//! Then, unless only testing, the chosen files are acted on, in rule order:
//!
//! - **MIGRATE**: the file's pool becomes the target (`Change::SetPool`, logged), then its
//!   blocks are moved there one by one as a restripe moves them (copied, verified, remapped
//!   by one logged change each). A crash in between leaves a file whose blocks are partly
//!   in its old pool, *ill-placed* in GPFS's word, readable all along; `restripe -p` moves
//!   the rest. With `-I defer` only the pool changes, and `restripe -p` moves the data later.
//! - **DELETE**: the file's name is removed (its last link frees it, or its last close).
//! - **LIST**: the file's path goes into the named list, which the caller prints.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_alloc::PoolId;
use tessera_policy::{Action, FileAttrs, Rule, ROOT_FILESET};

use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{FileKind, Ino, ROOT_INO};

/// What `policy apply` does with the files it chooses [mmapplypolicy -I].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ApplyMode {
    /// Choose and report; change nothing.
    Test,
    /// Change each migrated file's pool, leave its data for `restripe -p`.
    Defer,
    /// Do everything now.
    Yes,
}

/// What one rule chose (and, unless testing, did).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RuleOutcome {
    pub rule: String,
    pub action: String,
    pub files: u64,
    pub kb: u64,
    /// Why the rule chose nothing, when a threshold or limit held it back.
    pub note: Option<String>,
}

/// What a `policy apply` did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ApplyReport {
    pub files_scanned: u64,
    pub rules: Vec<RuleOutcome>,
    pub migrated: u64,
    pub bytes_moved: u64,
    pub deleted: u64,
    /// Each list's name and the paths in it.
    pub lists: Vec<(String, Vec<String>)>,
    /// Files that could not be acted on (changed or gone meanwhile), with why.
    pub errors: Vec<String>,
    pub stopped: bool,
}

/// Where a `policy apply` is: the phase, and files done of the phase's total (0 when not
/// known yet).
#[derive(Clone, Debug)]
pub struct ApplyProgress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

/// A file a rule chose.
struct Candidate {
    ino: Ino,
    parent: Ino,
    name: Vec<u8>,
    path: String,
    kb: u64,
    weight: f64,
}

/// Errors kept in a report: enough to say what went wrong, not one per file of a big tree.
const ERRORS_KEPT: usize = 100;

impl FileSystem {
    /// Runs the MIGRATE, DELETE and LIST rules of `text` over every file [mmapplypolicy].
    /// The policy is checked as `policy change` checks it; it is not installed.
    pub fn apply_policy(
        &self,
        text: &str,
        mode: ApplyMode,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&ApplyProgress),
    ) -> FsResult<ApplyReport> {
        self.owner_here("applying a policy")?;
        self.manager_here("applying a policy")?;
        self.check_fenced()?;
        let desc = self.descriptor();
        let policy = crate::placement::check_policy(&desc, text)?;
        let now = crate::inode::Timestamp::now().secs;
        let rules: Vec<&Rule> = policy
            .rules()
            .iter()
            .filter(|r| {
                matches!(
                    r.action,
                    Action::Migrate { .. } | Action::Delete { .. } | Action::List { .. }
                )
            })
            .collect();
        let mut report = ApplyReport::default();
        let mut chosen: Vec<Vec<Candidate>> = rules.iter().map(|_| Vec::new()).collect();

        // The scan: directories depth-first, every regular file once.
        let mut seen: HashSet<Ino> = HashSet::new();
        let mut dirs: Vec<(Ino, String)> = vec![(ROOT_INO, String::new())];
        while let Some((dir, path)) = dirs.pop() {
            if stop.load(Ordering::Relaxed) {
                report.stopped = true;
                return Ok(report);
            }
            let mut after = 0;
            loop {
                let listing = match self.readdir(dir, after) {
                    Ok(l) => l,
                    // Removed while the scan ran.
                    Err(FsError::NotFound | FsError::NotDir) => break,
                    Err(e) => return Err(e),
                };
                let Some(last) = listing.entries.last() else {
                    break;
                };
                after = last.0;
                for (_, ino, kind, name) in listing.entries {
                    if name == b"." || name == b".." {
                        continue;
                    }
                    let child = format!("{path}/{}", String::from_utf8_lossy(&name));
                    match kind {
                        FileKind::Directory => dirs.push((ino, child)),
                        FileKind::Regular if seen.insert(ino) => {
                            report.files_scanned += 1;
                            let Ok(attr) = self.getattr(ino) else {
                                continue;
                            };
                            // Asked of the file's owner: another slot's files too.
                            let pool = self.pool_name(self.routed(ino, |ns| ns.file_pool(ino))?);
                            let kb = self.allocated_bytes(ino) / 1024;
                            let f = FileAttrs {
                                name: String::from_utf8_lossy(&name).into_owned(),
                                path_name: child.clone(),
                                fileset_name: ROOT_FILESET.into(),
                                pool_name: pool.clone(),
                                user_id: attr.uid,
                                group_id: attr.gid,
                                mode: attr.mode(),
                                nlink: attr.nlink,
                                inode: ino,
                                file_size: attr.size,
                                kb_allocated: kb,
                                access_time: attr.atime.secs,
                                modification_time: attr.mtime.secs,
                                change_time: attr.ctime.secs,
                                creation_time: attr.crtime.secs,
                            };
                            let first = rules.iter().position(|r| {
                                r.from_pool().is_none_or(|from| from.pool == pool)
                                    && r.matches(&f, now)
                            });
                            if let Some(i) = first {
                                chosen[i].push(Candidate {
                                    ino,
                                    parent: dir,
                                    name: name.clone(),
                                    path: child,
                                    kb,
                                    weight: rules[i].weight(&f, now),
                                });
                            }
                            if report.files_scanned.is_multiple_of(1024) {
                                progress(&ApplyProgress {
                                    phase: "scanning files",
                                    done: report.files_scanned,
                                    total: 0,
                                });
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        progress(&ApplyProgress {
            phase: "scanning files",
            done: report.files_scanned,
            total: report.files_scanned,
        });

        // Thresholds: a rule runs only above HIGH and takes the heaviest files down to LOW.
        let mut used_kb = self.pool_use_kb()?;
        for (rule, files) in rules.iter().zip(chosen.iter_mut()) {
            let mut note = None;
            if let Some(from) = rule.from_pool() {
                if let Some(t) = from.threshold {
                    let (used, total) = used_kb.get(&from.pool).copied().unwrap_or((0, 0));
                    let pct = (used * 100).checked_div(total).unwrap_or(0);
                    if pct < u64::from(t.high) {
                        note = Some(format!(
                            "pool '{}' is {pct}% full, below THRESHOLD({},{})",
                            from.pool, t.high, t.low
                        ));
                        files.clear();
                    } else {
                        files.sort_by(|a, b| b.weight.total_cmp(&a.weight));
                        let target = total * u64::from(t.low) / 100;
                        let mut left = used;
                        let mut keep = 0;
                        for c in files.iter() {
                            if left <= target {
                                break;
                            }
                            left = left.saturating_sub(c.kb);
                            keep += 1;
                        }
                        files.truncate(keep);
                    }
                }
            }
            if let Action::Migrate {
                to,
                limit: Some(limit),
                ..
            } = &rule.action
            {
                // LIMIT(pct): no file goes to a pool it would fill past pct, as in GPFS.
                // Files go in decreasing WEIGHT and the first that does not fit ends the
                // rule's list, so a lighter file never takes the room of a heavier one.
                files.sort_by(|a, b| b.weight.total_cmp(&a.weight));
                let (used, total) = used_kb.get(to).copied().unwrap_or((0, 0));
                let room = total * u64::from(*limit) / 100;
                let mut filled = used;
                let fit = files
                    .iter()
                    .take_while(|c| {
                        filled += c.kb;
                        filled <= room
                    })
                    .count();
                let held = files.len() - fit;
                files.truncate(fit);
                if held > 0 {
                    note = Some(format!(
                        "{held} file(s) left where they are: pool '{to}' would be fuller than \
                         LIMIT({limit}) ({}% full now)",
                        (used * 100).checked_div(total).unwrap_or(0)
                    ));
                }
            }
            if let Action::Migrate { to, .. } = &rule.action {
                for c in files.iter() {
                    if let Some(u) = used_kb.get_mut(to) {
                        u.0 += c.kb;
                    }
                    if let Some(from) = rule.from_pool() {
                        if let Some(u) = used_kb.get_mut(&from.pool) {
                            u.0 = u.0.saturating_sub(c.kb);
                        }
                    }
                }
            }
            report.rules.push(RuleOutcome {
                rule: rule.label(),
                action: match rule.action {
                    Action::Migrate { .. } => "MIGRATE",
                    Action::Delete { .. } => "DELETE",
                    _ => "LIST",
                }
                .into(),
                files: files.len() as u64,
                kb: files.iter().map(|c| c.kb).sum(),
                note,
            });
        }

        // Lists are reported in every mode.
        for (rule, files) in rules.iter().zip(chosen.iter()) {
            if let Action::List { list, .. } = &rule.action {
                let paths = files.iter().map(|c| c.path.clone());
                match report.lists.iter_mut().find(|(l, _)| l == list) {
                    Some((_, v)) => v.extend(paths),
                    None => report.lists.push((list.clone(), paths.collect())),
                }
            }
        }
        if mode == ApplyMode::Test {
            return Ok(report);
        }

        let total: u64 = rules
            .iter()
            .zip(chosen.iter())
            .filter(|(r, _)| !matches!(r.action, Action::List { .. }))
            .map(|(_, f)| f.len() as u64)
            .sum();
        let mut done = 0;
        for (rule, files) in rules.iter().zip(chosen) {
            for c in files {
                if stop.load(Ordering::Relaxed) {
                    report.stopped = true;
                    return Ok(report);
                }
                let result = match &rule.action {
                    Action::Migrate { to, .. } => {
                        let pool = desc
                            .pools
                            .iter()
                            .position(|p| p == to)
                            .and_then(|p| PoolId::try_from(p).ok())
                            .expect("checked against the pools");
                        let move_data = mode == ApplyMode::Yes;
                        self.routed(c.ino, |ns| ns.migrate_file(c.ino, pool, move_data))
                            .map(|bytes| {
                                report.migrated += 1;
                                report.bytes_moved += bytes;
                            })
                    }
                    Action::Delete { .. } => self.remove(c.parent, &c.name, false).map(|()| {
                        report.deleted += 1;
                    }),
                    _ => continue,
                };
                match result {
                    Ok(()) => {}
                    // Gone or changed since the scan: nothing to do for it.
                    Err(e @ (FsError::NotFound | FsError::IsDir | FsError::NotDir)) => {
                        if report.errors.len() < ERRORS_KEPT {
                            report.errors.push(format!("{}: {e}", c.path));
                        }
                    }
                    Err(e) => return Err(e),
                }
                done += 1;
                progress(&ApplyProgress {
                    phase: "migrating and deleting",
                    done,
                    total,
                });
            }
        }
        self.sync_own()?;
        Ok(report)
    }

    /// KiB used and in all, per pool name, as `tessera df` counts them (an occupancy an
    /// administrator can compare with a THRESHOLD).
    fn pool_use_kb(&self) -> FsResult<std::collections::HashMap<String, (u64, u64)>> {
        Ok(self
            .df()?
            .pools
            .into_iter()
            .map(|p| {
                let free = p.free_full_block_bytes + p.free_fragment_bytes;
                (p.pool, ((p.size_bytes - free) / 1024, p.size_bytes / 1024))
            })
            .collect())
    }

    /// Moves file `ino` to pool `pool`: its recorded pool first (so new blocks go there at
    /// once), then, with `move_data`, every block outside the pool. Returns the bytes
    /// copied.
    pub(crate) fn migrate_file_here(
        &self,
        ino: Ino,
        pool: PoolId,
        move_data: bool,
    ) -> FsResult<u64> {
        {
            let mut m = self.owner().meta.lock();
            if m.state.attr(ino)?.kind != FileKind::Regular {
                return Err(FsError::NotFound);
            }
            if m.state.pool_of(ino)? != Some(pool) {
                self.log(&mut m, vec![crate::meta::Change::SetPool { ino, pool }])?;
            }
        }
        if !move_data {
            return Ok(0);
        }
        self.place_blocks_of(ino)
    }
}
