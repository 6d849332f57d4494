//! The Monitor's availability state: the Data Availability Bitmap (DAB) and the Pending Faults
//! Queue (PFQ), paper section 5.4.
//!
//! The PFQ is indexed by tag: every tag keeps the list of waiters that still miss it, so an
//! availability update visits only its own waiters, never the whole queue. A waiter is an opaque
//! `u32` chosen by the caller (the engine uses the slot index) and may wait on several tags.

use std::collections::HashMap;

use bitvec::order::Lsb0;
use bitvec::view::BitView;

use crate::interrupter::TagId;
use crate::prefetch::prefetch;

/// One bit per tag: set while the producer's data for that tag is available and unconsumed.
/// The bits are plain words: the fault path tests, sets and clears one bit per request, and
/// bitvec's general bit addressing takes several times the instructions of a word operation.
pub struct Dab {
    words: Vec<usize>,
    tags: usize,
}

impl Dab {
    /// A bitmap for tags `0..capacity`, all unavailable.
    pub fn new(capacity: u32) -> Self {
        let tags = capacity as usize;
        Self { words: vec![0; tags.div_ceil(usize::BITS as usize)], tags }
    }

    /// The word holding `tag`'s bit and the bit's mask in it.
    #[inline]
    fn word_and_mask(&self, tag: TagId) -> Option<(usize, usize)> {
        let index = tag.0 as usize;
        (index < self.tags).then(|| (index / usize::BITS as usize, 1 << (index % usize::BITS as usize)))
    }

    /// Whether `tag`'s data is available.
    #[inline]
    pub fn is_set(&self, tag: TagId) -> bool {
        self.word_and_mask(tag).is_some_and(|(word, mask)| self.words[word] & mask != 0)
    }

    /// Marks `tag` available; returns false if it already was.
    ///
    /// # Panics
    /// If `tag` is outside the bitmap.
    #[inline]
    pub fn set(&mut self, tag: TagId) -> bool {
        let (word, mask) = self.word_and_mask(tag).expect("tag inside the DAB");
        let was_clear = self.words[word] & mask == 0;
        self.words[word] |= mask;
        was_clear
    }

    /// Starts loading `tag`'s bit into the cache.
    pub(crate) fn prefetch(&self, tag: TagId) {
        if let Some((word, _)) = self.word_and_mask(tag) {
            prefetch(&self.words[word]);
        }
    }

    /// Marks `tag` consumed.
    ///
    /// # Panics
    /// If `tag` is outside the bitmap.
    #[inline]
    pub fn clear(&mut self, tag: TagId) {
        let (word, mask) = self.word_and_mask(tag).expect("tag inside the DAB");
        self.words[word] &= !mask;
    }

    /// Number of tags currently available.
    pub fn count_set(&self) -> usize {
        self.words.view_bits::<Lsb0>()[..self.tags].count_ones()
    }
}

/// Marks a tag no waiter waits on.
const NO_WAITER: u32 = u32::MAX;

/// A waiter's bookkeeping, kept to 8 bytes so that a million of them stay cache friendly: its
/// first missing tag inline (the engine's waiters wait on exactly one), and how many of its
/// tags are still missing; it is queued while that is nonzero.
#[derive(Clone, Copy)]
struct Waiting {
    first_tag: TagId,
    missing: u32,
}

/// Why the PFQ refused an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PfqError {
    /// The waiter id is outside the range the queue was built for.
    UnknownWaiter(u32),
    /// The waiter is already queued.
    AlreadyQueued(u32),
    /// A tag is outside the DAB.
    UnknownTag(TagId),
}

impl std::fmt::Display for PfqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownWaiter(w) => write!(f, "pending-fault waiter {w} is out of range"),
            Self::AlreadyQueued(w) => write!(f, "pending-fault waiter {w} is already queued"),
            Self::UnknownTag(t) => write!(f, "tag {} is outside the availability bitmap", t.0),
        }
    }
}

impl std::error::Error for PfqError {}

