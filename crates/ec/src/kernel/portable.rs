//! Table-lookup kernel: correct everywhere, and the reference the SIMD kernels are
//! tested against byte for byte.

use crate::gf::MUL;

/// Columns per pass; small enough that one output chunk stays in L1 while every input is
/// folded into it.
const CHUNK: usize = 4096;

pub(super) fn apply(coefs: &[u8], inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
    let n_in = inputs.len();
    let len = inputs.first().map_or(0, |s| s.len());
    let mut start = 0;
    while start < len {
        let end = (start + CHUNK).min(len);
        for (j, out) in outputs.iter_mut().enumerate() {
            let out = &mut out[start..end];
            let row = &coefs[j * n_in..(j + 1) * n_in];
            for (i, input) in inputs.iter().enumerate() {
                let table = &MUL[row[i] as usize];
                let input = &input[start..end];
                if i == 0 && !accumulate {
                    for (o, &x) in out.iter_mut().zip(input) {
                        *o = table[x as usize];
                    }
                } else {
                    for (o, &x) in out.iter_mut().zip(input) {
                        *o ^= table[x as usize];
                    }
                }
            }
        }
        start = end;
    }
}
