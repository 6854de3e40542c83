//! Declustered arrays and vdisks (work in progress).