/// Outcome of [`Pfq::enqueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Every tag was available: nothing was queued, the caller may activate at once.
    Ready,
    /// Queued; this many tags are still missing.
    Pending(u32),
}

/// The Pending Faults Queue, indexed by tag.
///
/// The common case, one waiter per tag and one tag per waiter, lives in two flat arrays and
/// never touches the heap; further tags of a waiter and further waiters of a tag go to side
/// tables, in the order they came.
pub struct Pfq {
    waiters: Vec<Waiting>,
    /// A waiter's tags after its first.
    more_tags: HashMap<u32, Vec<TagId>>,
    /// The earliest queued waiter of each tag, [`NO_WAITER`] if none.
    first_waiter: Vec<u32>,
    /// A tag's waiters after its first, in the order they were queued.
    more_waiters: HashMap<TagId, Vec<u32>>,
    depth: u32,
}

impl Pfq {
    /// A queue for waiter ids `0..max_waiters` and tags `0..tags`.
    pub fn new(max_waiters: u32, tags: u32) -> Self {
        Self {
            waiters: vec![Waiting { first_tag: TagId(0), missing: 0 }; max_waiters as usize],
            more_tags: HashMap::new(),
            first_waiter: vec![NO_WAITER; tags as usize],
            more_waiters: HashMap::new(),
            depth: 0,
        }
    }

    /// Number of queued waiters.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Whether `waiter` is queued.
    pub fn is_queued(&self, waiter: u32) -> bool {
        self.waiters.get(waiter as usize).is_some_and(|w| w.missing > 0)
    }

    /// Starts loading what queueing `waiter` on `tag` touches into the cache.
    pub(crate) fn prefetch(&self, waiter: u32, tag: TagId) {
        if let (Some(entry), Some(first)) = (self.waiters.get(waiter as usize), self.first_waiter.get(tag.0 as usize)) {
            prefetch(entry);
            prefetch(first);
        }
    }

    /// Queues `waiter` on the tags of `tags` that `dab` does not show available.
    #[inline]
    pub fn enqueue(&mut self, waiter: u32, tags: &[TagId], dab: &Dab) -> Result<Enqueued, PfqError> {
        if let Some(&bad) = tags.iter().find(|t| t.0 as usize >= self.first_waiter.len()) {
            return Err(PfqError::UnknownTag(bad));
        }
        let entry = self.waiters.get(waiter as usize).ok_or(PfqError::UnknownWaiter(waiter))?;
        if entry.missing > 0 {
            return Err(PfqError::AlreadyQueued(waiter));
        }
        let Some(first) = tags.iter().position(|&tag| !dab.is_set(tag)) else {
            return Ok(Enqueued::Ready);
        };
        Ok(self.queue(waiter, tags[first], &tags[first + 1..], dab))
    }

    /// Queues `waiter`, which is not queued yet, on its first missing tag and on those of
    /// `rest` that are missing too.
    fn queue(&mut self, waiter: u32, first_tag: TagId, rest: &[TagId], dab: &Dab) -> Enqueued {
        let mut count = 1;
        self.add_to_tag(first_tag, waiter);
        for tag in rest.iter().copied().filter(|&tag| tag != first_tag && !dab.is_set(tag)) {
            let more = self.more_tags.entry(waiter).or_default();
            if !more.contains(&tag) {
                more.push(tag);
                count += 1;
                self.add_to_tag(tag, waiter);
            }
        }
        self.waiters[waiter as usize] = Waiting { first_tag, missing: count };
        self.depth += 1;
        Enqueued::Pending(count)
    }

    fn add_to_tag(&mut self, tag: TagId, waiter: u32) {
        let first = &mut self.first_waiter[tag.0 as usize];
        if *first == NO_WAITER {
            *first = waiter;
        } else {
            self.more_waiters.entry(tag).or_default().push(waiter);
        }
    }

