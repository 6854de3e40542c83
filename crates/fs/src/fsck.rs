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

use crate::descriptor::{read_descriptor, write_descriptor};
use crate::error::FsResult;
use crate::inode::{Attr, DirEntry, FileKind, Ino, ROOT_INO};
use crate::meta::{Change, MetaState};
use crate::shard_tree::{DirItem, Item, RecordContent};

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
    /// Data blocks with fewer copies than their file asks for (written while a failure
    /// group was down): not a problem, `restripe -r` restores them.
    #[serde(default)]
    pub ill_replicated_blocks: u64,
    /// With two metadata copies (`-m 2`): metadata pages, log and map regions with one
    /// copy, or both in one failure group (written while a group was down or full), and
    /// map chunks whose two copies differ: not a problem, `restripe -r` gives them their
    /// second copy apart.
    #[serde(default)]
    pub ill_replicated_metadata: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

pub fn fsck(disks: Vec<(NsdId, Arc<dyn BlockDevice>)>, repair: bool) -> FsResult<FsckReport> {
    let slot_disks = disks.clone();
    let all: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|(_, d)| d.clone()).collect();
    let desc = read_descriptor(&all)?;
    let disk_set = crate::recovery::match_devices(&desc, &disks)?;
    let mut rec = crate::recovery::recover(&desc, &disk_set, crate::recovery::MapSource::Verify)?;
    let devices = disk_set.all();
    let mut report = FsckReport {
        replayed_records: rec.replayed_records as u64,
        problems: rec.conflicts.clone(),
        ..Default::default()
    };
    report
        .problems
        .extend(crate::slot::check_records(&desc, &disk_set));
    report.problems.extend(rec.slot_problems.iter().cloned());
    if let Some(loss) = &rec.log_loss {
        report
            .problems
            .push(crate::recovery::log_loss_problem(&desc.name, 0, loss));
    }
    let fixes = check(&desc, &mut rec.state, &mut report)?;
    report.ill_replicated_metadata = ill_replicated_metadata(&desc, &mut rec.state)?
        + crate::alloc_map::chunks_with_unequal_copies(&desc, &devices, &rec.alloc);
    // The stored allocation map against the one rebuilt from the metadata (after replay, both).
    let map_problems = match &rec.stored_map {
        None => Vec::new(),
        Some(Err(why)) => vec![format!("allocation map unreadable: {why}")],
        Some(Ok(stored)) => crate::alloc_map::compare(&desc, stored, &rec.alloc),
    };
    report.problems.extend(map_problems.iter().cloned());
    for region in desc.slot_regions() {
        report.problems.extend(crate::recovery::slot_map_problems(
            &desc,
            &disk_set,
            region.slot,
        ));
    }
    let map_fix = !map_problems.is_empty();
    let log_loss = rec.log_loss.is_some();
    if repair && rec.conflicts.is_empty() {
        // Slot logs that lost records start afresh first: their slots' fixes below are
        // applied through mounts of those slots, which refuse such a log.
        for &slot in &rec.slot_log_losses {
            match restart_slot_log(slot_disks.clone(), slot) {
                Ok(()) => report.repaired += 1,
                Err(e) => report.problems.push(format!(
                    "not repaired: the log of owner slot {slot} could not be started afresh ({e})"
                )),
            }
        }
    }
    if repair && (!fixes.is_empty() || map_fix || log_loss) && rec.conflicts.is_empty() {
        // Shards other slots own are repaired through their owners' logs: a checkpoint
        // here would supersede pages their records still name.
        for shard in std::mem::take(&mut rec.foreign_shards) {
            rec.state.release_shard(shard);
        }
        let mut elsewhere: std::collections::BTreeMap<u32, Vec<Change>> = Default::default();
        let mut repaired = report.repaired + u64::from(map_fix);
        for fix in &fixes {
            match rec.state.apply(fix) {
                Ok(freed) => {
                    repaired += 1;
                    for extent in freed {
                        let _ = rec.alloc.free(extent);
                    }
                }
                Err(crate::FsError::ShardElsewhere { shard }) => elsewhere
                    .entry(desc.shard_owner(shard as usize).slot)
                    .or_default()
                    .push(fix.clone()),
                Err(e) => return Err(e),
            }
        }
        let here = repaired;
        for (slot, fixes) in elsewhere {
            match repair_in_slot(slot_disks.clone(), slot, &fixes) {
                Ok(()) => repaired += fixes.len() as u64,
                Err(e) => report.problems.push(format!(
                    "not repaired: {} fix(es) of shards owner slot {slot} holds ({e})",
                    fixes.len()
                )),
            }
        }
        if log_loss {
            // An empty transaction, committed: the log's next page, the damaged one, is
            // written over as the first page of a new session, so no later open takes what
            // lies beyond it for committed records (`Journal::open_accepting_loss`).
            let record = postcard::to_stdvec(&Vec::<Change>::new()).expect("changes serialize");
            rec.journal.append(&record)?;
            rec.journal.commit_all()?;
            repaired += 1;
        }
        report.repaired = repaired;
        if here == 0 && !log_loss {
            return Ok(report); // Nothing of slot 0's to write.
        }
        // The rebuilt map is stored whole (recovery marked every chunk changed).
        let prepared = crate::checkpoint::prepare(
            &desc,
            0,
            &disk_set,
            &mut rec.alloc,
            &mut rec.state,
            &[],
            &[],
        )?;
        crate::checkpoint::write_pages(&desc, &disk_set, &prepared)?;
        let mut new_desc = desc.clone();
        crate::alloc_map::write_chunks(
            &mut new_desc,
            &disk_set,
            &rec.map_slots,
            prepared.generation,
            &prepared.map,
        )?;
        new_desc.generation += 1;
        new_desc.checkpoint.replay_from = rec.journal.appended_lsn();
        prepared.name_in(&mut new_desc);
        let slots: Vec<_> = devices.iter().cloned().map(Some).collect();
        write_descriptor(&new_desc, &slots)?;
    }
    Ok(report)
}

