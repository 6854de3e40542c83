//! The node transport: how Tessera daemons talk to each other over TCP.
//!
//! Every connection proves, in both directions, that its peer holds the cluster's secret
//! before any message is decoded; every frame is versioned, length-bounded and checksummed,
//! so a peer of another cluster, a port scanner or a truncated stream is refused with a
//! logged reason and never reaches the layers above.
