//! Copy-on-write B+trees against an in-memory model, over a real file-backed drive, with a
//! cache of a few pages so that nearly every visit evicts and re-reads.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{key, value, Harness};
use proptest::prelude::*;
use tessera_drive::{BlockDevice, FileDrive};
use tessera_meta::{MetaError, Tree};

const PAGE: usize = 4096;

fn drive(pages: u64) -> (tempfile::TempDir, Arc<dyn BlockDevice>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(pages * PAGE as u64).unwrap();
    drop(f);
    let d: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
    (dir, d)
}

fn contents(h: &mut Harness, t: &Tree) -> Vec<(Vec<u8>, Vec<u8>)> {
    h.store.range(t, &[], None, usize::MAX).unwrap()
}

fn model_vec(m: &BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[derive(Clone, Debug)]
enum Op {
    Insert { k: u64, pad: usize, vlen: usize },
    Remove { k: u64, pad: usize },
    Get { k: u64, pad: usize },
    Range { k: u64, limit: usize },
    Checkpoint,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    // Keys from a small space so that replaces and removes of present keys are common;
    // value sizes up to the largest a 4 KiB page takes (2020 bytes with the key).
    prop_oneof![
        8 => (0u64..400, 0usize..40, 0usize..300).prop_map(|(k, pad, vlen)| Op::Insert { k, pad: pad % 4, vlen }),
        1 => (0u64..400, 0usize..1500).prop_map(|(k, vlen)| Op::Insert { k, pad: 0, vlen }),
        5 => (0u64..400, 0usize..4).prop_map(|(k, pad)| Op::Remove { k, pad }),
        3 => (0u64..400, 0usize..4).prop_map(|(k, pad)| Op::Get { k, pad }),
        2 => (0u64..400, 1usize..50).prop_map(|(k, limit)| Op::Range { k, limit }),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
    ]
}

fn run_ops(ops: &[Op], cache_pages: usize) {
    let (_dir, d) = drive(4096);
    let mut h = Harness::new(d.clone(), PAGE, cache_pages);
    let mut tree = h.store.create_tree();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut durable_model = BTreeMap::new();
    h.checkpoint(&mut [&mut tree]).unwrap();
    for op in ops {
        match op {
            Op::Insert { k, pad, vlen } => {
                let (kk, v) = (key(*k, *pad), value(*k + *vlen as u64, *vlen));
                let old = h.store.insert(&mut tree, &kk, &v).unwrap();
                assert_eq!(old, model.insert(kk, v));
            }
            Op::Remove { k, pad } => {
                let kk = key(*k, *pad);
                assert_eq!(h.store.remove(&mut tree, &kk).unwrap(), model.remove(&kk));
            }
            Op::Get { k, pad } => {
                let kk = key(*k, *pad);
                assert_eq!(h.store.get(&tree, &kk).unwrap(), model.get(&kk).cloned());
            }
            Op::Range { k, limit } => {
                let start = key(*k, 0);
                let got = h.store.range(&tree, &start, None, *limit).unwrap();
                let want: Vec<_> = model
                    .range(start..)
                    .take(*limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(got, want);
                let end = key(*k + 20, 0);
                let got = h.store.range(&tree, &[], Some(&end), usize::MAX).unwrap();
                let want: Vec<_> = model
                    .range(..end.clone())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(got, want);
                let last = h.store.last_before(&tree, Some(&end)).unwrap();
                let want = model
                    .range(..end)
                    .next_back()
                    .map(|(k, v)| (k.clone(), v.clone()));
                assert_eq!(last, want);
            }
            Op::Checkpoint => {
                h.checkpoint(&mut [&mut tree]).unwrap();
                durable_model = model.clone();
            }
            Op::Reopen => {
                // What was not checkpointed is gone (the log would replay it).
                let roots = h.durable_roots.clone();
                let (h2, mut trees) =
                    Harness::reopen(d.clone(), PAGE, cache_pages, &roots, h.durable_generation);
                // Free is what the durable tree does not reach: nothing leaked, nothing
                // freed that the durable tree still needs.
                let leaked: Vec<_> = h2.free.difference(&h.free).collect();
                let early: Vec<_> = h.free.difference(&h2.free).collect();
                assert!(
                    leaked.is_empty() && early.is_empty(),
                    "pages leaked: {leaked:?}; freed while still reached: {early:?}"
                );
                h = h2;
                tree = trees.pop().unwrap();
                model = durable_model.clone();
                assert_eq!(contents(&mut h, &tree), model_vec(&model));
            }
        }
    }
    assert_eq!(contents(&mut h, &tree), model_vec(&model));
    h.checkpoint(&mut [&mut tree]).unwrap();
    let roots = h.durable_roots.clone();
    let (mut h2, trees) = Harness::reopen(d, PAGE, cache_pages, &roots, h.durable_generation);
    assert_eq!(contents(&mut h2, &trees[0]), model_vec(&model));
    // Every page is either free or reached by the tree: nothing leaked by splits, merges,
    // copies or frees (reopen counts the reached ones).
    assert_eq!(h2.free.len(), h.free.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn tree_matches_a_model_with_a_tiny_cache(ops in proptest::collection::vec(op(), 1..1500)) {
        run_ops(&ops, 3);
    }

    #[test]
    fn tree_matches_a_model_with_a_roomy_cache(ops in proptest::collection::vec(op(), 1..1500)) {
        run_ops(&ops, 1000);
    }
}

#[test]
fn hundred_thousand_keys_stay_logarithmic_and_survive_reopen() {
    let (_dir, d) = drive(1 << 16);
    let mut h = Harness::new(d.clone(), PAGE, 64);
    let mut tree = h.store.create_tree();
    let n = 100_000u64;
    for i in 0..n {
        // A scrambled order, so splits happen everywhere in the tree.
        let k = (i * 7919) % n;
        h.store
            .insert(&mut tree, &key(k, 12), &value(k, 40))
            .unwrap();
        if i % 20_000 == 19_999 {
            h.checkpoint(&mut [&mut tree]).unwrap();
        }
    }
    h.checkpoint(&mut [&mut tree]).unwrap();
    let mut levels = BTreeMap::new();
    h.store
        .visit_pages(&tree, &mut |_, level| {
            *levels.entry(level).or_insert(0u64) += 1
        })
        .unwrap();
    // ~56-byte entries, 4 KiB pages: about 70 per leaf, 1,400+ leaves, three or four levels.
    assert!(levels.len() <= 4, "levels {levels:?}");
    let pages: u64 = levels.values().sum();
    assert!(pages < 3_000, "{pages} pages for {n} keys");

    // Reads from a cold store of 64 pages cost at most one page per level.
    let roots = h.durable_roots.clone();
    let (mut h2, trees) = Harness::reopen(d.clone(), PAGE, 64, &roots, h.durable_generation);
    let before = h2.store.stats();
    for i in (0..n).step_by(997) {
        assert_eq!(
            h2.store.get(&trees[0], &key(i, 12)).unwrap(),
            Some(value(i, 40))
        );
    }
    let misses = h2.store.stats().misses - before.misses;
    assert!(
        misses <= (n / 997 + 1) * levels.len() as u64,
        "{misses} page reads"
    );

    // Delete everything but every hundredth key: merges shrink the tree again.
    let mut tree = Tree::on_disk(roots[0]);
    for i in 0..n {
        if i % 100 != 0 {
            assert!(h2.store.remove(&mut tree, &key(i, 12)).unwrap().is_some());
        }
    }
    h2.checkpoint(&mut [&mut tree]).unwrap();
    let mut after = 0u64;
    h2.store.visit_pages(&tree, &mut |_, _| after += 1).unwrap();
    assert!(
        after < pages / 20,
        "{after} pages left of {pages} after removing 99%"
    );
    let total = d.size_bytes() / PAGE as u64;
    assert_eq!(
        h2.free.len() as u64 + after,
        total,
        "pages leaked or freed twice"
    );
    let left = h2.store.range(&tree, &[], None, usize::MAX).unwrap();
    assert_eq!(left.len() as u64, n / 100);
    assert!(left
        .iter()
        .enumerate()
        .all(|(j, (k, _))| *k == key(j as u64 * 100, 12)));
}

/// Keys that only grow (inode records in creation order) fill their leaves: each append
/// that overflows a leaf starts the next one instead of splitting it in the middle, which
/// left every leaf half empty. Random inserts still split in the middle.
#[test]
fn appended_keys_fill_their_pages() {
    let (_dir, d) = drive(1 << 14);
    let mut h = Harness::new(d.clone(), PAGE, 64);
    let mut tree = h.store.create_tree();
    let n = 20_000u64;
    for i in 0..n {
        h.store
            .insert(&mut tree, &key(i, 12), &value(i, 40))
            .unwrap();
    }
    h.checkpoint(&mut [&mut tree]).unwrap();
    let mut leaves = 0u64;
    h.store
        .visit_pages(&tree, &mut |_, level| {
            if level == 0 {
                leaves += 1
            }
        })
        .unwrap();
    // 20-byte keys and 40-byte values: 60 bytes and 4 of overhead an entry; a full 4 KiB
    // leaf (48-byte header) holds 63, so 20,000 entries need 318 leaves.
    let full = n.div_ceil(((PAGE - 48) / 64) as u64);
    assert!(
        leaves <= full + full / 50,
        "{leaves} leaves for {n} appended entries; full pages would be {full}"
    );
    let all = h.store.range(&tree, &[], None, usize::MAX).unwrap();
    assert_eq!(all.len() as u64, n);
    assert!(all
        .iter()
        .enumerate()
        .all(|(i, (k, _))| *k == key(i as u64, 12)));
}

#[test]
fn a_checkpoint_writes_what_changed_not_the_whole_tree() {
    let (_dir, d) = drive(1 << 15);
    let mut h = Harness::new(d, PAGE, 256);
    let mut tree = h.store.create_tree();
    for i in 0..50_000u64 {
        h.store
            .insert(&mut tree, &key(i, 0), &value(i, 32))
            .unwrap();
    }
    h.checkpoint(&mut [&mut tree]).unwrap();
    let full = h.pages_written;
    for i in [10u64, 20_000, 49_999] {
        h.store
            .insert(&mut tree, &key(i, 0), &value(i + 1, 32))
            .unwrap();
    }
    h.checkpoint(&mut [&mut tree]).unwrap();
    let incremental = h.pages_written - full;
    // Three leaves and their paths (three levels at most, sharing the root).
    assert!(
        incremental <= 9,
        "{incremental} pages written for 3 changes (first: {full})"
    );
}

#[test]
fn many_trees_share_one_store_and_dropped_trees_free_their_pages() {
    let (_dir, d) = drive(1 << 14);
    let mut h = Harness::new(d.clone(), PAGE, 16);
    let free_at_start = h.free.len();
    let mut trees: Vec<Tree> = (0..20).map(|_| h.store.create_tree()).collect();
    for (t, tree) in trees.iter_mut().enumerate() {
        for i in 0..(t as u64 * 300) {
            h.store.insert(tree, &key(i, t), &value(i, 20)).unwrap();
        }
    }
    {
        let mut refs: Vec<&mut Tree> = trees.iter_mut().collect();
        h.checkpoint(&mut refs).unwrap();
    }
    // Drop every other tree, one before and one after its next change.
    let mut kept = Vec::new();
    for (t, mut tree) in trees.into_iter().enumerate() {
        if t % 2 == 0 {
            if t % 4 == 0 {
                h.store.insert(&mut tree, b"x", b"y").unwrap();
            }
            h.store.drop_tree(tree).unwrap();
        } else {
            kept.push((t, tree));
        }
    }
    {
        let mut refs: Vec<&mut Tree> = kept.iter_mut().map(|(_, t)| t).collect();
        h.checkpoint(&mut refs).unwrap();
    }
    let mut used = 0usize;
    for (t, tree) in &kept {
        let got = h.store.range(tree, &[], None, usize::MAX).unwrap();
        assert_eq!(got.len(), *t * 300);
        h.store.visit_pages(tree, &mut |_, _| used += 1).unwrap();
    }
    assert_eq!(
        h.free.len() + used,
        free_at_start,
        "pages leaked or freed twice"
    );
}

#[test]
fn oversized_entries_are_refused_and_change_nothing() {
    let (_dir, d) = drive(64);
    let mut h = Harness::new(d, PAGE, 8);
    let mut tree = h.store.create_tree();
    h.store.insert(&mut tree, b"a", b"1").unwrap();
    let max = h.format.max_entry_bytes();
    let err = h
        .store
        .insert(&mut tree, b"b", &vec![0u8; max])
        .unwrap_err();
    assert!(matches!(err, MetaError::EntryTooLarge { .. }), "{err}");
    assert!(
        err.to_string().contains("larger than a page allows"),
        "{err}"
    );
    let err = h.store.insert(&mut tree, &[7u8; 513], b"").unwrap_err();
    assert!(matches!(err, MetaError::EntryTooLarge { .. }), "{err}");
    h.store
        .insert(&mut tree, b"b", &vec![1u8; max - 1])
        .unwrap();
    assert_eq!(h.store.range(&tree, &[], None, 10).unwrap().len(), 2);
}

#[test]
fn running_out_of_page_space_changes_nothing() {
    let (_dir, d) = drive(8);
    let mut h = Harness::new(d, PAGE, 8);
    let mut tree = h.store.create_tree();
    for i in 0..2_000u64 {
        h.store
            .insert(&mut tree, &key(i, 0), &value(i, 16))
            .unwrap();
    }
    let dirty = h.store.dirty_pages();
    let err = h.checkpoint(&mut [&mut tree]).unwrap_err();
    assert!(matches!(err, MetaError::NoSpace(_)), "{err}");
    assert!(tree.is_dirty());
    assert_eq!(h.store.dirty_pages(), dirty);
    assert_eq!(
        h.store.range(&tree, &[], None, usize::MAX).unwrap().len(),
        2_000
    );
}

/// Emptying part of the page space (a disk being removed): pages there are marked changed a
/// budget at a time, each checkpoint writes them elsewhere, and nothing of the tree, its
/// pending changes or its durable image is lost on the way.
#[test]
fn relocated_pages_leave_the_emptied_range_and_keep_every_entry() {
    let (_dir, d) = drive(1 << 14);
    let mut h = Harness::new(d.clone(), PAGE, 16);
    let mut model = BTreeMap::new();
    let mut tree = h.store.create_tree();
    for i in 0..30_000u64 {
        h.store
            .insert(&mut tree, &key(i, 0), &value(i, 24))
            .unwrap();
        model.insert(key(i, 0), value(i, 24));
    }
    h.checkpoint(&mut [&mut tree]).unwrap();
    let mut pages = Vec::new();
    h.store
        .visit_pages(&tree, &mut |a, _| pages.push(a.0))
        .unwrap();
    let cut = pages.iter().max().unwrap() / 2;
    let below = pages.iter().filter(|&&a| a < cut).count();
    assert!(below > 50, "only {below} pages below the cut");
    // The emptied range takes no new pages (its disk is unavailable to the allocator).
    h.free.retain(|&a| a >= cut);
    let moving = move |p: &tessera_meta::PagePtr| p.addr.0 < cut;
    let mut rounds = 0;
    loop {
        // A change pending beside the relocation, as a live file system has.
        let i = 100_000 + rounds;
        h.store
            .insert(&mut tree, &key(i, 0), &value(i, 24))
            .unwrap();
        model.insert(key(i, 0), value(i, 24));
        let marked = h.store.relocate(&mut tree, &moving, 40).unwrap();
        assert!(marked <= 40);
        h.checkpoint(&mut [&mut tree]).unwrap();
        h.free.retain(|&a| a >= cut);
        rounds += 1;
        if marked == 0 {
            break;
        }
        assert!(rounds < 1000, "relocation does not converge");
    }
    assert!(
        rounds > below as u64 / 40,
        "{rounds} rounds for {below} pages"
    );
    let mut left = 0;
    h.store
        .visit_pages(&tree, &mut |a, _| left += usize::from(a.0 < cut))
        .unwrap();
    assert_eq!(left, 0, "pages still in the emptied range");
    assert_eq!(contents(&mut h, &tree), model_vec(&model));
    let roots = h.durable_roots.clone();
    let (mut h2, trees) = Harness::reopen(d, PAGE, 16, &roots, h.durable_generation);
    assert_eq!(contents(&mut h2, &trees[0]), model_vec(&model));
}

/// A mount opens every shard's tree at once: `prefetch_paths` reads the pages on the way to
/// one key in many trees (a level at a time, in parallel) so that the gets after it hit the
/// cache; a page that does not verify is left to the get, which reports it.
#[test]
fn prefetched_paths_serve_gets_from_the_cache_and_leave_bad_pages_to_the_get() {
    let (_dir, d) = drive(1 << 14);
    let mut h = Harness::new(d.clone(), PAGE, 64);
    let mut trees: Vec<Tree> = (0..30).map(|_| h.store.create_tree()).collect();
    for (t, tree) in trees.iter_mut().enumerate() {
        for i in 0..(t as u64 * 200) {
            h.store
                .insert(tree, &key(i, 0), &value(i + t as u64, 20))
                .unwrap();
        }
    }
    {
        let mut refs: Vec<&mut Tree> = trees.iter_mut().collect();
        h.checkpoint(&mut refs).unwrap();
    }
    let roots = h.durable_roots.clone();
    let fresh = |d: &Arc<dyn BlockDevice>| {
        tessera_meta::MetaStore::new(
            h.format,
            Arc::new(common::DriveReader {
                drive: d.clone(),
                page: PAGE,
            }),
            10_000,
            h.durable_generation + 1,
        )
    };
    let probe = key(150, 0);

    let mut store = fresh(&d);
    let mut trees: Vec<Tree> = roots.iter().map(|r| Tree::on_disk(*r)).collect();
    // One tree changed since the checkpoint: its root is in memory, its children on disk.
    store
        .insert(&mut trees[29], &key(1, 0), b"changed")
        .unwrap();
    let tall = roots[29];
    let refs: Vec<&Tree> = trees.iter().collect();
    store.prefetch_paths(&refs, &probe);
    let misses = store.stats().misses;
    for (t, tree) in trees.iter().enumerate() {
        let want = (150 < t as u64 * 200).then(|| value(150 + t as u64, 20));
        assert_eq!(store.get(tree, &probe).unwrap(), want, "tree {t}");
    }
    assert_eq!(
        store.stats().misses,
        misses,
        "a get after the prefetch read a page"
    );
    let mut levels = 0;
    store
        .visit_pages(&Tree::on_disk(tall), &mut |_, l| levels = levels.max(l))
        .unwrap();
    assert!(levels >= 1, "the largest tree has branch pages");

    // Garbage over every leaf of tree 7: the prefetch goes on, the get names the page.
    let mut leaves = Vec::new();
    fresh(&d)
        .visit_pages(&Tree::on_disk(roots[7]), &mut |a, l| {
            if l == 0 {
                leaves.push(a)
            }
        })
        .unwrap();
    for a in &leaves {
        let junk = tessera_drive::AlignedBuf::from_slice(&vec![0xa5u8; PAGE]);
        d.write_at(&junk, a.0 * PAGE as u64).unwrap();
    }
    let mut store = fresh(&d);
    let trees: Vec<Tree> = roots.iter().map(|r| Tree::on_disk(*r)).collect();
    store.prefetch_paths(&trees.iter().collect::<Vec<_>>(), &probe);
    match store.get(&trees[7], &probe) {
        Err(MetaError::Corrupt { .. }) => {}
        other => panic!("a garbage leaf read as {other:?}"),
    }
    for (t, tree) in trees.iter().enumerate().filter(|(t, _)| *t != 7) {
        let want = (150 < t as u64 * 200).then(|| value(150 + t as u64, 20));
        assert_eq!(store.get(tree, &probe).unwrap(), want, "tree {t}");
    }
}
