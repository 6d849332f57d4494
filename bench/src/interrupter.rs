//! The Interrupter's page pool (a segment tree) against a linear-scan first-fit bitmap, on an
//! empty pool and on one aged by channel churn, from 1K to 1M pages: allocate a run and free it
//! again.

use std::hint::black_box;

use serde::{Deserialize, Serialize};
use wic_engine::{PagePool, PageRun};

use crate::bitmap::BitmapFirstFit;
use crate::measure::{fastest, ns_per_op};
use crate::Settings;
use wic_emu::payload::Rng;

/// Run lengths requested in turn: the runs of channels with 256 B to 4 KiB messages.
const RUN_LENGTHS: [u32; 5] = [1, 2, 4, 8, 16];

#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub pages: u32,
    pub fragmented: bool,
    pub segment_tree_ns: f64,
    pub bitmap_ns: f64,
    pub speedup: f64,
}

/// What the benchmark asks of an allocator; both sides run the very same operations.
trait Allocator {
    fn alloc(&mut self, len: u32) -> u32;
    fn free(&mut self, start: u32, len: u32);
}

impl Allocator for PagePool {
    fn alloc(&mut self, len: u32) -> u32 {
        PagePool::alloc(self, len).expect("room in the pool").start
    }

    fn free(&mut self, start: u32, len: u32) {
        PagePool::free(self, PageRun { start, len }).expect("an allocated run");
    }
}

impl Allocator for BitmapFirstFit {
    fn alloc(&mut self, len: u32) -> u32 {
        BitmapFirstFit::alloc(self, len).expect("room in the bitmap")
    }

    fn free(&mut self, start: u32, len: u32) {
        BitmapFirstFit::free(self, start, len);
    }
}

/// Occupancy the aged pool is held at.
const AGED_OCCUPANCY: f64 = 0.85;

/// The runs live in a pool aged the way channel churn ages it: filled to 85% with runs of the
/// request mix, then each step frees a random live run and allocates one of a random length,
/// first fit, four times over the number of runs the pool holds. First fit is deterministic,
/// so the segment tree's placements are what the bitmap's would be; the tree does the aging
/// (the bitmap would take hours at 1M pages), and the bitmap gets its live runs.
fn aged(pages: u32, seed: u64) -> (PagePool, BitmapFirstFit) {
    let mut pool = PagePool::new(pages).expect("pool");
    let mut rng = Rng::new(seed);
    let mut length = || RUN_LENGTHS[(rng.next_u64() % RUN_LENGTHS.len() as u64) as usize];
    let mut live = Vec::new();
    let target = (f64::from(pages) * AGED_OCCUPANCY) as u32;
    while pages - pool.free_pages() < target {
        let Ok(run) = pool.alloc(length()) else { break };
        live.push(run);
    }
    let mut pick = Rng::new(seed ^ 0x5eed);
    for _ in 0..4 * live.len() {
        let index = (pick.next_u64() % live.len() as u64) as usize;
        pool.free(live.swap_remove(index)).expect("a live run");
        if let Ok(run) = pool.alloc(length()) {
            live.push(run);
        }
    }
    let mut bitmap = BitmapFirstFit::new(pages);
    for run in live {
        bitmap.occupy(run.start, run.len);
    }
    (pool, bitmap)
}

/// ns per allocate + free, run lengths in turn.
fn alloc_free_ns(allocator: &mut impl Allocator, settings: &Settings) -> f64 {
    let mut turn = 0;
    ns_per_op(settings.reps, settings.budget, 16, || {
        let len = RUN_LENGTHS[turn % RUN_LENGTHS.len()];
        let start = allocator.alloc(len);
        allocator.free(black_box(start), len);
        turn += 1;
    })
}

/// One pool configuration: the segment tree and the bitmap holding the same runs.
struct Pools {
    pages: u32,
    fragmented: bool,
    tree: PagePool,
    bitmap: BitmapFirstFit,
    tree_ns: Vec<f64>,
    bitmap_ns: Vec<f64>,
}

/// Short repetitions per requested one: a shared machine runs slower for stretches of tens of
/// milliseconds to seconds, so many short samples spread over the run find each configuration's
/// fast stretches more surely than a few long ones.
const SLICES_PER_REP: u32 = 10;

/// Every configuration's repetitions are spread over the whole run, one pass over all of them at
/// a time, so that a burst of interference from other tenants cannot spoil all of one's samples.
pub fn run(settings: &Settings) -> Vec<Row> {
    let sizes: &[u32] =
        if settings.quick { &[1 << 10, 1 << 14] } else { &[1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20] };
    let mut configs: Vec<Pools> = sizes
        .iter()
        .flat_map(|&pages| [false, true].map(|fragmented| (pages, fragmented)))
        .map(|(pages, fragmented)| {
            let (tree, bitmap) = if fragmented {
                aged(pages, settings.seed)
            } else {
                (PagePool::new(pages).expect("pool"), BitmapFirstFit::new(pages))
            };
            Pools { pages, fragmented, tree, bitmap, tree_ns: Vec::new(), bitmap_ns: Vec::new() }
        })
        .collect();
    let once = Settings { reps: 1, budget: settings.budget / SLICES_PER_REP, ..*settings };
    for _ in 0..settings.reps * SLICES_PER_REP as usize {
        for config in &mut configs {
            config.tree_ns.push(alloc_free_ns(&mut config.tree, &once));
            config.bitmap_ns.push(alloc_free_ns(&mut config.bitmap, &once));
        }
    }
    configs
        .iter()
        .map(|config| {
            let (segment_tree_ns, bitmap_ns) = (fastest(&config.tree_ns), fastest(&config.bitmap_ns));
            let row = Row {
                pages: config.pages,
                fragmented: config.fragmented,
                segment_tree_ns,
                bitmap_ns,
                speedup: bitmap_ns / segment_tree_ns,
            };
            eprintln!(
                "interrupter: {:>8} pages {:<10} segment tree {:>8.1} ns  bitmap {:>12.1} ns  x{:.1}",
                row.pages,
                if row.fragmented { "fragmented" } else { "empty" },
                row.segment_tree_ns,
                row.bitmap_ns,
                row.speedup
            );
            row
        })
        .collect()
}
