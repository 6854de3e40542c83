//! Checkpoints of the shard trees. A checkpoint gives every changed metadata page a new
//! place in the system pool (copy-on-write, see `tessera-meta`), writes the pages, and only
//! then does the caller write a descriptor naming the new roots and the log position they
//! hold; the pages the previous checkpoint used and this one replaced are freed after that
//! descriptor is durable. What a checkpoint writes is what changed since the last one.

use std::sync::Arc;

use tessera_alloc::{AllocKind, AllocMap, DiskAddr, Extent};
use tessera_drive::{AlignedBuf, BlockDevice};
use tessera_meta::{MetaError, MetaStore, PageAddr, PageFormat, PagePtr, PageReader};

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
        let dev = self.disks.try_get(a.disk).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "metadata page {addr} names disk {}, which the file system lacks",
                    a.disk
                ),
            )
        })?;
        let mut buf = AlignedBuf::zeroed(self.page_bytes);
        dev.read_at(
            &mut buf,
            self.data_start + a.sub_block * self.sub_block_bytes,
        )?;
        page.copy_from_slice(&buf);
        Ok(())
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
    let format = PageFormat::new(page, owner).map_err(|e| FsError::Corrupt(e.to_string()))?;
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

/// The metadata of the checkpoint `desc` names.
pub(crate) fn open_state(desc: &FsDescriptor, disks: &Arc<DiskSet>) -> FsResult<MetaState> {
    if desc.checkpoint.roots.len() != desc.shard_count as usize {
        return Err(FsError::Corrupt(format!(
            "descriptor lists {} shard roots for {} shards",
            desc.checkpoint.roots.len(),
            desc.shard_count
        )));
    }
    let store = new_store(desc, disks, desc.checkpoint.generation + 1)?;
    let roots: Vec<PagePtr> = desc.checkpoint.roots.iter().map(|r| r.ptr()).collect();
    MetaState::open(store, &roots)
}

/// A checkpoint whose pages have their places but are not written yet.
pub(crate) struct Prepared {
    pub generation: u64,
    pub pages: Vec<tessera_meta::CheckpointPage>,
    pub roots: Vec<ShardRoot>,
    /// Pages of earlier checkpoints this one no longer reaches: free once it is durable.
    pub superseded: Vec<Extent>,
    /// The chunks of the allocation map this checkpoint stores (`crate::alloc_map`).
    pub map: Vec<crate::alloc_map::ChunkImage>,
}

/// Places every changed page and takes the changed chunks of the allocation map (the part
/// of a checkpoint that needs the metadata lock). `unrecorded` are extents the map holds used
/// that the metadata does not reference as of this checkpoint (allocated but not logged,
/// released but not durable); the stored map leaves them free, as it does the pages this
/// checkpoint supersedes.
pub(crate) fn prepare(
    desc: &FsDescriptor,
    alloc: &mut AllocMap,
    state: &mut MetaState,
    unrecorded: &[Extent],
) -> FsResult<Prepared> {
    let subs = desc.checkpoint.page_bytes / desc.sub_block_size;
    state.write_headers()?;
    state.unsettled_into_tree()?;
    let (store, mut trees) = state.trees_mut();
    let cp = store
        .checkpoint(&mut trees, &mut |n| {
            let mut out: Vec<PageAddr> = Vec::with_capacity(n);
            let mut prev = None;
            for _ in 0..n {
                match alloc.alloc_fragment(0, AllocKind::Metadata, subs, prev) {
                    Ok(e) => {
                        prev = Some(e.addr);
                        out.push(page_addr(e.addr));
                    }
                    Err(e) => {
                        for a in &out {
                            let _ = alloc.free(Extent {
                                addr: disk_addr(*a),
                                sub_blocks: subs,
                            });
                        }
                        return Err(MetaError::NoSpace(e.to_string()));
                    }
                }
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
    let roots = trees
        .iter()
        .map(|t| ShardRoot::from(t.root().expect("checkpointed tree has a root page")))
        .collect();
    let superseded: Vec<Extent> = cp
        .superseded
        .iter()
        .map(|a| page_extent(desc, *a))
        .collect();
    let map = if desc.alloc_map.is_some() {
        let mut excluded = superseded.clone();
        excluded.extend_from_slice(unrecorded);
        crate::alloc_map::snapshot(alloc, &excluded)
    } else {
        Vec::new()
    };
    Ok(Prepared {
        generation: cp.generation,
        pages: cp.pages,
        roots,
        superseded,
        map,
    })
}

/// Largest write of a checkpoint. Pages placed one after another on a disk (the allocator
/// places a checkpoint's pages next to each other where it can) go out in one write: a
/// checkpoint of thousands of pages in a big directory cost a write (and, in a VM, an exit
/// to the host) per 16 KiB page, about a tenth of the daemon's time at four million files.
const WRITE_BATCH_BYTES: usize = 1 << 20;

/// Writes a prepared checkpoint's pages and makes them durable.
pub(crate) fn write_pages(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    prepared: &Prepared,
) -> FsResult<()> {
    let page_bytes = desc.checkpoint.page_bytes as usize;
    let page_subs = u64::from(desc.checkpoint.page_bytes / desc.sub_block_size);
    // A page address is the disk in its top bits and the sub-block below: sorted, the pages
    // of a disk come together in the order of their places.
    let mut order: Vec<usize> = (0..prepared.pages.len()).collect();
    order.sort_unstable_by_key(|&i| prepared.pages[i].addr.0);
    let batch_pages = (WRITE_BATCH_BYTES / page_bytes).max(1);
    let mut buf = AlignedBuf::zeroed(page_bytes * batch_pages.min(order.len().max(1)));
    let mut touched = vec![false; devices.len()];
    let mut rest = &order[..];
    while let Some(&first) = rest.first() {
        let start = disk_addr(prepared.pages[first].addr);
        let run = rest
            .iter()
            .take(batch_pages)
            .enumerate()
            .take_while(|&(k, &i)| {
                let a = disk_addr(prepared.pages[i].addr);
                a.disk == start.disk && a.sub_block == start.sub_block + k as u64 * page_subs
            })
            .count();
        for (k, &i) in rest[..run].iter().enumerate() {
            prepared.pages[i].encode(&mut buf[k * page_bytes..(k + 1) * page_bytes]);
        }
        devices[start.disk as usize].write_at(
            &buf[..run * page_bytes],
            desc.sub_block_offset(start.sub_block),
        )?;
        touched[start.disk as usize] = true;
        rest = &rest[run..];
    }
    for (dev, t) in devices.iter().zip(touched) {
        if t {
            dev.flush()?;
        }
    }
    Ok(())
}
