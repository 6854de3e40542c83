//! Layer 3 of Tessera: network shared disks (NSDs).
//!
//! An NSD is a drive or vdisk registered in the cluster under a name. It is recognised by
//! the descriptor written in its first sector (name and id), never by its device path, so
//! device names may change between boots. This crate owns the NSD layout on the device,
//! the descriptor format and the `%nsd:` stanza files administrators write.

mod types;

pub use types::{DiskUsage, NsdId, ThinDiskType};
