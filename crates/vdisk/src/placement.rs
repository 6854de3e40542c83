//! Where the strips of each stripe go: pure functions, so they can be tested on their own.
//!
//! Every stripe's `n = k + m` strips go to `n` distinct pdisks. Among the candidates the
//! least loaded (relative to its capacity) is taken first, ties broken by a hash of the
//! stripe and pdisk, which spreads every pair of pdisks over roughly the same number of
//! stripes (declustering) while keeping per-pdisk strip counts within one or two of each
//! other. Enclosures are capped: at most `cap` strips of a stripe per enclosure, where `cap`
//! is the smallest value the enclosures can satisfy (1 when there are at least `n`
//! enclosures). A stripe then survives the loss of `m / cap` whole enclosures.

/// A pdisk that may receive strips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub pdisk: u16,
    /// Dense enclosure number (0..enclosure count).
    pub enclosure: u32,
    /// Strips it can still take.
    pub capacity: u64,
    /// Strips it already holds (for balance with earlier vdisks).
    pub load: u64,
}

/// What a layout survives: any `pdisks` pdisk failures, and any `enclosures` whole
/// enclosure failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
pub struct Tolerance {
    pub pdisks: usize,
    pub enclosures: usize,
}

/// The smallest per-enclosure cap such that `n` strips fit into enclosures of the given
/// sizes (pdisk counts); `None` when even all pdisks together are fewer than `n`.
pub fn enclosure_cap(n: usize, enclosure_sizes: &[usize]) -> Option<usize> {
    if enclosure_sizes.iter().sum::<usize>() < n {
        return None;
    }
    (1..=n).find(|&cap| enclosure_sizes.iter().map(|&s| s.min(cap)).sum::<usize>() >= n)
}

/// The tolerance of a code with `m` redundant strips under a per-enclosure cap.
pub fn tolerance(m: usize, cap: usize) -> Tolerance {
    Tolerance {
        pdisks: m,
        enclosures: m / cap.max(1),
    }
}

/// A stable 64-bit mix (splitmix64), so placement is reproducible from the seed.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn enclosure_sizes(cands: &[Candidate]) -> Vec<usize> {
    let count = cands
        .iter()
        .map(|c| c.enclosure as usize + 1)
        .max()
        .unwrap_or(0);
    let mut sizes = vec![0; count];
    for c in cands {
        sizes[c.enclosure as usize] += 1;
    }
    sizes
}

/// Loads compared relative to capacity: `a` before `b` when `a` is relatively emptier.
fn emptier(load_a: u64, cap_a: u64, load_b: u64, cap_b: u64) -> std::cmp::Ordering {
    let total_a = u128::from(load_a + cap_a).max(1);
    let total_b = u128::from(load_b + cap_b).max(1);
    (u128::from(load_a) * total_b).cmp(&(u128::from(load_b) * total_a))
}

/// Places `stripes` stripes of `n` strips over `cands`: the result holds `n` pdisk numbers
/// per stripe. Fails when the candidates lack the pdisks or the capacity.
pub fn place(cands: &[Candidate], n: usize, stripes: u64, seed: u64) -> Result<Vec<u16>, String> {
    let cap = enclosure_cap(n, &enclosure_sizes(cands)).ok_or_else(|| {
        format!(
            "{n} strips per stripe need {n} pdisks, {} given",
            cands.len()
        )
    })?;
    let mut load: Vec<u64> = cands.iter().map(|c| c.load).collect();
    let mut room: Vec<u64> = cands.iter().map(|c| c.capacity).collect();
    let enclosures = enclosure_sizes(cands).len();
    let mut order: Vec<usize> = (0..cands.len()).collect();
    let mut out = Vec::with_capacity(usize::try_from(stripes).unwrap_or(0) * n);
    let mut per_enclosure = vec![0usize; enclosures];
    for stripe in 0..stripes {
        let salt = mix(seed ^ mix(stripe));
        order.sort_by(|&a, &b| {
            emptier(load[a], room[a], load[b], room[b]).then_with(|| {
                mix(salt ^ u64::from(cands[a].pdisk)).cmp(&mix(salt ^ u64::from(cands[b].pdisk)))
            })
        });
        per_enclosure.iter_mut().for_each(|c| *c = 0);
        let start = out.len();
        for &i in &order {
            let e = cands[i].enclosure as usize;
            if room[i] == 0 || per_enclosure[e] >= cap {
                continue;
            }
            per_enclosure[e] += 1;
            out.push(cands[i].pdisk);
            room[i] -= 1;
            load[i] += 1;
            if out.len() - start == n {
                break;
            }
        }
        if out.len() - start < n {
            return Err(format!(
                "stripe {stripe}: only {} of {n} strips fit (capacity exhausted)",
                out.len() - start
            ));
        }
    }
    Ok(out)
}

