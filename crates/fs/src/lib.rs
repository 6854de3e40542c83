//! Layer 4 of Tessera: the shared-disk file system core, free of any kernel interface.
//!
//! All metadata and data live on NSDs. The inode space is split into shards
//! (`ino % shard_count`); each shard's metadata is an on-disk B+tree of metadata pages read
//! through a bounded cache. A node that owns a shard logs every change to its recovery log
//! on shared disk before applying it, and checkpoints write the changed pages copy-on-write.
//! Any node that can read the NSDs can recover a shard from its tree's root plus the log.
//! See ARCHITECTURE.md for the formats and the reasons.

pub mod access;
pub mod acl;
mod across_owners;
pub mod alloc_map;
mod checkpoint;
mod client;
mod data;
pub mod descriptor;
mod disk_set;
pub mod disks;
mod early_answer;
pub mod error;
mod format;
mod fs;
pub mod fsck;
pub mod inode;
pub mod locks;
mod map_hold;
mod meta;
mod metanode;
mod metanode_wire;
mod mirrored_log;
mod namespace;
mod owner;
mod placement;
pub mod pmon;
pub mod policy_run;
mod prefetch;
mod read_tokens;
mod recovery;
pub mod replication;
mod report;
pub mod restripe;
mod shard_tree;
pub mod slot;
mod slot_move;
mod write_behind;

pub use data::{FileData, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FILE_BYTES_MAX};
pub use descriptor::{
    read_descriptor, AtimeMode, DiskStatus, FsDescriptor, FsDisk, Replication, StrictReplication,
};
pub use disks::DiskOpener;
pub use error::{FsError, FsResult};
pub use format::{erase, format, DiskSpec, FormatOptions, Progress, SHARDS_DEFAULT};
pub use fs::{DirListing, FileSystem, ServeCheck, ServeRefusal, SetAttr, StatFs};
pub use fsck::{fsck, FsckReport};
pub use inode::{Attr, FileKind, Ino, Timestamp, ROOT_INO};
pub use metanode_wire::CacheChange;
pub use metanode_wire::{
    ask_for_slot, request_kind, Fence, InProcessNode, InProcessOwner, MetanodeChannel, SlotHandBack,
};
pub use namespace::Caller;
pub use placement::PolicySummary;
pub use pmon::{
    LatencyHistograms, PmonSnapshot, SizeHistogram, LATENCY_BUCKETS_NS, SIZE_BOUNDS_BYTES,
};
pub use report::{DfDisk, DfPool, DfReport, InodeUsage};
pub use tessera_alloc::Placement;
