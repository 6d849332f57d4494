//! Host producers in place, through the real `wicd` on the shim backend: the application
//! writes its batch into the held run itself (all but each page's 8-byte head) and wicd hands
//! the module only the head words (`WIC_CMD_COMPLETE_HEADS`), which the fake GPU's fill counter
//! shows. Then the races a producer still writing meets: wicd's timeout, the module's own bound
//! with wicd stopped, and a close; each leaves its marker on every page head, however the
//! producer's stores and late publish fall, and the producer learns that its publish missed.

use nix::sys::signal::Signal;
use wic::{Channel, Client, ErrorCode, Run};
use wic_kabi::{WIC_MARKER_CHANNEL_CLOSED, WIC_MARKER_TIMEOUT, WIC_PAGE_SIZE};
use wic_kernel_io::fakegpu::{self, FakeGpu};

use crate::rig::{ensure, marker, Memory};
use crate::service::{completed, connect, held_by_wicd, hold, placed, spec, stats_until, Wicd, LONG_NS, PATIENCE};

/// The test batch of generation `generation`.
fn batch_of(generation: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(29).wrapping_add(generation * 101 + 7) as u8).collect()
}

/// Lends the slot-0 run the producer writes next.
fn acquire(channel: &Channel) -> Result<Run<'_>, String> {
    channel.acquire_run(0, PATIENCE).map_err(|e| format!("acquire_run: {e}"))
}

/// Writes `bytes` as the batch of `run`.
fn write(run: &Run<'_>, bytes: &[u8]) {
    // SAFETY: `run` was lent by acquire_run of a channel still open and is not yet published;
    // `bytes` is one batch.
    unsafe { run.write(0, bytes) };
}

/// Every page of the run at `va` (`pages` of them).
fn pages_of(va: u64, pages: u32) -> Vec<u64> {
    (0..u64::from(pages)).map(|p| va + p * WIC_PAGE_SIZE).collect()
}

/// The run at `va` starts every page with `word`.
fn heads_are(memory: &Memory, va: u64, pages: u32, word: u64, what: &str) -> Result<(), String> {
    for page in pages_of(va, pages) {
        let found = marker(memory, page);
        ensure(found == word, || format!("{what}: page {page:#x} starts with {found:#x}, not {word:#x}"))?;
    }
    Ok(())
}

pub fn run() -> Result<(), String> {
    let result = scenario();
    if result.is_err() {
        println!("wicd log:\n{}", crate::service::log_tail());
    }
    result
}

fn scenario() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 16 << 20)?;
    let wicd = Wicd::start()?;
    let client = connect(&fake)?;
    delivered_with_the_heads_alone(&fake, &client, &mut memory)?;
    missed_at_the_timeout(&fake, &client, &mut memory)?;
    missed_at_a_close(&fake, &client, &mut memory)?;
    drop(client);
    wicd.stop()?;
    missed_at_the_modules_bound(&fake, &mut memory)
}

