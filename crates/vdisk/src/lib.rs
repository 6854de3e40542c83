//! Layer 2 of Tessera: pdisks, declustered arrays and erasure-coded vdisks.
//!
//! A **pdisk** is a drive (a file or block device, opened with O_DIRECT) with a name, an
//! enclosure and a slot. A **declustered array** ([`DeclusteredArray`]) groups pdisks and
//! keeps spare space spread over all of them. A **vdisk** ([`Vdisk`]) is carved from an
//! array with an erasure code (`8+2p`, `3WayReplication`, ...) and a block size; it
//! implements [`tessera_drive::BlockDevice`], so the file system uses it as an NSD like
//! any drive.
//!
//! ```text
//! DeclusteredArray::create(name, &[PdiskSpec], DaOptions) / ::open(name, &[PathBuf])
//!   .create_vdisk(name, Code, block_bytes, VdiskSize)   -> Arc<Vdisk>  (a BlockDevice)
//!   .vdisk(name) / .vdisks() / .delete_vdisk(name)
//!   .pdisk_fail / pdisk_suspend / pdisk_resume / pdisk_drain / pdisk_replace(name, dev)
//!   .start_scrub() / .scrub_now() / .status() -> DaStatus / .tolerance(code)
//!   .close()                                            clean shutdown
//! ```
//!
//! How it works, in one paragraph per concern (ARCHITECTURE.md, "Layer 2", has the
//! reasons and the byte layouts):
//!
//! * **Layout.** One vdisk block is one stripe of `k` data and `m` parity strips, each on
//!   a different pdisk, spread over enclosures: one strip per enclosure when there are at
//!   least `k + m` enclosures, otherwise as few per enclosure as the enclosures allow (2
//!   for `8+2p` over 6 enclosures, so a whole enclosure can be lost). Where every strip
//!   lives is an explicit stripe map in the array's metadata, so rebuild can move single
//!   strips.
//! * **Integrity.** Every strip starts with a header carrying the stripe's write version
//!   and the CRC-32C of every 4 KiB sector of every strip. Every read is verified; a bad
//!   sector is rebuilt from the others, rewritten and counted, never returned.
//! * **Writes.** A full-block write computes parity and writes every strip as one I/O, in
//!   parallel, without reading. A smaller write reads the old data and the parity of its
//!   range and folds the difference into the parity (read-modify-write). A dirty-region
//!   bitmap, made durable before the first write into a region, closes the write hole:
//!   after a crash the dirty regions are resynchronised before any I/O.
//! * **Failures.** A pdisk that is missing, failed, or past its I/O error limit is not
//!   read; stripes that lost strips are served degraded (reconstructed on the fly) and a
//!   background worker rebuilds the strips into spare space, most endangered stripes
//!   first, throttled to leave foreground I/O its share. A stripe that lost more strips
//!   than its code tolerates fails with an error naming the vdisk, stripe and pdisks.
//!
//! Errors are [`VdiskError`]s; through the [`tessera_drive::BlockDevice`] interface they
//! become `io::Error`s that keep the full message.

mod cache;
mod core;
mod da;
mod dirty;
mod error;
mod layout;
mod meta;
mod pdisk;
pub mod placement;
mod pool;
mod space;
mod status;
mod stripe;
mod vdisk;
mod worker;

pub use da::{
    DaOptions, DeclusteredArray, PdiskSpec, VdiskSize, PDISKS_MAX, STRIP_BYTES_MAX, VDISKS_MAX,
};
pub use error::{VdiskError, NAME_MAX_BYTES, NAME_RULE};
pub use layout::PDISK_BYTES_MIN;
pub use meta::PdiskState;
pub use pdisk::{file_opener, read_pdisk_label, DeviceOpener, PdiskLabelInfo};
pub use placement::Tolerance;
pub use status::{
    DaState, DaStatus, PdiskStatus, Progress, RecoveryReport, ScrubReport, VdiskStats, VdiskStatus,
};
pub use tessera_ec::Code;
pub use vdisk::{StripLocation, Vdisk};
