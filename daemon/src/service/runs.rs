//! Which channel slot, and which of its two runs, each engine page belongs to (the emulated
//! backend's alone). A `Complete` names its channel and slot, but not which side its run and
//! companion are; the emulated backend needs that to find their page-state words, and to check that a fault's page, any
//! page of a run, is its channel's. One table lookup per address, whatever the number of
//! channels.

use wic_engine::{pool_page, EngineConfig, PAGE_SIZE};

/// Where a run lives: its channel, slot and generation parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunPlace {
    pub channel: u32,
    pub slot: u32,
    pub side: usize,
}

/// Marks a pool page no run holds.
const NO_CHANNEL: u32 = u32::MAX;

/// Engine page -> the channel slot whose run holds it, indexed by pool page.
#[derive(Debug)]
pub struct RunIndex {
    pool_base: u64,
    /// For the run holding each pool page: its channel ([`NO_CHANNEL`] if none does) and its
    /// slot times two plus its side; 8 bytes a page.
    pages: Vec<(u32, u32)>,
}

impl RunIndex {
    /// An empty index for an engine configured as `config`.
    pub fn new(config: &EngineConfig) -> Self {
        Self { pool_base: config.pool_base, pages: vec![(NO_CHANNEL, 0); config.pool_pages as usize] }
    }

    /// The pool page at `va`, which must be a page's first byte.
    fn page(&self, va: u64) -> Option<usize> {
        let page = pool_page(self.pool_base, va, &self.pages)?;
        (va & (PAGE_SIZE - 1) == 0).then_some(page)
    }

    /// Adds a channel whose runs of `pages_per_run` pages start at `runs[slot][side]`; pages
    /// outside the pool, which the engine never hands out, are ignored.
    pub fn add(&mut self, channel: u32, pages_per_run: u32, runs: impl IntoIterator<Item = [u64; 2]>) {
        for (slot, pair) in runs.into_iter().enumerate() {
            for (side, start) in pair.into_iter().enumerate() {
                for va in (0..u64::from(pages_per_run)).map(|i| start + i * PAGE_SIZE) {
                    if let Some(page) = self.page(va) {
                        self.pages[page] = (channel, 2 * slot as u32 + side as u32);
                    }
                }
            }
        }
    }

    /// Forgets a channel's runs (a scan of the pool, as channels close rarely).
    pub fn remove(&mut self, channel: u32) {
        for page in self.pages.iter_mut().filter(|(c, _)| *c == channel) {
            *page = (NO_CHANNEL, 0);
        }
    }

    /// The run that holds the page at `va`.
    pub fn place(&self, va: u64) -> Option<RunPlace> {
        let (channel, slot_side) = self.pages[self.page(va)?];
        (channel != NO_CHANNEL).then_some(RunPlace { channel, slot: slot_side / 2, side: (slot_side % 2) as usize })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> RunIndex {
        RunIndex::new(&EngineConfig { pool_base: 0x10_0000, pool_pages: 64, ..EngineConfig::default() })
    }

    #[test]
    fn runs_map_back_to_their_channel_slot_and_side() {
        let mut runs = index();
        runs.add(3, 2, [[0x10_0000, 0x10_2000], [0x10_4000, 0x10_6000]]);
        runs.add(5, 1, [[0x10_8000, 0x10_9000]]);
        assert_eq!(runs.place(0x10_6000), Some(RunPlace { channel: 3, slot: 1, side: 1 }));
        assert_eq!(runs.place(0x10_7000), Some(RunPlace { channel: 3, slot: 1, side: 1 }), "a run's second page");
        assert_eq!(runs.place(0x10_8000), Some(RunPlace { channel: 5, slot: 0, side: 0 }));
        assert_eq!(runs.place(0x10_a000), None, "past channel 5's one-page runs");
        assert_eq!(runs.place(0x10_1800), None, "not a page's first byte");
        assert_eq!(runs.place(0x0f_f000), None, "below the pool");
        assert_eq!(runs.place(0x10_0000 + 64 * 4096), None, "past the pool");
        runs.remove(3);
        assert_eq!(runs.place(0x10_0000), None);
        assert_eq!(runs.place(0x10_9000), Some(RunPlace { channel: 5, slot: 0, side: 1 }), "other channels stay");
    }

    #[test]
    fn addresses_outside_the_pool_are_ignored() {
        let mut runs = index();
        runs.add(1, 1, [[0x50_0000, 0x10_0000]]);
        assert_eq!(runs.place(0x50_0000), None);
        assert_eq!(runs.place(0x10_0000), Some(RunPlace { channel: 1, slot: 0, side: 1 }));
    }
}
