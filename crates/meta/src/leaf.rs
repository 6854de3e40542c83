//! A B+tree leaf in memory, kept in its page's own encoding: one buffer holds every entry as
//! the page does (`klen u16, vlen u16, key, value`, see `page.rs`), beside it an array of
//! each entry's offset. Why: a leaf decoded into a vector of separately allocated keys and
//! values took about 2.5 times its page in memory (two heap blocks and 64 bytes of vector
//! headers per entry), so a cache bounded in pages was bounded in memory only loosely, and
//! one that fits the metadata of ten million files did not fit the daemon's budget. In this
//! form a leaf takes its used payload plus 4 bytes an entry; decoding a page is one copy and
//! a walk over the entries, encoding one is a copy.
//!
//! Binary searches compare keys in the buffer, eight bytes at a time. An array of each
//! key's first sixteen bytes beside the offsets spared a read of the buffer per probe but
//! took 16 bytes an entry: with directory entries of about 40 bytes a leaf took 1.7 times
//! its page, and `pagepool`, which counts memory, held a third fewer pages (a cold `stat`
//! of ten million files in one directory fell to 0.78 of the rate at 100,000).

use std::cmp::Ordering;

use crate::page::LEAF_ENTRY_OVERHEAD;
use crate::store::{key_cmp, Probe};

#[derive(Clone, Debug, Default)]
pub(crate) struct Leaf {
    /// The entries, encoded as in a page's payload.
    buf: Vec<u8>,
    /// Per entry, where it starts in `buf`.
    offsets: Vec<u32>,
}

impl PartialEq for Leaf {
    fn eq(&self, other: &Leaf) -> bool {
        self.buf == other.buf
    }
}

impl Eq for Leaf {}

fn le16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Makes room for `more` elements, growing by an eighth rather than doubling: a leaf is
/// decoded with exactly its entries' room, and doubling at its first insert left a changed
/// leaf holding twice its page until evicted, which `pagepool`, bounded in pages, did not
/// see (the daemon grew past 2 GiB creating ten million files with a 1 GiB pool).
fn grow<T>(v: &mut Vec<T>, more: usize) {
    if v.capacity() - v.len() < more {
        v.reserve_exact(more.max(v.len() / 8));
    }
}

impl Leaf {
    /// A leaf of `entries`, in ascending key order.
    #[cfg(test)]
    pub(crate) fn from_entries(entries: &[(Vec<u8>, Vec<u8>)]) -> Leaf {
        let mut leaf = Leaf::default();
        for (k, v) in entries {
            leaf.insert(leaf.len(), k, v);
        }
        leaf
    }

    /// A leaf of the `count` entries encoded in `payload` (a page's payload in use); the
    /// entries must be well formed (the caller checks lengths and order as it reads them, by
    /// way of [`Leaf::parse`]).
    pub(crate) fn parse(payload: &[u8], count: usize, max_key: usize) -> Result<Leaf, String> {
        let mut offsets = Vec::with_capacity(count);
        let mut at = 0usize;
        let mut prev: Option<std::ops::Range<usize>> = None;
        for _ in 0..count {
            if at + LEAF_ENTRY_OVERHEAD > payload.len() {
                return Err(format!(
                    "entry runs past the {} payload bytes in use",
                    payload.len()
                ));
            }
            let (klen, vlen) = (le16(payload, at), le16(payload, at + 2));
            if klen > max_key {
                return Err(format!("key of {klen} bytes"));
            }
            let key = at + LEAF_ENTRY_OVERHEAD..at + LEAF_ENTRY_OVERHEAD + klen;
            let end = key.end + vlen;
            if end > payload.len() {
                return Err(format!(
                    "entry runs past the {} payload bytes in use",
                    payload.len()
                ));
            }
            if let Some(p) = &prev {
                if key_cmp(&payload[p.clone()], &payload[key.clone()]) != Ordering::Less {
                    return Err("keys out of order".into());
                }
            }
            offsets.push(u32::try_from(at).expect("a page is below 4 GiB"));
            prev = Some(key);
            at = end;
        }
        if at != payload.len() {
            return Err(format!(
                "{count} entries end at payload byte {at} but the header says {} are in use",
                payload.len()
            ));
        }
        Ok(Leaf {
            buf: payload.to_vec(),
            offsets,
        })
    }

