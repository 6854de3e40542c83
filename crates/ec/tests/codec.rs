//! Behaviour every vdisk relies on: any ≤ m losses rebuild exactly, > m is refused without
//! touching the stripe, all kernels agree byte for byte, and parity matches an independent
//! implementation of the same matrix.

use proptest::prelude::*;
use tessera_ec::{Code, Codec, CodecError};
use tessera_testkit::pattern;

fn all_codes() -> Vec<Code> {
    let mut codes = vec![
        Code::Replication { copies: 3 },
        Code::Replication { copies: 4 },
    ];
    for k in 1..=16u8 {
        for m in 1..=4u8 {
            codes.push(Code::ReedSolomon { k, m });
        }
    }
    codes
}

fn stripe(code: Code, len: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..code.total_strips())
        .map(|i| {
            if i >= code.data_strips() {
                return vec![0; len];
            }
            pattern(len, seed.wrapping_mul(64) + i as u64)
        })
        .collect()
}

fn encode(codec: &Codec, strips: &mut [Vec<u8>]) {
    let k = codec.code().data_strips();
    let (data, parity) = strips.split_at_mut(k);
    let data: Vec<&[u8]> = data.iter().map(|s| &s[..]).collect();
    let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|s| &mut s[..]).collect();
    codec.encode(&data, &mut parity).unwrap();
}

fn reconstruct(codec: &Codec, strips: &mut [Vec<u8>], present: &[bool]) -> Result<(), CodecError> {
    let mut views: Vec<&mut [u8]> = strips.iter_mut().map(|s| &mut s[..]).collect();
    codec.reconstruct(&mut views, present)
}

fn kernels() -> Vec<&'static str> {
    Codec::available_kernels()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    #[test]
    fn any_tolerable_loss_rebuilds_and_more_is_refused(
        code_index in 0..66usize,
        len in prop_oneof![Just(0usize), Just(1), 0..300usize, 0..5000usize],
        seed in any::<u64>(),
        lost_bits in any::<u32>(),
        kernel_index in 0..3usize,
    ) {
        let code = all_codes()[code_index];
        let kernels = kernels();
        let codec = Codec::with_kernel(code, kernels[kernel_index % kernels.len()]).unwrap();
        let total = code.total_strips();
        let mut strips = stripe(code, len, seed);
        encode(&codec, &mut strips);
        let original = strips.clone();

        // Lose a random subset of strips, trimmed to at most m so it is recoverable.
        let mut present: Vec<bool> = (0..total).map(|i| lost_bits >> i & 1 == 0).collect();
        let mut lost = present.iter().filter(|&&p| !p).count();
        for p in present.iter_mut() {
            if lost > code.fault_tolerance() && !*p {
                *p = true;
                lost -= 1;
            }
        }
        for (s, &p) in strips.iter_mut().zip(&present) {
            if !p {
                s.iter_mut().for_each(|b| *b = !*b);
            }
        }
        reconstruct(&codec, &mut strips, &present).unwrap();
        prop_assert_eq!(&strips, &original);

        // One more loss than the code tolerates: refused, nothing written.
        let mut present = vec![true; total];
        for p in present.iter_mut().skip((lost_bits as usize) % total).take(code.fault_tolerance() + 1) {
            *p = false;
        }
        let extra = present.iter().filter(|&&p| !p).count();
        if extra <= code.fault_tolerance() {
            // The window ran off the end; lose from the front instead.
            for p in present.iter_mut().take(code.fault_tolerance() + 1 - extra) {
                *p = false;
            }
        }
        let before = strips.clone();
        let err = reconstruct(&codec, &mut strips, &present).unwrap_err();
        prop_assert!(matches!(err, CodecError::TooManyLost { .. }), "{}", err);
        prop_assert_eq!(&strips, &before);
    }

    #[test]
    fn update_parity_equals_reencode(
        code_index in 0..66usize,
        len in 0..700usize,
        seed in any::<u64>(),
        which in any::<usize>(),
        range in (any::<usize>(), any::<usize>()),
    ) {
        let code = all_codes()[code_index];
        for kernel in kernels() {
            let codec = Codec::with_kernel(code, kernel).unwrap();
            let k = code.data_strips();
            let mut strips = stripe(code, len, seed);
            encode(&codec, &mut strips);
            let d = which % k;
            let (a, b) = (range.0 % (len + 1), range.1 % (len + 1));
            let (start, end) = (a.min(b), a.max(b));
            let old = strips[d][start..end].to_vec();
            let new: Vec<u8> = old.iter().enumerate().map(|(i, &x)| x ^ (i as u8).wrapping_mul(37) ^ 0x5C).collect();
            strips[d][start..end].copy_from_slice(&new);
            {
                let mut parity: Vec<&mut [u8]> = strips[k..].iter_mut().map(|s| &mut s[start..end]).collect();
                codec.update_parity(d, &old, &new, &mut parity).unwrap();
            }
            let mut fresh = strips.clone();
            encode(&codec, &mut fresh);
            prop_assert_eq!(&strips, &fresh);
        }
    }
}

