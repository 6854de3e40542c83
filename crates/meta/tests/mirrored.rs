//! Replicated metadata pages (`-m 2`): every page written twice, branch pointers carrying
//! both addresses, reads falling back to the second copy and repairing the first.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
use tessera_meta::{MetaStore, PageAddr, PageFormat, PagePlace, PagePtr, PageReader, Tree};

const PAGE: usize = 4096;
/// First copies live below this page address, second copies at `addr + HALF`: the two
/// halves stand for two failure groups.
const HALF: u64 = 1 << 13;

struct Reader {
    drive: Arc<dyn BlockDevice>,
    repairs: AtomicU64,
}

impl PageReader for Reader {
    fn read_page(&self, addr: PageAddr, page: &mut [u8]) -> std::io::Result<()> {
        let mut buf = AlignedBuf::zeroed(PAGE);
        self.drive.read_at(&mut buf, addr.0 * PAGE as u64)?;
        page.copy_from_slice(&buf);
        Ok(())
    }

    fn repair_page(&self, addr: PageAddr, page: &[u8], why: &str) -> bool {
        assert!(!why.is_empty());
        self.drive
            .write_at(&AlignedBuf::from_slice(page), addr.0 * PAGE as u64)
            .unwrap();
        self.repairs.fetch_add(1, Ordering::Relaxed);
        true
    }
}

fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn value(i: u64) -> Vec<u8> {
    format!("value of {i:08}").into_bytes()
}

fn store(drive: &Arc<dyn BlockDevice>, cache_pages: usize) -> (MetaStore, Arc<Reader>) {
    let format = PageFormat::new(PAGE, 0x5eed).unwrap().with_mirrors();
    let reader = Arc::new(Reader {
        drive: drive.clone(),
        repairs: AtomicU64::new(0),
    });
    let store = MetaStore::new(format, reader.clone(), cache_pages, 1);
    (store, reader)
}

/// Writes a checkpoint of `tree`, both copies of every page, and returns its root.
fn checkpoint(
    store: &mut MetaStore,
    tree: &mut Tree,
    free: &mut BTreeSet<u64>,
    drive: &Arc<dyn BlockDevice>,
) -> PagePtr {
    let cp = store
        .checkpoint(&mut [tree], &mut |n| {
            let picked: Vec<u64> = free.iter().take(n).copied().collect();
            for a in &picked {
                free.remove(a);
            }
            Ok(picked
                .into_iter()
                .map(|a| PagePlace {
                    addr: PageAddr(a),
                    mirror: Some(PageAddr(a + HALF)),
                })
                .collect())
        })
        .unwrap();
    for page in &cp.pages {
        let bytes = AlignedBuf::from_slice(&page.bytes());
        let mirror = page.mirror.expect("every page has a second copy");
        assert_eq!(mirror.0, page.addr.0 + HALF);
        for a in [page.addr, mirror] {
            drive.write_at(&bytes, a.0 * PAGE as u64).unwrap();
        }
    }
    drive.flush().unwrap();
    store.written(cp.generation);
    for a in cp.superseded {
        // Both copies are superseded together.
        if a.0 < HALF {
            assert!(free.insert(a.0), "page {a} freed twice");
        } else {
            assert!(
                free.contains(&(a.0 - HALF)),
                "second copy {a} freed without its first"
            );
        }
    }
    tree.root().unwrap()
}

fn zero_range(drive: &Arc<dyn BlockDevice>, pages: std::ops::Range<u64>) {
    let zero = AlignedBuf::zeroed(PAGE);
    for p in pages {
        drive.write_at(&zero, p * PAGE as u64).unwrap();
    }
    drive.flush().unwrap();
}

#[test]
fn a_tree_reads_whole_from_either_copy_and_repairs_the_lost_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(2 * HALF * PAGE as u64)
        .unwrap();
    let drive: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
    let mut free: BTreeSet<u64> = (0..HALF).collect();
    let (mut s, _) = store(&drive, 64);
    let mut tree = s.create_tree();
    for i in 0..20_000u64 {
        s.insert(
            &mut tree,
            &key(i * 7919 % 20_000),
            &value(i * 7919 % 20_000),
        )
        .unwrap();
    }
    checkpoint(&mut s, &mut tree, &mut free, &drive);
    // A second round of changes: superseded pages free both copies, new ones get two.
    for i in (0..20_000u64).step_by(3) {
        s.remove(&mut tree, &key(i)).unwrap();
    }
    let root = checkpoint(&mut s, &mut tree, &mut free, &drive);
    assert!(root.mirror.is_some());
    let want = |i: u64| (!i.is_multiple_of(3)).then(|| value(i));

    // The first failure group is lost: every first copy reads as zeros.
    zero_range(&drive, 0..HALF);
    let (mut s, reader) = store(&drive, 8);
    let tree = Tree::on_disk(root);
    for i in 0..20_000u64 {
        assert_eq!(s.get(&tree, &key(i)).unwrap(), want(i), "key {i}");
    }
    let read_second = s.stats().second_copy_reads;
    assert!(
        read_second > 100,
        "{read_second} pages read from the second copy"
    );
    assert_eq!(reader.repairs.load(Ordering::Relaxed), read_second);

    // The reads repaired the first copies: now the second failure group may go.
    zero_range(&drive, HALF..2 * HALF);
    let (mut s, _) = store(&drive, 8);
    for i in 0..20_000u64 {
        assert_eq!(s.get(&tree, &key(i)).unwrap(), want(i), "key {i}");
    }
    assert_eq!(s.stats().second_copy_reads, 0);

    // A scrub finds every damaged copy and rewrites it, without waiting for reads.
    zero_range(&drive, HALF..HALF + HALF / 2);
    let (mut s, reader) = store(&drive, 8);
    let (checked, repaired) = s.check_copies(&tree).unwrap();
    assert!(
        repaired > 0 && repaired < checked,
        "{repaired} of {checked}"
    );
    assert_eq!(reader.repairs.load(Ordering::Relaxed), repaired);
    zero_range(&drive, 0..HALF);
    let (mut s, _) = store(&drive, 8);
    for i in 0..20_000u64 {
        assert_eq!(s.get(&tree, &key(i)).unwrap(), want(i), "key {i}");
    }

    // The same a few leaves at a time, resuming from the key each part returns (how a
    // restripe lets go of its locks between parts): every damaged copy is found.
    zero_range(&drive, HALF..2 * HALF);
    let (mut s, _) = store(&drive, 8);
    let (mut from, mut parts, mut repaired) = (None::<Vec<u8>>, 0, 0);
    loop {
        let (_, r, next) = s.check_copies_from(&tree, from.as_deref(), 3).unwrap();
        repaired += r;
        parts += 1;
        match next {
            Some(k) => from = Some(k),
            None => break,
        }
        assert!(parts < 10_000, "the parts never reach the end");
    }
    assert!(
        parts > 10 && repaired > 0,
        "{parts} parts, {repaired} repaired"
    );
    zero_range(&drive, 0..HALF);
    let (mut s, _) = store(&drive, 8);
    for i in 0..20_000u64 {
        assert_eq!(s.get(&tree, &key(i)).unwrap(), want(i), "key {i}");
    }

    // Both copies gone: an error that says so, never wrong data.
    zero_range(&drive, 0..2 * HALF);
    let (mut s, _) = store(&drive, 8);
    let err = s.get(&tree, &key(1)).unwrap_err().to_string();
    assert!(err.contains("both copies"), "{err}");
}
