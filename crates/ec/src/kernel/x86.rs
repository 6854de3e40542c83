//! x86-64 kernels. Each keeps every output's accumulators in registers and streams each
//! input strip exactly once, so a pass costs one read of every input and one write of
//! every output, whatever the code's shape.
//!
//! Both return how many leading bytes they produced; the caller finishes the tail (less
//! than one unrolled step) with the portable kernel.

// The loops index fixed-size register arrays by (output, vector) so they unroll into named
// registers; iterator adaptors obscure that without changing the code generated.
#![allow(clippy::needless_range_loop)]

use super::{MAX_INPUTS, MAX_OUTPUTS};
use std::arch::x86_64::*;

/// 64-byte vectors per loop step: four per output keeps 4 x 4 = 16 accumulators live,
/// half the register file, and gives each affine unit independent work to overlap.
const GFNI_UNROLL: usize = 4;

/// How far ahead of the loads each input strip is prefetched into L1. With eight or more
/// strips streamed at once the hardware prefetchers fall behind, and the kernel stalls on
/// L2 even when the whole stripe is L2-resident. Measured on 8+2p, 128 KiB strips: +35%
/// at 2 KiB, +25% at 1 KiB and 512 B, nothing at 4 KiB.
const PREFETCH_BYTES: usize = 2048;

/// Whether a pass over strips of `len` bytes should write its outputs with non-temporal
/// stores. Once inputs plus outputs overflow L2, the output lines are evicted before
/// anyone reads them again, and fetching them for ownership first only doubles the
/// write traffic (8+2p: +55% at 256 KiB strips, +13% at 1 MiB). Below that the outputs
/// stay cached and streaming them out costs about 10%.
fn stream_outputs(strips: usize, len: usize) -> bool {
    static L2_BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let l2 = *L2_BYTES.get_or_init(|| {
        // Leaf 0x8000_0006 ECX[31:16] is the L2 size in KiB on both Intel and AMD.
        #[allow(unused_unsafe)]
        // SAFETY: every x86-64 CPU has CPUID; the extended leaf returns zeros if absent.
        let max_leaf = unsafe { __cpuid(0x8000_0000) }.eax;
        #[allow(unused_unsafe)]
        // SAFETY: as above, and the leaf is only read when the CPU reports it.
        let kib = if max_leaf >= 0x8000_0006 {
            unsafe { __cpuid(0x8000_0006) }.ecx >> 16
        } else {
            0
        };
        if kib == 0 {
            1 << 20
        } else {
            kib as usize * 1024
        }
    });
    strips * len > l2 * 3 / 4
}

/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and GFNI. `mats` is input-major with one
/// matrix per (input, output) pair; every strip has the same length.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) unsafe fn gfni_avx512(
    mats: &[u64],
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    accumulate: bool,
) -> usize {
    match outputs.len() {
        1 => gfni_n::<1>(mats, inputs, outputs, accumulate),
        2 => gfni_n::<2>(mats, inputs, outputs, accumulate),
        3 => gfni_n::<3>(mats, inputs, outputs, accumulate),
        4 => gfni_n::<4>(mats, inputs, outputs, accumulate),
        n => unreachable!("plan with {n} outputs"),
    }
}

#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn gfni_n<const M: usize>(
    mats: &[u64],
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    accumulate: bool,
) -> usize {
    const { assert!(M <= MAX_OUTPUTS) };
    let n_in = inputs.len();
    assert!(n_in <= MAX_INPUTS && mats.len() == n_in * M && outputs.len() == M);
    let len = inputs[0].len();
    let mut src = [std::ptr::null::<u8>(); MAX_INPUTS];
    for (p, s) in src.iter_mut().zip(inputs) {
        *p = s.as_ptr();
    }
    let mut dst = [std::ptr::null_mut::<u8>(); M];
    for (p, s) in dst.iter_mut().zip(outputs.iter_mut()) {
        *p = s.as_mut_ptr();
    }
    let mats = mats.as_ptr();
    let stream = stream_outputs(n_in + M, len) && dst.iter().all(|p| p.align_offset(64) == 0);

    let step = 64 * GFNI_UNROLL;
    let mut off = 0;
    while off + step <= len {
        let mut acc = [[_mm512_setzero_si512(); GFNI_UNROLL]; M];
        if accumulate {
            for j in 0..M {
                for u in 0..GFNI_UNROLL {
                    acc[j][u] = _mm512_loadu_si512(dst[j].add(off + 64 * u).cast());
                }
            }
        }
        // Inputs go in pairs so one three-way XOR folds both products into the
        // accumulator, leaving the vector ports to the affine multiplies.
        let mut i = 0;
        while i + 2 <= n_in {
            let pa = src[i].add(off);
            let pb = src[i + 1].add(off);
            let mut va = [_mm512_setzero_si512(); GFNI_UNROLL];
            let mut vb = [_mm512_setzero_si512(); GFNI_UNROLL];
            for u in 0..GFNI_UNROLL {
                // Prefetches never fault, so running past the end of the strip is harmless.
                _mm_prefetch::<_MM_HINT_T0>(pa.wrapping_add(PREFETCH_BYTES + 64 * u).cast());
                _mm_prefetch::<_MM_HINT_T0>(pb.wrapping_add(PREFETCH_BYTES + 64 * u).cast());
                va[u] = _mm512_loadu_si512(pa.add(64 * u).cast());
                vb[u] = _mm512_loadu_si512(pb.add(64 * u).cast());
            }
            for j in 0..M {
                let ma = _mm512_set1_epi64(*mats.add(i * M + j) as i64);
                let mb = _mm512_set1_epi64(*mats.add((i + 1) * M + j) as i64);
                for u in 0..GFNI_UNROLL {
                    let a = _mm512_gf2p8affine_epi64_epi8::<0>(va[u], ma);
                    let b = _mm512_gf2p8affine_epi64_epi8::<0>(vb[u], mb);
                    acc[j][u] = _mm512_ternarylogic_epi64::<0x96>(acc[j][u], a, b);
                }
            }
            i += 2;
        }
        if i < n_in {
            let p = src[i].add(off);
            let mut v = [_mm512_setzero_si512(); GFNI_UNROLL];
            for u in 0..GFNI_UNROLL {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES + 64 * u).cast());
                v[u] = _mm512_loadu_si512(p.add(64 * u).cast());
            }
            for j in 0..M {
                let a = _mm512_set1_epi64(*mats.add(i * M + j) as i64);
                for u in 0..GFNI_UNROLL {
                    let prod = _mm512_gf2p8affine_epi64_epi8::<0>(v[u], a);
                    acc[j][u] = _mm512_xor_si512(acc[j][u], prod);
                }
            }
        }
        for j in 0..M {
            for u in 0..GFNI_UNROLL {
                if stream {
                    _mm512_stream_si512(dst[j].add(off + 64 * u).cast(), acc[j][u]);
                } else {
                    _mm512_storeu_si512(dst[j].add(off + 64 * u).cast(), acc[j][u]);
                }
            }
        }
        off += step;
    }
    while off + 64 <= len {
        let mut acc = [_mm512_setzero_si512(); M];
        if accumulate {
            for j in 0..M {
                acc[j] = _mm512_loadu_si512(dst[j].add(off).cast());
            }
        }
        for i in 0..n_in {
            let v = _mm512_loadu_si512(src[i].add(off).cast());
            for j in 0..M {
                let a = _mm512_set1_epi64(*mats.add(i * M + j) as i64);
                acc[j] = _mm512_xor_si512(acc[j], _mm512_gf2p8affine_epi64_epi8::<0>(v, a));
            }
        }
        for j in 0..M {
            _mm512_storeu_si512(dst[j].add(off).cast(), acc[j]);
        }
        off += 64;
    }
    if stream {
        // Streaming stores are weakly ordered: fence them before the caller hands the
        // strips to another thread or to a device.
        _mm_sfence();
    }
    off
}

