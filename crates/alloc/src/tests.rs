//! Unit tests of the allocation map. The reference-model property test is in `tests/model.rs`.

use std::collections::HashMap;

use super::*;

fn disk(disk: DiskIndex, pool: PoolId, blocks: u64, data: bool, metadata: bool) -> AllocDisk {
    AllocDisk {
        disk,
        pool,
        blocks,
        holds_data: data,
        holds_metadata: metadata,
        available: true,
    }
}

fn hint(file_key: u64, block_index: u64, prev: Option<DiskAddr>) -> BlockHint {
    BlockHint {
        file_key,
        block_index,
        prev,
    }
}

fn data_disks(count: u16, blocks: u64) -> Vec<AllocDisk> {
    (0..count).map(|d| disk(d, 0, blocks, true, true)).collect()
}

#[test]
fn block_is_full_aligned_and_used() {
    let mut map = AllocMap::new(32, Placement::Scatter, data_disks(2, 10));
    assert_eq!(map.sub_blocks_per_block(), 32);
    let e = map
        .alloc_block(0, AllocKind::Data, hint(1, 0, None))
        .unwrap();
    assert_eq!(e.sub_blocks, 32);
    assert_eq!(e.addr.sub_block % 32, 0);
    assert!(!map.is_free(e));
    assert_eq!(map.pool_space(0, AllocKind::Data).blocks_free, 19);
    map.free(e).unwrap();
    assert!(map.is_free(e));
    assert_eq!(map.pool_space(0, AllocKind::Data).blocks_free, 20);
}

#[test]
fn scatter_balances_and_stripes() {
    let mut map = AllocMap::new(8, Placement::Scatter, data_disks(4, 2_000));
    let mut per_disk: HashMap<DiskIndex, u64> = HashMap::new();
    for file in 0..10u64 {
        let mut prev: Option<DiskAddr> = None;
        for block_index in 0..400 {
            let key = file * 7_919 + 13;
            let e = map
                .alloc_block(0, AllocKind::Data, hint(key, block_index, prev))
                .unwrap();
            if let Some(p) = prev {
                assert_ne!(
                    p.disk, e.addr.disk,
                    "consecutive blocks of a file on one disk"
                );
            }
            *per_disk.entry(e.addr.disk).or_default() += 1;
            prev = Some(e.addr);
        }
    }
    for d in 0..4 {
        let share = per_disk[&d] as f64 / 4_000.0;
        assert!((share - 0.25).abs() <= 0.03, "disk {d} got {share}");
    }
}

#[test]
fn scatter_without_prev_still_distinct_and_random_within_disk() {
    let mut map = AllocMap::new(1, Placement::Scatter, data_disks(3, 1_000));
    let addrs: Vec<DiskAddr> = (0..30)
        .map(|i| {
            map.alloc_block(0, AllocKind::Data, hint(42, i, None))
                .unwrap()
                .addr
        })
        .collect();
    for pair in addrs.windows(2) {
        assert_ne!(pair[0].disk, pair[1].disk);
    }
    // Pseudo-random placement inside the disk: not simply the lowest blocks.
    assert!(addrs.iter().any(|a| a.sub_block >= 100));
}

#[test]
fn scatter_falls_back_when_preferred_disk_is_full() {
    let mut disks = data_disks(3, 100);
    disks[0].blocks = 2;
    let mut map = AllocMap::new(4, Placement::Scatter, disks);
    for i in 0..150 {
        map.alloc_block(0, AllocKind::Data, hint(i % 5, i, None))
            .unwrap();
    }
    assert_eq!(map.disk_space(0).blocks_free, 0);
    assert_eq!(map.pool_space(0, AllocKind::Data).blocks_free, 202 - 150);
    // Fallback fills the remaining disks evenly.
    let free1 = map.disk_space(1).blocks_free;
    let free2 = map.disk_space(2).blocks_free;
    assert!(free1.abs_diff(free2) <= 2, "{free1} vs {free2}");
}

