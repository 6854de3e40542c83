//! On-disk metadata of a Tessera file system: checksummed metadata pages, a bounded cache of
//! them, and copy-on-write B+trees that a checkpoint writes back.
//!
//! # Why copy-on-write under a log
//!
//! The recovery log (`tessera-journal`) stays the commit point of every metadata change: a
//! change is durable when its log record is. The pages here are the checkpoint that the log
//! is replayed over. A page is never overwritten in place: a changed page gets a new address
//! when the next checkpoint writes it, its parent is changed to point there, and so on up to
//! the root, which the caller records (a descriptor, an inode slot). The pages reachable from
//! the roots of the newest durable checkpoint are therefore exactly the state at that
//! checkpoint's log position, whatever a crash interrupted, and recovery stays "replay the
//! log from the checkpoint over the pages", the same function as live operation. What a
//! checkpoint writes is what changed since the last one (changed leaves and their paths to
//! the root), never the whole metadata, so freeing log space costs what changed.
//!
//! # Memory
//!
//! Clean pages live in a cache bounded in pages ([`MetaStore::set_cache_pages`]); they are
//! evicted (CLOCK) and read again on demand. Changed pages stay in memory until a checkpoint
//! writes them; the caller checkpoints when [`MetaStore::dirty_pages`] passes its limit, so
//! both bounds hold together.
//!
//! # Freeing
//!
//! A page replaced or dropped since the last checkpoint is still part of the last durable
//! checkpoint, so it can only be reused once the next checkpoint is durable: each
//! [`Checkpoint`] lists the addresses it supersedes, and the caller frees them after it has
//! made the checkpoint's roots durable.

mod cache;
mod leaf;
pub mod page;
mod store;

pub use page::{PageFormat, PagePlace, PagePtr};
pub use store::{Checkpoint, CheckpointPage, MetaStore, PageReader, StoreStats, Tree};

/// Address of a metadata page, opaque to this crate (the file system encodes a disk index
/// and a sub-block number in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageAddr(pub u64);

impl std::fmt::Display for PageAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata page {addr}: {reason}")]
    Corrupt { addr: PageAddr, reason: String },
    #[error("reading metadata page {addr}: {source}")]
    Io {
        addr: PageAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("a metadata page must be a power of two from 4 KiB to 64 KiB, not {0} bytes")]
    BadPageSize(usize),
    #[error("a metadata key of {key} bytes and value of {value} bytes is larger than a page allows ({max} bytes together)")]
    EntryTooLarge {
        key: usize,
        value: usize,
        max: usize,
    },
    #[error("no space for metadata pages: {0}")]
    NoSpace(String),
    #[error("an earlier checkpoint of this metadata failed after its pages were given addresses; remount to recover from the log")]
    Poisoned,
}

pub type MetaResult<T> = Result<T, MetaError>;
