//! The cluster layer: nodes and their designations, the configuration repository replicated
//! with Raft on the quorum nodes, quorum, the cluster manager, disk leases and the epochs
//! that fence a node's late I/O.
//!
//! Code here reads time, randomness and the network only through seams a simulation can
//! drive, so that a failing schedule of kills, partitions and clock jumps replays from its
//! seed.

pub mod lease;
pub mod net;
pub mod node;
pub mod params;
pub mod raft;
pub mod rpc;
pub mod service;
pub mod state;
pub mod store;