/// Starts the log of owner slot `slot`, which lost committed records to a damaged page,
/// afresh at that page: the slot mounted accepting the loss (what precedes the page
/// replayed), an empty transaction committed over the damaged page as the first page of a
/// new session, and the slot unmounted (its checkpoint written).
fn restart_slot_log(disks: Vec<(NsdId, Arc<dyn BlockDevice>)>, slot: u32) -> FsResult<()> {
    let owner = crate::FileSystem::mount_slot_with(disks, slot, true)?;
    owner.log_repairs(Vec::new())?;
    // Durable before the checkpoint names a replay point inside the page it wrote over.
    owner.commit_all()?;
    owner.unmount()
}

/// Applies `fixes` of shards owner slot `slot` holds as that slot's owner would: mounted
/// here (its log replayed over its record), the fixes logged as one of its transactions,
/// unmounted (its checkpoint written), so that its record names the repaired pages.
fn repair_in_slot(
    disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
    slot: u32,
    fixes: &[Change],
) -> FsResult<()> {
    let owner = crate::FileSystem::mount_slot(disks, slot)?;
    owner.log_repairs(fixes.to_vec())?;
    owner.unmount()
}

/// Pages, log and map regions of a `-m 2` file system whose copies are not in two failure
/// groups (0 with one metadata copy, where that is the design).
fn ill_replicated_metadata(desc: &crate::FsDescriptor, state: &mut MetaState) -> FsResult<u64> {
    let Some(copies) = &desc.metadata_copies else {
        return Ok(0);
    };
    let group_of = |disk: u16| {
        desc.disks
            .iter()
            .find(|d| d.index == disk)
            .map(|d| d.failure_group)
    };
    let apart = |a: u16, b: Option<u16>| b.is_some_and(|b| group_of(a) != group_of(b));
    // A slot region whose copies share a group, or whose log has a copy that lacks records.
    let mut ill = desc
        .slot_regions()
        .iter()
        .filter(|r| {
            !apart(r.disk, r.second.map(|s| s.disk))
                || r.second.is_some_and(|s| s.log_behind.is_some())
        })
        .count() as u64;
    let (store, trees) = state.trees_mut();
    for tree in trees {
        store
            .visit_pointers(tree, &mut |p, _| {
                let disk = |a: tessera_meta::PageAddr| crate::checkpoint::disk_addr(a).disk;
                if !apart(disk(p.addr), p.mirror.map(disk)) {
                    ill += 1;
                }
            })
            .map_err(crate::shard_tree::meta_err)?;
    }
    if !apart(desc.log.disk, Some(copies.log_disk)) || copies.log_behind.is_some() {
        ill += 1;
    }
    if let Some(map) = &desc.alloc_map {
        for r in map.regions.iter().filter(|r| r.bytes > 0) {
            let second = copies.map_regions.iter().find(|m| m.disk == r.disk);
            if !apart(r.on_disk, second.map(|m| m.on_disk)) {
                ill += 1;
            }
        }
    }
    Ok(ill)
}

/// What the scan keeps of an inode.
struct Seen {
    attr: Attr,
    parent: Option<Ino>,
    xattrs: bool,
}