/// # Safety
/// The CPU must support AVX2. `tables` is input-major, one low/high nibble product table
/// per (input, output) pair; every strip has the same length.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn avx2(
    tables: &[[u8; 32]],
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    accumulate: bool,
) -> usize {
    match outputs.len() {
        1 => avx2_n::<1>(tables, inputs, outputs, accumulate),
        2 => avx2_n::<2>(tables, inputs, outputs, accumulate),
        3 => avx2_n::<3>(tables, inputs, outputs, accumulate),
        4 => avx2_n::<4>(tables, inputs, outputs, accumulate),
        n => unreachable!("plan with {n} outputs"),
    }
}

#[target_feature(enable = "avx2")]
unsafe fn avx2_n<const M: usize>(
    tables: &[[u8; 32]],
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
    accumulate: bool,
) -> usize {
    const { assert!(M <= MAX_OUTPUTS) };
    let n_in = inputs.len();
    assert!(n_in <= MAX_INPUTS && tables.len() == n_in * M && outputs.len() == M);
    let len = inputs[0].len();
    let mut src = [std::ptr::null::<u8>(); MAX_INPUTS];
    for (p, s) in src.iter_mut().zip(inputs) {
        *p = s.as_ptr();
    }
    let mut dst = [std::ptr::null_mut::<u8>(); M];
    for (p, s) in dst.iter_mut().zip(outputs.iter_mut()) {
        *p = s.as_mut_ptr();
    }
    let tables = tables.as_ptr();
    let nibble = _mm256_set1_epi8(0x0f);

    let mut off = 0;
    while off + 64 <= len {
        let mut acc = [[_mm256_setzero_si256(); 2]; M];
        if accumulate {
            for j in 0..M {
                acc[j][0] = _mm256_loadu_si256(dst[j].add(off).cast());
                acc[j][1] = _mm256_loadu_si256(dst[j].add(off + 32).cast());
            }
        }
        for i in 0..n_in {
            let p = src[i].add(off);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES).cast());
            let v0 = _mm256_loadu_si256(p.cast());
            let v1 = _mm256_loadu_si256(p.add(32).cast());
            let lo0 = _mm256_and_si256(v0, nibble);
            let hi0 = _mm256_and_si256(_mm256_srli_epi64::<4>(v0), nibble);
            let lo1 = _mm256_and_si256(v1, nibble);
            let hi1 = _mm256_and_si256(_mm256_srli_epi64::<4>(v1), nibble);
            for j in 0..M {
                let t = (*tables.add(i * M + j)).as_ptr();
                let tlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(t.cast()));
                let thi = _mm256_broadcastsi128_si256(_mm_loadu_si128(t.add(16).cast()));
                let p0 =
                    _mm256_xor_si256(_mm256_shuffle_epi8(tlo, lo0), _mm256_shuffle_epi8(thi, hi0));
                let p1 =
                    _mm256_xor_si256(_mm256_shuffle_epi8(tlo, lo1), _mm256_shuffle_epi8(thi, hi1));
                acc[j][0] = _mm256_xor_si256(acc[j][0], p0);
                acc[j][1] = _mm256_xor_si256(acc[j][1], p1);
            }
        }
        for j in 0..M {
            _mm256_storeu_si256(dst[j].add(off).cast(), acc[j][0]);
            _mm256_storeu_si256(dst[j].add(off + 32).cast(), acc[j][1]);
        }
        off += 64;
    }
    off
}