/// Two generations in place, one from the buffer between them: each warp gets its batch byte
/// for byte; the module filled 8 bytes a page for an in-place one, the whole batch for a copy.
fn delivered_with_the_heads_alone(fake: &FakeGpu, client: &Client, memory: &mut Memory) -> Result<(), String> {
    let (channel, _) = placed(client, memory, &spec(1, LONG_NS))?;
    let info = channel.info().clone();
    let (batch, pages) = (info.batch_bytes as usize, info.pages_per_run);
    ensure(pages >= 2, || format!("a run of {pages} page: the second page's head would go untested"))?;
    for generation in 0..3u32 {
        let run_va = info.slots[0].runs[(generation % 2) as usize];
        let data = batch_of(generation, batch);
        fake.reset().map_err(|e| e.to_string())?;
        hold(fake, &pages_of(run_va, pages))?;
        held_by_wicd(client, 1)?;
        let before = fake.filled().map_err(|e| format!("fill counter: {e}"))?;
        let in_place = generation != 1;
        if in_place {
            let run = acquire(&channel)?;
            ensure(run.data as u64 == run_va, || {
                format!("generation {generation} lent {:p}, not {run_va:#x}", run.data)
            })?;
            write(&run, &data);
            channel.publish_run(&run).map_err(|e| format!("publish_run: {e}"))?;
        } else {
            channel.wait_writable(0, PATIENCE).map_err(|e| format!("wait_writable: {e}"))?;
            channel.publish_copy(0, &data).map_err(|e| format!("publish_copy: {e}"))?;
        }
        completed(fake, &pages_of(run_va, pages), PATIENCE)?;
        ensure(memory.read(run_va, batch) == data, || format!("generation {generation}'s run lacks its batch"))?;
        let filled = fake.filled().map_err(|e| format!("fill counter: {e}"))? - before;
        let expected = if in_place { 8 * u64::from(pages) } else { batch as u64 };
        ensure(filled == expected, || {
            format!("generation {generation}: the module filled {filled} bytes, not {expected}")
        })?;
    }
    let stats = held_by_wicd(client, 0)?;
    ensure(stats.faults_completed >= 3 && stats.commands_failed == 0, || format!("stats: {stats:?}"))?;
    channel.wait_writable(0, PATIENCE).map_err(|e| format!("wait_writable: {e}"))?;
    println!("in-place: 3 generations delivered; the module wrote {pages} head words for each in-place one");
    channel.close().map_err(|e| format!("destroy: {e}"))
}

/// The producer is still writing when wicd's timeout completes the generation: the marker on
/// every head stays there through the producer's later stores and its late publish, which is
/// reported missed; the next generation, in place into the other run, is delivered.
fn missed_at_the_timeout(fake: &FakeGpu, client: &Client, memory: &mut Memory) -> Result<(), String> {
    let (channel, _) = placed(client, memory, &spec(1, 100_000_000))?;
    let info = channel.info().clone();
    let (batch, pages, runs) = (info.batch_bytes as usize, info.pages_per_run, info.slots[0].runs);
    let late = acquire(&channel)?;
    write(&late, &batch_of(0, batch)[..batch / 2]);
    fake.reset().map_err(|e| e.to_string())?;
    hold(fake, &pages_of(runs[0], pages))?;
    completed(fake, &pages_of(runs[0], pages), PATIENCE)?;
    heads_are(memory, runs[0], pages, WIC_MARKER_TIMEOUT, "wicd's timeout")?;
    write(&late, &batch_of(0, batch));
    channel.publish_run(&late).map_err(|e| format!("the late publish_run: {e}"))?;
    let missed = channel.wait_writable(0, PATIENCE);
    ensure(missed.as_ref().is_err_and(|e| e.code() == ErrorCode::Stale), || {
        format!("the late publish was not reported missed: {missed:?}")
    })?;
    heads_are(memory, runs[0], pages, WIC_MARKER_TIMEOUT, "after the late publish")?;
    next_generation_in_place(fake, client, memory, &channel, 1)?;
    println!("in-place: a publish after wicd's timeout was reported missed; the markers stayed");
    channel.close().map_err(|e| format!("destroy: {e}"))
}

/// Generation `generation` of `channel`'s slot 0, written in place in time, reaches its warp.
fn next_generation_in_place(
    fake: &FakeGpu,
    client: &Client,
    memory: &Memory,
    channel: &Channel,
    generation: u32,
) -> Result<(), String> {
    let info = channel.info();
    let (batch, pages) = (info.batch_bytes as usize, info.pages_per_run);
    let run_va = info.slots[0].runs[(generation % 2) as usize];
    let run = acquire(channel)?;
    ensure(run.data as u64 == run_va, || format!("generation {generation} lent {:p}, not {run_va:#x}", run.data))?;
    let data = batch_of(generation, batch);
    write(&run, &data);
    fake.reset().map_err(|e| e.to_string())?;
    hold(fake, &pages_of(run_va, pages))?;
    held_by_wicd(client, 1)?;
    channel.publish_run(&run).map_err(|e| format!("publish_run: {e}"))?;
    completed(fake, &pages_of(run_va, pages), PATIENCE)?;
    ensure(memory.read(run_va, batch) == data, || format!("generation {generation}'s run lacks its batch"))
}

