//! The POSIX conformance set again, with every NSD an 8+2p vdisk of a declustered array of
//! twelve file-backed pdisks in six enclosures: a file system on vdisk NSDs must behave
//! exactly as one on plain drives.

mod harness;

const BACKEND: harness::Backend = harness::Backend::Vdisks;

include!("posix_set/cases.rs");
