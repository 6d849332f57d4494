//! The Interrupter's allocators: the PCM page pool (paper §5.3) and the DAB tag ids.
//!
//! Page state lives in a segment tree whose nodes hold the longest free run overall, from the
//! left edge and from the right edge; each leaf summarises one 64-page word of a free bitmap.
//! The pool counts its free pages itself: it knows each change exactly, so the tree keeps no
//! per-node count, and a change that leaves a node's runs as they were stops climbing there.
//! Finding the leftmost run of `k` free pages and range-assigning a whole run are both
//! O(log n). A node that is entirely free or entirely allocated doubles as its own lazy
//! tag, so there is no lazy array, and all storage is sized in `new()`: `alloc` and `free` never
//! touch the heap.

use bitvec::vec::BitVec;
use std::fmt;

/// A run of contiguous pages: page indices `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageRun {
    /// First page of the run.
    pub start: u32,
    /// Number of pages in the run.
    pub len: u32,
}

impl PageRun {
    /// One past the last page of the run. Saturates, so a hand-built run cannot overflow.
    pub fn end(&self) -> u32 {
        self.start.saturating_add(self.len)
    }

    /// Whether `page` lies inside the run.
    pub fn contains(&self, page: u32) -> bool {
        page >= self.start && page - self.start < self.len
    }
}

/// Why the page pool refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// A pool was requested with zero pages.
    EmptyPool,
    /// A pool was requested with more pages than the tree supports.
    TooLarge { pages: u32, max: u32 },
    /// A run of zero pages was requested.
    ZeroLength,
    /// The pool cannot hold a request: `runs` runs of `pages_per_run` contiguous pages each and,
    /// unless `pat_pages` is zero, one more run of `pat_pages` contiguous pages. [`PagePool::alloc`]
    /// asks for one run; a channel asks for all of its runs at once (two a slot, then its GPU
    /// producer's PAT pages) and is refused as a whole.
    Exhausted {
        /// Runs of `pages_per_run` pages asked for.
        runs: u32,
        /// Contiguous pages each of those runs needs.
        pages_per_run: u32,
        /// Contiguous pages of one further run asked for with them (a GPU producer's PAT pages),
        /// or 0.
        pat_pages: u32,
        /// Longest run of contiguous free pages when the request was made.
        longest_free: u32,
        /// Total free pages when the request was made.
        free: u32,
    },
    /// `free()` was given something other than exactly a run that `alloc()` returned and that is
    /// still allocated (wrong start or length, freed twice, or out of range).
    NotAllocated {
        /// Start of the rejected run.
        start: u32,
        /// Length of the rejected run.
        len: u32,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyPool => write!(f, "PCM pool must have at least one page"),
            Self::TooLarge { pages, max } => {
                write!(f, "a PCM pool of {pages} pages exceeds the {max} pages the allocator supports")
            }
            Self::ZeroLength => write!(f, "cannot allocate a run of zero PCM pages"),
            Self::Exhausted { runs: 1, pages_per_run, pat_pages: 0, longest_free, free } => write!(
                f,
                "PCM pool exhausted: {pages_per_run} contiguous pages requested, \
                 longest free run is {longest_free} ({free} pages free)"
            ),
            Self::Exhausted { runs, pages_per_run, pat_pages, longest_free, free } => {
                let total = u64::from(*runs) * u64::from(*pages_per_run) + u64::from(*pat_pages);
                let plural = |n: u32, one: &'static str, many: &'static str| if n == 1 { one } else { many };
                write!(
                    f,
                    "PCM pool exhausted: {runs} {} of {pages_per_run} {}",
                    plural(*runs, "run", "runs"),
                    plural(*pages_per_run, "page", "contiguous pages")
                )?;
                if *pat_pages > 0 {
                    write!(f, " and a run of {pat_pages} PAT {}", plural(*pat_pages, "page", "pages"))?;
                }
                write!(f, " requested ({total} pages in all), longest free run is {longest_free} ({free} pages free)")
            }
            Self::NotAllocated { start, len } => write!(
                f,
                "PCM pages {start}..{} ({len} pages) are not an allocated run",
                u64::from(*start) + u64::from(*len)
            ),
        }
    }
}

impl std::error::Error for PoolError {}

/// Pages under one leaf of the segment tree: each leaf is one word of the free bitmap, which
/// takes six levels off the tree (8 instead of 14 at 16K pages).
const LEAF_PAGES: u32 = u64::BITS;

/// Summary of a node's page range; field names follow the paper's maxLen/leftLen/rightLen (its
/// `sum` is the pool's own count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node {
    /// Longest run of free pages anywhere in the range (`maxLen`).
    longest: u32,
    /// Free pages starting at the left edge (`leftLen`).
    prefix: u32,
    /// Free pages ending at the right edge (`rightLen`).
    suffix: u32,
}

impl Node {
    /// A range of `size` pages that are all free or all allocated.
    fn uniform(size: u32, free: bool) -> Self {
        let run = if free { size } else { 0 };
        Self { longest: run, prefix: run, suffix: run }
    }

    /// The summary of a leaf's bitmap word (bit `i` set: page `i` of the word is free).
    fn of_word(word: u64) -> Self {
        Self { longest: longest_ones(word), prefix: word.trailing_ones(), suffix: word.leading_ones() }
    }

