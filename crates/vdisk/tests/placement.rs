//! Placement: every stripe's strips on distinct pdisks, per-pdisk strip counts balanced,
//! and strips spread over enclosures (one per enclosure with at least k+m enclosures,
//! otherwise at most the smallest feasible number, e.g. 2 for 8+2p over 6 enclosures, so
//! that a whole enclosure can be lost).

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use tessera_vdisk::placement::{self, Candidate};
use tessera_vdisk::{Code, DaOptions, Tolerance, VdiskSize};

fn grid(pdisks: usize, enclosures: usize, capacity: u64) -> Vec<Candidate> {
    (0..pdisks)
        .map(|p| Candidate {
            pdisk: p as u16,
            enclosure: (p % enclosures) as u32,
            capacity,
            load: 0,
        })
        .collect()
}

fn check(cands: &[Candidate], n: usize, m: usize, map: &[u16], stripes: u64) {
    let enclosures = cands.iter().map(|c| c.enclosure).max().unwrap() as usize + 1;
    let sizes: Vec<usize> = (0..enclosures)
        .map(|e| cands.iter().filter(|c| c.enclosure as usize == e).count())
        .collect();
    let cap = placement::enclosure_cap(n, &sizes).unwrap();
    if enclosures >= n {
        assert_eq!(cap, 1);
    }
    let mut counts = vec![0u64; cands.len()];
    for stripe in map.chunks(n) {
        let mut seen = stripe.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len(),
            n,
            "strips of a stripe share a pdisk: {stripe:?}"
        );
        let mut per: HashMap<u32, usize> = HashMap::new();
        for &p in stripe {
            counts[p as usize] += 1;
            *per.entry(cands[p as usize].enclosure).or_default() += 1;
        }
        assert!(
            per.values().all(|&c| c <= cap),
            "enclosure cap {cap} exceeded: {per:?}"
        );
    }
    // Balance: equal enclosures, equal pdisks, so counts within 2 of each other.
    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
    assert!(hi - lo <= 2, "unbalanced: {counts:?}");
    assert_eq!(counts.iter().sum::<u64>(), stripes * n as u64);
    let tol = placement::tolerance(m, cap);
    assert_eq!(tol.pdisks, m);
    if cap <= m {
        assert!(tol.enclosures >= 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn balanced_and_spread(
        per_enclosure in 1usize..5,
        enclosures in 1usize..13,
        code in prop_oneof![Just((8usize, 2usize)), Just((4, 2)), Just((8, 3)), Just((4, 3)), Just((1, 2)), Just((1, 3))],
        stripes in 1u64..400,
        seed in any::<u64>(),
    ) {
        let (k, m) = code;
        let n = k + m;
        let pdisks = per_enclosure * enclosures;
        prop_assume!(pdisks >= n);
        let cands = grid(pdisks, enclosures, 1 << 20);
        let map = placement::place(&cands, n, stripes, seed).unwrap();
        check(&cands, n, m, &map, stripes);
    }
}

#[test]
fn twelve_pdisks_six_enclosures_8_2p() {
    let cands = grid(12, 6, 1 << 20);
    let map = placement::place(&cands, 10, 5000, 1).unwrap();
    check(&cands, 10, 2, &map, 5000);
    assert_eq!(
        placement::tolerance(2, 2),
        Tolerance {
            pdisks: 2,
            enclosures: 1
        }
    );
}

/// The same rules hold for a real vdisk, and its reported tolerance matches.
#[test]
fn vdisk_layout_and_tolerance() {
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let code = Code::parse("8+2p").unwrap();
    assert_eq!(
        da.tolerance(code),
        Tolerance {
            pdisks: 2,
            enclosures: 1
        }
    );
    let v = da
        .create_vdisk("v", code, 256 << 10, VdiskSize::Percent(100))
        .unwrap();
    assert_eq!(
        v.tolerance().unwrap(),
        Tolerance {
            pdisks: 2,
            enclosures: 1
        }
    );
    let enclosure: HashMap<String, String> = t
        .specs
        .iter()
        .map(|s| (s.name.clone(), s.enclosure.clone()))
        .collect();
    let mut counts: HashMap<String, u64> = HashMap::new();
    for s in 0..v.stripes() {
        let locs = v.strip_locations(s).unwrap();
        let mut per: HashMap<&str, usize> = HashMap::new();
        for l in &locs {
            *per.entry(&enclosure[&l.pdisk]).or_default() += 1;
            *counts.entry(l.pdisk.clone()).or_default() += 1;
        }
        assert!(per.values().all(|&c| c <= 2), "stripe {s}: {per:?}");
    }
    let (lo, hi) = (
        counts.values().min().unwrap(),
        counts.values().max().unwrap(),
    );
    assert!(hi - lo <= 2, "{counts:?}");
    // Spare space was kept: about one pdisk's worth of twelve.
    let st = da.status();
    assert!(
        st.spare_bytes > 0 && st.free_bytes < st.spare_bytes,
        "{} {}",
        st.free_bytes,
        st.spare_bytes
    );
    // With one enclosure per strip position (12 enclosures), one strip per enclosure.
    let t2 = make_pdisks(12, 12, 64 * MIB);
    let da2 = create(&t2, DaOptions::default());
    assert_eq!(
        da2.tolerance(code),
        Tolerance {
            pdisks: 2,
            enclosures: 2
        }
    );
    let v2 = da2
        .create_vdisk("v", code, 256 << 10, VdiskSize::Percent(50))
        .unwrap();
    assert_eq!(
        v2.tolerance().unwrap(),
        Tolerance {
            pdisks: 2,
            enclosures: 2
        }
    );
    da.close().unwrap();
    da2.close().unwrap();
}
