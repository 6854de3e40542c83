//! Little-endian field access at fixed byte offsets.
//!
//! Every NVMe and NVMe/TCP structure is a fixed layout of little-endian fields at offsets
//! taken from the specification. These helpers keep the decoders and encoders one line per
//! field, so each line can be checked against the spec's figure. They index directly: every
//! caller checks the buffer length once, up front, so an out-of-bounds offset here is a bug
//! in this crate (a programmer error that should crash), never a property of the input.

pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(array(b, off))
}

pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(array(b, off))
}

pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(array(b, off))
}

pub(crate) fn get_u128(b: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(array(b, off))
}

pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u128(b: &mut [u8], off: usize, v: u128) {
    b[off..off + 16].copy_from_slice(&v.to_le_bytes());
}

/// Copies `N` bytes starting at `off` into an array.
pub(crate) fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[off..off + N]);
    out
}
