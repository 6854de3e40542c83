//! Checkpoints of the shard trees. A checkpoint gives every changed metadata page a new
//! place in the system pool (copy-on-write, see `tessera-meta`), writes the pages, and only
//! then does the caller write a descriptor naming the new roots and the log position they
//! hold; the pages the previous checkpoint used and this one replaced are freed after that
//! descriptor is durable. What a checkpoint writes is what changed since the last one.

use std::sync::Arc;

use tessera_alloc::{AllocKind, AllocMap, DiskAddr, Extent};
use tessera_drive::AlignedBuf;
use tessera_meta::{MetaError, MetaStore, PageAddr, PageFormat, PagePlace, PageReader};

use crate::descriptor::{FsDescriptor, ShardRoot};
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};
use crate::meta::MetaState;

/// Smallest metadata page: room for a 4 MiB block's reference (a checksum per 4 KiB sector)
/// as one B+tree item, which may take half a page.
const MIN_PAGE_BYTES: u32 = 16 * 1024;
/// Metadata pages in memory per mounted file system, clean and changed together: 1 GiB of
/// 16 KiB pages (a leaf in memory is its page payload plus 4 bytes an entry). With 64 MiB,
/// a cold `stat` of a million files in one directory (about 10,000 pages of entries and
/// records, looked up in hash order) read a page for most names and ran at a tenth of the
/// rate at 100,000 files; with 512 MiB a cold stat of ten million ran at half the rate of
/// 100,000 and with 1 GiB at 0.94 (RESULTS.md); the daemon stays within 2 GiB.
pub(crate) const DEFAULT_CACHE_PAGES: usize = 65536;
/// Changed pages held before the background flusher starts a checkpoint (a quarter of the
/// default pool; `pagepool` sets it to a quarter of the pool).
pub(crate) const DIRTY_PAGES_SOFT: usize = DEFAULT_CACHE_PAGES / 4;
/// Changed pages held before a change waits for a checkpoint itself (half the pool).
pub(crate) const DIRTY_PAGES_HARD: usize = 2 * DIRTY_PAGES_SOFT;
/// The flusher's threshold with the smallest `pagepool`: 4 MiB of 16 KiB pages, so that a
/// tiny pool does not turn every few changes into a checkpoint.
pub(crate) const DIRTY_PAGES_MIN: usize = 256;

/// The metadata page size of a file system with these block and sub-block sizes: at least
/// 16 KiB, at least 1/256 of a block (a block reference's checksums), a whole number of
/// sub-blocks.
pub(crate) fn page_bytes(block_size: u32, sub_block_size: u32) -> u32 {
    MIN_PAGE_BYTES.max(block_size / 256).max(sub_block_size)
}

pub(crate) fn page_addr(a: DiskAddr) -> PageAddr {
    assert!(a.sub_block < 1 << 48, "sub-block number fits 48 bits");
    PageAddr((u64::from(a.disk) << 48) | a.sub_block)
}

pub(crate) fn disk_addr(p: PageAddr) -> DiskAddr {
    DiskAddr {
        disk: (p.0 >> 48) as u16,
        sub_block: p.0 & ((1 << 48) - 1),
    }
}

pub(crate) fn page_extent(desc: &FsDescriptor, p: PageAddr) -> Extent {
    Extent {
        addr: disk_addr(p),
        sub_blocks: desc.checkpoint.page_bytes / desc.sub_block_size,
    }
}

/// Reads metadata pages from the file system's disks.
struct DiskPages {
    disks: Arc<DiskSet>,
    data_start: u64,
    sub_block_bytes: u64,
    page_bytes: usize,
}

