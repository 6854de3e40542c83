//! Tokens: the grant table a token server keeps.
//!
//! A node that holds a token on part of an object may cache and change that part with no
//! further message until another node needs a conflicting token; then the holder flushes
//! what it changed, drops (or, for a reader's request, keeps read-only) its cached copy and
//! gives the range back. This is how GPFS-class file systems make a cluster of caching nodes
//! strictly coherent (a read that starts after a write returned anywhere sees it) without
//! asking a server on every access. In Tessera the owner of a shard is the token server for
//! its inodes (DESIGN.md, "Shared disk, owned metadata"); this crate is the table it keeps,
//! free of any I/O, so that the rules can be checked exhaustively and the server around it
//! (which sends revocations and waits for them, with a bounded wait) stays thin.
//!
//! # What a token is
//!
//! A token names an object (`K`: for the file system an inode's data, its attributes, or a
//! directory's entries), a half-open range of units (blocks of the file for data; `0..1`
//! for an object that is not divided) and a [`Mode`]: `Read` tokens of different holders
//! share a range, a `Write` token excludes every other holder's token on its range. A
//! holder's tokens on one object are disjoint ranges, adjacent ranges of one mode merged.
//!
//! # Asking for a token
//!
//! [`TokenTable::acquire`] takes the range the holder needs now (`required`) and the range
//! it would like (`desired`, containing `required`): GPFS's heuristic, which gives a single
//! writer of a file the whole file (no further request until someone else comes) and
//! concurrent writers the parts between each other. The answer is either
//! [`Acquired::Granted`], a range between the two with no conflict, now held; or
//! [`Acquired::Conflicts`], the [`Revocation`]s that must happen first: every other holder
//! whose token conflicts on `required`, with the part it must give up and whether it may
//! keep reading it (a writer asked for a read range downgrades instead of dropping). The
//! table changes nothing in that case; the server revokes (the holders flush and answer
//! with [`TokenTable::release`] or [`TokenTable::downgrade`]) and asks again. Only the
//! required range is revoked, so two writers of one file interleaving at block
//! granularity take turns per block, not per file.
//!
//! A holder that dies is dropped whole ([`TokenTable::drop_holder`]) once its log has been
//! replayed: its tokens protected changes that only the replay makes durable.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::Range;

use serde::{Deserialize, Serialize};

/// Shared or exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    fn conflicts(self, other: Mode) -> bool {
        self == Mode::Write || other == Mode::Write
    }
}

/// One holder's token on a range of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held<H> {
    pub holder: H,
    pub range: Range<u64>,
    pub mode: Mode,
}

/// What a conflicting holder must do before a request can be granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation<H> {
    pub holder: H,
    /// The part of its token it gives up (within the requested `required` range).
    pub range: Range<u64>,
    /// `Some(Read)`: it may keep reading the range (a reader asked), after flushing what
    /// it wrote; `None`: it drops the range.
    pub keep: Option<Mode>,
}

/// The answer to [`TokenTable::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired<H> {
    /// The holder now holds this range (at least `required`, at most `desired`) in the
    /// asked mode or a stronger one it already had.
    Granted(Range<u64>),
    /// Nothing changed: these holders must give up (or downgrade) their ranges first.
    Conflicts(Vec<Revocation<H>>),
}

/// A request the table cannot take: a caller's bug, reported rather than asserted so that a
/// request from the network cannot bring the server down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad token request: {}", self.0)
    }
}

impl std::error::Error for BadRequest {}

/// Tokens one holder may have on one object at most, in disjoint ranges. Writers that
/// interleave single blocks with another node's leave gaps, so ranges do not always merge;
/// past this bound a request is refused (the holder should give back what it does not
/// use), keeping every scan of an object's holders bounded.
pub const RANGES_PER_HOLDER_MAX: usize = 4096;

