//! The Interrupter's page pool (a segment tree) against a linear-scan first-fit bitmap, on an
//! empty pool and on a fragmented one, from 1K to 1M pages: allocate a run and free it again.

use std::hint::black_box;

use serde::Serialize;
use wic_engine::{PagePool, PageRun};

use crate::bitmap::BitmapFirstFit;
use crate::measure::ns_per_op;
use wic_emu::payload::Rng;
use crate::Settings;

/// Run lengths requested in turn: the runs of channels with 256 B to 4 KiB messages.
const RUN_LENGTHS: [u32; 5] = [1, 2, 4, 8, 16];

#[derive(Debug, Serialize)]
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

/// Fragments like long-lived channels do: runs of 1 to 8 pages until 70% of the pool is used,
/// then a random half of them freed, leaving small holes and a free tail.
fn fragment(allocator: &mut impl Allocator, pages: u32, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut runs = Vec::new();
    let mut used = 0u64;
    while used * 10 < u64::from(pages) * 7 {
        let len = 1 + (rng.next_u64() % 8) as u32;
        runs.push((allocator.alloc(len), len));
        used += u64::from(len);
    }
    for (start, len) in runs {
        if rng.next_u64() & 1 == 0 {
            allocator.free(start, len);
        }
    }
}

/// ns per allocate + free, run lengths in turn.
fn alloc_free_ns(allocator: &mut impl Allocator, pages: u32, fragmented: bool, settings: &Settings) -> f64 {
    if fragmented {
        fragment(allocator, pages, settings.seed);
    }
    let mut turn = 0;
    ns_per_op(settings.reps, settings.budget, 16, || {
        let len = RUN_LENGTHS[turn % RUN_LENGTHS.len()];
        let start = allocator.alloc(len);
        allocator.free(black_box(start), len);
        turn += 1;
    })
}

fn measure(pages: u32, fragmented: bool, settings: &Settings) -> Row {
    let segment_tree_ns = alloc_free_ns(&mut PagePool::new(pages).expect("pool"), pages, fragmented, settings);
    let bitmap_ns = alloc_free_ns(&mut BitmapFirstFit::new(pages), pages, fragmented, settings);
    Row { pages, fragmented, segment_tree_ns, bitmap_ns, speedup: bitmap_ns / segment_tree_ns }
}

pub fn run(settings: &Settings) -> Vec<Row> {
    let sizes: &[u32] = if settings.quick { &[1 << 10, 1 << 14] } else { &[1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20] };
    let mut rows = Vec::new();
    for &pages in sizes {
        for fragmented in [false, true] {
            let row = measure(pages, fragmented, settings);
            eprintln!(
                "interrupter: {pages:>8} pages {:<10} segment tree {:>8.1} ns  bitmap {:>12.1} ns  x{:.1}",
                if fragmented { "fragmented" } else { "empty" },
                row.segment_tree_ns,
                row.bitmap_ns,
                row.speedup
            );
            rows.push(row);
        }
    }
    rows
}