    /// The entries as a page's payload.
    pub(crate) fn payload(&self) -> &[u8] {
        &self.buf
    }

    pub(crate) fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Bytes of the payload (what the entries take in a page).
    pub(crate) fn payload_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Bytes entry `i` takes in a page.
    pub(crate) fn entry_bytes(&self, i: usize) -> usize {
        self.end(i) - self.offsets[i] as usize
    }

    fn end(&self, i: usize) -> usize {
        self.offsets
            .get(i + 1)
            .map_or(self.buf.len(), |o| *o as usize)
    }

    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let at = self.offsets[i] as usize;
        let klen = le16(&self.buf, at);
        &self.buf[at + LEAF_ENTRY_OVERHEAD..at + LEAF_ENTRY_OVERHEAD + klen]
    }

    pub(crate) fn value(&self, i: usize) -> &[u8] {
        let at = self.offsets[i] as usize;
        let klen = le16(&self.buf, at);
        &self.buf[at + LEAF_ENTRY_OVERHEAD + klen..self.end(i)]
    }

    /// Order of entry `i`'s key against a searched-for key.
    #[inline]
    pub(crate) fn cmp_key(&self, i: usize, probe: &Probe) -> Ordering {
        key_cmp(self.key(i), probe.bytes)
    }

    /// Where `probe` is (`Ok`) or would go (`Err`).
    pub(crate) fn search(&self, probe: &Probe) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.cmp_key(mid, probe) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// The number of entries below `probe`.
    pub(crate) fn below(&self, probe: &Probe) -> usize {
        match self.search(probe) {
            Ok(i) | Err(i) => i,
        }
    }

    /// Replaces bytes `range` of the buffer by `with`, moving the offsets of the entries
    /// after `first_after` (the first entry starting at or after `range.end`).
    fn splice(&mut self, range: std::ops::Range<usize>, with: &[u8], first_after: usize) {
        let delta = with.len() as i64 - range.len() as i64;
        if let Ok(more) = usize::try_from(delta) {
            grow(&mut self.buf, more);
        }
        // By hand rather than `Vec::splice`, which moves the bytes one by one: a 4 MiB
        // block's reference is about 4 KiB, rewritten at every write into the block.
        let (start, end, len) = (range.start, range.end, self.buf.len());
        if with.len() > range.len() {
            let extra = with.len() - range.len();
            self.buf.resize(len + extra, 0);
            self.buf.copy_within(end..len, end + extra);
        } else if with.len() < range.len() {
            let less = range.len() - with.len();
            self.buf.copy_within(end..len, end - less);
            self.buf.truncate(len - less);
        }
        self.buf[start..start + with.len()].copy_from_slice(with);
        if delta != 0 {
            for o in &mut self.offsets[first_after..] {
                *o = u32::try_from(i64::from(*o) + delta).expect("offset fits u32");
            }
        }
    }

    /// Inserts an entry at position `i` (the caller keeps the order).
    pub(crate) fn insert(&mut self, i: usize, key: &[u8], value: &[u8]) {
        let at = if i < self.len() {
            self.offsets[i] as usize
        } else {
            self.buf.len()
        };
        let mut entry = Vec::with_capacity(LEAF_ENTRY_OVERHEAD + key.len() + value.len());
        entry.extend_from_slice(&u16::try_from(key.len()).expect("key fits").to_le_bytes());
        entry.extend_from_slice(
            &u16::try_from(value.len())
                .expect("value fits")
                .to_le_bytes(),
        );
        entry.extend_from_slice(key);
        entry.extend_from_slice(value);
        self.splice(at..at, &entry, i);
        grow(&mut self.offsets, 1);
        self.offsets
            .insert(i, u32::try_from(at).expect("offset fits u32"));
    }

    /// Gives back the room grown for changes: called when a changed leaf is written and
    /// stays cached as a clean page, which may live long.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.buf.shrink_to_fit();
        self.offsets.shrink_to_fit();
    }

    /// Replaces entry `i`'s value; returns the old one.
    pub(crate) fn set_value(&mut self, i: usize, value: &[u8]) -> Vec<u8> {
        let old = self.value(i).to_vec();
        self.replace_value(i, value);
        old
    }

    /// [`Leaf::set_value`] without returning the old value.
    pub(crate) fn replace_value(&mut self, i: usize, value: &[u8]) {
        let at = self.offsets[i] as usize;
        let klen = le16(&self.buf, at);
        let vlen = u16::try_from(value.len())
            .expect("value fits")
            .to_le_bytes();
        self.buf[at + 2..at + 4].copy_from_slice(&vlen);
        let start = at + LEAF_ENTRY_OVERHEAD + klen;
        let end = self.end(i);
        self.splice(start..end, value, i + 1);
    }

    /// Removes entry `i`; returns its value.
    pub(crate) fn remove(&mut self, i: usize) -> Vec<u8> {
        let old = self.value(i).to_vec();
        let range = self.offsets[i] as usize..self.end(i);
        self.splice(range, &[], i + 1);
        self.offsets.remove(i);
        old
    }

    /// Moves entries `at..` into a new leaf.
    pub(crate) fn split_off(&mut self, at: usize) -> Leaf {
        let from = self.offsets[at] as usize;
        let buf = self.buf.split_off(from);
        let offsets = self
            .offsets
            .split_off(at)
            .into_iter()
            .map(|o| o - u32::try_from(from).expect("offset fits u32"))
            .collect();
        self.buf.shrink_to_fit();
        Leaf { buf, offsets }
    }

    /// The entries of `self` then those of `right` (every key of `right` is greater).
    pub(crate) fn concat(&self, right: &Leaf) -> Leaf {
        let shift = u32::try_from(self.buf.len()).expect("offset fits u32");
        let mut buf = Vec::with_capacity(self.buf.len() + right.buf.len());
        buf.extend_from_slice(&self.buf);
        buf.extend_from_slice(&right.buf);
        Leaf {
            buf,
            offsets: self
                .offsets
                .iter()
                .copied()
                .chain(right.offsets.iter().map(|o| o + shift))
                .collect(),
        }
    }

    /// Heap bytes this leaf holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buf.capacity() + self.offsets.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Every change keeps the leaf equal to a sorted map, and its buffer exactly the
        /// page encoding of that map (which `parse` reads back to the same leaf).
        #[test]
        fn leaf_matches_a_sorted_map(
            ops in proptest::collection::vec(
                (0u8..4, proptest::collection::vec(0u8..4, 0..20), proptest::collection::vec(any::<u8>(), 0..40)),
                1..200,
            )
        ) {
            let mut leaf = Leaf::default();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            for (op, key, value) in ops {
                let probe = Probe::new(&key);
                match (op, leaf.search(&probe)) {
                    (0 | 1, Ok(i)) => {
                        let old = leaf.set_value(i, &value);
                        prop_assert_eq!(Some(old), model.insert(key, value));
                    }
                    (0 | 1, Err(i)) => {
                        leaf.insert(i, &key, &value);
                        prop_assert_eq!(model.insert(key, value), None);
                    }
                    (2, Ok(i)) => {
                        prop_assert_eq!(Some(leaf.remove(i)), model.remove(&key));
                    }
                    (2, Err(i)) => {
                        prop_assert!(!model.contains_key(&key));
                        prop_assert_eq!(i, model.range(..key.clone()).count());
                    }
                    (_, _) if leaf.len() > 1 => {
                        let at = leaf.len() / 2;
                        let right = leaf.split_off(at);
                        prop_assert_eq!(leaf.len() + right.len(), model.len());
                        leaf = leaf.concat(&right);
                    }
                    _ => {}
                }
                prop_assert_eq!(leaf.len(), model.len());
                for (i, (k, v)) in model.iter().enumerate() {
                    prop_assert_eq!(leaf.key(i), k.as_slice());
                    prop_assert_eq!(leaf.value(i), v.as_slice());
                    prop_assert_eq!(leaf.cmp_key(i, &Probe::new(k)), Ordering::Equal);
                }
                let entries: usize = model.iter().map(|(k, v)| LEAF_ENTRY_OVERHEAD + k.len() + v.len()).sum();
                prop_assert_eq!(leaf.payload_bytes(), entries);
                let parsed = Leaf::parse(leaf.payload(), leaf.len(), 512).unwrap();
                prop_assert_eq!(&parsed.offsets, &leaf.offsets);
            }
        }
    }

    #[test]
    fn a_parsed_leaf_takes_little_more_than_its_page() {
        // Directory-entry-like items: 17-byte keys, 24-byte values, a 16 KiB page's worth.
        let mut entries = Vec::new();
        let mut bytes = 0;
        for i in 0u64..10_000 {
            let mut key = vec![0u8; 9];
            key.extend_from_slice(&(i * 7919).to_be_bytes());
            let entry = (key, vec![7u8; 24]);
            bytes += LEAF_ENTRY_OVERHEAD + entry.0.len() + entry.1.len();
            if bytes > 16 * 1024 - 48 {
                break;
            }
            entries.push(entry);
        }
        entries.sort();
        let built = Leaf::from_entries(&entries);
        let parsed = Leaf::parse(built.payload(), built.len(), 512).unwrap();
        let ratio = parsed.heap_bytes() as f64 / (16.0 * 1024.0);
        assert!(
            ratio < 1.15,
            "a parsed leaf takes {ratio:.2} times its page"
        );
    }

    /// A leaf filled one insert at a time after it was read (a directory leaf taking new
    /// names) grows by eighths, not doubling, and gives the room back when written.
    #[test]
    fn a_changed_leaf_stays_near_its_page() {
        let entry = |i: u32| {
            (
                format!("file.{:07}", i * 7919 % 1_000_003).into_bytes(),
                vec![7u8; 12],
            )
        };
        let mut entries: Vec<_> = (0..200).map(entry).collect();
        entries.sort();
        let built = Leaf::from_entries(&entries);
        let mut leaf = Leaf::parse(built.payload(), built.len(), 512).unwrap();
        let mut i = 200;
        while leaf.payload().len() < 16 * 1024 - 64 {
            let (k, v) = entry(i);
            let at = leaf.search(&Probe::new(&k)).unwrap_err();
            leaf.insert(at, &k, &v);
            i += 1;
        }
        let used = (leaf.payload().len() + leaf.len() * 4) as f64;
        let grown = leaf.heap_bytes() as f64;
        assert!(grown < 1.2 * used, "{grown} bytes for {used} in use");
        leaf.shrink_to_fit();
        assert_eq!(
            leaf.heap_bytes() as f64,
            used,
            "payload and 4 bytes an entry"
        );
    }

    #[test]
    fn damaged_payloads_are_refused() {
        let leaf = Leaf::from_entries(&[(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), vec![])]);
        let p = leaf.payload().to_vec();
        assert!(Leaf::parse(&p, 3, 512).unwrap_err().contains("runs past"));
        assert!(Leaf::parse(&p, 1, 512)
            .unwrap_err()
            .contains("end at payload byte"));
        let mut swapped = p.clone();
        swapped[4] = b'c';
        assert!(Leaf::parse(&swapped, 2, 512)
            .unwrap_err()
            .contains("out of order"));
        let mut long = p;
        long[1] = 0xFF;
        assert!(Leaf::parse(&long, 2, 512).unwrap_err().contains("key of"));
    }
}