#[test]
fn cluster_continues_runs_then_moves_on() {
    let mut map = AllocMap::new(4, Placement::Cluster, data_disks(2, 8));
    let first = map
        .alloc_block(0, AllocKind::Data, hint(1, 0, None))
        .unwrap();
    let mut prev = first.addr;
    for i in 1..4 {
        let e = map
            .alloc_block(0, AllocKind::Data, hint(1, i, Some(prev)))
            .unwrap();
        assert_eq!(e.addr.disk, prev.disk);
        assert_eq!(e.addr.sub_block, prev.sub_block + 4);
        prev = e.addr;
    }
    // Occupy the block right after the run: the next block goes to the other disk.
    let blocker = Extent {
        addr: DiskAddr {
            disk: prev.disk,
            sub_block: prev.sub_block + 4,
        },
        sub_blocks: 4,
    };
    map.mark_used(blocker).unwrap();
    let e = map
        .alloc_block(0, AllocKind::Data, hint(1, 4, Some(prev)))
        .unwrap();
    assert_ne!(e.addr.disk, prev.disk);
}

#[test]
fn pools_and_kinds_are_separate() {
    let mut disks = vec![
        disk(0, 0, 50, true, false),
        disk(1, 0, 50, false, true),
        disk(2, 1, 50, true, false),
        disk(3, 0, 50, true, false),
    ];
    disks[3].available = false;
    for placement in [Placement::Scatter, Placement::Cluster] {
        let mut map = AllocMap::new(8, placement, disks.clone());
        for i in 0..20 {
            let h = hint(i, i, None);
            assert_eq!(map.alloc_block(0, AllocKind::Data, h).unwrap().addr.disk, 0);
            assert_eq!(
                map.alloc_block(0, AllocKind::Metadata, h)
                    .unwrap()
                    .addr
                    .disk,
                1
            );
            assert_eq!(map.alloc_block(1, AllocKind::Data, h).unwrap().addr.disk, 2);
            assert_eq!(
                map.alloc_fragment(0, AllocKind::Data, 3, None)
                    .unwrap()
                    .addr
                    .disk,
                0
            );
            assert_eq!(
                map.alloc_fragment(0, AllocKind::Metadata, 3, None)
                    .unwrap()
                    .addr
                    .disk,
                1
            );
        }
        assert!(matches!(
            map.alloc_block(1, AllocKind::Metadata, hint(0, 0, None)),
            Err(AllocError::NoSpace {
                pool: 1,
                kind: AllocKind::Metadata
            })
        ));
        assert!(matches!(
            map.alloc_block(9, AllocKind::Data, hint(0, 0, None)),
            Err(AllocError::NoSpace { pool: 9, .. })
        ));
        let data0 = map.pool_space(0, AllocKind::Data);
        assert_eq!(
            data0.blocks_total, 100,
            "unavailable disks still count in totals"
        );
        assert_eq!(map.pool_space(0, AllocKind::Metadata).blocks_total, 50);
        map.set_available(3, true);
        map.set_available(0, false);
        let e = map
            .alloc_block(0, AllocKind::Data, hint(1, 1, None))
            .unwrap();
        assert_eq!(e.addr.disk, 3);
        assert!(!map.disks()[0].available);
    }
}

#[test]
fn filling_a_disk_reports_no_space() {
    for placement in [Placement::Scatter, Placement::Cluster] {
        let mut map = AllocMap::new(8, placement, data_disks(1, 100));
        let mut extents = Vec::new();
        for i in 0..100 {
            extents.push(
                map.alloc_block(0, AllocKind::Data, hint(i, i, None))
                    .unwrap(),
            );
        }
        let no_space = map.alloc_block(0, AllocKind::Data, hint(0, 100, None));
        assert!(matches!(
            no_space,
            Err(AllocError::NoSpace {
                pool: 0,
                kind: AllocKind::Data
            })
        ));
        assert!(matches!(
            map.alloc_fragment(0, AllocKind::Data, 1, None),
            Err(AllocError::NoSpace { .. })
        ));
        assert!(map.alloc_contiguous_blocks(0, AllocKind::Data, 1).is_err());
        assert_eq!(
            map.disk_space(0),
            DiskSpace {
                blocks_total: 100,
                ..DiskSpace::default()
            }
        );
        map.free(extents[37]).unwrap();
        for _ in 0..8 {
            let e = map.alloc_fragment(0, AllocKind::Data, 1, None).unwrap();
            assert_eq!(e.addr.sub_block / 8, extents[37].addr.sub_block / 8);
        }
        assert!(map.alloc_fragment(0, AllocKind::Data, 1, None).is_err());
        assert!(map
            .alloc_block(0, AllocKind::Data, hint(0, 0, None))
            .is_err());
    }
}

