//! The inner loop of the codec: `out[j] (^)= sum_i coef[j][i] * in[i]` over byte strips, in
//! one of several instruction-set flavours chosen at run time.
//!
//! Every encode, reconstruct and parity update is one such linear map; only its coefficient
//! matrix differs. A [`Plan`] holds the coefficients already expanded into the form its
//! kernel consumes, so the expansion is paid once per matrix, not once per call.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::CodecError;

/// Most outputs one pass produces. Every map the codec builds has at most m ≤ 4 outputs;
/// the SIMD kernels keep all output accumulators in registers, which bounds this.
pub(crate) const MAX_OUTPUTS: usize = 4;
/// Most inputs one pass reads (k ≤ 16; a parity update reads two).
pub(crate) const MAX_INPUTS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    Portable,
    Avx2,
    GfniAvx512,
}

/// Overrides run-time detection; used by tests and benchmarks to compare kernels.
pub(crate) const KERNEL_ENV: &str = "TESSERA_EC_KERNEL";

impl Kernel {
    pub const ALL: [Kernel; 3] = [Kernel::GfniAvx512, Kernel::Avx2, Kernel::Portable];

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::GfniAvx512 => "gfni-avx512",
        }
    }

    pub fn from_name(name: &str) -> Result<Kernel, CodecError> {
        let kernel = Kernel::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(name.trim()))
            .ok_or_else(|| CodecError::UnknownKernel {
                name: name.to_string(),
            })?;
        if !kernel.available() {
            return Err(CodecError::KernelUnavailable {
                name: kernel.name(),
                available: available_names(),
            });
        }
        Ok(kernel)
    }

    pub fn available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::GfniAvx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("gfni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU runs, unless `TESSERA_EC_KERNEL` names another.
    pub fn select() -> Result<Kernel, CodecError> {
        match std::env::var(KERNEL_ENV) {
            Ok(name) if !name.trim().is_empty() => Kernel::from_name(&name),
            _ => Ok(Kernel::ALL
                .into_iter()
                .find(|k| k.available())
                .unwrap_or(Kernel::Portable)),
        }
    }
}

pub(crate) fn available_names() -> String {
    Kernel::ALL
        .into_iter()
        .filter(|k| k.available())
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A coefficient matrix (`outputs` rows by `inputs` columns) prepared for one kernel.
#[derive(Debug)]
pub(crate) struct Plan {
    kernel: Kernel,
    outputs: usize,
    inputs: usize,
    /// Row-major, one row per output; the portable kernel and the SIMD tails use these.
    coefs: Vec<u8>,
    /// Kernel-specific expansion, laid out input-major (`[input][output]`) because the SIMD
    /// loops load one input vector and fold it into every output before the next input.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    expanded: Expanded,
}

#[derive(Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Expanded {
    None,
    /// One 8x8 bit matrix per coefficient for the GF(2) affine instruction.
    Affine(Vec<u64>),
    /// Products of each coefficient with the 16 low and 16 high nibbles.
    Nibbles(Vec<[u8; 32]>),
}

impl Plan {
    pub fn new(kernel: Kernel, outputs: usize, inputs: usize, coefs: Vec<u8>) -> Plan {
        assert!(
            (1..=MAX_OUTPUTS).contains(&outputs),
            "plan outputs {outputs} out of range"
        );
        assert!(
            (1..=MAX_INPUTS).contains(&inputs),
            "plan inputs {inputs} out of range"
        );
        assert_eq!(coefs.len(), outputs * inputs);
        let expanded = match kernel {
            Kernel::Portable => Expanded::None,
            Kernel::GfniAvx512 => Expanded::Affine(
                (0..inputs * outputs)
                    .map(|n| affine_matrix(coefs[(n % outputs) * inputs + n / outputs]))
                    .collect(),
            ),
            Kernel::Avx2 => Expanded::Nibbles(
                (0..inputs * outputs)
                    .map(|n| nibble_tables(coefs[(n % outputs) * inputs + n / outputs]))
                    .collect(),
            ),
        };
        Plan {
            kernel,
            outputs,
            inputs,
            coefs,
            expanded,
        }
    }

    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Computes every output from the inputs. With `accumulate` the products are XORed into
    /// the outputs' current contents (parity update); otherwise the outputs are overwritten.
    pub fn apply(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]], accumulate: bool) {
        assert_eq!(inputs.len(), self.inputs);
        assert_eq!(outputs.len(), self.outputs);
        let len = inputs[0].len();
        assert!(
            inputs.iter().all(|s| s.len() == len),
            "input strips differ in length"
        );
        assert!(
            outputs.iter().all(|s| s.len() == len),
            "output strips differ in length"
        );
        let done = match (&self.expanded, self.kernel) {
            #[cfg(target_arch = "x86_64")]
            (Expanded::Affine(mats), Kernel::GfniAvx512) => {
                // SAFETY: a Plan for this kernel exists only after `Kernel::available`
                // confirmed the CPU has AVX-512F/BW and GFNI.
                unsafe { x86::gfni_avx512(mats, inputs, outputs, accumulate) }
            }
            #[cfg(target_arch = "x86_64")]
            (Expanded::Nibbles(tables), Kernel::Avx2) => {
                // SAFETY: as above, AVX2 was detected before the Plan was built.
                unsafe { x86::avx2(tables, inputs, outputs, accumulate) }
            }
            _ => 0,
        };
        if done < len {
            let tail_in: Vec<&[u8]> = inputs.iter().map(|s| &s[done..]).collect();
            let mut tail_out: Vec<&mut [u8]> = outputs.iter_mut().map(|s| &mut s[done..]).collect();
            portable::apply(&self.coefs, &tail_in, &mut tail_out, accumulate);
        }
    }
}

/// The 8x8 GF(2) matrix that multiplies a byte by `c` under the affine instruction.
///
/// Bit `i` of `c * x` is the parity of `x AND row_i`, where bit `b` of `row_i` is bit `i` of
/// `c * 2^b`. The instruction takes row `i` from byte `7 - i` of the 64-bit operand.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn affine_matrix(c: u8) -> u64 {
    let mut m = 0u64;
    for i in 0..8 {
        let mut row = 0u8;
        for b in 0..8 {
            if crate::gf::mul(c, 1 << b) >> i & 1 == 1 {
                row |= 1 << b;
            }
        }
        m |= (row as u64) << (8 * (7 - i));
    }
    m
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn nibble_tables(c: u8) -> [u8; 32] {
    let mut t = [0u8; 32];
    for n in 0..16u8 {
        t[n as usize] = crate::gf::mul(c, n);
        t[16 + n as usize] = crate::gf::mul(c, n << 4);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Software model of the affine instruction, to pin down the row/bit order of
    /// `affine_matrix` independently of any CPU.
    fn affine(m: u64, x: u8) -> u8 {
        (0..8).fold(0u8, |out, i| {
            let row = (m >> (8 * (7 - i))) as u8;
            out | ((((row & x).count_ones() & 1) as u8) << i)
        })
    }

    #[test]
    fn affine_matrix_multiplies() {
        for c in 0..=255u8 {
            let m = affine_matrix(c);
            for x in 0..=255u8 {
                assert_eq!(affine(m, x), crate::gf::mul(c, x), "c={c} x={x}");
            }
        }
    }

    #[test]
    fn nibble_tables_multiply() {
        for c in 0..=255u8 {
            let t = nibble_tables(c);
            for x in 0..=255u8 {
                let got = t[(x & 15) as usize] ^ t[16 + (x >> 4) as usize];
                assert_eq!(got, crate::gf::mul(c, x));
            }
        }
    }
}
