//! Our own implementation of the kernel's FUSE protocol: the ABI, request parsing, reply
//! encoding, mounting, and two transports (the /dev/fuse loop and FUSE-over-io_uring).

pub(crate) mod abi;
pub(crate) mod mount;
pub(crate) mod notify;
pub(crate) mod reply;
pub(crate) mod request;
pub(crate) mod session;
pub(crate) mod uring;