#[test]
fn fragments_best_fit_and_split() {
    let mut map = AllocMap::new(16, Placement::Scatter, data_disks(1, 10));
    // Blocks 0, 1, 2 get longest free runs of 3, 5 and 10.
    for (block, used) in [(0u64, 13u32), (1, 11), (2, 6)] {
        let addr = DiskAddr {
            disk: 0,
            sub_block: block * 16,
        };
        map.mark_used(Extent {
            addr,
            sub_blocks: used,
        })
        .unwrap();
    }
    let space = map.disk_space(0);
    assert_eq!(space.blocks_free, 7);
    assert_eq!(space.sub_blocks_free_in_fragments, 18);
    let e = map.alloc_fragment(0, AllocKind::Data, 4, None).unwrap();
    assert_eq!(e.addr.sub_block, 16 + 11, "best fit is block 1");
    let e = map.alloc_fragment(0, AllocKind::Data, 3, None).unwrap();
    assert_eq!(e.addr.sub_block, 13, "best fit is block 0");
    let e = map.alloc_fragment(0, AllocKind::Data, 11, None).unwrap();
    assert_eq!(
        e.addr.sub_block % 16,
        0,
        "no partial block fits: a free block is split"
    );
    assert_eq!(map.disk_space(0).blocks_free, 6);
    // Within a block, the smallest run that fits is used.
    let mut map = AllocMap::new(16, Placement::Scatter, data_disks(1, 10));
    let block9 = DiskAddr {
        disk: 0,
        sub_block: 9 * 16,
    };
    map.mark_used(Extent {
        addr: block9,
        sub_blocks: 16,
    })
    .unwrap();
    let hole = |offset: u64, len: u32| Extent {
        addr: DiskAddr {
            disk: 0,
            sub_block: 9 * 16 + offset,
        },
        sub_blocks: len,
    };
    map.free(hole(0, 8)).unwrap();
    map.free(hole(12, 3)).unwrap();
    let e = map
        .alloc_fragment(0, AllocKind::Data, 2, Some(block9))
        .unwrap();
    assert_eq!(e.addr.sub_block, 9 * 16 + 12);
}

#[test]
fn fragment_prefers_near_disk() {
    let mut map = AllocMap::new(8, Placement::Scatter, data_disks(3, 10));
    let near = DiskAddr {
        disk: 2,
        sub_block: 40,
    };
    let e = map
        .alloc_fragment(0, AllocKind::Data, 3, Some(near))
        .unwrap();
    assert_eq!(e.addr.disk, 2);
    assert_eq!(e.addr.sub_block, 40, "splits the free block at near");
    let e2 = map
        .alloc_fragment(0, AllocKind::Data, 2, Some(near))
        .unwrap();
    assert_eq!(e2.addr.sub_block, 43, "packs into the partial block");
}

