//! Erasure codes for declustered arrays (work in progress).