/// Checks the structure; returns the changes that would repair what it found.
fn check(
    desc: &crate::FsDescriptor,
    state: &mut MetaState,
    report: &mut FsckReport,
) -> FsResult<Vec<Change>> {
    let mut inodes: HashMap<Ino, Seen> = HashMap::new();
    let mut entries: Vec<(Ino, Vec<u8>, DirItem)> = Vec::new();
    let mut homeless: Vec<String> = Vec::new();
    let mut hidden: Vec<(Ino, Vec<u8>)> = Vec::new();
    let sectors_per_sub = u64::from(desc.sub_block_size) / crate::inode::CSUM_SECTOR_BYTES;
    let group_of = |disk: u16| {
        desc.disks
            .iter()
            .find(|d| d.index == disk)
            .map(|d| d.failure_group)
    };
    // The copies the inode whose record the scan saw last asks for (records come before
    // their blocks).
    let mut asks: (Ino, usize) = (0, 1);
    state.scan(&mut |item| {
        match item {
            Item::Inode(rec) => {
                asks = (rec.attr.ino, usize::from(rec.copies));
                let parent = match rec.content {
                    RecordContent::Dir { parent } => Some(parent),
                    _ => None,
                };
                inodes.insert(
                    rec.attr.ino,
                    Seen {
                        attr: rec.attr,
                        parent,
                        xattrs: rec.xattrs,
                    },
                );
            }
            Item::Dirent { dir, item } => {
                if inodes.get(&dir).is_none_or(|s| s.parent.is_none()) {
                    homeless.push(format!(
                        "directory entries of inode {dir}, which is not a directory"
                    ));
                }
                entries.push((dir, item.name.clone(), item));
            }
            Item::Block { ino, index, block } => {
                if !inodes.contains_key(&ino) {
                    homeless.push(format!("block {index} of missing inode {ino}"));
                }
                report.blocks += 1;
                let groups: Vec<Option<i32>> =
                    block.extents().map(|e| group_of(e.addr.disk)).collect();
                let mut distinct = groups.clone();
                distinct.sort_unstable();
                distinct.dedup();
                if groups.contains(&None) {
                    report.problems.push(format!(
                        "inode {ino} block {index}: a copy on a disk the file system lacks"
                    ));
                } else if distinct.len() != groups.len() {
                    report.problems.push(format!(
                        "inode {ino} block {index}: two copies in one failure group"
                    ));
                }
                if asks.0 == ino && block.copy_count() < asks.1 {
                    report.ill_replicated_blocks += 1;
                }
                let want = u64::from(block.extent.sub_blocks) * sectors_per_sub;
                if block.crcs.len() as u64 != want {
                    report.problems.push(format!(
                        "inode {ino} block {index}: {} checksums for {want} sectors",
                        block.crcs.len()
                    ));
                }
            }
            Item::Xattr { ino, name, chunk } => match inodes.get(&ino) {
                None => homeless.push(format!("extended attributes of missing inode {ino}")),
                Some(s) if !s.xattrs && chunk == 0 => hidden.push((ino, name)),
                Some(_) => {}
            },
            Item::Header(_) | Item::Orphan(_) => {}
        }
        Ok(())
    })?;
    homeless.dedup();
    report.problems.extend(homeless);
    let mut fixes = Vec::new();
    // Setting the attribute again sets the record's flag, so that it is seen again.
    for (ino, name) in hidden {
        report.problems.push(format!(
            "inode {ino} has extended attribute {:?} but its record says it has none",
            String::from_utf8_lossy(&name)
        ));
        if let Some(value) = state.stored_xattr(ino, &name)? {
            fixes.push(Change::SetXattr { ino, name, value });
        }
    }
    report.inodes = inodes.len() as u64;
    report.directories = inodes.values().filter(|s| s.parent.is_some()).count() as u64;
    // A directory named in two directories (a move across owners cut by a crash keeps
    // the name its parent pointer names, or the first).
    let mut kept_name: HashMap<Ino, (Ino, &[u8])> = HashMap::new();
    for (dir, name, entry) in &entries {
        if let Some(t) = inodes.get(&entry.ino) {
            if t.attr.kind == FileKind::Directory && entry.kind == FileKind::Directory {
                let slot = kept_name.entry(entry.ino).or_insert((*dir, name));
                if t.parent == Some(*dir) {
                    *slot = (*dir, name);
                }
            }
        }
    }
    let mut refs: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    for (dir, name, entry) in &entries {
        let name_text = String::from_utf8_lossy(name);
        match inodes.get(&entry.ino) {
            Some(t)
                if t.attr.kind == FileKind::Directory
                    && entry.kind == FileKind::Directory
                    && kept_name.get(&entry.ino) != Some(&(*dir, name.as_slice())) =>
            {
                report.problems.push(format!(
                    "directory {} is named in two directories: its name {name_text:?} in \
                     directory {dir} goes",
                    entry.ino
                ));
                fixes.push(Change::DirRemove {
                    dir: *dir,
                    name: name.clone(),
                });
            }
            None => {
                report.problems.push(format!(
                    "directory {dir} entry {name_text:?} points to missing inode {}",
                    entry.ino
                ));
                fixes.push(Change::DirRemove {
                    dir: *dir,
                    name: name.clone(),
                });
            }
            Some(t) if t.attr.kind != entry.kind => {
                report.problems.push(format!(
                    "directory {dir} entry {name_text:?} has the wrong file type"
                ));
            }
            Some(t) => {
                *refs.entry(entry.ino).or_default() += 1;
                if t.attr.kind == FileKind::Directory {
                    *subdirs.entry(*dir).or_default() += 1;
                    if t.parent != Some(*dir) {
                        report.problems.push(format!(
                            "directory {} has a wrong parent pointer",
                            entry.ino
                        ));
                        fixes.push(Change::SetParent {
                            dir: entry.ino,
                            parent: *dir,
                        });
                    }
                }
            }
        }
    }
    check_dir_sizes(&inodes, &entries, report, &mut fixes);
    check_links(state, &inodes, &refs, &subdirs, report, &mut fixes)?;
    Ok(fixes)
}

