//! Layer 1 of Tessera: NVMe over TCP.
//!
//! Tessera's drives are reached over NVMe/TCP so that any node can serve any NSD and any
//! standard initiator (Linux `nvme-tcp`, SPDK) can talk to a Tessera drive server, and a
//! Tessera host can talk to any standard target. This crate will hold three parts:
//!
//! * [`wire`]: the wire format, byte for byte, with no connection state: NVMe/TCP PDUs
//!   (TCP Transport Specification 1.0), submission and completion queue entries, admin,
//!   NVM and Fabrics commands (NVMe Base 2.0, NVMe-oF 1.1), Identify data, log pages and
//!   reservation data. Synchronous: PDUs are read from any `std::io::Read` and written to
//!   any `std::io::Write`.
//! * the drive server (an NVMe/TCP target exporting `BlockDevice`s), to come;
//! * the host (an initiator presenting a remote namespace as a `BlockDevice`), to come.
//!
//! Both of the latter are built only on the public API of [`wire`]; start at its module
//! documentation, which maps every specification structure to the module that holds it.
//!
//! [`fuzz_decode`] is the entry point for a `cargo fuzz` target over every decoder.

pub mod wire;

pub use wire::fuzz_decode;
