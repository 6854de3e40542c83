//! Sizes and counts as administrators write them: `64K`, `256k`, `1M`, `4m`, `1G`, `65536`.

use anyhow::{bail, Result};

/// The block sizes `-B` accepts.
pub const BLOCK_BYTES_MIN: u64 = 64 << 10;
pub const BLOCK_BYTES_MAX: u64 = 16 << 20;
const BLOCK_SIZES_TEXT: &str = "64K, 128K, 256K, 512K, 1M, 2M, 4M, 8M or 16M";

/// Parses a number with an optional binary suffix K, M, G or T (either case).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last()?.to_ascii_uppercase() {
        'K' => (&text[..text.len() - 1], 10),
        'M' => (&text[..text.len() - 1], 20),
        'G' => (&text[..text.len() - 1], 30),
        'T' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let number: u64 = digits.parse().ok()?;
    number.checked_mul(1u64 << shift)
}

/// `-B`: a power of two from 64K to 16M.
pub fn parse_block_size(text: &str) -> Result<u32> {
    let Some(bytes) = parse_size(text) else {
        bail!("-B {text}: not a size; use {BLOCK_SIZES_TEXT}");
    };
    if !bytes.is_power_of_two() {
        bail!("-B {text}: block size is not a power of two; use {BLOCK_SIZES_TEXT}");
    }
    if bytes < BLOCK_BYTES_MIN {
        bail!("-B {text}: block size is below the minimum of 64K; use {BLOCK_SIZES_TEXT}");
    }
    if bytes > BLOCK_BYTES_MAX {
        bail!("-B {text}: block size is above the maximum of 16M; use {BLOCK_SIZES_TEXT}");
    }
    Ok(bytes as u32)
}

/// `-i`: 512, 1K or 4K.
pub fn parse_inode_size(text: &str) -> Result<u32> {
    match parse_size(text) {
        Some(b @ (512 | 1024 | 4096)) => Ok(b as u32),
        _ => bail!("-i {text}: unsupported inode size; use 512, 1K or 4K"),
    }
}

/// `--inode-limit MAX[:PREALLOC]`.
pub fn parse_inode_limit(text: &str) -> Result<(u64, u64)> {
    let (max_text, pre_text) = text.split_once(':').unwrap_or((text, "0"));
    let (Some(max), Some(pre)) = (parse_size(max_text), parse_size(pre_text)) else {
        bail!("--inode-limit {text}: write MAX or MAX:PREALLOC, e.g. 10000000:5000000");
    };
    if max == 0 {
        bail!("--inode-limit {text}: the maximum must be at least 1");
    }
    if pre > max {
        bail!("--inode-limit {text}: preallocated inodes ({pre}) exceed the maximum ({max})");
    }
    Ok((max, pre))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("256k"), Some(256 << 10));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_block_size("1m").unwrap(), 1 << 20);
        assert!(parse_block_size("3M")
            .unwrap_err()
            .to_string()
            .contains("power of two"));
        assert!(parse_block_size("32K")
            .unwrap_err()
            .to_string()
            .contains("minimum"));
        assert!(parse_block_size("32M")
            .unwrap_err()
            .to_string()
            .contains("maximum"));
    }

    #[test]
    fn inode_limits() {
        assert_eq!(
            parse_inode_limit("10000000:5000000").unwrap(),
            (10_000_000, 5_000_000)
        );
        assert_eq!(parse_inode_limit("1M").unwrap(), (1 << 20, 0));
        assert!(parse_inode_limit("5:10").is_err());
    }
}