    /// The summary of two adjacent ranges of `half` pages each.
    fn combine(left: Self, right: Self, half: u32) -> Self {
        Self {
            longest: left.longest.max(right.longest).max(left.suffix + right.prefix),
            prefix: if left.prefix == half { half + right.prefix } else { left.prefix },
            suffix: if right.suffix == half { half + left.suffix } else { right.suffix },
        }
    }
}

/// Bits of `word` at which a run of at least `k` set bits (`1 <= k <= 64`) starts.
fn run_starts(word: u64, k: u32) -> u64 {
    // Invariant: `starts` marks runs of at least `covered` bits. Shifting by `step <= covered`
    // and intersecting extends each run by `step`, so this takes O(log k) steps.
    let (mut starts, mut covered) = (word, 1);
    while covered < k {
        let step = covered.min(k - covered);
        starts &= starts >> step;
        covered += step;
    }
    starts
}

/// Length of the longest run of set bits in `word`, in O(log 64) steps.
fn longest_ones(word: u64) -> u32 {
    if word == u64::MAX {
        return u64::BITS;
    }
    // `runs[j]` marks the starts of runs of at least 2^j bits; then build the answer greedily
    // from the largest power of two down, `starts` marking runs of at least `longest` bits.
    let mut runs = [word; 6];
    for j in 1..runs.len() {
        runs[j] = runs[j - 1] & (runs[j - 1] >> (1 << (j - 1)));
    }
    let (mut starts, mut longest) = (u64::MAX, 0);
    for (j, &run) in runs.iter().enumerate().rev() {
        let longer = starts & (run >> longest);
        if longer != 0 {
            starts = longer;
            longest += 1 << j;
        }
    }
    longest
}

/// Mask of bits `low..=high` of a word.
fn bit_range(low: u32, high: u32) -> u64 {
    (u64::MAX >> (u64::BITS - 1 - high)) & (u64::MAX << low)
}

/// Where [`SegmentTree::locate`] found a run.
struct Fit {
    start: u32,
    /// The leaf whose word holds the whole run, when the descent ended at a (non-uniform) leaf.
    within_leaf: Option<usize>,
}

/// The segment tree over a boolean free/allocated array (paper §5.3), with O(log n) range assign.
///
/// A perfect binary tree over a power-of-two number of leaves, each leaf summarising one 64-page
/// word of a free bitmap. Pages past the last one (tail bits, padding leaves) stay allocated,
/// so no query can ever return them.
#[derive(Debug, Clone)]
pub struct SegmentTree {
    pages: u32,
    /// Free bitmap, bit `p % 64` of word `p / 64` set while page `p` is free.
    words: Vec<u64>,
    /// Number of leaves: the smallest power of two holding all words.
    leaves: usize,
    /// `log2(leaves)`: the level of the root, leaves being level 0.
    height: u32,
    /// Implicit binary-heap layout: root at 1, children of `i` at `2i` and `2i + 1`, word `w`'s leaf at
    /// `leaves + w`. Invariant: below a uniform node (all free or all allocated) nodes and words
    /// may be stale and are never read; everywhere else they are accurate.
    nodes: Vec<Node>,
}

impl SegmentTree {
    /// Largest supported size, so that every node's page count (and its double) fits a `u32`.
    const MAX_PAGES: u32 = 1 << 30;

    /// A tree of `pages` pages, all free. A tree of 0 pages is valid and never fits anything.
    ///
    /// # Panics
    /// If `pages` exceeds 2^30.
    pub fn new(pages: u32) -> Self {
        assert!(pages <= Self::MAX_PAGES, "segment tree of {pages} pages exceeds 2^30");
        let full_words = (pages / LEAF_PAGES) as usize;
        let tail_pages = pages % LEAF_PAGES;
        let mut words = vec![u64::MAX; full_words];
        if tail_pages > 0 || words.is_empty() {
            words.push(!(u64::MAX << tail_pages));
        }
        let leaves = words.len().next_power_of_two();
        let mut nodes = vec![Node::uniform(0, false); 2 * leaves];
        for (leaf, &word) in nodes[leaves..].iter_mut().zip(&words) {
            *leaf = Node::of_word(word);
        }
        let mut tree = Self { pages, words, leaves, height: leaves.trailing_zeros(), nodes };
        for level in 1..=tree.height {
            for index in (leaves >> level)..(leaves >> (level - 1)) {
                tree.pull_up(index, level);
            }
        }
        tree
    }

    /// Number of pages the tree covers.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// Length of the longest run of contiguous free pages.
    pub fn longest_free_run(&self) -> u32 {
        self.nodes[1].longest
    }

    /// Start of the leftmost run of `k` contiguous free pages, if any. An empty run (`k = 0`)
    /// trivially fits at page 0.
    pub fn first_fit(&self, k: u32) -> Option<u32> {
        if k == 0 {
            return Some(0);
        }
        self.locate(k).map(|fit| fit.start)
    }

