//! Single-thread codec throughput, the number behind `tessera bench ec`.

use crate::{Code, Codec, CodecError};

use std::time::{Duration, Instant};

pub struct BenchReport {
    pub code: super::Code,
    pub strip_bytes: usize,
    pub kernel: &'static str,
    pub encode_gbps: f64,
    pub decode_gbps: f64,
}

/// Strips start on a cache-line boundary, as O_DIRECT buffers do in a vdisk; the kernels
/// do not need it, but unaligned strips would measure split loads, not the codec.
struct AlignedStrip {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedStrip {
    fn new(len: usize, seed: u64) -> AlignedStrip {
        let mut buf = vec![0u8; len + 64];
        let start = buf.as_ptr().align_offset(64);
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for b in &mut buf[start..start + len] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        AlignedStrip { buf, start, len }
    }

    fn get(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// One thread. GB/s = data bytes (k × strip) per second, 1e9 bytes. Decode = reconstruct
/// with m DATA strips lost (first m data strips). Runs encode for `seconds`, then decode
/// for `seconds`.
pub fn run(
    code: super::Code,
    strip_bytes: usize,
    seconds: f64,
) -> Result<BenchReport, super::CodecError> {
    let codec = Codec::new(code)?;
    let (k, m) = (code.data_strips(), code.parity_strips());
    let mut strips: Vec<AlignedStrip> = (0..k + m)
        .map(|i| AlignedStrip::new(strip_bytes, i as u64 + 1))
        .collect();
    let budget = Duration::from_secs_f64(seconds.max(0.0));
    let data_bytes = (k * strip_bytes) as f64;

    let encode_gbps = {
        let (data, parity) = strips.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|s| s.get()).collect();
        let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|s| s.get_mut()).collect();
        timed(budget, data_bytes, || codec.encode(&data, &mut parity))?
    };

    // Data loss is the expensive case (every output needs the inverted matrix); lost parity
    // is just encode.
    let lost = match code {
        Code::Replication { .. } => 1,
        Code::ReedSolomon { .. } => m.min(k),
    };
    let expected: Vec<Vec<u8>> = strips[..lost].iter().map(|s| s.get().to_vec()).collect();
    let present: Vec<bool> = (0..k + m).map(|i| i >= lost).collect();
    let decode_gbps = {
        let mut views: Vec<&mut [u8]> = strips.iter_mut().map(|s| s.get_mut()).collect();
        let gbps = timed(budget, data_bytes, || {
            // Scribble on the lost strips so every pass really rebuilds them.
            views[..lost]
                .iter_mut()
                .filter_map(|s| s.first_mut())
                .for_each(|b| *b ^= 0xA5);
            codec.reconstruct(&mut views, &present)
        })?;
        for (view, want) in views.iter().zip(&expected) {
            assert!(
                view[..] == want[..],
                "benchmark decode did not restore the lost strips"
            );
        }
        gbps
    };
    Ok(BenchReport {
        code,
        strip_bytes,
        kernel: codec.kernel(),
        encode_gbps,
        decode_gbps,
    })
}

/// Repeats `op` until `budget` has passed (at least once) and returns data GB/s.
fn timed(
    budget: Duration,
    bytes_per_op: f64,
    mut op: impl FnMut() -> Result<(), CodecError>,
) -> Result<f64, CodecError> {
    op()?; // warm caches and the decode-plan cache before timing
    let start = Instant::now();
    let mut ops = 0u64;
    loop {
        op()?;
        ops += 1;
        let elapsed = start.elapsed();
        if elapsed >= budget {
            return Ok(bytes_per_op * ops as f64 / elapsed.as_secs_f64() / 1e9);
        }
    }
}
