//! Reference-model test: random operation sequences run against both `AllocMap` and a plain
//! `HashSet` of used sub-blocks. After every step the two must agree on every result, on
//! space accounting (exactly), and on whether space exists at all.

use std::collections::HashSet;

use proptest::prelude::*;
use tessera_alloc::{
    AllocDisk, AllocError, AllocKind, AllocMap, BlockHint, DiskAddr, DiskIndex, DiskSpace, Extent,
    Placement, PoolId,
};

/// Disk indexes are deliberately sparse; `UNKNOWN_DISK` is not in the map.
const DISK_INDEXES: [DiskIndex; 3] = [0, 3, 7];
const UNKNOWN_DISK: DiskIndex = 9;

fn test_disks() -> Vec<AllocDisk> {
    let disk = |disk, pool, blocks, holds_data, holds_metadata| AllocDisk {
        disk,
        pool,
        blocks,
        holds_data,
        holds_metadata,
        available: true,
    };
    vec![
        disk(0, 0, 6, true, true),
        disk(3, 0, 5, true, false),
        disk(7, 1, 4, false, true),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    AllocBlock {
        pool: PoolId,
        metadata: bool,
        file: u64,
        index: u64,
        with_prev: bool,
    },
    AllocFragment {
        pool: PoolId,
        metadata: bool,
        size_seed: u32,
        near: Option<usize>,
    },
    FreeHandedOut {
        which: usize,
    },
    /// Seeds of an extent: mostly valid, sometimes empty, crossing a block or out of range.
    Free {
        disk: usize,
        block: u64,
        offset: u32,
        len: u32,
    },
    MarkUsed {
        disk: usize,
        block: u64,
        offset: u32,
        len: u32,
    },
    SetAvailable {
        disk: usize,
        available: bool,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let raw_extent = (0..4usize, 0..7u64, any::<u32>(), any::<u32>());
    prop_oneof![
        4 => (0..2u16, any::<bool>(), 0..4u64, 0..12u64, any::<bool>()).prop_map(
            |(pool, metadata, file, index, with_prev)| {
                Op::AllocBlock { pool, metadata, file, index, with_prev }
            }
        ),
        4 => (0..2u16, any::<bool>(), any::<u32>(), proptest::option::of(any::<usize>()))
            .prop_map(|(pool, metadata, size_seed, near)| {
                Op::AllocFragment { pool, metadata, size_seed, near }
            }),
        4 => any::<usize>().prop_map(|which| Op::FreeHandedOut { which }),
        1 => raw_extent
            .clone()
            .prop_map(|(disk, block, offset, len)| Op::Free { disk, block, offset, len }),
        2 => raw_extent
            .prop_map(|(disk, block, offset, len)| Op::MarkUsed { disk, block, offset, len }),
        1 => (0..3usize, any::<bool>())
            .prop_map(|(disk, available)| Op::SetAvailable { disk, available }),
    ]
}

struct Model {
    per_block: u32,
    disks: Vec<AllocDisk>,
    used: HashSet<(DiskIndex, u64)>,
}

impl Model {
    fn disk(&self, index: DiskIndex) -> Option<&AllocDisk> {
        self.disks.iter().find(|d| d.disk == index)
    }

    fn is_used(&self, disk: DiskIndex, sub_block: u64) -> bool {
        self.used.contains(&(disk, sub_block))
    }

    fn valid(&self, e: Extent) -> bool {
        let Some(d) = self.disk(e.addr.disk) else {
            return false;
        };
        let per_block = u64::from(self.per_block);
        let offset = e.addr.sub_block % per_block;
        e.sub_blocks >= 1
            && offset + u64::from(e.sub_blocks) <= per_block
            && e.addr.sub_block / per_block < d.blocks
    }

    fn sub_blocks(e: Extent) -> impl Iterator<Item = (DiskIndex, u64)> {
        (e.addr.sub_block..e.addr.sub_block + u64::from(e.sub_blocks))
            .map(move |s| (e.addr.disk, s))
    }

    fn used_in_block(&self, disk: DiskIndex, block: u64) -> u32 {
        let start = block * u64::from(self.per_block);
        let count = (start..start + u64::from(self.per_block))
            .filter(|&s| self.is_used(disk, s))
            .count();
        u32::try_from(count).unwrap()
    }

    fn longest_free_run(&self, disk: DiskIndex, block: u64) -> u32 {
        let start = block * u64::from(self.per_block);
        let (mut longest, mut run) = (0, 0);
        for s in start..start + u64::from(self.per_block) {
            run = if self.is_used(disk, s) { 0 } else { run + 1 };
            longest = longest.max(run);
        }
        longest
    }

    fn space(&self, disk: DiskIndex) -> DiskSpace {
        let d = self.disk(disk).unwrap();
        let mut space = DiskSpace {
            blocks_total: d.blocks,
            ..DiskSpace::default()
        };
        for block in 0..d.blocks {
            match self.used_in_block(disk, block) {
                0 => space.blocks_free += 1,
                used if used < self.per_block => {
                    space.sub_blocks_free_in_fragments += u64::from(self.per_block - used);
                }
                _ => {}
            }
        }
        space
    }

    fn eligible(&self, pool: PoolId, kind: AllocKind) -> Vec<&AllocDisk> {
        let holds = |d: &AllocDisk| match kind {
            AllocKind::Data => d.holds_data,
            AllocKind::Metadata => d.holds_metadata,
        };
        self.disks
            .iter()
            .filter(|d| d.available && d.pool == pool && holds(d))
            .collect()
    }

    /// Whether an eligible disk has a block whose longest free run is at least `len`, counting
    /// only partially used blocks when `partial_only`.
    fn has_room(&self, pool: PoolId, kind: AllocKind, len: u32, partial_only: bool) -> bool {
        self.eligible(pool, kind).iter().any(|d| {
            (0..d.blocks).any(|b| {
                let partial = self.used_in_block(d.disk, b) > 0;
                (partial || !partial_only) && self.longest_free_run(d.disk, b) >= len
            })
        })
    }
}

struct Harness {
    map: AllocMap,
    model: Model,
    handed_out: Vec<Extent>,
}

impl Harness {
    fn new(per_block: u32, placement: Placement) -> Harness {
        let disks = test_disks();
        Harness {
            map: AllocMap::new(per_block, placement, disks.clone()),
            model: Model {
                per_block,
                disks,
                used: HashSet::new(),
            },
            handed_out: Vec::new(),
        }
    }

    fn raw_extent(&self, disk: usize, block: u64, offset: u32, len: u32) -> Extent {
        let disk = DISK_INDEXES.get(disk).copied().unwrap_or(UNKNOWN_DISK);
        let per_block = self.model.per_block;
        let offset = offset % per_block;
        let len = if len & 7 == 0 {
            len / 8 % (per_block + 2)
        } else {
            1 + len % (per_block - offset)
        };
        let sub_block = block * u64::from(per_block) + u64::from(offset);
        Extent {
            addr: DiskAddr { disk, sub_block },
            sub_blocks: len,
        }
    }

    fn check_new_extent(&mut self, e: Extent, pool: PoolId, kind: AllocKind) {
        assert!(self.model.valid(e), "allocator handed out invalid {e:?}");
        let eligible = self.model.eligible(pool, kind);
        assert!(
            eligible.iter().any(|d| d.disk == e.addr.disk),
            "{e:?} on an ineligible disk"
        );
        for s in Model::sub_blocks(e) {
            assert!(
                self.model.used.insert(s),
                "{e:?} handed out twice (sub-block {s:?})"
            );
        }
        assert!(!self.map.is_free(e));
        self.handed_out.push(e);
    }

    fn alloc_block(&mut self, pool: PoolId, kind: AllocKind, file: u64, index: u64, prev: bool) {
        let prev = if prev {
            self.handed_out.last().map(|e| e.addr)
        } else {
            None
        };
        let hint = BlockHint {
            file_key: file,
            block_index: index,
            prev,
        };
        let expect_room = self.model.has_room(pool, kind, self.model.per_block, false);
        match self.map.alloc_block(pool, kind, hint) {
            Ok(e) => {
                assert!(
                    expect_room,
                    "allocated {e:?} but the model has no free block"
                );
                assert_eq!(e.sub_blocks, self.model.per_block);
                assert_eq!(
                    self.model
                        .used_in_block(e.addr.disk, e.addr.sub_block / u64::from(e.sub_blocks)),
                    0
                );
                self.check_new_extent(e, pool, kind);
            }
            Err(AllocError::NoSpace { pool: p, kind: k }) => {
                assert!(!expect_room, "NoSpace but the model has a free block");
                assert_eq!((p, k), (pool, kind));
            }
            Err(other) => panic!("unexpected {other}"),
        }
    }

    fn alloc_fragment(&mut self, pool: PoolId, kind: AllocKind, seed: u32, near: Option<usize>) {
        if self.model.per_block == 1 {
            return;
        }
        let len = 1 + seed % (self.model.per_block - 1);
        let near = near.and_then(|i| self.handed_out.get(i % self.handed_out.len().max(1)));
        let near = near.map(|e| e.addr);
        let expect_room = self.model.has_room(pool, kind, len, false);
        let expect_partial = self.model.has_room(pool, kind, len, true);
        match self.map.alloc_fragment(pool, kind, len, near) {
            Ok(e) => {
                assert!(expect_room, "allocated {e:?} but the model has no room");
                assert_eq!(e.sub_blocks, len);
                let block = e.addr.sub_block / u64::from(self.model.per_block);
                let was_partial = self.model.used_in_block(e.addr.disk, block) > 0;
                assert_eq!(
                    was_partial, expect_partial,
                    "partial blocks must be packed first"
                );
                self.check_new_extent(e, pool, kind);
            }
            Err(AllocError::NoSpace { .. }) => assert!(!expect_room, "NoSpace but model has room"),
            Err(other) => panic!("unexpected {other}"),
        }
    }

    fn free(&mut self, e: Extent) {
        let result = self.map.free(e);
        if !self.model.valid(e) {
            assert!(
                matches!(result, Err(AllocError::OutOfRange { .. })),
                "{result:?}"
            );
        } else if Model::sub_blocks(e).any(|s| !self.model.used.contains(&s)) {
            assert!(
                matches!(result, Err(AllocError::NotAllocated { .. })),
                "{result:?}"
            );
        } else {
            result.unwrap();
            Model::sub_blocks(e).for_each(|s| assert!(self.model.used.remove(&s)));
            assert!(self.map.is_free(e));
        }
    }

    fn mark_used(&mut self, e: Extent) {
        let result = self.map.mark_used(e);
        if !self.model.valid(e) {
            assert!(
                matches!(result, Err(AllocError::OutOfRange { .. })),
                "{result:?}"
            );
        } else if Model::sub_blocks(e).any(|s| self.model.used.contains(&s)) {
            assert!(
                matches!(result, Err(AllocError::AlreadyUsed { .. })),
                "{result:?}"
            );
        } else {
            result.unwrap();
            Model::sub_blocks(e).for_each(|s| assert!(self.model.used.insert(s)));
            self.handed_out.push(e);
        }
    }

    fn apply(&mut self, op: Op) {
        let kind = |metadata| {
            if metadata {
                AllocKind::Metadata
            } else {
                AllocKind::Data
            }
        };
        match op {
            Op::AllocBlock {
                pool,
                metadata,
                file,
                index,
                with_prev,
            } => {
                self.alloc_block(pool, kind(metadata), file, index, with_prev);
            }
            Op::AllocFragment {
                pool,
                metadata,
                size_seed,
                near,
            } => {
                self.alloc_fragment(pool, kind(metadata), size_seed, near);
            }
            Op::FreeHandedOut { which } => {
                if !self.handed_out.is_empty() {
                    let e = self.handed_out.swap_remove(which % self.handed_out.len());
                    self.free(e);
                }
            }
            Op::Free {
                disk,
                block,
                offset,
                len,
            } => {
                self.free(self.raw_extent(disk, block, offset, len));
            }
            Op::MarkUsed {
                disk,
                block,
                offset,
                len,
            } => {
                self.mark_used(self.raw_extent(disk, block, offset, len));
            }
            Op::SetAvailable { disk, available } => {
                self.map.set_available(DISK_INDEXES[disk], available);
                self.model
                    .disks
                    .iter_mut()
                    .find(|d| d.disk == DISK_INDEXES[disk])
                    .unwrap()
                    .available = available;
            }
        }
    }

    fn check_space(&self) {
        for disk in DISK_INDEXES {
            assert_eq!(
                self.map.disk_space(disk),
                self.model.space(disk),
                "disk {disk}"
            );
        }
        for (pool, kind) in [
            (0, AllocKind::Data),
            (0, AllocKind::Metadata),
            (1, AllocKind::Metadata),
        ] {
            let mut expected = DiskSpace::default();
            let holds = |d: &&AllocDisk| match kind {
                AllocKind::Data => d.holds_data,
                AllocKind::Metadata => d.holds_metadata,
            };
            for d in self
                .model
                .disks
                .iter()
                .filter(|d| d.pool == pool)
                .filter(holds)
            {
                let space = self.model.space(d.disk);
                expected.blocks_total += space.blocks_total;
                expected.blocks_free += space.blocks_free;
                expected.sub_blocks_free_in_fragments += space.sub_blocks_free_in_fragments;
            }
            assert_eq!(self.map.pool_space(pool, kind), expected);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn matches_reference_model(
        per_block in prop::sample::select(vec![1u32, 2, 4, 8, 16, 64, 128]),
        cluster in any::<bool>(),
        ops in prop::collection::vec(op_strategy(), 1..200),
    ) {
        let placement = if cluster { Placement::Cluster } else { Placement::Scatter };
        let mut harness = Harness::new(per_block, placement);
        for op in ops {
            harness.apply(op);
            harness.check_space();
        }
        // Freeing every used sub-block restores every disk to empty.
        let used: Vec<(DiskIndex, u64)> = harness.model.used.iter().copied().collect();
        for (disk, sub_block) in used {
            harness.free(Extent { addr: DiskAddr { disk, sub_block }, sub_blocks: 1 });
        }
        harness.check_space();
        for disk in DISK_INDEXES {
            let space = harness.map.disk_space(disk);
            prop_assert_eq!(space.blocks_free, space.blocks_total);
        }
    }
}