/// A directory's size is the bytes its entries take ([`crate::meta::dirent_bytes`]). Its
/// repair goes first: the repairs after it that remove or add entries change the size
/// from the right value.
fn check_dir_sizes(
    inodes: &HashMap<Ino, Seen>,
    entries: &[(Ino, Vec<u8>, crate::shard_tree::DirItem)],
    report: &mut FsckReport,
    fixes: &mut Vec<Change>,
) {
    let mut held: HashMap<Ino, u64> = HashMap::new();
    for (dir, name, _) in entries {
        *held.entry(*dir).or_default() += crate::meta::dirent_bytes(name.len());
    }
    let mut dirs: Vec<&Seen> = inodes
        .values()
        .filter(|s| s.attr.kind == FileKind::Directory && s.attr.nlink > 0)
        .collect();
    dirs.sort_by_key(|s| s.attr.ino);
    let mut sizes = Vec::new();
    for seen in dirs {
        let dir = seen.attr.ino;
        let size = held.get(&dir).copied().unwrap_or(0);
        if seen.attr.size != size {
            report.problems.push(format!(
                "directory {dir} has size {} but its entries take {size} bytes",
                seen.attr.size
            ));
            sizes.push(Change::DirSize { dir, size });
        }
    }
    fixes.splice(0..0, sizes);
}

