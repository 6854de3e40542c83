//! Offline consistency check and repair (mmfsck): the file system must not be mounted.
//!
//! It recovers the metadata the way mount does (checkpoint plus log replay), then checks the
//! structure: every block referenced once and inside its disk, directory entries pointing at
//! live inodes of the right kind, link counts, parent pointers, reachability, checksum
//! vectors that match their extents. Blocks past the end of a file are legitimate
//! (fallocate with FALLOC_FL_KEEP_SIZE). With repair, fixes are applied and written as a new checkpoint.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessera_drive::BlockDevice;
use tessera_nsd::NsdId;

use crate::descriptor::{read_descriptor, write_descriptor, Checkpoint};
use crate::error::FsResult;
use crate::inode::{Content, DirEntry, FileKind, Ino, ROOT_INO};
use crate::meta::{Change, MetaState};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckReport {
    pub problems: Vec<String>,
    pub repaired: u64,
    pub inodes: u64,
    pub directories: u64,
    pub blocks: u64,
    pub replayed_records: u64,
    /// Inodes unlinked while open; mount reclaims them, so they are not problems.
    pub orphans: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

pub fn fsck(disks: Vec<(NsdId, Arc<dyn BlockDevice>)>, repair: bool) -> FsResult<FsckReport> {
    let all: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|(_, d)| d.clone()).collect();
    let desc = read_descriptor(&all)?;
    let devices = crate::recovery::match_devices(&desc, &disks)?;
    let mut rec = crate::recovery::recover(&desc, &devices)?;
    let mut report = FsckReport {
        replayed_records: rec.replayed_records as u64,
        problems: rec.conflicts.clone(),
        ..Default::default()
    };
    let fixes = check(&desc, &rec.state, &mut report);
    if repair && !fixes.is_empty() {
        for fix in &fixes {
            rec.state.apply(fix)?;
        }
        let (mut alloc, conflicts) = crate::recovery::rebuild_alloc(&desc, &rec.state);
        if conflicts.is_empty() {
            let images = crate::checkpoint::format_images(&desc, &devices, &mut alloc, &rec.state)?;
            let mut new_desc = desc.clone();
            new_desc.generation += 1;
            new_desc.checkpoint = Checkpoint {
                replay_from: rec.journal.appended_lsn(),
                shards: images,
            };
            let slots: Vec<_> = devices.iter().cloned().map(Some).collect();
            write_descriptor(&new_desc, &slots)?;
            report.repaired = fixes.len() as u64;
        }
    }
    Ok(report)
}

