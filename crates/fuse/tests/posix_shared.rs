//! The POSIX conformance set again, through the mount of the node that owns the metadata
//! of a file system other nodes mount too (`KernelCache::Shared`): every write takes data
//! tokens and goes past the page cache, locks, flocks and appends go through the owner's
//! lock table, and reads are served from the page cache. It must behave exactly as a
//! one-node mount.

mod harness;

const BACKEND: harness::Backend = harness::Backend::Shared;

include!("posix_set/cases.rs");