fn check_links(
    state: &mut MetaState,
    inodes: &HashMap<Ino, Seen>,
    refs: &HashMap<Ino, u32>,
    subdirs: &HashMap<Ino, u32>,
    report: &mut FsckReport,
    fixes: &mut Vec<Change>,
) -> FsResult<()> {
    let mut lost = Vec::new();
    let mut order: Vec<&Seen> = inodes.values().collect();
    order.sort_by_key(|s| s.attr.ino);
    for seen in order {
        let attr = seen.attr;
        let ino = attr.ino;
        let linked = refs.get(&ino).copied().unwrap_or(0);
        if attr.nlink == 0 {
            report.orphans += 1;
            continue;
        }
        let expected = if attr.kind == FileKind::Directory {
            2 + subdirs.get(&ino).copied().unwrap_or(0)
        } else {
            linked
        };
        if ino != ROOT_INO && linked == 0 {
            report
                .problems
                .push(format!("inode {ino} is not referenced by any directory"));
            lost.push(attr);
            continue;
        }
        if attr.nlink != expected {
            report.problems.push(format!(
                "inode {ino} has link count {} but {expected} references",
                attr.nlink
            ));
            let mut attr = attr;
            attr.nlink = expected;
            fixes.push(Change::PutAttr(attr));
        }
    }
    if lost.is_empty() {
        return Ok(());
    }
    // Unreferenced inodes are kept, not freed: they go to /lost+found under their number.
    let existing = state.lookup(ROOT_INO, b"lost+found")?.map(|e| e.ino);
    let mut taken: HashSet<u64> = HashSet::new();
    let lf = match existing {
        Some(ino) => ino,
        None => {
            let ino = state.allocate_ino(state.shard_of(ROOT_INO));
            let mut attr = state.attr(ROOT_INO)?;
            attr.ino = ino;
            attr.perm = 0o700;
            attr.nlink = 2;
            fixes.push(Change::PutAttr(attr));
            fixes.push(Change::SetParent {
                dir: ino,
                parent: ROOT_INO,
            });
            let cookie = state.new_cookie(ROOT_INO, b"lost+found")?;
            fixes.push(Change::DirInsert {
                dir: ROOT_INO,
                name: b"lost+found".to_vec(),
                entry: DirEntry {
                    ino,
                    kind: FileKind::Directory,
                    cookie,
                },
            });
            ino
        }
    };
    for mut attr in lost {
        let name = format!("#{}", attr.ino).into_bytes();
        // lost+found may not exist yet (its creation is among the fixes): cookies are
        // chosen here, avoiding the ones this repair already gave out.
        let mut cookie = match existing {
            Some(_) => state.new_cookie(lf, &name)?,
            None => crate::shard_tree::first_cookie(&name),
        };
        while !taken.insert(cookie) {
            cookie += 1;
        }
        fixes.push(Change::DirInsert {
            dir: lf,
            name,
            entry: DirEntry {
                ino: attr.ino,
                kind: attr.kind,
                cookie,
            },
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
    Ok(())
}

#[cfg(test)]
mod dir_size_tests {
    use std::path::Path;

    use tessera_drive::FileDrive;
    use tessera_nsd::descriptor::NsdDescriptor;
    use tessera_nsd::DiskUsage;

    use super::*;
    use crate::namespace::Caller;
    use crate::{DiskSpec, FileSystem, FormatOptions};

    /// A directory made before directories had a size says 0 with entries in it: fsck names
    /// it, `fsck -y` sets its size from its entries, and a second check is clean.
    #[test]
    fn a_directory_whose_size_disagrees_with_its_entries_is_found_and_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let id = NsdId::random();
        let open = || -> Vec<(NsdId, Arc<dyn BlockDevice>)> {
            vec![(id, Arc::new(FileDrive::open(Path::new(&path)).unwrap()))]
        };
        let disks = open();
        let nd = NsdDescriptor {
            id,
            name: "nsd0".into(),
            device_bytes: 64 << 20,
            created_unix: 0,
            cluster_id: [0; 16],
        };
        tessera_nsd::descriptor::write_descriptor(disks[0].1.as_ref(), &nd).unwrap();
        let spec = DiskSpec {
            nsd_name: "nsd0".into(),
            nsd_id: id,
            usage: DiskUsage::DataAndMetadata,
            failure_group: 1,
            pool: "system".into(),
            device: disks[0].1.clone(),
        };
        let opts = FormatOptions {
            block_size: 256 << 10,
            log_bytes: 8 << 20,
            max_inodes: 10_000,
            ..Default::default()
        };
        crate::format(vec![spec], &opts, &mut |_| {}).unwrap();
        drop(disks);

        let fs = FileSystem::mount(open()).unwrap();
        let root = Caller { uid: 0, gid: 0 };
        let d = fs
            .create_node(ROOT_INO, b"old", FileKind::Directory, 0o755, 0, root, None)
            .unwrap();
        for name in [&b"one"[..], b"three"] {
            fs.create_node(d.ino, name, FileKind::Regular, 0o644, 0, root, None)
                .unwrap();
        }
        let right = crate::meta::dirent_bytes(3) + crate::meta::dirent_bytes(5);
        assert_eq!(fs.getattr(d.ino).unwrap().size, right);
        // As a file system made before sizes left it.
        fs.log_repairs(vec![Change::DirSize {
            dir: d.ino,
            size: 0,
        }])
        .unwrap();
        assert_eq!(fs.getattr(d.ino).unwrap().size, 0);
        fs.unmount().unwrap();
        drop(fs);

        let found = fsck(open(), false).unwrap();
        let want = format!(
            "directory {} has size 0 but its entries take {right} bytes",
            d.ino
        );
        assert!(found.problems.contains(&want), "{:?}", found.problems);
        assert_eq!(found.problems.len(), 1, "{:?}", found.problems);
        let fixed = fsck(open(), true).unwrap();
        assert!(fixed.repaired >= 1, "{fixed:?}");
        let again = fsck(open(), false).unwrap();
        assert!(again.is_clean(), "{:?}", again.problems);
        let fs = FileSystem::mount(open()).unwrap();
        assert_eq!(fs.getattr(d.ino).unwrap().size, right);
        fs.unmount().unwrap();
    }
}