/// Checks the structure; returns the changes that would repair what it found.
fn check(desc: &crate::FsDescriptor, state: &MetaState, report: &mut FsckReport) -> Vec<Change> {
    let mut fixes = Vec::new();
    let mut refs: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    let inodes: Vec<_> = state
        .shards
        .iter()
        .flat_map(|s| s.inodes.values())
        .collect();
    report.inodes = inodes.len() as u64;
    let sectors_per_sub = u64::from(desc.sub_block_size) / crate::inode::CSUM_SECTOR_BYTES;
    for inode in &inodes {
        let ino = inode.attr.ino;
        match &inode.content {
            Content::Dir(dir) => {
                report.directories += 1;
                for (name, entry) in &dir.entries {
                    let name_text = String::from_utf8_lossy(name);
                    match state.get(entry.ino) {
                        None => {
                            report.problems.push(format!(
                                "directory {ino} entry {name_text:?} points to missing inode {}",
                                entry.ino
                            ));
                            fixes.push(Change::DirRemove {
                                dir: ino,
                                name: name.clone(),
                            });
                        }
                        Some(t) if t.attr.kind != entry.kind => {
                            report.problems.push(format!(
                                "directory {ino} entry {name_text:?} has the wrong file type"
                            ));
                        }
                        Some(t) => {
                            *refs.entry(entry.ino).or_default() += 1;
                            if t.attr.kind == FileKind::Directory {
                                *subdirs.entry(ino).or_default() += 1;
                                if t.dir().map(|d| d.parent) != Some(ino) {
                                    report.problems.push(format!(
                                        "directory {} has a wrong parent pointer",
                                        entry.ino
                                    ));
                                    fixes.push(Change::SetParent {
                                        dir: entry.ino,
                                        parent: ino,
                                    });
                                }
                            }
                        }
                    }
                }
            }
            Content::Blocks(blocks) => {
                for (index, b) in blocks {
                    report.blocks += 1;
                    let want = u64::from(b.extent.sub_blocks) * sectors_per_sub;
                    if b.crcs.len() as u64 != want {
                        report.problems.push(format!(
                            "inode {ino} block {index}: {} checksums for {want} sectors",
                            b.crcs.len()
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    check_links(state, &inodes, &refs, &subdirs, report, &mut fixes);
    fixes
}

fn check_links(
    state: &MetaState,
    inodes: &[&crate::inode::Inode],
    refs: &HashMap<Ino, u32>,
    subdirs: &HashMap<Ino, u32>,
    report: &mut FsckReport,
    fixes: &mut Vec<Change>,
) {
    let mut lost = Vec::new();
    for inode in inodes {
        let ino = inode.attr.ino;
        let linked = refs.get(&ino).copied().unwrap_or(0);
        if inode.attr.nlink == 0 {
            report.orphans += 1;
            continue;
        }
        let expected = if inode.attr.kind == FileKind::Directory {
            2 + subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            linked
        };
        if ino != ROOT_INO && linked == 0 {
            report
                .problems
                .push(format!("inode {ino} is not referenced by any directory"));
            lost.push(inode.attr);
            continue;
        }
        if inode.attr.nlink != expected {
            report.problems.push(format!(
                "inode {ino} has link count {} but {expected} references",
                inode.attr.nlink
            ));
            let mut attr = inode.attr;
            attr.nlink = expected;
            fixes.push(Change::PutAttr(attr));
        }
    }
    if lost.is_empty() {
        return;
    }
    // Unreferenced inodes are kept, not freed: they go to /lost+found under their number.
    let root = state.get(ROOT_INO).and_then(|r| r.dir());
    let existing = root
        .and_then(|r| r.entries.get(&b"lost+found"[..]))
        .map(|e| e.ino);
    let mut cookie = root.map_or(3, |r| r.next_cookie);
    let lf = existing.unwrap_or_else(|| {
        let max = state
            .shards
            .iter()
            .flat_map(|s| s.inodes.keys())
            .max()
            .copied()
            .unwrap_or(1);
        let ino = max + 1;
        let mut attr = state.get(ROOT_INO).expect("root exists").attr;
        attr.ino = ino;
        attr.perm = 0o700;
        attr.nlink = 2;
        fixes.push(Change::PutAttr(attr));
        fixes.push(Change::SetParent {
            dir: ino,
            parent: ROOT_INO,
        });
        let entry = DirEntry {
            ino,
            kind: FileKind::Directory,
            cookie,
        };
        cookie += 1;
        fixes.push(Change::DirInsert {
            dir: ROOT_INO,
            name: b"lost+found".to_vec(),
            entry,
        });
        ino
    });
    let seen: HashSet<Ino> = HashSet::new();
    let mut lf_cookie = state
        .get(lf)
        .and_then(|i| i.dir())
        .map_or(3, |d| d.next_cookie);
    for mut attr in lost {
        if seen.contains(&attr.ino) {
            continue;
        }
        let entry = DirEntry {
            ino: attr.ino,
            kind: attr.kind,
            cookie: lf_cookie,
        };
        lf_cookie += 1;
        let name = format!("#{}", attr.ino).into_bytes();
        fixes.push(Change::DirInsert {
            dir: lf,
            name,
            entry,
        });
        if attr.kind == FileKind::Directory {
            fixes.push(Change::SetParent {
                dir: attr.ino,
                parent: lf,
            });
        } else {
            attr.nlink = 1;
            fixes.push(Change::PutAttr(attr));
        }
    }
    let _ = cookie;
}