    /// Allocates the leftmost run of `k >= 1` contiguous free pages and returns its start.
    pub fn take_first_fit(&mut self, k: u32) -> Option<u32> {
        debug_assert!(k >= 1, "a run of zero pages is not taken");
        let fit = self.locate(k)?;
        match fit.within_leaf {
            // The descent passed through non-uniform nodes only, so there is nothing to push
            // down: update the word and settle its ancestors.
            Some(leaf) => {
                let bit = fit.start % LEAF_PAGES;
                self.assign_bits(leaf, bit_range(bit, bit + k - 1), false);
                self.pull_up_to_root(leaf >> 1, 1);
            }
            None => self.assign(fit.start, k, false),
        }
        Some(fit.start)
    }

    /// The leftmost run of `k >= 1` free pages, found in one root-to-leaf descent.
    fn locate(&self, k: u32) -> Option<Fit> {
        if self.nodes[1].longest < k {
            return None;
        }
        let (mut index, mut start, mut size) = (1, 0, LEAF_PAGES << self.height);
        loop {
            // Uniform nodes may have stale children, so stop at one; a fully free node fits at
            // its left edge. Since `longest >= k >= 1` here, the node is never fully allocated.
            if self.nodes[index].longest == size {
                return Some(Fit { start, within_leaf: None });
            }
            if index >= self.leaves {
                let word = self.words[index - self.leaves];
                // The descent only enters a leaf whose own word holds a run of `k`.
                return Some(Fit { start: start + run_starts(word, k).trailing_zeros(), within_leaf: Some(index) });
            }
            size /= 2;
            let (left, right) = (self.nodes[2 * index], self.nodes[2 * index + 1]);
            if left.longest >= k {
                index *= 2;
            } else if left.suffix + right.prefix >= k {
                return Some(Fit { start: start + size - left.suffix, within_leaf: None });
            } else {
                index = 2 * index + 1;
                start += size;
            }
        }
    }

    /// Marks pages `[start, start + len)` all free (`free = true`) or all allocated, in O(log n).
    ///
    /// # Panics
    /// If the range extends past the last page: that is a caller bug, and letting it through
    /// would free the padding pages.
    pub fn assign(&mut self, start: u32, len: u32, free: bool) {
        let end = u64::from(start) + u64::from(len);
        assert!(
            end <= u64::from(self.pages),
            "assign of pages {start}..{end} past the end of a {}-page tree",
            self.pages
        );
        if len == 0 {
            return;
        }
        // Iterative lazy segment tree. The words holding the range's first and last page are
        // updated bit by bit; the whole words between them are covered by O(log n) tiling
        // nodes. Only the ancestors of the two edge leaves straddle the range: they form two
        // paths up to level `merged_from` and one path above it. Push uniform state down those
        // paths, update the edges and the tiling, then recompute the paths bottom-up.
        let last_page = start + len - 1;
        let first = self.leaves + (start / LEAF_PAGES) as usize;
        let last = self.leaves + (last_page / LEAF_PAGES) as usize;
        let merged_from = (usize::BITS - (first ^ last).leading_zeros()).max(1);
        for level in (merged_from..=self.height).rev() {
            self.push_down(first >> level, level);
        }
        for level in (1..merged_from).rev() {
            self.push_down(first >> level, level);
            self.push_down(last >> level, level);
        }

        let (first_bit, last_bit) = (start % LEAF_PAGES, last_page % LEAF_PAGES);
        if first == last {
            self.assign_bits(first, bit_range(first_bit, last_bit), free);
        } else {
            self.assign_bits(first, bit_range(first_bit, LEAF_PAGES - 1), free);
            self.assign_bits(last, bit_range(0, last_bit), free);
        }
        let (mut left, mut right, mut size) = (first + 1, last, LEAF_PAGES);
        while left < right {
            if left & 1 == 1 {
                self.nodes[left] = Node::uniform(size, free);
                left += 1;
            }
            if right & 1 == 1 {
                right -= 1;
                self.nodes[right] = Node::uniform(size, free);
            }
            left >>= 1;
            right >>= 1;
            size *= 2;
        }

        for level in 1..merged_from {
            self.pull_up(first >> level, level);
            self.pull_up(last >> level, level);
        }
        self.pull_up_to_root(first >> merged_from, merged_from);
    }

    /// Whether `page` is free. Pages past the end do not exist and so are never free.
    pub fn is_free(&self, page: u32) -> bool {
        if page >= self.pages {
            return false;
        }
        let (mut index, mut offset, mut size) = (1, page, LEAF_PAGES << self.height);
        loop {
            // Stop at the first uniform node: what lies below it may be stale.
            match self.nodes[index].longest {
                0 => return false,
                longest if longest == size => return true,
                _ => {}
            }
            if index >= self.leaves {
                return (self.words[index - self.leaves] >> offset) & 1 == 1;
            }
            size /= 2;
            index *= 2;
            if offset >= size {
                index += 1;
                offset -= size;
            }
        }
    }

    /// Hands a uniform node's state to its children before they are updated individually.
    fn push_down(&mut self, index: usize, level: u32) {
        let size = LEAF_PAGES << level;
        let free = match self.nodes[index].longest {
            0 => false,
            longest if longest == size => true,
            _ => return,
        };
        let child = Node::uniform(size / 2, free);
        self.nodes[2 * index] = child;
        self.nodes[2 * index + 1] = child;
    }

