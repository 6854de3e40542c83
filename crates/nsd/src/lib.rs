//! Layer 3 of Tessera: network shared disks (NSDs).
//!
//! An NSD is a drive or vdisk registered in the cluster under a name. It is recognised by
//! the descriptor written in its first sector (name and id), never by its device path, so
//! device names may change between boots. This crate owns the NSD layout on the device
//! ([`layout`]), the descriptor format ([`descriptor`]) and the `%nsd:` stanza files
//! administrators write ([`stanza`]).

pub mod descriptor;
pub mod layout;
pub mod scan;
pub mod stanza;
mod types;

pub use descriptor::{
    check_device_size, erase_descriptor, probe_in_use, read_descriptor, write_descriptor, InUse,
    NsdDescriptor, NsdError,
};
pub use stanza::{
    format_nsd_stanza, format_pdisk_stanza, format_pool_stanza, parse_nsd_servers_changes,
    parse_nsd_stanzas, parse_pdisk_stanzas, parse_pool_stanzas, parse_stanzas, Attr,
    NsdServersChange, NsdStanza, PdiskStanza, PoolStanza, Stanza, StanzaError,
};
pub use types::{
    check_name, DiskUsage, NsdId, ParseValueError, ThinDiskType, NAME_MAX_BYTES, NAME_RULE,
};
