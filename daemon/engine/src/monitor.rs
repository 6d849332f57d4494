//! The Monitor's availability state: the Data Availability Bitmap (DAB) and the Pending Faults
//! Queue (PFQ), paper section 5.4.
//!
//! The PFQ is indexed by tag: every tag keeps the list of waiters that still miss it, so an
//! availability update visits only its own waiters, never the whole queue. A waiter is an opaque
//! `u32` chosen by the caller (the engine uses the slot index) and may wait on several tags.

use bitvec::vec::BitVec;

use crate::interrupter::TagId;

/// One bit per tag: set while the producer's data for that tag is available and unconsumed.
pub struct Dab {
    bits: BitVec,
}

impl Dab {
    /// A bitmap for tags `0..capacity`, all unavailable.
    pub fn new(capacity: u32) -> Self {
        Self { bits: BitVec::repeat(false, capacity as usize) }
    }

    /// Whether `tag`'s data is available.
    pub fn is_set(&self, tag: TagId) -> bool {
        self.bits.get(tag.0 as usize).is_some_and(|bit| *bit)
    }

    /// Marks `tag` available; returns false if it already was.
    pub fn set(&mut self, tag: TagId) -> bool {
        !self.bits.replace(tag.0 as usize, true)
    }

    /// Marks `tag` consumed.
    pub fn clear(&mut self, tag: TagId) {
        self.bits.set(tag.0 as usize, false);
    }

    /// Number of tags currently available.
    pub fn count_set(&self) -> usize {
        self.bits.count_ones()
    }
}

/// A waiter's bookkeeping: which tags it waits on and how many of them are still missing.
#[derive(Clone, Default)]
struct Waiting {
    tags: Vec<TagId>,
    missing: u32,
    queued: bool,
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
pub struct Pfq {
    waiters: Vec<Waiting>,
    waiters_by_tag: Vec<Vec<u32>>,
    depth: u32,
}

impl Pfq {
    /// A queue for waiter ids `0..max_waiters` and tags `0..tags`.
    pub fn new(max_waiters: u32, tags: u32) -> Self {
        Self {
            waiters: vec![Waiting::default(); max_waiters as usize],
            waiters_by_tag: vec![Vec::new(); tags as usize],
            depth: 0,
        }
    }

    /// Number of queued waiters.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Whether `waiter` is queued.
    pub fn is_queued(&self, waiter: u32) -> bool {
        self.waiters.get(waiter as usize).is_some_and(|w| w.queued)
    }

    /// Queues `waiter` on the tags of `tags` that `dab` does not show available.
    pub fn enqueue(&mut self, waiter: u32, tags: &[TagId], dab: &Dab) -> Result<Enqueued, PfqError> {
        if let Some(&bad) = tags.iter().find(|t| t.0 as usize >= self.waiters_by_tag.len()) {
            return Err(PfqError::UnknownTag(bad));
        }
        let entry = self.waiters.get_mut(waiter as usize).ok_or(PfqError::UnknownWaiter(waiter))?;
        if entry.queued {
            return Err(PfqError::AlreadyQueued(waiter));
        }
        entry.tags.clear();
        for &tag in tags {
            if !dab.is_set(tag) && !entry.tags.contains(&tag) {
                entry.tags.push(tag);
            }
        }
        entry.missing = entry.tags.len() as u32;
        if entry.missing == 0 {
            return Ok(Enqueued::Ready);
        }
        entry.queued = true;
        for tag in &entry.tags {
            self.waiters_by_tag[tag.0 as usize].push(waiter);
        }
        self.depth += 1;
        Ok(Enqueued::Pending(entry.missing))
    }

    /// `tag` became available: every waiter whose last missing tag it was leaves the queue and is
    /// appended to `ready`.
    pub fn on_available(&mut self, tag: TagId, ready: &mut Vec<u32>) {
        let Some(list) = self.waiters_by_tag.get_mut(tag.0 as usize) else { return };
        for waiter in list.drain(..) {
            let entry = &mut self.waiters[waiter as usize];
            entry.missing -= 1;
            if entry.missing == 0 {
                entry.queued = false;
                self.depth -= 1;
                ready.push(waiter);
            }
        }
    }

    /// Removes `waiter` (timeout, channel close); returns whether it was queued.
    pub fn remove(&mut self, waiter: u32) -> bool {
        let Some(entry) = self.waiters.get_mut(waiter as usize) else { return false };
        if !entry.queued {
            return false;
        }
        entry.queued = false;
        self.depth -= 1;
        for tag in &entry.tags {
            self.waiters_by_tag[tag.0 as usize].retain(|w| *w != waiter);
        }
        true
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
        assert_eq!(pfq.waiters_by_tag[1], vec![1], "tag 1's waiters untouched");
        assert_eq!(pfq.waiters_by_tag[2], vec![2]);
        assert_eq!(pfq.depth(), 2);
    }
}
