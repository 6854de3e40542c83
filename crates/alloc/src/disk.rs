//! The allocation state of one disk: which sub-blocks are used, and indexes over the blocks so
//! that whole free blocks and best-fit fragment blocks are found without scanning.

use crate::summary::SummaryBitset;

/// Largest supported sub-blocks per block; a block's used count then fits in a `u16` and the
/// non-empty-bucket bitmap of [`PartialIndex`] in 16 words.
pub(crate) const SUB_BLOCKS_PER_BLOCK_MAX: u32 = 1024;

const WORD_BITS: u64 = 64;

/// Words of the sub-block bitmap in one persisted chunk of the map (see
/// [`crate::MAP_CHUNK_WORDS`]).
pub(crate) use crate::MAP_CHUNK_WORDS as CHUNK_WORDS;

/// One bit per sub-block of the disk; a set bit is a used sub-block.
#[derive(Clone, Debug)]
struct SubBlockBitmap {
    words: Vec<u64>,
}

impl SubBlockBitmap {
    fn new(sub_blocks: u64) -> SubBlockBitmap {
        let words = usize::try_from(sub_blocks.div_ceil(WORD_BITS)).expect("bitmap fits in memory");
        SubBlockBitmap {
            words: vec![0; words],
        }
    }

    /// Calls `f(word, mask)` for each word overlapping `[start, start + len)`.
    fn for_each_word(&self, start: u64, len: u64, mut f: impl FnMut(u64, u64) -> bool) -> bool {
        let end = start + len;
        let mut position = start;
        while position < end {
            let offset = position % WORD_BITS;
            let bits = (WORD_BITS - offset).min(end - position);
            let mask = low_mask(bits) << offset;
            if !f(self.words[word_index(position)], mask) {
                return false;
            }
            position += bits;
        }
        true
    }

    /// Whether every sub-block of `[start, start + len)` is used (`used`) or free (`!used`).
    fn all(&self, start: u64, len: u64, used: bool) -> bool {
        self.for_each_word(start, len, |word, mask| {
            if used {
                word & mask == mask
            } else {
                word & mask == 0
            }
        })
    }

    fn set(&mut self, start: u64, len: u64, used: bool) {
        let end = start + len;
        let mut position = start;
        while position < end {
            let offset = position % WORD_BITS;
            let bits = (WORD_BITS - offset).min(end - position);
            let mask = low_mask(bits) << offset;
            let word = &mut self.words[word_index(position)];
            if used {
                *word |= mask;
            } else {
                *word &= !mask;
            }
            position += bits;
        }
    }

    /// Number of used sub-blocks in `[start, start + len)`.
    fn count_used(&self, start: u64, len: u64) -> u64 {
        let mut count = 0;
        self.for_each_word(start, len, |word, mask| {
            count += u64::from((word & mask).count_ones());
            true
        });
        count
    }

    /// Length of the run of sub-blocks in state `used` that starts at `start`, capped at `end`.
    fn run_len(&self, start: u64, end: u64, used: bool) -> u64 {
        let mut position = start;
        while position < end {
            let offset = position % WORD_BITS;
            let mut word = self.words[word_index(position)];
            if used {
                word = !word;
            }
            // Zero bits of `word` are now the bits in state `used`.
            let run = u64::from((word >> offset).trailing_zeros()).min(WORD_BITS - offset);
            position += run;
            if run < WORD_BITS - offset {
                break;
            }
        }
        position.min(end) - start
    }

    /// Calls `f(start, len)` for each maximal run of free sub-blocks inside `[start, end)`.
    /// Costs one step per run plus one per word.
    fn for_each_free_run(&self, start: u64, end: u64, mut f: impl FnMut(u64, u64)) {
        let mut position = start;
        while position < end {
            let free = self.run_len(position, end, false);
            if free > 0 {
                f(position, free);
                position += free;
            }
            position += self.run_len(position, end, true);
        }
    }
}