#[test]
fn every_kernel_writes_identical_parity() {
    let lens = [0, 1, 63, 64, 65, 255, 256, 257, 1000, 4096 + 77, 65536 + 3];
    for code in all_codes() {
        let portable = Codec::with_kernel(code, "portable").unwrap();
        for &len in &lens {
            let mut want = stripe(code, len, len as u64 * 31 + code.total_strips() as u64);
            encode(&portable, &mut want);
            for kernel in kernels() {
                let codec = Codec::with_kernel(code, kernel).unwrap();
                let mut got = want.clone();
                got[code.data_strips()..]
                    .iter_mut()
                    .for_each(|p| p.fill(0xEE));
                encode(&codec, &mut got);
                assert!(
                    got == want,
                    "{kernel} parity differs from portable for {code} len {len}"
                );
                // Decode through this kernel too: lose the first m strips.
                let present: Vec<bool> = (0..code.total_strips())
                    .map(|i| i >= code.fault_tolerance())
                    .collect();
                got[..code.fault_tolerance()]
                    .iter_mut()
                    .for_each(|s| s.fill(0x11));
                reconstruct(&codec, &mut got, &present).unwrap();
                assert!(got == want, "{kernel} decode differs for {code} len {len}");
            }
        }
    }
}

#[test]
fn parity_matches_independent_implementation() {
    use reed_solomon_erasure::galois_8::ReedSolomon;
    for k in 1..=16usize {
        for m in 1..=4usize {
            let code = Code::ReedSolomon {
                k: k as u8,
                m: m as u8,
            };
            let reference = ReedSolomon::new(k, m).unwrap();
            for kernel in kernels() {
                let codec = Codec::with_kernel(code, kernel).unwrap();
                let mut ours = stripe(code, 1000, (k * 10 + m) as u64);
                encode(&codec, &mut ours);
                let mut theirs = ours.clone();
                theirs[k..].iter_mut().for_each(|p| p.fill(0));
                reference.encode(&mut theirs).unwrap();
                assert!(
                    ours == theirs,
                    "{kernel}: parity of {code} differs from the reference"
                );
            }
        }
    }
}

#[test]
fn replication_copies() {
    for copies in [3u8, 4] {
        let codec = Codec::new(Code::Replication { copies }).unwrap();
        assert_eq!(codec.id(), 2);
        let mut strips = stripe(codec.code(), 333, 9);
        encode(&codec, &mut strips);
        assert!(strips.iter().all(|s| *s == strips[0]));
        let original = strips.clone();
        let mut present = vec![true; copies as usize];
        present[0] = false;
        present[1] = false;
        strips[0].fill(0);
        strips[1].fill(0);
        reconstruct(&codec, &mut strips, &present).unwrap();
        assert_eq!(strips, original);
    }
}

#[test]
fn code_names_round_trip() {
    for code in all_codes() {
        let name = code.to_string();
        assert_eq!(Code::parse(&name).unwrap(), code, "{name}");
        assert_eq!(name.parse::<Code>().unwrap(), code);
    }
    assert_eq!(
        Code::parse("8+2P").unwrap(),
        Code::ReedSolomon { k: 8, m: 2 }
    );
    assert_eq!(
        Code::parse(" 4+3p ").unwrap(),
        Code::ReedSolomon { k: 4, m: 3 }
    );
    assert_eq!(
        Code::parse("3way").unwrap(),
        Code::Replication { copies: 3 }
    );
    assert_eq!(
        Code::parse("4WAYREPLICATION").unwrap(),
        Code::Replication { copies: 4 }
    );
    assert_eq!(Code::parse("8+2p").unwrap().to_string(), "8+2p");
    assert_eq!(
        Code::parse("3wayreplication").unwrap().to_string(),
        "3WayReplication"
    );
    let c = Code::parse("16+4p").unwrap();
    assert_eq!(
        (
            c.data_strips(),
            c.parity_strips(),
            c.total_strips(),
            c.fault_tolerance()
        ),
        (16, 4, 20, 4)
    );
    let r = Code::parse("3WayReplication").unwrap();
    assert_eq!(
        (
            r.data_strips(),
            r.parity_strips(),
            r.total_strips(),
            r.fault_tolerance()
        ),
        (1, 2, 3, 2)
    );
}