    /// Sets the `mask` bits of leaf `leaf`'s word free or allocated and re-summarises the leaf.
    fn assign_bits(&mut self, leaf: usize, mask: u64, free: bool) {
        let word_index = leaf - self.leaves;
        // A uniform leaf's word may be stale: its summary is what holds.
        let current = match self.nodes[leaf].longest {
            0 => 0,
            LEAF_PAGES => u64::MAX,
            _ => self.words[word_index],
        };
        let word = if free { current | mask } else { current & !mask };
        self.words[word_index] = word;
        self.nodes[leaf] = Node::of_word(word);
    }

    /// Recomputes node `index` at `level` and its ancestors, carrying each new summary up in
    /// registers, and stops at the first node that comes out unchanged: no ancestor can change
    /// then. After a small alloc or free in a fragmented pool that is a few levels, not all.
    fn pull_up_to_root(&mut self, index: usize, level: u32) {
        if level > self.height {
            return;
        }
        let old = self.nodes[index];
        self.pull_up(index, level);
        let (mut child, mut node, mut half) = (index, self.nodes[index], LEAF_PAGES << level);
        if node == old {
            return;
        }
        while child > 1 {
            let sibling = self.nodes[child ^ 1];
            let (left, right) = if child & 1 == 0 { (node, sibling) } else { (sibling, node) };
            let parent = child >> 1;
            node = Node::combine(left, right, half);
            if node == self.nodes[parent] {
                return;
            }
            self.nodes[parent] = node;
            child = parent;
            half *= 2;
        }
    }

    /// Recomputes a node from its children.
    // Forced inline: it runs once or twice per level of every assign, and left to itself the
    // compiler makes it a call, which cost about 10% of an alloc + free.
    #[inline(always)]
    fn pull_up(&mut self, index: usize, level: u32) {
        let half = LEAF_PAGES << (level - 1);
        self.nodes[index] = Node::combine(self.nodes[2 * index], self.nodes[2 * index + 1], half);
    }
}

/// The PCM page pool: a segment tree plus a record of allocated runs, so that `free()` accepts
/// exactly the runs that `alloc()` returned.
#[derive(Debug, Clone)]
pub struct PagePool {
    tree: SegmentTree,
    /// Length of the allocated run starting at each page, 0 where none starts.
    run_len_at: Vec<u32>,
    allocated_runs: u32,
    free_pages: u32,
}

impl PagePool {
    /// A pool of `pages` free pages, at most 2^30 (see [`SegmentTree::new`]).
    pub fn new(pages: u32) -> Result<Self, PoolError> {
        if pages == 0 {
            return Err(PoolError::EmptyPool);
        }
        if pages > SegmentTree::MAX_PAGES {
            return Err(PoolError::TooLarge { pages, max: SegmentTree::MAX_PAGES });
        }
        Ok(Self {
            tree: SegmentTree::new(pages),
            run_len_at: vec![0; pages as usize],
            allocated_runs: 0,
            free_pages: pages,
        })
    }

    /// Total number of pages in the pool.
    pub fn capacity(&self) -> u32 {
        self.tree.pages()
    }

    /// Number of free pages.
    pub fn free_pages(&self) -> u32 {
        self.free_pages
    }

    /// Length of the longest run of contiguous free pages: the largest `alloc` that can succeed.
    pub fn longest_free_run(&self) -> u32 {
        self.tree.longest_free_run()
    }

    /// Number of runs currently allocated.
    pub fn allocated_runs(&self) -> u32 {
        self.allocated_runs
    }

    /// Allocates the leftmost run of `len` contiguous free pages (first fit), in O(log n).
    pub fn alloc(&mut self, len: u32) -> Result<PageRun, PoolError> {
        if len == 0 {
            return Err(PoolError::ZeroLength);
        }
        let Some(start) = self.tree.take_first_fit(len) else {
            return Err(PoolError::Exhausted {
                runs: 1,
                pages_per_run: len,
                pat_pages: 0,
                longest_free: self.tree.longest_free_run(),
                free: self.free_pages,
            });
        };
        self.run_len_at[start as usize] = len;
        self.allocated_runs += 1;
        self.free_pages -= len;
        Ok(PageRun { start, len })
    }

    /// Returns a run to the pool, in O(log n). The run must be exactly one that `alloc` returned
    /// and that has not been freed since; anything else is refused and changes nothing.
    pub fn free(&mut self, run: PageRun) -> Result<(), PoolError> {
        let recorded_len = self.run_len_at.get(run.start as usize).copied();
        if run.len == 0 || recorded_len != Some(run.len) {
            return Err(PoolError::NotAllocated { start: run.start, len: run.len });
        }
        self.run_len_at[run.start as usize] = 0;
        self.tree.assign(run.start, run.len, true);
        self.allocated_runs -= 1;
        self.free_pages += run.len;
        Ok(())
    }
}

/// A tag id: the index of a bit in the DAB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TagId(pub u32);

/// Why the tag allocator refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagError {
    /// All `capacity` tags are in use.
    Exhausted {
        /// Number of tags the allocator manages.
        capacity: u32,
    },
    /// The tag is out of range or not currently allocated.
    NotAllocated(TagId),
}

impl fmt::Display for TagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exhausted { capacity } => write!(f, "all {capacity} DAB tags are in use"),
            Self::NotAllocated(TagId(tag)) => write!(f, "DAB tag {tag} is not allocated"),
        }
    }
}

