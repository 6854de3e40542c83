//! Helpers shared by the test suites of Tessera's crates (a dev-dependency only).

/// Deterministic pseudo-random bytes (xorshift), so a test can write data and later check
/// every byte by regenerating it from the seed instead of keeping a copy.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_repeat_by_seed_and_differ_between_seeds() {
        assert_eq!(super::pattern(4096, 7), super::pattern(4096, 7));
        assert_ne!(super::pattern(4096, 7), super::pattern(4096, 8));
        assert_eq!(super::pattern(100, 1).len(), 100);
    }
}
