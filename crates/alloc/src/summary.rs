//! A summary bitset: a bit per element plus summary levels above it, so that setting, clearing
//! and finding the next set bit cost O(log64 n) word operations instead of a linear scan.
//!
//! Level 0 holds one bit per element. Bit `j` of level `k + 1` is set exactly when word `j` of
//! level `k` is non-zero. Levels are added until the top level is a single word, so a bitset of
//! one million elements has four levels (15 625, 245, 4 and 1 words) and any search touches at
//! most about eight words.

const WORD_BITS: u64 = 64;

#[derive(Clone, Debug)]
pub(crate) struct SummaryBitset {
    levels: Vec<Vec<u64>>,
    len: u64,
    count: u64,
}

impl SummaryBitset {
    /// A bitset of `len` elements, all set.
    pub(crate) fn new_full(len: u64) -> SummaryBitset {
        let word_count = usize::try_from(len.div_ceil(WORD_BITS)).expect("bitset too large");
        let mut leaf = vec![u64::MAX; word_count];
        let tail_bits = len % WORD_BITS;
        if tail_bits != 0 {
            *leaf.last_mut().expect("non-empty when tail_bits != 0") = (1u64 << tail_bits) - 1;
        }
        let bitset = SummaryBitset::build(leaf, len);
        assert_eq!(bitset.count, len);
        bitset
    }

    fn build(leaf: Vec<u64>, len: u64) -> SummaryBitset {
        let count = leaf.iter().map(|w| u64::from(w.count_ones())).sum();
        let mut levels = vec![leaf];
        while levels.last().expect("at least the leaf level").len() > 1 {
            let below = levels.last().expect("at least the leaf level");
            let mut above = vec![0u64; below.len().div_ceil(64)];
            for (index, word) in below.iter().enumerate() {
                if *word != 0 {
                    above[index / 64] |= 1u64 << (index % 64);
                }
            }
            levels.push(above);
        }
        SummaryBitset { levels, len, count }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Number of set elements.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn contains(&self, index: u64) -> bool {
        assert!(index < self.len, "bit {index} out of range {}", self.len);
        let word = self.levels[0][word_index(index)];
        word & bit(index) != 0
    }

    /// Sets element `index`, which must be clear.
    pub(crate) fn insert(&mut self, index: u64) {
        assert!(!self.contains(index), "bit {index} already set");
        let mut position = index;
        for level in &mut self.levels {
            let word = &mut level[word_index(position)];
            let was_empty = *word == 0;
            *word |= bit(position);
            if !was_empty {
                break;
            }
            position /= WORD_BITS;
        }
        self.count += 1;
    }

    /// Clears element `index`, which must be set.
    pub(crate) fn remove(&mut self, index: u64) {
        assert!(self.contains(index), "bit {index} already clear");
        let mut position = index;
        for level in &mut self.levels {
            let word = &mut level[word_index(position)];
            *word &= !bit(position);
            if *word != 0 {
                break;
            }
            position /= WORD_BITS;
        }
        self.count -= 1;
    }

    /// The first set element at or after `from`.
    pub(crate) fn find_next(&self, from: u64) -> Option<u64> {
        if from >= self.len {
            return None;
        }
        let found = self.find_at(0, from)?;
        assert!(found >= from);
        assert!(found < self.len);
        Some(found)
    }

    /// The first set element at or after `from`, wrapping around to the start.
    pub(crate) fn find_next_wrapping(&self, from: u64) -> Option<u64> {
        self.find_next(from).or_else(|| self.find_next(0))
    }

    /// The first clear element at or after `from`, or `len` if there is none. This is a linear
    /// scan of the leaf level (64 elements per step); it is used only for rare whole-disk
    /// searches such as placing the journal at format time.
    pub(crate) fn find_next_clear(&self, from: u64) -> u64 {
        let leaf = &self.levels[0];
        let mut position = from;
        while position < self.len {
            let inverted = !leaf[word_index(position)] >> (position % WORD_BITS);
            if inverted != 0 {
                return (position + u64::from(inverted.trailing_zeros())).min(self.len);
            }
            position = (position / WORD_BITS + 1) * WORD_BITS;
        }
        self.len
    }

    /// The first set bit of `level` at or after `position`, as a bit index of that level.
    fn find_at(&self, level: usize, position: u64) -> Option<u64> {
        let words = &self.levels[level];
        let index = word_index(position);
        if index >= words.len() {
            return None;
        }
        let bits = words[index] & (u64::MAX << (position % WORD_BITS));
        if bits != 0 {
            return Some(index as u64 * WORD_BITS + u64::from(bits.trailing_zeros()));
        }
        let next_index = if level + 1 < self.levels.len() {
            // A set bit at the level above is the index of a non-empty word at this level.
            let above = self.find_at(level + 1, index as u64 + 1)?;
            usize::try_from(above).expect("fits in memory")
        } else {
            // The top level is a single word, so there is nothing after it.
            (index + 1..words.len()).find(|&i| words[i] != 0)?
        };
        let word = words[next_index];
        assert_ne!(word, 0, "summary bit set for an empty word");
        Some(next_index as u64 * WORD_BITS + u64::from(word.trailing_zeros()))
    }
}

fn word_index(position: u64) -> usize {
    usize::try_from(position / WORD_BITS).expect("bitset index fits in memory")
}

fn bit(position: u64) -> u64 {
    1u64 << (position % WORD_BITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_next_across_levels() {
        let len = 300_000;
        let mut set = SummaryBitset::new_full(len);
        assert_eq!(set.count(), len);
        for i in 0..len {
            if i != 5 && i != 70_000 && i != len - 1 {
                set.remove(i);
            }
        }
        assert_eq!(set.count(), 3);
        assert_eq!(set.find_next(0), Some(5));
        assert_eq!(set.find_next(6), Some(70_000));
        assert_eq!(set.find_next(70_001), Some(len - 1));
        assert_eq!(set.find_next(len), None);
        assert_eq!(set.find_next_wrapping(len - 1), Some(len - 1));
        set.remove(len - 1);
        assert_eq!(set.find_next(70_001), None);
        assert_eq!(set.find_next_wrapping(70_001), Some(5));
        set.insert(64 * 64 * 64 + 3);
        assert_eq!(set.find_next(70_001), Some(64 * 64 * 64 + 3));
        assert_eq!(set.find_next_clear(5), 6);
        assert_eq!(set.find_next_clear(0), 0);
    }

    #[test]
    fn small_and_empty() {
        let mut set = SummaryBitset::new_full(0);
        assert_eq!(set.find_next(0), None);
        assert_eq!(set.find_next_wrapping(0), None);
        set = SummaryBitset::new_full(3);
        assert_eq!(set.len(), 3);
        assert_eq!(set.find_next_clear(0), 3);
        set.remove(1);
        assert_eq!(set.find_next(1), Some(2));
        assert_eq!(set.find_next_clear(0), 1);
    }
}