impl PageReader for DiskPages {
    fn read_page(&self, addr: PageAddr, page: &mut [u8]) -> std::io::Result<()> {
        let a = disk_addr(addr);
        if self.disks.is_down(a.disk) {
            // The other copy answers (metadata replicated) or the read fails by name.
            return Err(std::io::Error::other(format!(
                "metadata page {addr} is on NSD {}, which is down",
                self.disks.name(a.disk)
            )));
        }
        let dev = self.disks.try_get(a.disk).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "metadata page {addr} names disk {}, which the file system lacks",
                    a.disk
                ),
            )
        })?;
        // One aligned buffer per thread, kept: a fresh one per page read cost a zeroing and
        // its page faults each time (a tenth of a mount's CPU, which reads hundreds).
        thread_local! {
            static BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
        }
        BUF.with(|cell| {
            let mut kept = cell.borrow_mut();
            if kept.as_ref().is_none_or(|b| b.len() != self.page_bytes) {
                *kept = Some(AlignedBuf::zeroed(self.page_bytes));
            }
            let buf = kept.as_mut().expect("set above");
            dev.read_at(buf, self.data_start + a.sub_block * self.sub_block_bytes)?;
            page.copy_from_slice(buf);
            Ok(())
        })
    }

    fn repair_page(&self, addr: PageAddr, page: &[u8], why: &str) -> bool {
        let a = disk_addr(addr);
        let name = self.disks.name(a.disk);
        if self.disks.is_down(a.disk) {
            tracing::warn!(
                "metadata page {addr} read from its second copy: NSD {name} is down;                  `tessera restripe -r` rewrites its copies there once it is back"
            );
            return false;
        }
        let result = self.disks.get(a.disk).write_at(
            &AlignedBuf::from_slice(page),
            self.data_start + a.sub_block * self.sub_block_bytes,
        );
        match result {
            Ok(()) => {
                tracing::warn!(
                    "metadata page {addr} on NSD {name} was damaged ({why}); rewritten from \
                     its other copy"
                );
                true
            }
            Err(e) => {
                tracing::error!(
                    "metadata page {addr} on NSD {name} is damaged ({why}) and could not be \
                     rewritten from its other copy: {e}"
                );
                false
            }
        }
    }
}

/// The page store of a file system, its next checkpoint being `generation`.
pub(crate) fn new_store(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    generation: u64,
) -> FsResult<MetaStore> {
    let page = desc.checkpoint.page_bytes as usize;
    let owner = u64::from_le_bytes(desc.fs_uuid[..8].try_into().expect("8 bytes"));
    let mut format = PageFormat::new(page, owner).map_err(|e| FsError::Corrupt(e.to_string()))?;
    if desc.metadata_copies.is_some() {
        format = format.with_mirrors();
    }
    let reader = Arc::new(DiskPages {
        disks: Arc::clone(disks),
        data_start: tessera_nsd::layout::data_start_bytes(u64::from(desc.block_size)),
        sub_block_bytes: u64::from(desc.sub_block_size),
        page_bytes: page,
    });
    Ok(MetaStore::new(
        format,
        reader,
        DEFAULT_CACHE_PAGES,
        generation,
    ))
}

/// The metadata of every shard: those the owner map gives slot 0 from the checkpoint `desc`
/// names, the others from their slots' records. Returns the shards slot 0 does not hold
/// (to be released by a mount once recovery has counted their blocks) and why any of them
/// could not be opened.
pub(crate) fn open_state(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
) -> FsResult<(MetaState, Vec<usize>, Vec<String>)> {
    if desc.checkpoint.roots.len() != desc.shard_count as usize {
        return Err(FsError::Corrupt(format!(
            "descriptor lists {} shard roots for {} shards",
            desc.checkpoint.roots.len(),
            desc.shard_count
        )));
    }
    let store = new_store(desc, disks, desc.checkpoint.generation + 1)?;
    let mut roots: Vec<Option<tessera_meta::PagePtr>> =
        desc.root_ptrs().into_iter().map(Some).collect();
    let (foreign, problems) = crate::slot::foreign_roots(desc, disks);
    for (shard, root) in &foreign {
        roots[*shard] = *root;
    }
    let state = MetaState::open(store, &roots)?;
    Ok((
        state,
        foreign.into_iter().map(|(s, _)| s).collect(),
        problems,
    ))
}

