//! Layer 1 of Tessera: NVMe over TCP.
//!
//! Tessera's drives are reached over NVMe/TCP so that any node can serve any NSD and any
//! standard initiator (Linux `nvme-tcp`, SPDK) can talk to a Tessera drive server, and a
//! Tessera host can talk to any standard target. This crate holds three parts:
//!
//! * [`wire`]: the wire format, byte for byte, with no connection state: NVMe/TCP PDUs
//!   (TCP Transport Specification 1.0), submission and completion queue entries, admin,
//!   NVM and Fabrics commands (NVMe Base 2.0, NVMe-oF 1.1), Identify data, log pages and
//!   reservation data. Synchronous: PDUs are read from any `std::io::Read` and written to
//!   any `std::io::Write`.
//! * [`target`]: the drive server, an NVMe/TCP target exporting files and block devices
//!   as namespaces (a JBOF, or the two controllers of an array), configured with
//!   nvmetcli-style JSON: [`target::DriveServer`];
//! * [`host`]: the initiator. [`host::Host`] is the node's native NVMe multipath registry
//!   (`nvme connect` / `nvme list` / `multipath -ll`): it connects controllers over
//!   NVMe/TCP, groups their paths per namespace and presents each namespace as a
//!   [`host::MultipathNamespace`], a `tessera_drive::BlockDevice` that survives path loss.
//!
//! Both of the latter are built only on the public API of [`wire`]; start at its module
//! documentation, which maps every specification structure to the module that holds it.
//!
//! [`fuzz_decode`] is the entry point for a `cargo fuzz` target over every decoder.

pub mod host;
pub mod target;
pub mod wire;

pub use wire::fuzz_decode;
