//! Space and inode reports for `tessera df` (mmdf).

use serde::{Deserialize, Serialize};

use crate::error::FsResult;
use crate::fs::FileSystem;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DfDisk {
    pub nsd_name: String,
    pub pool: String,
    pub failure_group: i32,
    pub holds_metadata: bool,
    pub holds_data: bool,
    pub size_bytes: u64,
    pub free_full_block_bytes: u64,
    pub free_fragment_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DfPool {
    pub pool: String,
    pub size_bytes: u64,
    pub free_full_block_bytes: u64,
    pub free_fragment_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeUsage {
    pub used: u64,
    pub free: u64,
    pub allocated: u64,
    pub max: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DfReport {
    pub block_size: u32,
    pub sub_block_size: u32,
    pub disks: Vec<DfDisk>,
    pub pools: Vec<DfPool>,
    pub inodes: InodeUsage,
    /// Owner slots that did not answer for their regions' free space and their inodes
    /// (their free space shows as used, their inodes as free).
    #[serde(default)]
    pub unanswered_slots: Vec<u32>,
}

/// What the owner slots beside the file system manager say of their space.
pub(crate) struct SlotsSpace {
    /// By disk index: whole blocks free and sub-blocks free in fragments, in the slots'
    /// regions (which the manager's map holds as used).
    pub free: std::collections::HashMap<u32, (u64, u64)>,
    /// Inodes the slots' shards use.
    pub inodes: u64,
    /// Slots whose owner did not answer.
    pub unanswered: Vec<u32>,
    /// Why each slot in `unanswered` did not, in the same order.
    pub why: Vec<SlotSilence>,
}

/// Why an owner slot did not answer for its space.
pub(crate) enum SlotSilence {
    /// No node is known to own it (none mounted it): asking again will not help.
    NoOwner,
    /// Its owner was asked and failed, or answered nothing: it may answer next time.
    Failed(String),
}

impl std::fmt::Display for SlotSilence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotSilence::NoOwner => f.write_str("no node owns it"),
            SlotSilence::Failed(e) => f.write_str(e),
        }
    }
}

impl FileSystem {
    /// Asks every owner slot beside the manager for its regions' free space and its inodes.
    /// Called before the metadata lock is taken: a slot's owner may be asking this manager
    /// something meanwhile.
    pub(crate) fn slots_space(&self, desc: &crate::descriptor::FsDescriptor) -> SlotsSpace {
        let mut space = SlotsSpace {
            free: Default::default(),
            inodes: 0,
            unanswered: Vec::new(),
            why: Vec::new(),
        };
        for slot in self.slots_beside_the_manager(desc) {
            let asked = self
                .slot_namespace(slot)
                .map(|owner| (owner.disk_free(), owner.space()));
            match asked {
                Some((Ok(free), s)) if s.inodes_total > 0 => {
                    for (disk, blocks, fragments) in free {
                        let e = space.free.entry(disk).or_default();
                        e.0 += blocks;
                        e.1 += fragments;
                    }
                    space.inodes += s.inodes_total - s.inodes_free;
                }
                other => {
                    space.unanswered.push(slot);
                    space.why.push(match other {
                        None => SlotSilence::NoOwner,
                        Some((Err(e), _)) => SlotSilence::Failed(e.to_string()),
                        Some((Ok(_), _)) => {
                            SlotSilence::Failed("its owner reported no inodes".to_string())
                        }
                    });
                }
            }
        }
        space
    }

    pub fn df(&self) -> FsResult<DfReport> {
        self.owner_here("df")?;
        self.manager_here("df")?;
        let desc = self.descriptor();
        let bs = u64::from(desc.block_size);
        let sub = u64::from(desc.sub_block_size);
        // Each owner slot allocates in its own regions and counts its own shards' inodes
        // (this map holds their regions as used): their free space and inodes are theirs
        // to say. Asked before the metadata lock is taken: a slot's owner may be asking
        // this manager something meanwhile.
        let SlotsSpace {
            free: slot_free,
            inodes: slot_inodes,
            unanswered: unanswered_slots,
            ..
        } = self.slots_space(&desc);
        let m = self.owner().meta.lock();
        let disks: Vec<DfDisk> = desc
            .disks
            .iter()
            .map(|d| {
                let mut space = m.alloc.disk_space(d.index);
                if let Some((blocks, fragments)) = slot_free.get(&u32::from(d.index)) {
                    space.blocks_free += blocks;
                    space.sub_blocks_free_in_fragments += fragments;
                }
                DfDisk {
                    nsd_name: d.nsd_name.clone(),
                    pool: desc.pool_name(d.pool).to_string(),
                    failure_group: d.failure_group,
                    holds_metadata: d.usage.holds_metadata(),
                    holds_data: d.usage.holds_data(),
                    size_bytes: d.size_bytes,
                    free_full_block_bytes: space.blocks_free * bs,
                    free_fragment_bytes: space.sub_blocks_free_in_fragments * sub,
                }
            })
            .collect();
        let pools = desc
            .pools
            .iter()
            .map(|p| {
                let members = disks.iter().filter(|d| d.pool == *p);
                DfPool {
                    pool: p.clone(),
                    size_bytes: members.clone().map(|d| d.size_bytes).sum(),
                    free_full_block_bytes: members.clone().map(|d| d.free_full_block_bytes).sum(),
                    free_fragment_bytes: members.map(|d| d.free_fragment_bytes).sum(),
                }
            })
            .collect();
        let used = m.state.inode_count() + slot_inodes;
        Ok(DfReport {
            block_size: desc.block_size,
            sub_block_size: desc.sub_block_size,
            disks,
            pools,
            inodes: InodeUsage {
                used,
                free: desc.max_inodes.saturating_sub(used),
                allocated: used.max(desc.prealloc_inodes),
                max: desc.max_inodes,
            },
            unanswered_slots,
        })
    }
}