/// Picks a pdisk for one strip of a stripe whose other strips sit in `members` (pdisk,
/// enclosure): not a member, the enclosure cap respected when possible (relaxed one step at
/// a time otherwise, so redundancy is restored even when enclosures are short), emptiest
/// first. `None` when no candidate has room.
pub fn pick_target(
    cands: &[Candidate],
    members: &[(u16, u32)],
    n: usize,
    salt: u64,
) -> Option<u16> {
    let cap = enclosure_cap(n, &enclosure_sizes(cands)).unwrap_or(n);
    let usable: Vec<&Candidate> = cands
        .iter()
        .filter(|c| c.capacity > 0 && !members.iter().any(|&(p, _)| p == c.pdisk))
        .collect();
    for limit in cap..=n {
        let best = usable
            .iter()
            .filter(|c| members.iter().filter(|&&(_, e)| e == c.enclosure).count() < limit)
            .min_by(|a, b| {
                emptier(a.load, a.capacity, b.load, b.capacity).then_with(|| {
                    mix(salt ^ u64::from(a.pdisk)).cmp(&mix(salt ^ u64::from(b.pdisk)))
                })
            });
        if let Some(c) = best {
            return Some(c.pdisk);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(pdisks: u16, enclosures: u32, capacity: u64) -> Vec<Candidate> {
        (0..pdisks)
            .map(|p| Candidate {
                pdisk: p,
                enclosure: u32::from(p) % enclosures,
                capacity,
                load: 0,
            })
            .collect()
    }

    #[test]
    fn caps_follow_the_enclosure_count() {
        assert_eq!(enclosure_cap(10, &[2; 6]), Some(2));
        assert_eq!(enclosure_cap(10, &[1; 12]), Some(1));
        assert_eq!(enclosure_cap(10, &[12]), Some(10));
        assert_eq!(enclosure_cap(10, &[8]), None);
        assert_eq!(enclosure_cap(3, &[5, 1]), Some(2));
        assert_eq!(
            tolerance(2, 2),
            Tolerance {
                pdisks: 2,
                enclosures: 1
            }
        );
        assert_eq!(
            tolerance(2, 10),
            Tolerance {
                pdisks: 2,
                enclosures: 0
            }
        );
    }

    #[test]
    fn places_distinct_pdisks_and_fills_exactly() {
        let cands = grid(12, 6, 100);
        let map = place(&cands, 10, 120, 7).unwrap();
        for s in map.chunks(10) {
            let mut v = s.to_vec();
            v.sort_unstable();
            v.dedup();
            assert_eq!(v.len(), 10);
        }
        assert!(place(&cands, 10, 121, 7).is_err());
    }

    #[test]
    fn target_avoids_members_and_full_enclosures() {
        let cands = grid(12, 6, 10);
        let members: Vec<(u16, u32)> = (0..9).map(|p| (p, u32::from(p) % 6)).collect();
        let t = pick_target(&cands, &members, 10, 1).unwrap();
        assert!(t >= 9);
        // Enclosures 0, 1, 2 already hold two strips each: 9, 10 and 11 are in 3, 4, 5.
        assert!([9, 10, 11].contains(&t));
    }
}