#[test]
fn bad_code_names_say_what_is_accepted() {
    for (input, says) in [
        ("8+0p", "0 parity strips"),
        ("17+2p", "17 data strips"),
        ("8+5p", "5 parity strips"),
        ("foo", "neither"),
        ("2way", "2-way"),
        ("8+xp", "not a number"),
        ("", "neither"),
    ] {
        let msg = Code::parse(input).unwrap_err().to_string();
        assert!(msg.contains(says), "{input:?}: {msg}");
        assert!(msg.contains("accepted: K+Mp"), "{input:?}: {msg}");
    }
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let codec = Codec::new(Code::ReedSolomon { k: 4, m: 2 }).unwrap();
    assert_eq!(codec.id(), 1);
    let a = vec![0u8; 64];
    let short = vec![0u8; 63];
    let mut p = [vec![0u8; 64], vec![0u8; 64]];
    let mut parity: Vec<&mut [u8]> = p.iter_mut().map(|s| &mut s[..]).collect();
    let err = codec.encode(&[&a, &a, &a], &mut parity).unwrap_err();
    assert!(matches!(err, CodecError::StripCount { .. }), "{err}");
    let err = codec
        .encode(&[&a, &a, &a, &short], &mut parity)
        .unwrap_err();
    assert!(matches!(err, CodecError::StripLength { .. }), "{err}");
    let err = codec.update_parity(4, &a, &a, &mut parity).unwrap_err();
    assert!(matches!(err, CodecError::DataIndex { .. }), "{err}");
    assert!(Codec::with_kernel(codec.code(), "sse9").is_err());
    assert!(Codec::new(Code::ReedSolomon { k: 8, m: 9 }).is_err());
}

#[test]
fn codec_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Codec>();
}

#[test]
fn bench_run_reports_sane_numbers() {
    let r = tessera_ec::bench::run(Code::ReedSolomon { k: 4, m: 2 }, 4096, 0.01).unwrap();
    assert!(r.encode_gbps > 0.0 && r.decode_gbps > 0.0);
    assert_eq!(r.strip_bytes, 4096);
}

/// Stripes larger than L2 take the streaming-store path, which only runs on 64-byte
/// aligned output strips; check it against the portable kernel too.
#[test]
fn large_aligned_stripes_match_portable() {
    let code = Code::ReedSolomon { k: 8, m: 2 };
    let len = 384 * 1024 + 64 * 3 + 5; // odd tail on purpose
    let aligned = |seed: u64| {
        let mut buf = vec![0u8; len + 64];
        let start = buf.as_ptr().align_offset(64);
        let mut x = seed | 1;
        for b in &mut buf[start..start + len] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        (buf, start)
    };
    let mut bufs: Vec<(Vec<u8>, usize)> = (0..10).map(|i| aligned(i + 1)).collect();
    let portable = Codec::with_kernel(code, "portable").unwrap();
    let mut want = vec![vec![0u8; len]; 2];
    {
        let data: Vec<&[u8]> = bufs[..8].iter().map(|(b, s)| &b[*s..*s + len]).collect();
        let mut parity: Vec<&mut [u8]> = want.iter_mut().map(|p| &mut p[..]).collect();
        portable.encode(&data, &mut parity).unwrap();
    }
    for kernel in kernels() {
        let codec = Codec::with_kernel(code, kernel).unwrap();
        let (data, parity) = bufs.split_at_mut(8);
        let data: Vec<&[u8]> = data.iter().map(|(b, s)| &b[*s..*s + len]).collect();
        let mut parity: Vec<&mut [u8]> = parity
            .iter_mut()
            .map(|(b, s)| &mut b[*s..*s + len])
            .collect();
        codec.encode(&data, &mut parity).unwrap();
        assert!(
            parity[0][..] == want[0][..] && parity[1][..] == want[1][..],
            "{kernel}"
        );
        parity.iter_mut().for_each(|p| p.fill(0));
    }
    let original: Vec<Vec<u8>> = bufs.iter().map(|(b, s)| b[*s..*s + len].to_vec()).collect();
    for kernel in kernels() {
        let codec = Codec::with_kernel(code, kernel).unwrap();
        let mut views: Vec<&mut [u8]> =
            bufs.iter_mut().map(|(b, s)| &mut b[*s..*s + len]).collect();
        views[8].copy_from_slice(&want[0]);
        views[9].copy_from_slice(&want[1]);
        views[0].fill(0);
        views[3].fill(0);
        let present: Vec<bool> = (0..10).map(|i| i != 0 && i != 3).collect();
        codec.reconstruct(&mut views, &present).unwrap();
        assert!(
            views[0][..] == original[0][..] && views[3][..] == original[3][..],
            "{kernel}"
        );
    }
}