/// A checkpoint whose pages have their places but are not written yet.
pub(crate) struct Prepared {
    pub generation: u64,
    pub pages: Vec<tessera_meta::CheckpointPage>,
    pub roots: Vec<ShardRoot>,
    /// The roots' second addresses (`NO_SECOND_COPY` for none), with metadata replicated.
    pub root_mirrors: Vec<u64>,
    /// Pages of earlier checkpoints this one no longer reaches: free once it is durable.
    pub superseded: Vec<Extent>,
    /// The chunks of the allocation map this checkpoint stores (`crate::alloc_map`).
    pub map: Vec<crate::alloc_map::ChunkImage>,
    /// The shards this checkpoint holds (their roots are in `roots`).
    pub held: Vec<usize>,
    /// One past the highest disk index of the allocation map snapshotted: every disk whose
    /// chunks it stores or has stored (an owner slot's record says so, `SlotRecord`).
    pub disks_covered: u32,
}

impl Prepared {
    /// Names this checkpoint's roots in `desc` (the caller then writes it).
    pub fn name_in(&self, desc: &mut FsDescriptor) {
        desc.checkpoint.generation = self.generation;
        desc.checkpoint.roots = self.roots.clone();
        if let Some(copies) = &mut desc.metadata_copies {
            copies.root_mirrors = self.root_mirrors.clone();
        }
    }
}

