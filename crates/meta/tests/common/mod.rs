//! A metadata store over a real drive, as a file system uses it: pages at `addr * page`,
//! a free list of page addresses, checkpoints written and flushed, superseded pages freed
//! only once the next checkpoint is durable.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;

use tessera_drive::{AlignedBuf, BlockDevice};
use tessera_meta::{MetaError, MetaStore, PageAddr, PageFormat, PagePtr, PageReader, Tree};

pub const OWNER: u64 = 0x7e55_e7a0_0000_0001;

pub struct DriveReader {
    pub drive: Arc<dyn BlockDevice>,
    pub page: usize,
}

impl PageReader for DriveReader {
    fn read_page(&self, addr: PageAddr, page: &mut [u8]) -> std::io::Result<()> {
        let mut buf = AlignedBuf::zeroed(self.page);
        self.drive.read_at(&mut buf, addr.0 * self.page as u64)?;
        page.copy_from_slice(&buf);
        Ok(())
    }
}

/// The caller's side of the store: the allocator of page addresses and the durable roots.
pub struct Harness {
    pub drive: Arc<dyn BlockDevice>,
    pub format: PageFormat,
    pub store: MetaStore,
    pub free: BTreeSet<u64>,
    /// Roots of the newest durable checkpoint, as a descriptor would record them.
    pub durable_roots: Vec<PagePtr>,
    pub durable_generation: u64,
    pub pages_written: u64,
}

impl Harness {
    pub fn new(drive: Arc<dyn BlockDevice>, page: usize, cache_pages: usize) -> Harness {
        let format = PageFormat::new(page, OWNER).unwrap();
        let pages = drive.size_bytes() / page as u64;
        let reader = Arc::new(DriveReader {
            drive: drive.clone(),
            page,
        });
        Harness {
            drive,
            format,
            store: MetaStore::new(format, reader, cache_pages, 1),
            free: (0..pages).collect(),
            durable_roots: Vec::new(),
            durable_generation: 0,
            pages_written: 0,
        }
    }

    /// Reopens the store from the durable roots, with the allocator rebuilt from what the
    /// trees reach (as fsck would).
    pub fn reopen(
        drive: Arc<dyn BlockDevice>,
        page: usize,
        cache_pages: usize,
        roots: &[PagePtr],
        generation: u64,
    ) -> (Harness, Vec<Tree>) {
        let mut h = Harness::new(drive, page, cache_pages);
        h.store = MetaStore::new(
            h.format,
            Arc::new(DriveReader {
                drive: h.drive.clone(),
                page,
            }),
            cache_pages,
            generation + 1,
        );
        h.durable_roots = roots.to_vec();
        h.durable_generation = generation;
        let trees: Vec<Tree> = roots.iter().map(|r| Tree::on_disk(*r)).collect();
        for t in &trees {
            let free = &mut h.free;
            h.store
                .visit_pages(t, &mut |addr, _| {
                    assert!(free.remove(&addr.0), "page {addr} reached twice");
                })
                .unwrap();
        }
        (h, trees)
    }

    /// A checkpoint: pages written, drive flushed, then the roots become durable (the
    /// descriptor write, here a variable), then superseded pages are freed.
    pub fn checkpoint(&mut self, trees: &mut [&mut Tree]) -> Result<(), MetaError> {
        let cp = self.prepare(trees)?;
        self.write(&cp.pages);
        self.drive.flush().unwrap();
        self.durable_roots = trees.iter().map(|t| t.root().unwrap()).collect();
        self.durable_generation = cp.generation;
        self.store.written(cp.generation);
        for a in cp.superseded {
            assert!(self.free.insert(a.0), "page {a} freed twice");
        }
        Ok(())
    }

    pub fn prepare(
        &mut self,
        trees: &mut [&mut Tree],
    ) -> Result<tessera_meta::Checkpoint, MetaError> {
        let free = &mut self.free;
        self.store.checkpoint(trees, &mut |n| {
            if free.len() < n {
                return Err(MetaError::NoSpace(format!(
                    "{n} pages wanted, {} free",
                    free.len()
                )));
            }
            // Lowest addresses first: freed pages are reused at once, which is what would
            // expose a page freed too early.
            let picked: Vec<u64> = free.iter().take(n).copied().collect();
            for a in &picked {
                free.remove(a);
            }
            Ok(picked.into_iter().map(|a| PageAddr(a).into()).collect())
        })
    }

    pub fn write(&mut self, pages: &[tessera_meta::CheckpointPage]) {
        for page in pages {
            let addr = page.addr;
            let buf = AlignedBuf::from_slice(&page.bytes());
            self.drive
                .write_at(&buf, addr.0 * self.format.page_bytes as u64)
                .unwrap();
            self.pages_written += 1;
        }
    }
}

/// A key from a number, big-endian so that key order is number order, with `pad` extra
/// bytes to vary key lengths.
pub fn key(n: u64, pad: usize) -> Vec<u8> {
    let mut k = n.to_be_bytes().to_vec();
    k.extend(std::iter::repeat_n((n % 251) as u8, pad));
    k
}

pub fn value(n: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (n as usize).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}