#[test]
fn mark_used_and_free_report_errors() {
    let mut map = AllocMap::new(8, Placement::Cluster, data_disks(2, 4));
    let at = |disk, sub_block, sub_blocks| Extent {
        addr: DiskAddr { disk, sub_block },
        sub_blocks,
    };
    map.mark_used(at(1, 3, 4)).unwrap();
    assert!(matches!(
        map.mark_used(at(1, 6, 2)),
        Err(AllocError::AlreadyUsed { .. })
    ));
    assert!(
        map.is_free(at(1, 7, 1)),
        "a failed mark_used changes nothing"
    );
    assert!(matches!(
        map.free(at(1, 2, 2)),
        Err(AllocError::NotAllocated { .. })
    ));
    assert!(!map.is_free(at(1, 3, 1)), "a failed free changes nothing");
    for bad in [
        at(5, 0, 1),
        at(0, 6, 3),
        at(0, 32, 1),
        at(0, 0, 0),
        at(0, 0, 9),
    ] {
        assert!(
            matches!(map.mark_used(bad), Err(AllocError::OutOfRange { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(map.free(bad), Err(AllocError::OutOfRange { .. })),
            "{bad:?}"
        );
    }
    map.free(at(1, 3, 4)).unwrap();
    assert_eq!(
        map.disk_space(1),
        DiskSpace {
            blocks_total: 4,
            blocks_free: 4,
            ..Default::default()
        }
    );
}

#[test]
fn contiguous_blocks_for_the_journal() {
    let mut map = AllocMap::new(4, Placement::Scatter, data_disks(2, 20));
    map.mark_used(Extent {
        addr: DiskAddr {
            disk: 0,
            sub_block: 5 * 4,
        },
        sub_blocks: 1,
    })
    .unwrap();
    map.mark_used(Extent {
        addr: DiskAddr {
            disk: 1,
            sub_block: 2 * 4,
        },
        sub_blocks: 4,
    })
    .unwrap();
    let (start, count) = map
        .alloc_contiguous_blocks(0, AllocKind::Metadata, 12)
        .unwrap();
    assert_eq!(count, 12);
    assert_eq!(start.sub_block % 4, 0);
    let first = start.sub_block / 4;
    assert!(first == 6 || (start.disk == 1 && first == 3), "{start:?}");
    for block in first..first + 12 {
        let e = Extent {
            addr: DiskAddr {
                disk: start.disk,
                sub_block: block * 4,
            },
            sub_blocks: 4,
        };
        assert!(!map.is_free(e));
    }
    assert!(map
        .alloc_contiguous_blocks(0, AllocKind::Metadata, 18)
        .is_err());
}

/// A million blocks over four disks: allocation and free must stay cheap per operation.
#[test]
fn million_blocks_is_fast() {
    for placement in [Placement::Scatter, Placement::Cluster] {
        let mut map = AllocMap::new(32, placement, data_disks(4, 250_000));
        let mut extents = Vec::with_capacity(100_000);
        let mut prev = None;
        for i in 0..100_000u64 {
            let e = map
                .alloc_block(0, AllocKind::Data, hint(i / 100, i % 100, prev))
                .unwrap();
            prev = if i % 100 == 99 { None } else { Some(e.addr) };
            extents.push(e);
        }
        for i in 0..10_000u32 {
            extents.push(
                map.alloc_fragment(0, AllocKind::Data, 1 + i % 31, None)
                    .unwrap(),
            );
        }
        assert!(map.pool_space(0, AllocKind::Data).blocks_free < 900_000);
        for e in extents.drain(..) {
            map.free(e).unwrap();
        }
        let space = map.pool_space(0, AllocKind::Data);
        assert_eq!(
            space,
            DiskSpace {
                blocks_total: 1_000_000,
                blocks_free: 1_000_000,
                ..Default::default()
            }
        );
    }
}

#[test]
fn bitmaps_round_trip_with_their_indexes() {
    // Blocks of 64 sub-blocks over two disks, enough for several chunks of 508 words each.
    let disks = || data_disks(2, 1200);
    let mut map = AllocMap::new(64, Placement::Scatter, disks());
    let mut kept = Vec::new();
    for i in 0..700u64 {
        let e = if i % 3 == 0 {
            map.alloc_fragment(0, AllocKind::Data, 1 + (i % 40) as u32, None)
        } else {
            map.alloc_block(0, AllocKind::Data, hint(i, i, None))
        }
        .unwrap();
        if i % 5 == 0 {
            map.free(e).unwrap();
        } else {
            kept.push(e);
        }
    }
    let bitmaps: Vec<Vec<u64>> = (0..2).map(|d| map.bitmap(d).to_vec()).collect();
    let mut loaded = AllocMap::from_bitmaps(64, Placement::Scatter, disks(), bitmaps).unwrap();
    for d in 0..2 {
        assert_eq!(loaded.disk_space(d), map.disk_space(d));
        assert_eq!(loaded.bitmap(d), map.bitmap(d));
        assert_eq!(loaded.chunk_count(d), 1200 * 64 / 64 / MAP_CHUNK_WORDS + 1);
    }
    assert!(
        loaded.take_dirty_chunks().is_empty(),
        "a loaded map starts clean"
    );
    for e in &kept {
        assert!(!loaded.is_free(*e));
    }
    // The derived indexes work: fragments pack into partial blocks, frees restore space.
    for e in kept.iter().take(100) {
        loaded.free(*e).unwrap();
    }
    while loaded.alloc_fragment(0, AllocKind::Data, 7, None).is_ok() {}
    assert!(loaded.pool_space(0, AllocKind::Data).blocks_free == 0);
}

#[test]
fn bitmaps_that_do_not_fit_are_refused() {
    let disks = || data_disks(1, 9);
    assert!(AllocMap::from_bitmaps(32, Placement::Scatter, disks(), vec![vec![0; 4]]).is_err());
    // 9 blocks of 32 sub-blocks: 5 words, the last one half used by the disk.
    let mut words = vec![0u64; 5];
    words[4] = 1 << 40;
    let err = AllocMap::from_bitmaps(32, Placement::Scatter, disks(), vec![words]).unwrap_err();
    assert!(err.contains("beyond"), "{err}");
    assert!(AllocMap::from_bitmaps(32, Placement::Scatter, disks(), vec![]).is_err());
}

#[test]
fn changed_chunks_are_reported_once() {
    // A disk of 600 words of bitmap (one sub-block per block): two chunks.
    let mut map = AllocMap::new(1, Placement::Cluster, data_disks(1, 600 * 64));
    assert_eq!(map.chunk_count(0), 2);
    assert!(map.take_dirty_chunks().is_empty());
    let far = Extent {
        addr: DiskAddr {
            disk: 0,
            sub_block: 550 * 64,
        },
        sub_blocks: 1,
    };
    map.mark_used(far).unwrap();
    assert_eq!(map.take_dirty_chunks(), vec![(0, 1)]);
    assert!(map.take_dirty_chunks().is_empty());
    map.mark_chunks_dirty(far).unwrap();
    assert_eq!(map.take_dirty_chunks(), vec![(0, 1)]);
    map.mark_all_chunks_dirty();
    assert_eq!(map.take_dirty_chunks(), vec![(0, 0), (0, 1)]);
    assert_eq!(map.chunk_words(0, 1).len(), 600 - MAP_CHUNK_WORDS);
    assert_eq!(map.chunk_words(0, 1)[550 - MAP_CHUNK_WORDS], 1);
}

#[test]
fn allocation_can_be_restricted_to_some_disks() {
    let mut map = AllocMap::new(8, Placement::Scatter, data_disks(4, 50));
    let only_odd = |d: DiskIndex| d % 2 == 1;
    for i in 0..60 {
        let e = map
            .alloc_block_on(0, AllocKind::Data, hint(3, i, None), &only_odd)
            .unwrap();
        assert!(only_odd(e.addr.disk), "block on disk {}", e.addr.disk);
        let f = map
            .alloc_fragment_on(0, AllocKind::Data, 3, None, &only_odd)
            .unwrap();
        assert!(only_odd(f.addr.disk), "fragment on disk {}", f.addr.disk);
    }
    // Once the allowed disks are full there is no space, though the others are empty.
    while map
        .alloc_block_on(0, AllocKind::Data, hint(4, 0, None), &only_odd)
        .is_ok()
    {}
    assert!(matches!(
        map.alloc_block_on(0, AllocKind::Data, hint(4, 0, None), &only_odd),
        Err(AllocError::NoSpace { .. })
    ));
    assert_eq!(map.disk_space(0).blocks_free, 50);
    assert_eq!(map.disk_space(2).blocks_free, 50);
    assert!(map
        .alloc_block(0, AllocKind::Data, hint(4, 0, None))
        .is_ok());
}

#[test]
fn an_added_disk_is_free_stored_whole_and_allocated_from_once_available() {
    let mut map = AllocMap::new(8, Placement::Scatter, data_disks(2, 40));
    for i in 0..70 {
        map.alloc_block(0, AllocKind::Data, hint(1, i, None))
            .unwrap();
    }
    let _ = map.take_dirty_chunks();
    let mut added = disk(2, 0, 100, true, false);
    added.available = false;
    map.add_disk(added);
    assert_eq!(map.disks().len(), 3);
    assert_eq!(map.disk_space(2).blocks_free, 100);
    // Its whole bitmap is changed (the next checkpoint writes it); the others are not.
    let dirty = map.take_dirty_chunks();
    assert_eq!(dirty.len(), map.chunk_count(2));
    assert!(dirty.iter().all(|(d, _)| *d == 2));
    // Not available yet: the full old disks run out and the new one is not used.
    for i in 0..10 {
        map.alloc_block(0, AllocKind::Data, hint(1, 70 + i, None))
            .unwrap();
    }
    assert!(map
        .alloc_block(0, AllocKind::Data, hint(1, 80, None))
        .is_err());
    map.set_available(2, true);
    let e = map
        .alloc_block(0, AllocKind::Data, hint(1, 80, None))
        .unwrap();
    assert_eq!(e.addr.disk, 2);
    // Metadata never goes to a data-only disk.
    assert!(map
        .alloc_block(0, AllocKind::Metadata, hint(2, 0, None))
        .is_err());
}

/// Fills a map with a mix of whole blocks and fragments, freeing some again (deterministic).
fn churn(map: &mut AllocMap, seed: u64, count: u64) {
    let mut kept = Vec::new();
    let mut x = seed;
    for i in 0..count {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let e = if x.is_multiple_of(3) {
            map.alloc_block(0, AllocKind::Data, hint(seed, i, None))
        } else {
            map.alloc_fragment(0, AllocKind::Data, 1 + (x >> 40) as u32 % 7, None)
        }
        .unwrap();
        if x.is_multiple_of(5) {
            map.free(e).unwrap();
        } else {
            kept.push(e);
        }
    }
}

#[test]
fn a_chunk_set_from_another_map_reads_as_a_map_built_from_the_merged_bitmap() {
    // 8 sub-blocks a block: a chunk is 4,064 blocks, the disk three chunks (the last short).
    let disks = || data_disks(1, 10_000);
    let mut a = AllocMap::new(8, Placement::Scatter, disks());
    let mut b = AllocMap::new(8, Placement::Cluster, disks());
    churn(&mut a, 1, 8_000);
    churn(&mut b, 2, 5_000);
    assert!(
        a.chunk_words(0, 1).iter().any(|w| *w != 0),
        "a uses chunk 1"
    );
    assert_eq!(b.chunk_count(0), 3);
    let mut merged = b.bitmap(0).to_vec();
    let from_a = a.chunk_words(0, 1).to_vec();
    merged[MAP_CHUNK_WORDS..2 * MAP_CHUNK_WORDS].copy_from_slice(&from_a);
    b.take_dirty_chunks();
    b.set_chunk_words(0, 1, &from_a).unwrap();
    assert_eq!(
        b.take_dirty_chunks(),
        vec![(0, 1)],
        "the chunk is to be stored"
    );
    assert_eq!(b.bitmap(0), &merged[..]);
    let built =
        AllocMap::from_bitmaps(8, Placement::Cluster, disks(), vec![merged.clone()]).unwrap();
    assert_eq!(b.disk_space(0), built.disk_space(0));
    // Everything still free is handed out exactly once, never a used sub-block.
    let mut used = merged;
    loop {
        let e = match b.alloc_fragment(0, AllocKind::Data, 3, None) {
            Ok(e) => e,
            Err(_) => match b.alloc_fragment(0, AllocKind::Data, 1, None) {
                Ok(e) => e,
                Err(_) => break,
            },
        };
        for s in e.addr.sub_block..e.addr.sub_block + u64::from(e.sub_blocks) {
            let (w, bit) = ((s / 64) as usize, s % 64);
            assert_eq!(used[w] >> bit & 1, 0, "sub-block {s} handed out while used");
            used[w] |= 1 << bit;
        }
    }
    assert_eq!(b.disk_space(0).blocks_free, 0);
    assert_eq!(b.disk_space(0).sub_blocks_free_in_fragments, 0);
}

#[test]
fn a_chunk_held_all_used_takes_no_allocation() {
    let mut map = AllocMap::new(8, Placement::Scatter, data_disks(2, 10_000));
    churn(&mut map, 3, 2_000);
    let before = map.disk_space(1);
    let chunk: Vec<u64> = map.chunk_words(1, 1).to_vec();
    let free_in_chunk: u64 = chunk.iter().map(|w| u64::from(w.count_zeros())).sum();
    map.set_chunk_words(1, 1, &vec![u64::MAX; chunk.len()])
        .unwrap();
    let after = map.disk_space(1);
    let free = |s: DiskSpace| s.blocks_free * 8 + s.sub_blocks_free_in_fragments;
    assert_eq!(free(before) - free(after), free_in_chunk);
    let held = (MAP_CHUNK_WORDS as u64 * 64)..(2 * MAP_CHUNK_WORDS as u64 * 64);
    while let Ok(e) = map.alloc_block(0, AllocKind::Data, hint(9, 0, None)) {
        assert!(
            e.addr.disk != 1 || !held.contains(&e.addr.sub_block),
            "{e:?} is in the held chunk"
        );
    }
    // Given back: its words as they were, and its space with them.
    let full = free(map.disk_space(1));
    map.set_chunk_words(1, 1, &chunk).unwrap();
    assert_eq!(free(map.disk_space(1)) - full, free_in_chunk);
    assert_eq!(map.chunk_words(1, 1), &chunk[..]);
}

#[test]
fn a_block_across_a_chunk_edge_keeps_its_part_on_each_side() {
    // 1,024 sub-blocks a block: chunk 1 (sub-blocks 32,512 to 65,023) holds the last 256
    // sub-blocks of block 31 and the first 512 of block 63.
    let mut map = AllocMap::new(1024, Placement::Scatter, data_disks(1, 100));
    let words = map.chunk_words(0, 1).len();
    map.set_chunk_words(0, 1, &vec![u64::MAX; words]).unwrap();
    let space = map.disk_space(0);
    assert_eq!(
        space.blocks_free,
        31 + 36,
        "blocks 0-30 and 64-99 are outside chunk 1"
    );
    assert_eq!(space.sub_blocks_free_in_fragments, 768 + 512);
    let e = map.alloc_fragment(0, AllocKind::Data, 700, None).unwrap();
    assert_eq!(e.addr.sub_block / 1024, 31, "the free part of block 31");
    map.set_chunk_words(0, 1, &vec![0; words]).unwrap();
    let space = map.disk_space(0);
    assert_eq!(space.blocks_free, 31 + 100 - 32);
}

#[test]
fn a_bad_chunk_is_refused_and_changes_nothing() {
    // 80,008 sub-blocks: the last word has 8 bits of disk.
    let mut map = AllocMap::new(8, Placement::Scatter, data_disks(1, 10_001));
    let before = map.bitmap(0).to_vec();
    let len = map.chunk_words(0, 2).len();
    assert!(map
        .set_chunk_words(0, 0, &[0; 3])
        .unwrap_err()
        .contains("words for chunk 0"));
    assert!(map
        .set_chunk_words(0, 3, &[0; 3])
        .unwrap_err()
        .contains("beyond"));
    assert!(map
        .set_chunk_words(7, 0, &[0; 3])
        .unwrap_err()
        .contains("disk 7"));
    assert!(map
        .set_chunk_words(0, 2, &vec![u64::MAX; len])
        .unwrap_err()
        .contains("beyond the disk"));
    assert_eq!(map.bitmap(0), &before[..]);
}