/// The channel is destroyed while its producer writes: the closed marker on every head, and
/// the producer's stores that come after it (into the process's own memory, which the run still
/// is) never reach one.
fn missed_at_a_close(fake: &FakeGpu, client: &Client, memory: &mut Memory) -> Result<(), String> {
    let (channel, _) = placed(client, memory, &spec(1, LONG_NS))?;
    let info = channel.info().clone();
    let (batch, pages, runs) = (info.batch_bytes as usize, info.pages_per_run, info.slots[0].runs);
    let run = acquire(&channel)?;
    write(&run, &batch_of(0, batch)[..batch / 3]);
    fake.reset().map_err(|e| e.to_string())?;
    hold(fake, &pages_of(runs[0], pages))?;
    held_by_wicd(client, 1)?;
    let run_data = run.data;
    channel.close().map_err(|e| format!("destroy: {e}"))?;
    completed(fake, &pages_of(runs[0], pages), PATIENCE)?;
    // The handle, and the head words with it, are gone; the producer's stores into the run
    // itself go on, as a thread that has not noticed makes them.
    let data = batch_of(0, batch);
    for page in 0..pages as usize {
        let body = page * WIC_PAGE_SIZE as usize + 8..((page + 1) * WIC_PAGE_SIZE as usize).min(batch);
        // SAFETY: the run's pages are the process's own memory (`memory`), outlive the channel,
        // and no Rust reference covers them.
        unsafe { std::ptr::copy_nonoverlapping(data[body.clone()].as_ptr(), run_data.add(body.start), body.len()) };
    }
    heads_are(memory, runs[0], pages, WIC_MARKER_CHANNEL_CLOSED, "the close")?;
    println!("in-place: a close during the producer's writes left the closed marker on every head");
    Ok(())
}

/// wicd stopped past the module's bound (max_hold_ms 500): the module ends the hold with the
/// timeout marker while the producer writes and publishes; resumed, wicd drops the publish as
/// missed, and the marker stays on every head.
fn missed_at_the_modules_bound(fake: &FakeGpu, memory: &mut Memory) -> Result<(), String> {
    let param = wic_kernel_io::device::MAX_HOLD_MS_PARAM;
    let default = std::fs::read_to_string(param).map_err(|e| format!("{param}: {e}"))?;
    std::fs::write(param, "500\n").map_err(|e| format!("{param}: {e}"))?;
    let result = (|| {
        let wicd = Wicd::start()?;
        let client = connect(fake)?;
        let (channel, _) = placed(&client, memory, &spec(1, 300_000_000))?;
        let info = channel.info().clone();
        let (batch, pages, runs) = (info.batch_bytes as usize, info.pages_per_run, info.slots[0].runs);
        let run = acquire(&channel)?;
        fake.reset().map_err(|e| e.to_string())?;
        hold(fake, &pages_of(runs[0], pages))?;
        held_by_wicd(&client, 1)?;
        wicd.signal(Signal::SIGSTOP)?;
        write(&run, &batch_of(0, batch)[..batch / 2]);
        let ended = completed(fake, &pages_of(runs[0], pages), PATIENCE);
        write(&run, &batch_of(0, batch));
        let published = channel.publish_run(&run);
        wicd.signal(Signal::SIGCONT)?;
        ended.map_err(|e| format!("the module's bound with wicd stopped: {e}"))?;
        published.map_err(|e| format!("publish_run while wicd was stopped: {e}"))?;
        let missed = channel.wait_writable(0, PATIENCE);
        ensure(missed.as_ref().is_err_and(|e| e.code() == ErrorCode::Stale), || {
            format!("the publish after the module's bound was not reported missed: {missed:?}")
        })?;
        heads_are(memory, runs[0], pages, WIC_MARKER_TIMEOUT, "the module's bound")?;
        stats_until(&client, "the module's expiry counted", |s| s.faults_expired_in_module == 1)?;
        next_generation_in_place(fake, &client, memory, &channel, 1)?;
        println!("in-place: a publish racing the module's own bound was reported missed; the markers stayed");
        drop(channel);
        drop(client);
        wicd.stop()
    })();
    std::fs::write(param, &default).map_err(|e| format!("{param}: {e}"))?;
    result
}