/// Places every changed page and takes the changed chunks of the allocation map (the part
/// of a checkpoint that needs the metadata lock). `unrecorded` are extents the map holds used
/// that the metadata does not reference as of this checkpoint (allocated but not logged,
/// released but not durable); the stored map leaves them free, as it does the pages this
/// checkpoint supersedes.
pub(crate) fn prepare(
    desc: &FsDescriptor,
    slot: u32,
    disks: &DiskSet,
    alloc: &mut AllocMap,
    state: &mut MetaState,
    unrecorded: &[Extent],
    released: &[usize],
) -> FsResult<Prepared> {
    let subs = desc.checkpoint.page_bytes / desc.sub_block_size;
    let mirrored = desc.metadata_copies.is_some();
    state.write_headers()?;
    state.unsettled_into_tree()?;
    let held = state.held_shards();
    let state_shards = state.shard_count() as usize;
    let (store, mut trees) = state.trees_mut();
    let mut single = 0usize;
    let cp = store
        .checkpoint(&mut trees, &mut |n| {
            let mut out: Vec<PagePlace> = Vec::with_capacity(n);
            let (mut prev, mut prev_mirror) = (None, None);
            let up = |d: tessera_alloc::DiskIndex| !disks.is_down(d);
            let give_back = |alloc: &mut AllocMap, out: &[PagePlace]| {
                for place in out {
                    for a in std::iter::once(place.addr).chain(place.mirror) {
                        let _ = alloc.free(Extent {
                            addr: disk_addr(a),
                            sub_blocks: subs,
                        });
                    }
                }
            };
            for _ in 0..n {
                let first = match alloc.alloc_fragment_on(0, AllocKind::Metadata, subs, prev, &up) {
                    Ok(e) => e,
                    Err(e) => {
                        give_back(alloc, &out);
                        return Err(MetaError::NoSpace(e.to_string()));
                    }
                };
                prev = Some(first.addr);
                // The second copy in another failure group; with none up (or none with
                // room) the page has one copy until `restripe -r` gives it its second.
                let group = disks.failure_group(first.addr.disk);
                let other = |d: tessera_alloc::DiskIndex| up(d) && disks.failure_group(d) != group;
                let mirror = mirrored
                    .then(|| {
                        alloc
                            .alloc_fragment_on(0, AllocKind::Metadata, subs, prev_mirror, &other)
                            .ok()
                    })
                    .flatten();
                if mirrored && mirror.is_none() {
                    single += 1;
                }
                prev_mirror = mirror.map(|m| m.addr).or(prev_mirror);
                out.push(PagePlace {
                    addr: page_addr(first.addr),
                    mirror: mirror.map(|m| page_addr(m.addr)),
                });
            }
            Ok(out)
        })
        .map_err(|e| match e {
            MetaError::NoSpace(_) => FsError::NoSpace {
                pool: "system".into(),
                what: "metadata pages of a checkpoint",
            },
            other => FsError::Corrupt(other.to_string()),
        })?;
    if single > 0 {
        tracing::warn!(
            "{}: {single} metadata page(s) of this checkpoint have one copy: no metadata disk              of another failure group is up or has room; `tessera restripe {} -r` gives them              their second copy once one is",
            desc.name,
            desc.name
        );
    }
    // Every shard keeps a place in the descriptor's list; one this owner does not hold keeps
    // what it had (the owner map, not this list, says where its live root is).
    let mut roots = desc.checkpoint.roots.clone();
    // (At format the list is empty and every shard is held.)
    roots.resize(state_shards, ShardRoot { addr: 0, crc32c: 0 });
    let mut root_mirrors = desc
        .metadata_copies
        .as_ref()
        .map(|c| c.root_mirrors.clone())
        .unwrap_or_default();
    root_mirrors.resize(roots.len(), crate::descriptor::NO_SECOND_COPY);
    for (s, t) in held.iter().zip(trees.iter()) {
        let p = t.root().expect("checkpointed tree has a root page");
        roots[*s] = ShardRoot::from(p);
        root_mirrors[*s] = p.mirror.map_or(crate::descriptor::NO_SECOND_COPY, |a| a.0);
    }
    // A page in another slot's allocation region is a hand-over root this slot's owner
    // took a shard from: its giver frees it once no record of this slot names it (see
    // `slot::reclaim_hand_over_roots`), never this owner.
    let elsewhere = crate::slot::regions_elsewhere(desc, slot);
    let mut superseded: Vec<Extent> = cp
        .superseded
        .iter()
        .map(|a| page_extent(desc, *a))
        .filter(|e| !crate::alloc_map::touches_chunks(e, &elsewhere))
        .collect();
    // Hand-over roots their taker's records no longer fall back to: freed like the pages
    // this checkpoint supersedes, and no longer named.
    let handed = desc.root_ptrs();
    for &s in released {
        assert!(
            !held.contains(&s),
            "a released hand-over root is of a shard given away"
        );
        let p = handed[s];
        superseded.extend(
            std::iter::once(p.addr)
                .chain(p.mirror)
                .map(|a| page_extent(desc, a)),
        );
        roots[s] = ShardRoot { addr: 0, crc32c: 0 };
        root_mirrors[s] = crate::descriptor::NO_SECOND_COPY;
    }
    let map = if desc.alloc_map.is_some() {
        let mut excluded = superseded.clone();
        excluded.extend_from_slice(unrecorded);
        crate::alloc_map::snapshot(alloc, &excluded, &elsewhere)
    } else {
        Vec::new()
    };
    Ok(Prepared {
        generation: cp.generation,
        pages: cp.pages,
        roots,
        root_mirrors,
        superseded,
        map,
        held,
        disks_covered: alloc
            .disks()
            .iter()
            .map(|d| u32::from(d.disk) + 1)
            .max()
            .unwrap_or(0),
    })
}

/// Largest write of a checkpoint. Pages placed one after another on a disk (the allocator
/// places a checkpoint's pages next to each other where it can) go out in one write: a
/// checkpoint of thousands of pages in a big directory cost a write (and, in a VM, an exit
/// to the host) per 16 KiB page, about a tenth of the daemon's time at four million files.
const WRITE_BATCH_BYTES: usize = 1 << 20;

