//! Power loss and damage: a checkpoint interrupted anywhere leaves the previous one whole,
//! even though its superseded pages were reused at once; a damaged page is an error that
//! names it, and the rest of the tree stays readable.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{key, value, Harness};
use tessera_drive::{AlignedBuf, BlockDevice, FileDrive, VolatileCacheConfig};
use tessera_meta::{MetaError, PageAddr, Tree};
use tessera_testkit::SimDrive;

const PAGE: usize = 4096;
const PAGES: u64 = 4096;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn backing(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("meta.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(PAGES * PAGE as u64).unwrap();
    path
}

fn volatile(path: &std::path::Path, seed: u64) -> Arc<SimDrive> {
    let file: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(path).unwrap());
    Arc::new(SimDrive::with_cache(
        file,
        Arc::default(),
        VolatileCacheConfig {
            seed,
            capacity_bytes: 8 << 20,
            early_destage_one_in: 4,
        },
    ))
}

/// Rounds of changes and checkpoints on a drive with a volatile write cache; in each round
/// the power fails at a random point of the checkpoint (before, during or after its page
/// writes, before or after the flush). After every power loss the store reopens from the
/// roots the last durable checkpoint recorded and must hold exactly that checkpoint.
#[test]
fn power_loss_during_checkpoints_keeps_the_last_durable_one() {
    let rounds = tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", 40);
    let seed = std::env::var("TESSERA_POWERLOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0000_1234_5678u64);
    eprintln!("power-loss seed {seed} (TESSERA_POWERLOSS_SEED={seed} replays it)");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let path = backing(&dir);

    let mut drive = volatile(&path, seed);
    let mut h = Harness::new(drive.clone(), PAGE, 8);
    let mut tree = h.store.create_tree();
    h.checkpoint(&mut [&mut tree]).unwrap();
    let mut durable: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut model = durable.clone();
    let mut saved = (h.durable_roots.clone(), h.durable_generation);
    for round in 0..rounds {
        // A few clean checkpoints, then one that the power cuts.
        let clean = rng.below(3);
        for step in 0..=clean {
            for _ in 0..rng.below(400) + 1 {
                let k = rng.below(3000);
                if rng.below(3) == 0 {
                    let got = h.store.remove(&mut tree, &key(k, 3)).unwrap();
                    assert_eq!(got, model.remove(&key(k, 3)));
                } else {
                    let v = value(k + round as u64, rng.below(200) as usize);
                    let got = h.store.insert(&mut tree, &key(k, 3), &v).unwrap();
                    assert_eq!(got, model.insert(key(k, 3), v));
                }
            }
            if step < clean {
                h.checkpoint(&mut [&mut tree]).unwrap();
                durable = model.clone();
                continue;
            }
            saved = (h.durable_roots.clone(), h.durable_generation);
            let cp = h.prepare(&mut [&mut tree]).unwrap();
            let cut = rng.below(cp.pages.len() as u64 + 2) as usize;
            let written = cut.min(cp.pages.len());
            h.write(&cp.pages[..written]);
            if cut > cp.pages.len() {
                // Pages flushed, but the roots never recorded: still the old checkpoint.
                drive.flush().unwrap();
            }
            drive.power_cut();
        }
        drop(h);
        drive = volatile(&path, seed.wrapping_add(round as u64 + 1));
        let (h2, mut trees) = Harness::reopen(drive.clone(), PAGE, 8, &saved.0, saved.1);
        h = h2;
        tree = trees.pop().unwrap();
        let got = h.store.range(&tree, &[], None, usize::MAX).unwrap();
        let want: Vec<_> = durable
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            got.len(),
            want.len(),
            "round {round}: entry count after power loss"
        );
        assert!(
            got == want,
            "round {round}: contents differ after power loss"
        );
        model = durable.clone();
    }
}

/// A page damaged on disk: the read that reaches it fails naming the page, other leaves
/// still read, and a lost write (an older, intact page left where the new one should be)
/// is caught by the checksum its parent keeps.
#[test]
fn damaged_and_stale_pages_are_errors_that_name_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let path = backing(&dir);
    let file: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
    let mut h = Harness::new(file.clone(), PAGE, 4);
    let mut tree = h.store.create_tree();
    for i in 0..2_000u64 {
        h.store
            .insert(&mut tree, &key(i, 0), &value(i, 40))
            .unwrap();
    }
    h.checkpoint(&mut [&mut tree]).unwrap();
    // Which leaf holds key 1000? The one whose page the cold read of it fetches last.
    let mut leaves = Vec::new();
    h.store
        .visit_pages(&tree, &mut |addr, level| {
            if level == 0 {
                leaves.push(addr)
            }
        })
        .unwrap();
    assert!(leaves.len() > 10);
    let victim = leaves[leaves.len() / 2];
    let read = |addr: PageAddr| {
        let mut buf = AlignedBuf::zeroed(PAGE);
        file.read_at(&mut buf, addr.0 * PAGE as u64).unwrap();
        buf
    };
    let original = read(victim);

    // Flip one byte in the middle of the leaf.
    let mut bad = AlignedBuf::from_slice(&original);
    bad[PAGE / 2] ^= 0x40;
    file.write_at(&bad, victim.0 * PAGE as u64).unwrap();
    let roots = h.durable_roots.clone();
    let mut h2 = Harness::new(file.clone(), PAGE, 4);
    let tree2 = Tree::on_disk(roots[0]);
    let mut failed = Vec::new();
    for i in 0..2_000u64 {
        match h2.store.get(&tree2, &key(i, 0)) {
            Ok(v) => assert_eq!(v, Some(value(i, 40))),
            Err(e) => failed.push((i, e)),
        }
    }
    assert!(
        !failed.is_empty() && failed.len() < 200,
        "{} keys failed",
        failed.len()
    );
    for (_, e) in &failed {
        assert!(
            matches!(e, MetaError::Corrupt { addr, .. } if *addr == victim),
            "{e}"
        );
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
    }

    // A stale page: the leaf as an earlier checkpoint wrote it, intact, at the same place.
    let mut h3 = Harness::new(file.clone(), PAGE, 4);
    file.write_at(&original, victim.0 * PAGE as u64).unwrap();
    let mut tree3 = Tree::on_disk(roots[0]);
    let (first_bad, _) = failed[0];
    h3.store
        .insert(&mut tree3, &key(first_bad, 0), b"new")
        .unwrap();
    // The new leaf is given the old leaf's place (the first address goes to the first page
    // written, the leaf).
    let others: Vec<u64> = (0..PAGES).filter(|p| *p != victim.0).collect();
    let cp = h3
        .store
        .checkpoint(&mut [&mut tree3], &mut |n| {
            let mut out = vec![PageAddr(victim.0)];
            out.extend(others.iter().rev().take(n - 1).map(|p| PageAddr(*p)));
            Ok(out.into_iter().map(Into::into).collect())
        })
        .unwrap();
    // Write every page of the checkpoint except the new leaf: its write is "lost".
    for page in &cp.pages {
        if page.addr != victim {
            file.write_at(
                &AlignedBuf::from_slice(&page.bytes()),
                page.addr.0 * PAGE as u64,
            )
            .unwrap();
        }
    }
    let mut h4 = Harness::new(file.clone(), PAGE, 4);
    let tree4 = Tree::on_disk(tree3.root().unwrap());
    let err = h4.store.get(&tree4, &key(first_bad, 0)).unwrap_err();
    assert!(err.to_string().contains("stale page"), "{err}");
}