impl std::error::Error for TagError {}

/// Allocates tag ids from `0..capacity`, always the lowest free one.
#[derive(Debug, Clone)]
pub struct TagAllocator {
    /// One bit per tag, set while the tag is allocated.
    allocated: BitVec,
    in_use: u32,
    /// Every tag below this one is allocated, so the search for a free tag starts here.
    search_from: u32,
}

impl TagAllocator {
    /// An allocator of `capacity` tags, all free.
    pub fn new(capacity: u32) -> Self {
        Self { allocated: BitVec::repeat(false, capacity as usize), in_use: 0, search_from: 0 }
    }

    /// Number of tags managed.
    pub fn capacity(&self) -> u32 {
        // Built from a u32 in `new` and never resized.
        self.allocated.len() as u32
    }

    /// Number of tags currently allocated.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Allocates the lowest free tag; the search is a word-wise scan from the lowest free hint.
    pub fn alloc(&mut self) -> Result<TagId, TagError> {
        let exhausted = TagError::Exhausted { capacity: self.capacity() };
        if self.in_use == self.capacity() {
            return Err(exhausted);
        }
        let Some(offset) = self.allocated[self.search_from as usize..].first_zero() else {
            return Err(exhausted);
        };
        let tag = self.search_from + offset as u32;
        self.allocated.set(tag as usize, true);
        self.in_use += 1;
        self.search_from = tag + 1;
        Ok(TagId(tag))
    }

    /// Returns `tag` to the allocator.
    pub fn free(&mut self, tag: TagId) -> Result<(), TagError> {
        if !self.is_allocated(tag) {
            return Err(TagError::NotAllocated(tag));
        }
        self.allocated.set(tag.0 as usize, false);
        self.in_use -= 1;
        self.search_from = self.search_from.min(tag.0);
        Ok(())
    }

    /// Whether `tag` is currently allocated; tags out of range never are.
    pub fn is_allocated(&self, tag: TagId) -> bool {
        self.allocated.get(tag.0 as usize).is_some_and(|bit| *bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    /// Brute-force model of the pool: a bitmap with linear-scan first fit.
    struct Reference {
        free: Vec<bool>,
        runs: Vec<PageRun>,
    }

    impl Reference {
        fn new(pages: u32) -> Self {
            Self { free: vec![true; pages as usize], runs: Vec::new() }
        }

        fn first_fit(&self, k: u32) -> Option<u32> {
            let mut run = 0;
            for (page, &free) in self.free.iter().enumerate() {
                run = if free { run + 1 } else { 0 };
                if run == k {
                    return Some(page as u32 + 1 - k);
                }
            }
            None
        }

        fn longest_free_run(&self) -> u32 {
            let (mut run, mut longest) = (0, 0);
            for &free in &self.free {
                run = if free { run + 1 } else { 0 };
                longest = longest.max(run);
            }
            longest
        }

        fn free_pages(&self) -> u32 {
            self.free.iter().filter(|&&free| free).count() as u32
        }

        fn mark(&mut self, run: PageRun, free: bool) {
            self.free[run.start as usize..run.end() as usize].fill(free);
        }

        fn alloc(&mut self, len: u32) -> Result<PageRun, PoolError> {
            if len == 0 {
                return Err(PoolError::ZeroLength);
            }
            let Some(start) = self.first_fit(len) else {
                return Err(PoolError::Exhausted {
                    runs: 1,
                    pages_per_run: len,
                    pat_pages: 0,
                    longest_free: self.longest_free_run(),
                    free: self.free_pages(),
                });
            };
            let run = PageRun { start, len };
            self.mark(run, false);
            self.runs.push(run);
            Ok(run)
        }

        fn free(&mut self, run: PageRun) -> Result<(), PoolError> {
            let Some(position) = self.runs.iter().position(|&live| live == run) else {
                return Err(PoolError::NotAllocated { start: run.start, len: run.len });
            };
            self.runs.swap_remove(position);
            self.mark(run, true);
            Ok(())
        }
    }

    /// How a live run is bent into a (usually) bogus one.
    #[derive(Debug, Clone, Copy)]
    enum Alteration {
        Shorter,
        Longer,
        ShiftedLeft,
        ShiftedRight,
        Empty,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u32),
        /// Free a live run (or a never-allocated one if none is live).
        FreeLive(Index),
        /// Free a live run with its start or length altered.
        FreeAltered(Index, Alteration),
        /// Free a run freed earlier; it may have been handed out again since.
        FreeStale(Index),
        FreeArbitrary(u32, u32),
    }

    /// The pool under test and the reference, driven in lockstep.
    struct Harness {
        pool: PagePool,
        reference: Reference,
        freed: Vec<PageRun>,
    }

    impl Harness {
        fn new(pages: u32) -> Self {
            Self {
                pool: PagePool::new(pages).expect("nonzero pool"),
                reference: Reference::new(pages),
                freed: Vec::new(),
            }
        }

        /// Allocates from both; the run, or `None` once both agree on the error.
        fn alloc(&mut self, len: u32) -> Result<Option<PageRun>, TestCaseError> {
            let result = self.pool.alloc(len);
            prop_assert_eq!(&result, &self.reference.alloc(len), "alloc({})", len);
            self.check()?;
            Ok(result.ok())
        }

        fn free(&mut self, run: PageRun) -> Result<(), TestCaseError> {
            let result = self.pool.free(run);
            prop_assert_eq!(&result, &self.reference.free(run), "free({:?})", run);
            if result.is_ok() {
                self.freed.push(run);
            }
            self.check()
        }

        fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
            let live = |index: &Index| {
                let runs = &self.reference.runs;
                if runs.is_empty() {
                    PageRun { start: 0, len: 1 }
                } else {
                    runs[index.index(runs.len())]
                }
            };
            match op {
                Op::Alloc(len) => self.alloc(*len).map(drop),
                Op::FreeLive(index) => self.free(live(index)),
                Op::FreeAltered(index, alteration) => {
                    let PageRun { start, len } = live(index);
                    let bogus = match alteration {
                        Alteration::Shorter => PageRun { start, len: len - 1 },
                        Alteration::Longer => PageRun { start, len: len + 1 },
                        Alteration::ShiftedLeft => PageRun { start: start.wrapping_sub(1), len },
                        Alteration::ShiftedRight => PageRun { start: start + 1, len },
                        Alteration::Empty => PageRun { start, len: 0 },
                    };
                    self.free(bogus)
                }
                Op::FreeStale(index) => {
                    let stale = if self.freed.is_empty() {
                        PageRun { start: 0, len: 2 }
                    } else {
                        self.freed[index.index(self.freed.len())]
                    };
                    self.free(stale)
                }
                Op::FreeArbitrary(start, len) => self.free(PageRun { start: *start, len: *len }),
            }
        }

        fn check(&self) -> Result<(), TestCaseError> {
            prop_assert_eq!(self.pool.free_pages(), self.reference.free_pages());
            prop_assert_eq!(self.pool.longest_free_run(), self.reference.longest_free_run());
            prop_assert_eq!(self.pool.allocated_runs(), self.reference.runs.len() as u32);
            for (page, &free) in self.reference.free.iter().enumerate() {
                prop_assert_eq!(self.pool.tree.is_free(page as u32), free, "page {}", page);
            }
            Ok(())
        }
    }

