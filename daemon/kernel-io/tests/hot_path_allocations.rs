//! The fault hot path allocates nothing once warm: in the engine, decoding and classifying a
//! batch, holding requests, publishing, delivering, dropping duplicates and expiring timeouts;
//! around it, on the shim backend, reading the record ring, translating records and building the
//! kernel command batch. All of it runs on memory the engine and its caller already have. A
//! counting global allocator proves it. It counts per thread, so the test harness's own threads
//! cannot disturb the count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use wic_engine::fault::AccessType;
use wic_engine::{
    ChannelId, ChannelSpec, Command, DataSource, Engine, EngineConfig, FaultEntry, Producer, RawFaultEntry,
};
use wic_kernel_io::{BatchPath, MemoryRing, Placement, Record, RecordRing};

struct Counting;

thread_local! {
    // Const-initialised and without a destructor, so counting never allocates itself.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_allocation() {
    // `try_with` because the allocator also runs while a thread's locals are torn down.
    let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
}

fn allocations_on_this_thread() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` through this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SLOTS: u32 = 256;
/// Rounds run before counting (buffers, heaps and histograms reach their sizes), then rounds
/// counted.
const WARM_ROUNDS: u64 = 4;
const COUNTED_ROUNDS: u64 = 100;

/// This thread's allocations over [`COUNTED_ROUNDS`] calls of `round(generation)` that follow
/// [`WARM_ROUNDS`] uncounted ones.
fn allocations_once_warm(mut round: impl FnMut(u64)) -> u64 {
    (0..WARM_ROUNDS).for_each(&mut round);
    let before = allocations_on_this_thread();
    (WARM_ROUNDS..WARM_ROUNDS + COUNTED_ROUNDS).for_each(&mut round);
    allocations_on_this_thread() - before
}

/// One round of traffic on every slot: a 256-entry batch of first faults (held), its duplicate
/// storm, a publish per slot (delivered), a batch whose data was published first (delivered at
/// once), and a round of timeouts.
fn round(
    engine: &mut Engine,
    runs: &[[u64; 2]],
    generation: &mut u64,
    now: &mut u64,
    faults: &mut Vec<RawFaultEntry>,
    out: &mut Vec<Command>,
) {
    let channel = wic_engine::ChannelId(0);
    let entries = |faults: &mut Vec<RawFaultEntry>, side: usize| {
        faults.clear();
        faults.extend(
            runs.iter().map(|r| FaultEntry::replayable_gpc(r[side], AccessType::Read, 0, 0x1000, 0, 0).encode()),
        );
    };
    for phase in 0..3 {
        let side = (*generation % 2) as usize;
        entries(faults, side);
        *now += 1_000;
        out.clear();
        match phase {
            0 => {
                engine.handle_faults(*now, 0, faults, out);
                engine.handle_faults(*now, 0, faults, out);
                for slot in 0..SLOTS {
                    engine.publish(*now, channel, slot, out).expect("publish");
                }
            }
            1 => {
                for slot in 0..SLOTS {
                    engine.publish(*now, channel, slot, out).expect("publish");
                }
                engine.handle_faults(*now, 0, faults, out);
            }
            _ => {
                engine.handle_faults(*now, 0, faults, out);
                *now += 1_000_000;
                engine.expire(*now, out);
            }
        }
        assert_eq!(engine.held(), 0);
        *generation += 1;
    }
}

#[test]
fn a_warm_engine_handles_faults_publishes_and_timeouts_without_allocating() {
    let mut engine = Engine::new(EngineConfig::default()).expect("engine");
    let spec = ChannelSpec {
        consumer_gpu: 0,
        producer: Producer::Host,
        message_bytes: 256,
        slots: SLOTS,
        timeout_ns: 500_000,
    };
    let layout = engine.open_channel(spec).expect("channel");
    let runs: Vec<[u64; 2]> = layout.slots.iter().map(|s| s.runs).collect();
    let (mut generation, mut now) = (0, 0);
    let mut faults = Vec::with_capacity(SLOTS as usize);
    let mut out = Vec::new();
    let allocations =
        allocations_once_warm(|_| round(&mut engine, &runs, &mut generation, &mut now, &mut faults, &mut out));
    let stats = engine.stats();
    let rounds = WARM_ROUNDS + COUNTED_ROUNDS;
    assert_eq!(stats.delivered, rounds * 2 * u64::from(SLOTS), "the rounds did their work");
    assert!(stats.timed_out >= rounds * u64::from(SLOTS));
    assert_eq!(allocations, 0, "the hot path allocated {allocations} times in {COUNTED_ROUNDS} warm rounds");
}

#[test]
fn holds_delivered_long_before_their_timeout_do_not_grow_the_deadline_heap() {
    let mut engine = Engine::new(EngineConfig::default()).expect("engine");
    let spec = ChannelSpec {
        consumer_gpu: 0,
        producer: Producer::Host,
        message_bytes: 256,
        slots: SLOTS,
        timeout_ns: u64::MAX / 4,
    };
    let layout = engine.open_channel(spec).expect("channel");
    let mut out = Vec::new();
    let mut faults = Vec::with_capacity(SLOTS as usize);
    // Every slot's request is held, then delivered by its publish; no deadline ever passes.
    let mut hold_and_deliver = |generation: u64, out: &mut Vec<Command>| {
        faults.clear();
        let side = (generation % 2) as usize;
        faults.extend(
            layout
                .slots
                .iter()
                .map(|s| FaultEntry::replayable_gpc(s.runs[side], AccessType::Read, 0, 0x1000, 0, 0).encode()),
        );
        out.clear();
        engine.handle_faults(generation, 0, &faults, out);
        assert_eq!(engine.held(), SLOTS);
        for slot in 0..SLOTS {
            engine.publish(generation, layout.id, slot, out).expect("publish");
        }
    };
    let allocations = allocations_once_warm(|generation| hold_and_deliver(generation, &mut out));
    assert_eq!(engine.stats().delivered, (WARM_ROUNDS + COUNTED_ROUNDS) * u64::from(SLOTS));
    assert_eq!(allocations, 0, "holding and delivering allocated {allocations} times in {COUNTED_ROUNDS} warm rounds");
}

#[test]
fn a_warm_batch_path_reads_translates_and_builds_commands_without_allocating() {
    let mut engine = Engine::new(EngineConfig::default()).expect("engine");
    let spec = ChannelSpec {
        consumer_gpu: 0,
        producer: Producer::Host,
        message_bytes: 256,
        slots: SLOTS,
        timeout_ns: 500_000,
    };
    let layout = engine.open_channel(spec).expect("channel");
    let placement = Placement::new(&layout, 1, 0x7000_0000_0000);
    let process_runs: Vec<[u64; 2]> =
        layout.slots.iter().map(|s| s.runs.map(|run| placement.process_va(run).expect("placed"))).collect();
    let mut path = BatchPath::new(engine.config());
    path.add(&placement, &[1]);
    let mut memory = MemoryRing::new(1024);
    // SAFETY: `memory` owns the ring's bytes, is not moved, and outlives the reader.
    let mut ring = unsafe { RecordRing::new(memory.base(), memory.bytes()) }.expect("a well-formed ring");
    let host_data = |_: ChannelId, source: DataSource, _: u64| match source {
        DataSource::Host { offset } => Some(0x5000_0000_0000 + offset),
        DataSource::Gpu { .. } => None,
    };
    let (mut out, mut seq, mut kernel_commands) = (Vec::new(), 0u64, 0usize);
    let mut batch = |generation: u64, out: &mut Vec<Command>| {
        out.clear();
        for slot in 0..SLOTS {
            engine.publish(generation, layout.id, slot, out).expect("publish");
        }
        for runs in &process_runs {
            let entry =
                FaultEntry::replayable_gpc(runs[(generation % 2) as usize], AccessType::Read, seq, 0x1000, 0, 0)
                    .encode();
            memory.write(
                seq,
                &Record {
                    seq,
                    space_id: 1,
                    gpu_id: 0,
                    range_id: 1,
                    pat: false,
                    expired: false,
                    unsupported_gpu: false,
                    held_ns: 0,
                    entry,
                },
            );
            seq += 1;
        }
        memory.publish(seq);
        out.clear();
        path.take_faults(&mut ring, &mut engine.intake(generation, out));
        kernel_commands +=
            path.translate(out, host_data, &mut |command, _| panic!("{command:?} did not translate"), &mut 0).len();
    };
    let allocations = allocations_once_warm(|generation| batch(generation, &mut out));
    let batches = (WARM_ROUNDS + COUNTED_ROUNDS) as usize;
    assert_eq!(kernel_commands, batches * (SLOTS as usize + 1), "every batch delivered every slot, and replayed");
    assert_eq!(allocations, 0, "the batch path allocated {allocations} times in {COUNTED_ROUNDS} warm batches");
}