fn low_mask(bits: u64) -> u64 {
    assert!((1..=WORD_BITS).contains(&bits));
    if bits == WORD_BITS {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Persisted chunks of a bitmap of `sub_blocks` bits.
fn chunk_count(sub_blocks: u64) -> usize {
    usize::try_from(sub_blocks.div_ceil(WORD_BITS))
        .expect("bitmap fits in memory")
        .div_ceil(CHUNK_WORDS)
}

fn word_index(position: u64) -> usize {
    usize::try_from(position / WORD_BITS).expect("bitmap index fits in memory")
}

/// Partially used blocks, bucketed by the length of their longest free run, so the best-fit
/// block for an `n` sub-block fragment is the first block of the first non-empty bucket `>= n`.
/// Buckets are unordered vectors with a per-block position for O(1) swap-removal.
#[derive(Clone, Debug)]
struct PartialIndex {
    /// `buckets[k]` holds the partially used blocks whose longest free run is `k` sub-blocks.
    buckets: Vec<Vec<u32>>,
    /// Bit `k` is set when `buckets[k]` is non-empty.
    non_empty: Vec<u64>,
    /// Position of each partially used block inside its bucket (meaningless for other blocks).
    position_in_bucket: Vec<u32>,
}

impl PartialIndex {
    fn new(sub_blocks_per_block: u32, blocks: u64) -> PartialIndex {
        // With one sub-block per block no block is ever partially used.
        let positions = if sub_blocks_per_block > 1 { blocks } else { 0 };
        PartialIndex {
            buckets: vec![Vec::new(); sub_blocks_per_block as usize],
            non_empty: vec![0; (sub_blocks_per_block as usize).div_ceil(64)],
            position_in_bucket: vec![0; usize::try_from(positions).expect("fits in memory")],
        }
    }

    fn insert(&mut self, block: u64, key: u32) {
        assert!(key >= 1 && (key as usize) < self.buckets.len());
        let bucket = &mut self.buckets[key as usize];
        let block = u32::try_from(block).expect("block index fits u32");
        self.position_in_bucket[block as usize] = u32::try_from(bucket.len()).expect("fits u32");
        bucket.push(block);
        self.non_empty[key as usize / 64] |= 1u64 << (key % 64);
    }

    fn remove(&mut self, block: u64, key: u32) {
        let bucket = &mut self.buckets[key as usize];
        let block = u32::try_from(block).expect("block index fits u32");
        let position = self.position_in_bucket[block as usize] as usize;
        assert_eq!(bucket[position], block, "partial index out of sync");
        bucket.swap_remove(position);
        if let Some(&moved) = bucket.get(position) {
            self.position_in_bucket[moved as usize] = u32::try_from(position).expect("fits u32");
        }
        if bucket.is_empty() {
            self.non_empty[key as usize / 64] &= !(1u64 << (key % 64));
        }
    }

    /// The block with the smallest longest-free-run `>= sub_blocks`, and that run length.
    fn best_fit(&self, sub_blocks: u32) -> Option<(u32, u64)> {
        let first_word = sub_blocks as usize / 64;
        for (index, word) in self.non_empty.iter().enumerate().skip(first_word) {
            let mut bits = *word;
            if index == first_word {
                bits &= u64::MAX << (sub_blocks % 64);
            }
            if bits != 0 {
                let key = u32::try_from(index * 64).expect("small") + bits.trailing_zeros();
                // The most recently added block: it is likely still in cache and near the
                // blocks allocated just before it.
                let block = *self.buckets[key as usize].last().expect("non-empty bucket");
                return Some((key, u64::from(block)));
            }
        }
        None
    }
}

/// Allocation state of one disk.
#[derive(Clone, Debug)]
pub(crate) struct DiskState {
    sub_blocks_per_block: u32,
    bitmap: SubBlockBitmap,
    /// Used sub-blocks per block: 0 means free, `sub_blocks_per_block` means full.
    used: Vec<u16>,
    /// Completely free blocks.
    free_blocks: SummaryBitset,
    /// Partially used blocks, for best-fit fragment allocation.
    partial: PartialIndex,
    /// Free sub-blocks inside partially used blocks.
    fragment_free: u64,
    /// Where the next sequential (Cluster) search on this disk starts.
    pub(crate) cursor: u64,
    /// A bit per persisted chunk of the bitmap: set when the chunk changed since the caller
    /// last took the dirty set, so a checkpoint writes only what changed.
    dirty_chunks: Vec<u64>,
}

impl DiskState {
    pub(crate) fn new(sub_blocks_per_block: u32, blocks: u64) -> DiskState {
        assert!(sub_blocks_per_block.is_power_of_two());
        assert!(sub_blocks_per_block <= SUB_BLOCKS_PER_BLOCK_MAX);
        // Block indexes are kept as u32 in the partial index; 2^32 blocks of 64 KiB is 256 TiB.
        assert!(
            blocks < u64::from(u32::MAX),
            "disk has too many blocks: {blocks}"
        );
        let sub_blocks = blocks * u64::from(sub_blocks_per_block);
        DiskState {
            sub_blocks_per_block,
            bitmap: SubBlockBitmap::new(sub_blocks),
            used: vec![0; usize::try_from(blocks).expect("fits in memory")],
            free_blocks: SummaryBitset::new_full(blocks),
            partial: PartialIndex::new(sub_blocks_per_block, blocks),
            fragment_free: 0,
            cursor: 0,
            dirty_chunks: vec![0; chunk_count(sub_blocks).div_ceil(64)],
        }
    }

    /// A disk whose used sub-blocks are the set bits of `words` (a stored bitmap); the block
    /// indexes are derived from it. Every chunk starts clean.
    ///
    /// # Errors
    ///
    /// When `words` has the wrong length or marks sub-blocks beyond the disk.
    pub(crate) fn from_words(
        sub_blocks_per_block: u32,
        blocks: u64,
        words: Vec<u64>,
    ) -> Result<DiskState, String> {
        let mut state = DiskState::new(sub_blocks_per_block, blocks);
        if words.len() != state.bitmap.words.len() {
            return Err(format!(
                "{} bitmap words for a disk of {} words",
                words.len(),
                state.bitmap.words.len()
            ));
        }
        let sub_blocks = blocks * u64::from(sub_blocks_per_block);
        let tail = sub_blocks % WORD_BITS;
        if tail != 0 && words.last().is_some_and(|w| w >> tail != 0) {
            return Err(format!(
                "sub-blocks beyond the disk's {sub_blocks} are marked used"
            ));
        }
        state.bitmap.words = words;
        for block in 0..blocks {
            let (start, end) = state.block_range(block);
            let used = state.bitmap.count_used(start, end - start);
            if used > 0 {
                state.free_blocks.remove(block);
                let used = u32::try_from(used).expect("at most 1024");
                state.used[usize::try_from(block).expect("fits in memory")] =
                    u16::try_from(used).expect("at most 1024");
                state.attach(block, used);
            }
        }
        Ok(state)
    }

    /// Replaces the words of chunk `chunk` with `words` (as many as the chunk has), keeping
    /// the per-block counts and indexes in step, and marks the chunk changed. A block that
    /// straddles the chunk's edge (more than 64 sub-blocks per block, not dividing the
    /// chunk) takes the new bits for its part inside the chunk only.
    pub(crate) fn set_chunk(&mut self, chunk: usize, words: &[u64]) -> Result<(), String> {
        let first_word = chunk * CHUNK_WORDS;
        let total = self.bitmap.words.len();
        if first_word >= total {
            return Err(format!("chunk {chunk} is beyond the disk's {total} words"));
        }
        let end_word = total.min(first_word + CHUNK_WORDS);
        if words.len() != end_word - first_word {
            return Err(format!(
                "{} words for chunk {chunk}, which has {}",
                words.len(),
                end_word - first_word
            ));
        }
        let sub_blocks = self.blocks() * u64::from(self.sub_blocks_per_block);
        let tail = sub_blocks % WORD_BITS;
        if end_word == total && tail != 0 && words.last().is_some_and(|w| w >> tail != 0) {
            return Err(format!(
                "sub-blocks beyond the disk's {sub_blocks} are marked used"
            ));
        }
        let start = first_word as u64 * WORD_BITS;
        let end = (end_word as u64 * WORD_BITS).min(sub_blocks);
        let spb = u64::from(self.sub_blocks_per_block);
        let (first_block, last_block) = (start / spb, (end - 1) / spb);
        for block in first_block..=last_block {
            let index = usize::try_from(block).expect("fits in memory");
            let before = u32::from(self.used[index]);
            self.detach(block, before);
        }
        self.bitmap.words[first_word..end_word].copy_from_slice(words);
        for block in first_block..=last_block {
            let (b_start, b_end) = self.block_range(block);
            let used = u32::try_from(self.bitmap.count_used(b_start, b_end - b_start))
                .expect("at most 1024");
            let index = usize::try_from(block).expect("fits in memory");
            self.used[index] = u16::try_from(used).expect("at most 1024");
            self.attach(block, used);
        }
        self.mark_chunk(chunk);
        Ok(())
    }

    /// The bitmap, a bit per sub-block (set = used), in words of 64 sub-blocks.
    pub(crate) fn words(&self) -> &[u64] {
        &self.bitmap.words
    }

    /// Number of persisted chunks of this disk's bitmap.
    pub(crate) fn chunks(&self) -> usize {
        self.bitmap.words.len().div_ceil(CHUNK_WORDS)
    }

    /// Marks the chunks holding sub-blocks `[sub_block, sub_block + len)` changed.
    pub(crate) fn mark_dirty(&mut self, sub_block: u64, len: u64) {
        let first = word_index(sub_block) / CHUNK_WORDS;
        let last = word_index(sub_block + len.max(1) - 1) / CHUNK_WORDS;
        for chunk in first..=last {
            self.mark_chunk(chunk);
        }
    }

    /// Marks every chunk changed.
    pub(crate) fn mark_all_dirty(&mut self) {
        for chunk in 0..self.chunks() {
            self.mark_chunk(chunk);
        }
    }

    pub(crate) fn mark_chunk(&mut self, chunk: usize) {
        assert!(chunk < self.chunks(), "chunk {chunk} beyond the bitmap");
        self.dirty_chunks[chunk / 64] |= 1u64 << (chunk % 64);
    }

    /// The changed chunks, in order, leaving none marked.
    pub(crate) fn take_dirty(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (index, word) in self.dirty_chunks.iter_mut().enumerate() {
            let mut bits = std::mem::take(word);
            while bits != 0 {
                out.push(index * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        out
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.free_blocks.len()
    }

    pub(crate) fn free_block_count(&self) -> u64 {
        self.free_blocks.count()
    }

    pub(crate) fn fragment_free(&self) -> u64 {
        self.fragment_free
    }

    pub(crate) fn is_block_free(&self, block: u64) -> bool {
        self.free_blocks.contains(block)
    }

    /// Whether every sub-block of `[sub_block, sub_block + len)` is in state `used`.
    pub(crate) fn range_is(&self, sub_block: u64, len: u32, used: bool) -> bool {
        self.bitmap.all(sub_block, u64::from(len), used)
    }

    /// The first completely free block at or after `from`, wrapping around.
    pub(crate) fn next_free_block(&self, from: u64) -> Option<u64> {
        self.free_blocks.find_next_wrapping(from)
    }

    /// The partially used block that best fits a fragment of `sub_blocks`, with the length
    /// of its longest free run.
    pub(crate) fn best_fit_partial(&self, sub_blocks: u32) -> Option<(u32, u64)> {
        self.partial.best_fit(sub_blocks)
    }

    /// The first run of `count` completely free blocks, lowest address first. Linear in the
    /// number of free-block runs; meant for one-off placements such as the journal.
    pub(crate) fn find_free_block_run(&self, count: u64) -> Option<u64> {
        let mut from = 0;
        while let Some(start) = self.free_blocks.find_next(from) {
            let end = self.free_blocks.find_next_clear(start);
            if end - start >= count {
                return Some(start);
            }
            from = end;
        }
        None
    }

    /// The start of the smallest free run of at least `sub_blocks` inside `block`.
    pub(crate) fn best_run_in_block(&self, block: u64, sub_blocks: u32) -> Option<u64> {
        let (start, end) = self.block_range(block);
        let mut best: Option<(u64, u64)> = None;
        self.bitmap
            .for_each_free_run(start, end, |run_start, run_len| {
                let fits = run_len >= u64::from(sub_blocks);
                let smaller = match best {
                    None => true,
                    Some((_, best_len)) => run_len < best_len,
                };
                if fits && smaller {
                    best = Some((run_start, run_len));
                }
            });
        best.map(|(run_start, _)| run_start)
    }

    /// Marks `[sub_block, sub_block + len)` (inside `block`) used or free and updates the
    /// block indexes. The caller has checked that the range is entirely in the other state.
    pub(crate) fn change(&mut self, block: u64, sub_block: u64, len: u32, used: bool) {
        let (start, end) = self.block_range(block);
        assert!(
            sub_block >= start && sub_block + u64::from(len) <= end,
            "crosses a block"
        );
        assert!(
            self.range_is(sub_block, len, !used),
            "range not entirely in the other state"
        );
        let block_index = usize::try_from(block).expect("fits in memory");
        let before = u32::from(self.used[block_index]);
        self.detach(block, before);
        self.bitmap.set(sub_block, u64::from(len), used);
        self.mark_dirty(sub_block, u64::from(len));
        let after = if used { before + len } else { before - len };
        assert!(after <= self.sub_blocks_per_block);
        self.used[block_index] = u16::try_from(after).expect("at most 1024");
        self.attach(block, after);
    }

    /// Removes `block` from whichever index its used count `used` puts it in.
    fn detach(&mut self, block: u64, used: u32) {
        if used == 0 {
            self.free_blocks.remove(block);
        } else if used < self.sub_blocks_per_block {
            let key = self.longest_free_run(block);
            self.partial.remove(block, key);
            self.fragment_free -= u64::from(self.sub_blocks_per_block - used);
        }
    }

    /// Adds `block` to the index its used count `used` puts it in.
    fn attach(&mut self, block: u64, used: u32) {
        if used == 0 {
            self.free_blocks.insert(block);
        } else if used < self.sub_blocks_per_block {
            let key = self.longest_free_run(block);
            self.partial.insert(block, key);
            self.fragment_free += u64::from(self.sub_blocks_per_block - used);
        }
    }

    fn longest_free_run(&self, block: u64) -> u32 {
        let (start, end) = self.block_range(block);
        let mut longest = 0;
        self.bitmap
            .for_each_free_run(start, end, |_, run_len| longest = longest.max(run_len));
        u32::try_from(longest).expect("run within one block")
    }

    fn block_range(&self, block: u64) -> (u64, u64) {
        assert!(
            block < self.blocks(),
            "block {block} out of range {}",
            self.blocks()
        );
        let start = block * u64::from(self.sub_blocks_per_block);
        (start, start + u64::from(self.sub_blocks_per_block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cross_words() {
        let mut bitmap = SubBlockBitmap::new(256);
        bitmap.set(10, 100, true);
        assert!(bitmap.all(10, 100, true));
        assert!(!bitmap.all(9, 2, true));
        assert!(bitmap.all(0, 10, false));
        assert!(bitmap.all(110, 146, false));
        let mut runs = Vec::new();
        bitmap.for_each_free_run(0, 256, |start, len| runs.push((start, len)));
        assert_eq!(runs, vec![(0, 10), (110, 146)]);
        runs.clear();
        bitmap.for_each_free_run(64, 128, |start, len| runs.push((start, len)));
        assert_eq!(runs, vec![(110, 18)]);
        bitmap.set(10, 100, false);
        assert!(bitmap.all(0, 256, false));
    }

    #[test]
    fn partial_best_fit_and_accounting() {
        let mut disk = DiskState::new(128, 4);
        disk.change(0, 0, 100, true);
        disk.change(1, 128, 120, true);
        assert_eq!(disk.free_block_count(), 2);
        assert_eq!(disk.fragment_free(), 28 + 8);
        assert_eq!(disk.best_fit_partial(5), Some((8, 1)));
        assert_eq!(disk.best_fit_partial(9), Some((28, 0)));
        assert_eq!(disk.best_fit_partial(29), None);
        disk.change(0, 50, 10, false);
        assert_eq!(disk.best_run_in_block(0, 5), Some(50));
        assert_eq!(disk.best_run_in_block(0, 20), Some(100));
        assert_eq!(disk.fragment_free(), 38 + 8);
        disk.change(0, 0, 50, false);
        disk.change(0, 60, 40, false);
        assert_eq!(disk.free_block_count(), 3);
        assert_eq!(disk.find_free_block_run(2), Some(2));
        assert_eq!(disk.find_free_block_run(3), None);
    }
}
