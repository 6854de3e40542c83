//! The PDU decoder must never allocate more than the configured maximum PDU size, however
//! large a PLEN, DATAL or count the peer claims. This binary installs a counting global
//! allocator, so it holds this one test only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_nvme::wire::{DigestConfig, PduReader, Side};

static TRACKING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Counting;

impl Counting {
    fn note(size: usize) {
        if TRACKING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(size, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A PDU header with a plausible type and HLEN and an arbitrary, often huge, PLEN.
fn random_header(rng: &mut StdRng) -> Vec<u8> {
    const TYPES: [(u8, u8); 9] = [
        (0, 128),
        (1, 128),
        (2, 24),
        (3, 24),
        (4, 72),
        (5, 24),
        (6, 24),
        (7, 24),
        (9, 24),
    ];
    let (pdu_type, hlen) = TYPES[rng.gen_range(0..TYPES.len())];
    let plen: u32 = match rng.gen_range(0..4) {
        0 => rng.gen(),
        1 => u32::MAX - rng.gen_range(0..16),
        2 => rng.gen_range(0..20_000),
        _ => u32::from(hlen) + rng.gen_range(0..9000),
    };
    let mut bytes = vec![
        pdu_type,
        rng.gen_range(0..16),
        hlen,
        hlen.wrapping_add(rng.gen_range(0..8)),
    ];
    bytes.extend_from_slice(&plen.to_le_bytes());
    let body = rng.gen_range(0..12_000);
    bytes.extend((0..body).map(|_| rng.gen::<u8>()));
    // DATAL at byte 16 consistent with PLEN half the time, so data really gets read.
    if bytes.len() >= 20 && rng.gen_bool(0.5) {
        let datal = plen.saturating_sub(u32::from(bytes[3]));
        bytes[16..20].copy_from_slice(&datal.to_le_bytes());
    }
    bytes
}

#[test]
fn decoding_never_allocates_more_than_the_maximum_pdu() {
    const MAX_PDU: u32 = 8192;
    let mut rng = StdRng::seed_from_u64(0x6e76_6d65);
    let mut decoded = 0;
    for _ in 0..20_000 {
        let bytes = random_header(&mut rng);
        let side = if rng.gen_bool(0.5) {
            Side::Host
        } else {
            Side::Controller
        };
        let mut reader = PduReader::new(side, MAX_PDU, DigestConfig::NONE);
        TRACKING.store(true, Ordering::Relaxed);
        let result = reader.read_pdu(&mut Cursor::new(&bytes));
        TRACKING.store(false, Ordering::Relaxed);
        decoded += usize::from(result.is_ok());
        drop(result);
    }
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= MAX_PDU as usize,
        "an allocation of {largest} bytes"
    );
    // Make sure the test is not vacuous: some PDUs decoded, and big data buffers were made.
    assert!(decoded > 20, "only {decoded} PDUs decoded");
    assert!(
        largest > MAX_PDU as usize / 2,
        "largest allocation only {largest} bytes"
    );
}
