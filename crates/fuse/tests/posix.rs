//! The POSIX conformance set on NSDs that are file-backed drives.

mod harness;

const BACKEND: harness::Backend = harness::Backend::Drives;

include!("posix_set/cases.rs");