    /// `tag` became available: every waiter whose last missing tag it was leaves the queue and is
    /// appended to `ready`.
    pub fn on_available(&mut self, tag: TagId, ready: &mut Vec<u32>) {
        let Some(first) = self.first_waiter.get_mut(tag.0 as usize) else { return };
        let first = std::mem::replace(first, NO_WAITER);
        if first == NO_WAITER {
            return;
        }
        self.tag_arrived(first, ready);
        if !self.more_waiters.is_empty() {
            for waiter in self.more_waiters.remove(&tag).unwrap_or_default() {
                self.tag_arrived(waiter, ready);
            }
        }
    }

    /// One of `waiter`'s missing tags arrived.
    fn tag_arrived(&mut self, waiter: u32, ready: &mut Vec<u32>) {
        let entry = &mut self.waiters[waiter as usize];
        entry.missing -= 1;
        if entry.missing == 0 {
            self.depth -= 1;
            ready.push(waiter);
            if !self.more_tags.is_empty() {
                self.more_tags.remove(&waiter);
            }
        }
    }

    /// Removes `waiter` (timeout, channel close); returns whether it was queued.
    pub fn remove(&mut self, waiter: u32) -> bool {
        let Some(entry) = self.waiters.get_mut(waiter as usize) else { return false };
        if entry.missing == 0 {
            return false;
        }
        entry.missing = 0;
        self.depth -= 1;
        let first_tag = entry.first_tag;
        self.remove_from_tag(first_tag, waiter);
        for tag in self.more_tags.remove(&waiter).unwrap_or_default() {
            self.remove_from_tag(tag, waiter);
        }
        true
    }

