//! The drive server: an NVMe/TCP target exporting files and block devices as namespaces,
//! the way a JBOF or the two controllers of an array do.
//!
//! Start with [`DriveServer::start`] on a [`TargetConfig`]. Every port serves the
//! discovery subsystem (`nqn.2014-08.org.nvmexpress.discovery`) and the NVM subsystems
//! listed for it; standard initiators (`nvme discover`/`nvme connect` of Linux, SPDK)
//! connect to it, and so does Tessera's own host ([`crate::host`]).
//!
//! # Configuration
//!
//! JSON in the shape of `nvmetcli saveconfig` (a subset), so a Linux NVMe administrator
//! reads it at sight. `crates/nvme/TARGET_CONFIG.md` has the full reference; in short:
//!
//! ```json
//! {
//!   "hosts": [{"nqn": "nqn.2024-01.io.tessera:node1"}],
//!   "ports": [{
//!     "portid": 1,
//!     "addr": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "192.0.2.10", "trsvcid": "4420"},
//!     "param": {"inline_data_size": "16384"},
//!     "subsystems": ["nqn.2024-01.io.tessera:jbof1"],
//!     "ana_groups": [{"grpid": 1, "ana": {"state": "optimized"}}],
//!     "referrals": []
//!   }],
//!   "subsystems": [{
//!     "nqn": "nqn.2024-01.io.tessera:jbof1",
//!     "attr": {"allow_any_host": "0", "serial": "JBOF1", "model": "Tessera drive server"},
//!     "allowed_hosts": ["nqn.2024-01.io.tessera:node1"],
//!     "namespaces": [{"nsid": 1, "enable": 1, "ana_grpid": 1,
//!                     "device": {"path": "/dev/nvme0n1", "nguid": "...", "uuid": "..."}}]
//!   }],
//!   "tessera": {"keep_alive_max_ms": 300000, "io_threads_per_queue": 32}
//! }
//! ```
//!
//! * `hosts`: host NQNs that `allowed_hosts` may name.
//! * `ports[]`: `portid` 1..=65534 (unique); `addr` with `trtype` "tcp", `adrfam`
//!   "ipv4"/"ipv6", `traddr` an IP address, `trsvcid` a TCP port ("0" picks a free one,
//!   see [`DriveServer::local_addrs`]), optional `treq` ("not specified"/"not required")
//!   and `tsas` ("none"); optional `param.inline_data_size` (bytes of in-capsule data on
//!   I/O queues, multiple of 16, default 16384, at most 262144); `subsystems` exported
//!   here; `ana_groups` with `grpid` 1..=128 and `ana.state` one of "optimized",
//!   "non-optimized", "inaccessible", "persistent-loss", "change" (groups not listed are
//!   optimized); `referrals` (`name`, `addr`, optional `portid`, `enable`).
//! * `subsystems[]`: `nqn` (unique, not the discovery NQN); `attr.allow_any_host` "0"/"1"
//!   (default "0"), `attr.serial` (≤ 20 characters, default derived from the NQN),
//!   `attr.model` (≤ 40, default "Tessera drive server"); `allowed_hosts`; `namespaces[]`
//!   with `nsid` 1..=1024 (unique in the subsystem), `enable` 0/1, `ana_grpid` (default 1),
//!   `device.path` (file or block device, 4096-byte LBAs), optional `device.nguid` and
//!   `device.uuid` (32 hex digits, dashes allowed; by default derived stably from the
//!   subsystem NQN and NSID, so every port reports the same identity).
//! * `tessera` (all optional): `keep_alive_max_ms`, `io_threads_per_queue`,
//!   `max_connections_per_port`, `queue_entries_max`, `io_queues_max`,
//!   `maxh2cdata_bytes`.
//!
//! Numbers may be JSON numbers or decimal strings (nvmetcli writes both). Unknown keys
//! and malformed values are errors naming the JSON path and what is allowed; duplicate
//! NQNs, NSIDs or portids, a port naming an undefined subsystem and an invalid NQN are
//! errors too, and missing devices fail [`DriveServer::start`] before anything listens.
//!
//! # What a controller offers
//!
//! Dynamic controller model (CNTLID 0xFFFF on the admin Connect), MDTS 4 MiB, MAXH2CDATA
//! 1 MiB by default, in-capsule data up to IOCCSZ, header and data digests (CRC32C) as the
//! host asks, CPDA 0; admin: Identify (controller, namespace, active NSID list, NS
//! identification descriptors), Get Log Page (error, SMART, firmware slot, ANA with RGO,
//! reservation notification, discovery), Set/Get Features (Number of Queues, Keep Alive
//! Timer, Async Event Configuration, Volatile Write Cache, Reservation Persistence), Keep Alive, Asynchronous
//! Event Request (completed on ANA change), Abort (never aborts); I/O: Read, Write,
//! Flush, Write Zeroes, Dataset Management (deallocate), Reservation Register / Acquire /
//! Release / Report (types 1-6, shared by every controller of the subsystem, keyed by
//! HOSTID; persisted through a restart when the host turns PTPL on and the server has a
//! state directory). See the module documentation of each part for the details.

mod ana;
mod buffers;
pub mod config;
mod connection;
mod controller;
mod discovery;
mod io;
mod namespace;
pub mod reservation;
mod reservation_store;
mod server;
mod subsystem;
mod uring;

pub use crate::wire::log::AnaState;
pub use config::{
    ConfigError, Limits, NamespaceConfig, PortAddr, PortConfig, ReloadPlan, SubsystemConfig,
    TargetConfig,
};
pub use namespace::{IoObserver, ObservedIo};
pub use server::{
    DeviceOpener, DriveServer, HostGate, NamespaceStats, PortStats, ServerError, ServerStats,
    StatsSource,
};