/// The tokens granted on every object of a token server.
#[derive(Clone, Debug)]
pub struct TokenTable<K, H> {
    /// Per object, every holder's ranges, sorted by (holder, start).
    objects: BTreeMap<K, Vec<Held<H>>>,
}

impl<K: Ord + Clone + Debug, H: Ord + Copy + Debug> Default for TokenTable<K, H> {
    fn default() -> Self {
        TokenTable {
            objects: BTreeMap::new(),
        }
    }
}

fn overlap(a: &Range<u64>, b: &Range<u64>) -> Option<Range<u64>> {
    let r = a.start.max(b.start)..a.end.min(b.end);
    (r.start < r.end).then_some(r)
}

impl<K: Ord + Clone + Debug, H: Ord + Copy + Debug> TokenTable<K, H> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for `mode` on `required` of `key` for `holder`, as much of `desired` as is
    /// free. See the crate's comment.
    pub fn acquire(
        &mut self,
        holder: H,
        key: &K,
        required: Range<u64>,
        desired: Range<u64>,
        mode: Mode,
    ) -> Result<Acquired<H>, BadRequest> {
        if required.start >= required.end {
            return Err(BadRequest(format!("empty required range {required:?}")));
        }
        if desired.start > required.start || desired.end < required.end {
            return Err(BadRequest(format!(
                "desired range {desired:?} does not contain the required {required:?}"
            )));
        }
        let held = self.objects.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let conflicting = |h: &&Held<H>| h.holder != holder && h.mode.conflicts(mode);
        let revocations: Vec<Revocation<H>> = held
            .iter()
            .filter(conflicting)
            .filter_map(|h| {
                overlap(&h.range, &required).map(|range| Revocation {
                    holder: h.holder,
                    range,
                    keep: (mode == Mode::Read).then_some(Mode::Read),
                })
            })
            .collect();
        if !revocations.is_empty() {
            return Ok(Acquired::Conflicts(revocations));
        }
        // The largest part of `desired` around `required` that no conflicting token touches.
        let (mut lo, mut hi) = (desired.start, desired.end);
        for h in held.iter().filter(conflicting) {
            if h.range.end <= required.start {
                lo = lo.max(h.range.end);
            } else if h.range.start >= required.end {
                hi = hi.min(h.range.start);
            }
        }
        let granted = lo..hi;
        debug_assert!(granted.start <= required.start && granted.end >= required.end);
        let ranges = self.holder_ranges(key, holder) + 1;
        if ranges > RANGES_PER_HOLDER_MAX {
            return Err(BadRequest(format!(
                "{holder:?} holds {ranges} ranges of {key:?}, more than the \
                 {RANGES_PER_HOLDER_MAX} allowed; it should give back ranges it no longer uses"
            )));
        }
        self.set(holder, key, granted.clone(), |old| old.max(mode), mode);
        Ok(Acquired::Granted(granted))
    }

    /// `holder` gives up `range` of `key` (all it holds there; nothing if it holds none).
    pub fn release(&mut self, holder: H, key: &K, range: Range<u64>) {
        self.edit(holder, key, range, |_| None);
    }

    /// `holder` keeps only reading `range` of `key` (its write tokens there become reads).
    pub fn downgrade(&mut self, holder: H, key: &K, range: Range<u64>) {
        self.edit(holder, key, range, |_| Some(Mode::Read));
    }

    /// Every token of `holder` goes (it died and its log was replayed, or it unmounted).
    pub fn drop_holder(&mut self, holder: H) {
        self.objects.retain(|_, held| {
            held.retain(|h| h.holder != holder);
            !held.is_empty()
        });
    }

    /// The tokens on `key`, by holder and range.
    pub fn holders(&self, key: &K) -> &[Held<H>] {
        self.objects.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The mode `holder` holds on all of `range` of `key`: `Write` if it holds it all in
    /// write, `Read` if all in at least read, else `None`.
    pub fn held_mode(&self, holder: H, key: &K, range: Range<u64>) -> Option<Mode> {
        let mut at = range.start;
        let mut mode = Mode::Write;
        for h in self.holders(key).iter().filter(|h| h.holder == holder) {
            if h.range.end <= at {
                continue;
            }
            if h.range.start > at {
                return None;
            }
            mode = mode.min(h.mode);
            at = h.range.end;
            if at >= range.end {
                return Some(mode);
            }
        }
        (at >= range.end).then_some(mode)
    }

    /// Objects with at least one token.
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    fn holder_ranges(&self, key: &K, holder: H) -> usize {
        self.holders(key)
            .iter()
            .filter(|h| h.holder == holder)
            .count()
    }

    /// Sets `holder`'s tokens on `range`: where it held a mode, `merge(old)`; elsewhere
    /// `fresh`.
    fn set(
        &mut self,
        holder: H,
        key: &K,
        range: Range<u64>,
        merge: impl Fn(Mode) -> Mode,
        fresh: Mode,
    ) {
        self.rewrite(holder, key, range, |old| Some(merge(old)), Some(fresh));
    }

    /// Applies `change` to `holder`'s tokens within `range` (`None` drops them).
    fn edit(
        &mut self,
        holder: H,
        key: &K,
        range: Range<u64>,
        change: impl Fn(Mode) -> Option<Mode>,
    ) {
        if self.objects.contains_key(key) {
            self.rewrite(holder, key, range, change, None);
        }
    }

    /// Rewrites `holder`'s tokens within `range` of `key`: a part it held becomes
    /// `on_held(old)`, a part it did not becomes `on_gap` (`None`: nothing); outside
    /// `range` its tokens stay.
    fn rewrite(
        &mut self,
        holder: H,
        key: &K,
        range: Range<u64>,
        on_held: impl Fn(Mode) -> Option<Mode>,
        on_gap: Option<Mode>,
    ) {
        let held = self.objects.entry(key.clone()).or_default();
        let mut mine: Vec<(Range<u64>, Mode)> = Vec::new();
        // Held ranges come sorted by start, so the gaps of `range` are found in one pass.
        let mut at = range.start;
        held.retain(|h| {
            if h.holder != holder {
                return true;
            }
            match overlap(&h.range, &range) {
                None => mine.push((h.range.clone(), h.mode)),
                Some(o) => {
                    if h.range.start < o.start {
                        mine.push((h.range.start..o.start, h.mode));
                    }
                    if let (Some(m), true) = (on_gap, o.start > at) {
                        mine.push((at..o.start, m));
                    }
                    if let Some(m) = on_held(h.mode) {
                        mine.push((o.clone(), m));
                    }
                    at = o.end;
                    if o.end < h.range.end {
                        mine.push((o.end..h.range.end, h.mode));
                    }
                }
            }
            false
        });
        if let (Some(m), true) = (on_gap, at < range.end) {
            mine.push((at..range.end, m));
        }
        Self::put_back(held, holder, mine);
        if held.is_empty() {
            self.objects.remove(key);
        }
    }

    /// Puts `holder`'s ranges back into `held` sorted, merging neighbours of one mode.
    fn put_back(held: &mut Vec<Held<H>>, holder: H, mut mine: Vec<(Range<u64>, Mode)>) {
        mine.sort_by_key(|(r, _)| r.start);
        let mut merged: Vec<Held<H>> = Vec::with_capacity(mine.len());
        for (range, mode) in mine {
            if range.start >= range.end {
                continue;
            }
            match merged.last_mut() {
                Some(last) if last.mode == mode && last.range.end == range.start => {
                    last.range.end = range.end;
                }
                _ => merged.push(Held {
                    holder,
                    range,
                    mode,
                }),
            }
        }
        held.extend(merged);
        held.sort_by_key(|h| (h.holder, h.range.start));
    }
}

#[cfg(test)]
mod tests;