    /// Takes `waiter` off `tag`'s waiters, if it is still among them; the next one moves up.
    fn remove_from_tag(&mut self, tag: TagId, waiter: u32) {
        let more = self.more_waiters.get_mut(&tag);
        let first = &mut self.first_waiter[tag.0 as usize];
        if *first == waiter {
            *first = match more {
                Some(more) => more.remove(0),
                None => NO_WAITER,
            };
        } else if let Some(more) = more {
            more.retain(|w| *w != waiter);
        }
        if self.more_waiters.get(&tag).is_some_and(Vec::is_empty) {
            self.more_waiters.remove(&tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The naive reference: a flat list of (waiter, tags) rescanned in full on every update.
    #[derive(Default)]
    struct NaivePfq {
        queue: Vec<(u32, BTreeSet<u32>)>,
    }

    impl NaivePfq {
        fn ready_after(&mut self, dab: &[bool]) -> BTreeSet<u32> {
            let mut ready = BTreeSet::new();
            self.queue.retain(|(w, tags)| {
                let done = tags.iter().all(|t| dab[*t as usize]);
                if done {
                    ready.insert(*w);
                }
                !done
            });
            ready
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Enqueue(u32, Vec<u32>),
        Publish(u32),
        Consume(u32),
        Remove(u32),
    }

    const TAGS: u32 = 24;
    const WAITERS: u32 = 16;

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..WAITERS, prop::collection::vec(0..TAGS, 1..4)).prop_map(|(w, t)| Op::Enqueue(w, t)),
            (0..TAGS).prop_map(Op::Publish),
            (0..TAGS).prop_map(Op::Consume),
            (0..WAITERS).prop_map(Op::Remove),
        ]
    }

    proptest! {
        #[test]
        fn pfq_matches_naive_rescan(ops in prop::collection::vec(op(), 1..200)) {
            let mut dab = Dab::new(TAGS);
            let mut pfq = Pfq::new(WAITERS, TAGS);
            let mut model_dab = vec![false; TAGS as usize];
            let mut model = NaivePfq::default();
            for op in ops {
                match op {
                    Op::Enqueue(w, tags) => {
                        let tags: Vec<TagId> = tags.into_iter().map(TagId).collect();
                        let queued_before = model.queue.iter().any(|(x, _)| *x == w);
                        let got = pfq.enqueue(w, &tags, &dab);
                        if queued_before {
                            prop_assert_eq!(got, Err(PfqError::AlreadyQueued(w)));
                            continue;
                        }
                        let missing: BTreeSet<u32> =
                            tags.iter().map(|t| t.0).filter(|t| !model_dab[*t as usize]).collect();
                        if missing.is_empty() {
                            prop_assert_eq!(got, Ok(Enqueued::Ready));
                        } else {
                            prop_assert_eq!(got, Ok(Enqueued::Pending(missing.len() as u32)));
                            model.queue.push((w, missing));
                        }
                    }
                    Op::Publish(t) => {
                        let newly = dab.set(TagId(t));
                        prop_assert_eq!(newly, !model_dab[t as usize]);
                        model_dab[t as usize] = true;
                        let mut ready = Vec::new();
                        if newly {
                            pfq.on_available(TagId(t), &mut ready);
                        }
                        let got: BTreeSet<u32> = ready.iter().copied().collect();
                        prop_assert_eq!(got.len(), ready.len(), "a waiter was woken twice");
                        prop_assert_eq!(got, model.ready_after(&model_dab));
                    }
                    Op::Consume(t) => {
                        // Consumption only happens to tags no queued waiter still misses.
                        if model.queue.iter().all(|(_, tags)| !tags.contains(&t)) {
                            dab.clear(TagId(t));
                            model_dab[t as usize] = false;
                        }
                    }
                    Op::Remove(w) => {
                        let before = model.queue.len();
                        model.queue.retain(|(x, _)| *x != w);
                        prop_assert_eq!(pfq.remove(w), before != model.queue.len());
                    }
                }
                prop_assert_eq!(pfq.depth() as usize, model.queue.len());
                prop_assert_eq!(dab.count_set(), model_dab.iter().filter(|b| **b).count());
                for w in 0..WAITERS {
                    prop_assert_eq!(pfq.is_queued(w), model.queue.iter().any(|(x, _)| *x == w));
                }
            }
        }
    }

    proptest! {
        #[test]
        fn dab_matches_a_bool_per_tag(capacity in 1u32..200, ops in prop::collection::vec((any::<bool>(), 0u32..200), 1..300)) {
            let mut dab = Dab::new(capacity);
            let mut model = vec![false; capacity as usize];
            for (set, tag) in ops {
                let tag = tag % capacity;
                if set {
                    prop_assert_eq!(dab.set(TagId(tag)), !model[tag as usize]);
                } else {
                    dab.clear(TagId(tag));
                }
                model[tag as usize] = set;
                for (t, &bit) in model.iter().enumerate() {
                    prop_assert_eq!(dab.is_set(TagId(t as u32)), bit);
                }
                prop_assert!(!dab.is_set(TagId(capacity)), "past the end is never set");
                prop_assert_eq!(dab.count_set(), model.iter().filter(|b| **b).count());
            }
        }
    }

    #[test]
    fn rejects_out_of_range_ids() {
        let dab = Dab::new(4);
        let mut pfq = Pfq::new(2, 4);
        assert_eq!(pfq.enqueue(2, &[TagId(0)], &dab), Err(PfqError::UnknownWaiter(2)));
        assert_eq!(pfq.enqueue(0, &[TagId(4)], &dab), Err(PfqError::UnknownTag(TagId(4))));
        assert!(!pfq.remove(7));
        assert!(PfqError::UnknownTag(TagId(4)).to_string().contains('4'));
    }

    #[test]
    fn update_touches_only_its_waiters() {
        let mut dab = Dab::new(3);
        let mut pfq = Pfq::new(3, 3);
        pfq.enqueue(0, &[TagId(0)], &dab).unwrap();
        pfq.enqueue(1, &[TagId(1)], &dab).unwrap();
        pfq.enqueue(2, &[TagId(0), TagId(2)], &dab).unwrap();
        dab.set(TagId(0));
        let mut ready = Vec::new();
        pfq.on_available(TagId(0), &mut ready);
        assert_eq!(ready, vec![0]);
        assert_eq!(pfq.first_waiter[1], 1, "tag 1's waiters untouched");
        assert_eq!(pfq.first_waiter[2], 2);
        assert_eq!(pfq.depth(), 2);
    }
}
