//! The POSIX conformance set again, through a client-only mount: every metadata request
//! goes, encoded, to an owner mounted beside it, and the kernel caches nothing, as on a
//! node that mounts a file system another node owns. It must behave exactly as the
//! owner's own mount.

mod harness;

const BACKEND: harness::Backend = harness::Backend::Client;

include!("posix_set/cases.rs");