    fn alteration() -> impl Strategy<Value = Alteration> {
        prop_oneof![
            Just(Alteration::Shorter),
            Just(Alteration::Longer),
            Just(Alteration::ShiftedLeft),
            Just(Alteration::ShiftedRight),
            Just(Alteration::Empty),
        ]
    }

    fn op(alloc_len: impl Strategy<Value = u32>, pages: u32) -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => alloc_len.prop_map(Op::Alloc),
            4 => any::<Index>().prop_map(Op::FreeLive),
            1 => (any::<Index>(), alteration()).prop_map(|(index, alt)| Op::FreeAltered(index, alt)),
            1 => any::<Index>().prop_map(Op::FreeStale),
            1 => (0..pages + 4, 0..pages + 4).prop_map(|(start, len)| Op::FreeArbitrary(start, len)),
        ]
    }

    fn small_pool_ops() -> impl Strategy<Value = (u32, Vec<Op>)> {
        (1..=300u32).prop_flat_map(|pages| {
            let alloc_len = prop_oneof![3 => 0..=8u32, 1 => 1..=pages + 2];
            (Just(pages), prop::collection::vec(op(alloc_len, pages), 1..200))
        })
    }

    const PAPER_POOL_PAGES: u32 = 16_384;

    fn paper_pool_ops() -> impl Strategy<Value = Vec<Op>> {
        let alloc_len = prop_oneof![2 => 1..=64u32, 2 => 1..=2048u32, 1 => 1..=PAPER_POOL_PAGES + 1];
        prop::collection::vec(op(alloc_len, PAPER_POOL_PAGES), 1..60)
    }

    proptest! {
        #[test]
        fn pool_matches_reference_on_small_pools((pages, ops) in small_pool_ops()) {
            let mut harness = Harness::new(pages);
            for op in &ops {
                harness.apply(op)?;
            }
        }

        #[test]
        fn pool_matches_reference_fragmented(
            pages in 2..=300u32,
            unit in 1..=4u32,
            large in 1..=300u32,
        ) {
            let mut harness = Harness::new(pages);
            let mut runs = Vec::new();
            while let Some(run) = harness.alloc(unit)? {
                runs.push(run);
            }
            for &run in runs.iter().step_by(2) {
                harness.free(run)?;
            }
            // Only `unit`-page holes are left (and a shorter tail), so a larger request fails
            // and the reference supplies the exact numbers it must report.
            harness.alloc(large)?;
            harness.alloc(unit)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        #[test]
        fn pool_matches_reference_at_paper_size(ops in paper_pool_ops()) {
            let mut harness = Harness::new(PAPER_POOL_PAGES);
            for op in &ops {
                harness.apply(op)?;
            }
        }
    }

    /// Range assigns over arbitrary ranges, including ones that mix free and allocated pages.
    fn tree_assigns() -> impl Strategy<Value = (u32, Vec<(u32, u32, bool)>, Vec<u32>)> {
        // Up to 18 leaves, so that trees of several levels with a partial last word are covered.
        (1..=1100u32).prop_flat_map(|pages| {
            let assign = (0..pages, 0..=pages, any::<bool>()).prop_map(move |(a, b, free)| {
                let (start, end) = (a.min(b), a.max(b).min(pages));
                (start, end - start, free)
            });
            (Just(pages), prop::collection::vec(assign, 1..100), prop::collection::vec(1..=pages + 1, 4))
        })
    }

    proptest! {
        #[test]
        fn tree_range_assign_matches_bitmap((pages, assigns, probes) in tree_assigns()) {
            let mut tree = SegmentTree::new(pages);
            let mut reference = Reference::new(pages);
            for (start, len, free) in assigns {
                tree.assign(start, len, free);
                reference.mark(PageRun { start, len }, free);
                let longest = reference.longest_free_run();
                prop_assert_eq!(tree.longest_free_run(), longest);
                for k in probes.iter().copied().chain([1, 2, longest.max(1), longest + 1]) {
                    prop_assert_eq!(tree.first_fit(k), reference.first_fit(k), "first_fit({})", k);
                }
                for page in 0..pages {
                    prop_assert_eq!(tree.is_free(page), reference.free[page as usize]);
                }
            }
        }
    }

    /// Lengths of the maximal runs of set bits in `word`, with their starting bits.
    fn naive_runs(word: u64) -> Vec<(u32, u32)> {
        let mut runs = Vec::new();
        let mut bit = 0;
        while bit < 64 {
            let len = (word >> bit).trailing_ones();
            if len > 0 {
                runs.push((bit, len));
            }
            bit += len.max(1);
        }
        runs
    }

    proptest! {
        #[test]
        fn word_helpers_match_naive_scan(
            word in prop_oneof![
                Just(0),
                Just(u64::MAX),
                any::<u64>(),
                any::<u64>().prop_map(|w| w | w >> 1 | w >> 3),
            ],
            k in 1..=64u32,
        ) {
            let runs = naive_runs(word);
            let longest = runs.iter().map(|&(_, len)| len).max().unwrap_or(0);
            prop_assert_eq!(longest_ones(word), longest);
            let expected = runs
                .iter()
                .filter(|&&(_, len)| len >= k)
                .fold(0u64, |starts, &(bit, len)| starts | (bit_range(bit, bit + len - k)));
            prop_assert_eq!(run_starts(word, k), expected);
        }
    }

    #[test]
    fn tree_edges() {
        let mut tree = SegmentTree::new(5);
        assert_eq!((tree.pages(), tree.longest_free_run()), (5, 5));
        assert_eq!(tree.first_fit(5), Some(0));
        assert_eq!(tree.first_fit(6), None);
        assert_eq!(tree.first_fit(0), Some(0));
        assert!(!tree.is_free(5), "padding and out-of-range pages are never free");
        tree.assign(1, 3, false);
        assert_eq!(tree.first_fit(1), Some(0));
        assert_eq!(tree.first_fit(2), None);
        tree.assign(0, 0, false);
        assert_eq!((0..5).filter(|&page| tree.is_free(page)).count(), 2);
    }

    #[test]
    #[should_panic(expected = "past the end")]
    fn tree_assign_past_end_panics() {
        SegmentTree::new(8).assign(4, 5, true);
    }

    #[test]
    fn boundary_crossing_fit_is_found() {
        let mut pool = PagePool::new(8).expect("nonzero pool");
        let first = pool.alloc(3).expect("fits");
        pool.alloc(5).expect("fits");
        pool.free(first).expect("allocated");
        let tail = pool.alloc(1).expect("fits");
        assert_eq!(tail, PageRun { start: 0, len: 1 });
        // Pages 1..3 free, straddling nothing; now free 3..8 to get a run 1..8 across the middle.
        pool.free(PageRun { start: 3, len: 5 }).expect("allocated");
        assert_eq!(pool.alloc(6), Ok(PageRun { start: 1, len: 6 }));
        assert_eq!(pool.free_pages(), 1);
        assert_eq!(pool.allocated_runs(), 2);
    }

    #[test]
    fn fragmentation_blocks_large_runs_until_neighbours_free() {
        let mut pool = PagePool::new(64).expect("nonzero pool");
        let runs: Vec<PageRun> = (0..64).map(|_| pool.alloc(1).expect("fits")).collect();
        assert_eq!(
            pool.alloc(1),
            Err(PoolError::Exhausted { runs: 1, pages_per_run: 1, pat_pages: 0, longest_free: 0, free: 0 })
        );
        for &run in runs.iter().step_by(2) {
            pool.free(run).expect("allocated");
        }
        assert_eq!(
            pool.alloc(2),
            Err(PoolError::Exhausted { runs: 1, pages_per_run: 2, pat_pages: 0, longest_free: 1, free: 32 })
        );
        pool.free(runs[41]).expect("allocated");
        assert_eq!(pool.alloc(3), Ok(PageRun { start: 40, len: 3 }));
        assert_eq!(pool.alloc(1), Ok(PageRun { start: 0, len: 1 }));
    }

    #[test]
    fn empty_pool_and_zero_length_are_errors() {
        assert_eq!(PagePool::new(0).err(), Some(PoolError::EmptyPool));
        assert_eq!(
            PagePool::new((1 << 30) + 1).err(),
            Some(PoolError::TooLarge { pages: (1 << 30) + 1, max: 1 << 30 })
        );
        let mut pool = PagePool::new(4).expect("nonzero pool");
        assert_eq!(pool.alloc(0), Err(PoolError::ZeroLength));
        assert_eq!(pool.capacity(), 4);
        assert_eq!(pool.free_pages(), 4);
    }

    #[test]
    fn double_free_is_refused() {
        let mut pool = PagePool::new(16).expect("nonzero pool");
        let run = pool.alloc(4).expect("fits");
        assert_eq!(pool.free(run), Ok(()));
        assert_eq!(pool.free(run), Err(PoolError::NotAllocated { start: 0, len: 4 }));
        assert_eq!(pool.free_pages(), 16);
        assert_eq!(pool.allocated_runs(), 0);
    }

    #[test]
    fn sub_and_super_runs_are_refused() {
        let mut pool = PagePool::new(16).expect("nonzero pool");
        pool.alloc(2).expect("fits");
        let run = pool.alloc(4).expect("fits");
        for bogus in [
            PageRun { start: 2, len: 3 },
            PageRun { start: 3, len: 3 },
            PageRun { start: 2, len: 5 },
            PageRun { start: 1, len: 5 },
            PageRun { start: 0, len: 6 },
            PageRun { start: 2, len: 0 },
            PageRun { start: 16, len: 1 },
            PageRun { start: u32::MAX, len: u32::MAX },
        ] {
            assert_eq!(
                pool.free(bogus),
                Err(PoolError::NotAllocated { start: bogus.start, len: bogus.len }),
                "{bogus:?}"
            );
        }
        assert_eq!(pool.free_pages(), 10, "refused frees change nothing");
        assert_eq!(pool.free(run), Ok(()));
    }

    #[test]
    fn page_run_bounds() {
        let run = PageRun { start: 3, len: 2 };
        assert_eq!(run.end(), 5);
        assert!(!run.contains(2) && run.contains(3) && run.contains(4) && !run.contains(5));
        assert!(!PageRun { start: 3, len: 0 }.contains(3));
        assert_eq!(PageRun { start: u32::MAX, len: 2 }.end(), u32::MAX);
    }

    #[test]
    fn tags_are_lowest_first_and_exhaust() {
        let mut tags = TagAllocator::new(130);
        assert_eq!(tags.capacity(), 130);
        for expected in 0..130 {
            assert_eq!(tags.alloc(), Ok(TagId(expected)));
        }
        assert_eq!(tags.in_use(), 130);
        assert_eq!(tags.alloc(), Err(TagError::Exhausted { capacity: 130 }));
        for freed in [129, 70, 5, 64] {
            tags.free(TagId(freed)).expect("allocated");
            assert!(!tags.is_allocated(TagId(freed)));
        }
        assert_eq!(tags.in_use(), 126);
        for expected in [5, 64, 70, 129] {
            assert_eq!(tags.alloc(), Ok(TagId(expected)));
        }
        assert_eq!(tags.alloc(), Err(TagError::Exhausted { capacity: 130 }));
    }

    #[test]
    fn tag_frees_are_checked() {
        let mut tags = TagAllocator::new(8);
        let tag = tags.alloc().expect("free tag");
        assert!(tags.is_allocated(tag));
        assert_eq!(tags.free(tag), Ok(()));
        assert_eq!(tags.free(tag), Err(TagError::NotAllocated(tag)));
        assert_eq!(tags.free(TagId(8)), Err(TagError::NotAllocated(TagId(8))));
        assert!(!tags.is_allocated(TagId(u32::MAX)));
        assert_eq!(tags.in_use(), 0);
        assert_eq!(TagAllocator::new(0).alloc(), Err(TagError::Exhausted { capacity: 0 }));
    }

    #[test]
    fn error_messages_name_the_numbers() {
        let exhausted = |runs, pages_per_run, pat_pages| {
            PoolError::Exhausted { runs, pages_per_run, pat_pages, longest_free: 3, free: 12 }.to_string()
        };
        assert_eq!(
            exhausted(1, 5, 0),
            "PCM pool exhausted: 5 contiguous pages requested, longest free run is 3 (12 pages free)"
        );
        // Several runs need not lie next to each other: the message says how many and how long.
        assert_eq!(
            exhausted(4, 2, 0),
            "PCM pool exhausted: 4 runs of 2 contiguous pages requested (8 pages in all), \
             longest free run is 3 (12 pages free)"
        );
        assert_eq!(
            exhausted(6, 1, 6),
            "PCM pool exhausted: 6 runs of 1 page and a run of 6 PAT pages requested \
             (12 pages in all), longest free run is 3 (12 pages free)"
        );
        let most = u64::from(u32::MAX) * u64::from(u32::MAX) + u64::from(u32::MAX);
        assert!(exhausted(u32::MAX, u32::MAX, u32::MAX).contains(&format!("({most} pages in all)")));
        let not_allocated = PoolError::NotAllocated { start: 7, len: 3 }.to_string();
        assert!(not_allocated.contains("7..10") && not_allocated.contains('3'), "{not_allocated}");
        assert!(!PoolError::EmptyPool.to_string().is_empty());
        assert!(!PoolError::ZeroLength.to_string().is_empty());
        assert!(TagError::Exhausted { capacity: 42 }.to_string().contains("42"));
        assert!(TagError::NotAllocated(TagId(9)).to_string().contains('9'));
    }
}