/// Writes a prepared checkpoint's pages, every copy, and makes them durable. With metadata
/// replicated, a disk that fails a write or a flush is marked down and the checkpoint
/// stands as long as every page has one copy written (the pointers still name the failed
/// copy: reads skip it while the disk is down and find it stale by its checksum after,
/// and `restripe -r` rewrites it); with one copy any failure fails the checkpoint.
pub(crate) fn write_pages(
    desc: &FsDescriptor,
    disks: &DiskSet,
    prepared: &Prepared,
) -> FsResult<()> {
    let page_bytes = desc.checkpoint.page_bytes as usize;
    let page_subs = u64::from(desc.checkpoint.page_bytes / desc.sub_block_size);
    let mirrored = desc.metadata_copies.is_some();
    // Every copy to write: (address, page). A page address is the disk in its top bits and
    // the sub-block below: sorted, the pages of a disk come together in their places' order.
    let mut order: Vec<(PageAddr, usize)> = prepared
        .pages
        .iter()
        .enumerate()
        .flat_map(|(i, p)| std::iter::once((p.addr, i)).chain(p.mirror.map(|m| (m, i))))
        .filter(|(a, _)| !disks.is_down(disk_addr(*a).disk))
        .collect();
    order.sort_unstable_by_key(|(a, _)| a.0);
    let batch_pages = (WRITE_BATCH_BYTES / page_bytes).max(1);
    let mut buf = AlignedBuf::zeroed(page_bytes * batch_pages.min(order.len().max(1)));
    let mut touched = vec![false; disks.len()];
    let mut failed: Vec<(tessera_alloc::DiskIndex, std::io::Error)> = Vec::new();
    let mut rest = &order[..];
    while let Some(&(first, _)) = rest.first() {
        let start = disk_addr(first);
        let run = rest
            .iter()
            .take(batch_pages)
            .enumerate()
            .take_while(|&(k, &(a, _))| {
                let a = disk_addr(a);
                a.disk == start.disk && a.sub_block == start.sub_block + k as u64 * page_subs
            })
            .count();
        let skip = failed.iter().any(|(d, _)| *d == start.disk);
        if !skip {
            for (k, &(_, i)) in rest[..run].iter().enumerate() {
                prepared.pages[i].encode(&mut buf[k * page_bytes..(k + 1) * page_bytes]);
            }
            let written = disks.get(start.disk).write_at(
                &buf[..run * page_bytes],
                desc.sub_block_offset(start.sub_block),
            );
            match written {
                Ok(()) => touched[start.disk as usize] = true,
                Err(e) if mirrored => failed.push((start.disk, e)),
                Err(e) => return Err(e.into()),
            }
        }
        rest = &rest[run..];
    }
    for (disk, t) in touched.into_iter().enumerate() {
        let disk = disk as tessera_alloc::DiskIndex;
        if t && !failed.iter().any(|(d, _)| *d == disk) {
            match disks.get(disk).flush() {
                Ok(()) => {}
                Err(e) if mirrored => failed.push((disk, e)),
                Err(e) => return Err(e.into()),
            }
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    for (disk, e) in &failed {
        if disks.set_down(*disk, true) {
            tracing::error!(
                "{}: NSD {} is down: a write of metadata pages failed: {e}; the pages'                  copies in other failure groups are used; after fixing it run `tessera disk                  change {} start -d {}` and `tessera restripe {} -r`",
                desc.name,
                disks.name(*disk),
                desc.name,
                disks.name(*disk),
                desc.name
            );
        }
    }
    let lost = prepared.pages.iter().find(|p| {
        std::iter::once(p.addr)
            .chain(p.mirror)
            .all(|a| disks.is_down(disk_addr(a).disk))
    });
    match lost {
        Some(p) => Err(FsError::Io(std::io::Error::other(format!(
            "no copy of metadata page {} could be written: {}",
            p.addr,
            failed
                .iter()
                .map(|(d, e)| format!("NSD {}: {e}", disks.name(*d)))
                .collect::<Vec<_>>()
                .join("; ")
        )))),
        None => Ok(()),
    }
}
