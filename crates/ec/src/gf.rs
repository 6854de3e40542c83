//! Arithmetic in GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11D), and the
//! small matrix algebra the codec needs to build encoding and decoding matrices.
//!
//! Tables are built at compile time: the codec must never pay for them on the I/O path.

/// Generator polynomial shared with the widely deployed Reed-Solomon libraries, so parity
/// written by Tessera can be checked or rebuilt by other tools.
pub(crate) const POLY: u16 = 0x11D;

const fn build_exp_log() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // Doubling the exp table lets mul() add two logs without a modulo.
    while i < 512 {
        exp[i] = exp[i - 255];
        i += 1;
    }
    (exp, log)
}

const EXP_LOG: ([u8; 512], [u8; 256]) = build_exp_log();
static EXP: [u8; 512] = EXP_LOG.0;
static LOG: [u8; 256] = EXP_LOG.1;

const fn build_mul_table() -> [[u8; 256]; 256] {
    let (exp, log) = build_exp_log();
    let mut t = [[0u8; 256]; 256];
    let mut a = 1;
    while a < 256 {
        let mut b = 1;
        while b < 256 {
            t[a][b] = exp[log[a] as usize + log[b] as usize];
            b += 1;
        }
        a += 1;
    }
    t
}

/// Full product table: row `c` is "multiply by c", which is what the portable kernel and
/// the SIMD tails index per coefficient.
pub(crate) static MUL: [[u8; 256]; 256] = build_mul_table();

pub(crate) fn mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

pub(crate) fn inv(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// a^n with the conventions of the reference Vandermonde construction (0^0 = 1).
pub(crate) fn pow(a: u8, n: usize) -> u8 {
    if n == 0 {
        return 1;
    }
    if a == 0 {
        return 0;
    }
    EXP[(LOG[a as usize] as usize * n) % 255]
}

/// Row-major square or rectangular matrix over GF(2^8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub cells: Vec<u8>,
}

impl Matrix {
    pub fn zero(rows: usize, cols: usize) -> Matrix {
        Matrix {
            rows,
            cols,
            cells: vec![0; rows * cols],
        }
    }

    pub fn identity(n: usize) -> Matrix {
        let mut m = Matrix::zero(n, n);
        for i in 0..n {
            m.cells[i * n + i] = 1;
        }
        m
    }

    pub fn row(&self, r: usize) -> &[u8] {
        &self.cells[r * self.cols..(r + 1) * self.cols]
    }

    pub fn get(&self, r: usize, c: usize) -> u8 {
        self.cells[r * self.cols + c]
    }

    pub fn set(&mut self, r: usize, c: usize, v: u8) {
        self.cells[r * self.cols + c] = v;
    }

    pub fn multiply(&self, rhs: &Matrix) -> Matrix {
        assert_eq!(self.cols, rhs.rows);
        let mut out = Matrix::zero(self.rows, rhs.cols);
        for r in 0..self.rows {
            for c in 0..rhs.cols {
                let mut acc = 0u8;
                for i in 0..self.cols {
                    acc ^= mul(self.get(r, i), rhs.get(i, c));
                }
                out.set(r, c, acc);
            }
        }
        out
    }

    /// Matrix made of the given rows of `self`, in that order.
    pub fn select_rows(&self, rows: &[usize]) -> Matrix {
        let mut out = Matrix::zero(rows.len(), self.cols);
        for (i, &r) in rows.iter().enumerate() {
            out.cells[i * self.cols..(i + 1) * self.cols].copy_from_slice(self.row(r));
        }
        out
    }

    /// Gauss-Jordan inverse; None when singular (never for rows of a systematic
    /// Vandermonde-derived matrix, which is the property the code relies on).
    pub fn invert(&self) -> Option<Matrix> {
        assert_eq!(self.rows, self.cols, "only square matrices have inverses");
        let n = self.rows;
        let mut a = self.clone();
        let mut b = Matrix::identity(n);
        for col in 0..n {
            let pivot = (col..n).find(|&r| a.get(r, col) != 0)?;
            if pivot != col {
                for c in 0..n {
                    a.cells.swap(pivot * n + c, col * n + c);
                    b.cells.swap(pivot * n + c, col * n + c);
                }
            }
            let scale = inv(a.get(col, col));
            for c in 0..n {
                a.set(col, c, mul(a.get(col, c), scale));
                b.set(col, c, mul(b.get(col, c), scale));
            }
            for r in 0..n {
                let f = a.get(r, col);
                if r == col || f == 0 {
                    continue;
                }
                for c in 0..n {
                    let av = a.get(r, c) ^ mul(f, a.get(col, c));
                    a.set(r, c, av);
                    let bv = b.get(r, c) ^ mul(f, b.get(col, c));
                    b.set(r, c, bv);
                }
            }
        }
        debug_assert_eq!(a, Matrix::identity(n));
        Some(b)
    }
}

/// The (k+m) x k encoding matrix: a Vandermonde matrix with rows 0..k+m and columns 0..k,
/// multiplied by the inverse of its top k x k square so the top becomes the identity
/// (data strips are stored as is). This is the construction of the Backblaze/klauspost
/// family, so parity bytes are interchangeable with those libraries.
pub(crate) fn encoding_matrix(k: usize, m: usize) -> Matrix {
    let total = k + m;
    assert!(total <= 256, "GF(2^8) Vandermonde needs distinct row bases");
    let mut vm = Matrix::zero(total, k);
    for r in 0..total {
        for c in 0..k {
            vm.set(r, c, pow(r as u8, c));
        }
    }
    let top: Vec<usize> = (0..k).collect();
    let top_inv = vm
        .select_rows(&top)
        .invert()
        .expect("Vandermonde top square is invertible");
    let enc = vm.multiply(&top_inv);
    debug_assert_eq!(enc.select_rows(&top), Matrix::identity(k));
    enc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_axioms_hold_on_samples() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
            assert_eq!(mul(a, 1), a);
            assert_eq!(mul(a, 0), 0);
        }
        assert_eq!(mul(2, 0x80), 0x1D);
    }

    #[test]
    fn inverse_round_trips() {
        let enc = encoding_matrix(8, 4);
        let rows = [0, 2, 3, 5, 7, 8, 10, 11];
        let sub = enc.select_rows(&rows);
        let inv = sub.invert().unwrap();
        assert_eq!(sub.multiply(&inv), Matrix::identity(8));
    }
}
