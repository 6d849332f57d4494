//! Held faults against GPU time-slicing, on the fake GPU's model of the rule in nvidia-uvm
//! (`uvm_gpu_non_replayable_faults.c`: replayable faults block preemption of the channel until
//! serviced) and of RM's answer to a context switch that does not finish (the channel reset
//! past `RmEngineContextSwitchTimeoutUs`, 4295 ms by default). With no bound on a hold, a fault
//! the daemon never completes keeps another context's switch waiting until the channel is reset
//! and the held warp killed. Under the module's default `max_hold_ms` (3 s) the module ends the
//! hold first and the switch is done before RM's default timeout. And a process that exits with
//! a fault held: nvidia-uvm stops its channels when its UVM mm file is released
//! (`uvm_va_space_mm_shutdown()`), in no fixed order with its socket to wicd, and the stop must
//! not wait for the bound. The parameter is restored whatever happens.

use std::time::{Duration, Instant};

use wic_kernel_io::fakegpu;

use crate::rig::{ensure, stall_held, Direct, GPU};

const PARAM: &str = wic_kernel_io::device::MAX_HOLD_MS_PARAM;
const PAGE: u64 = 4096;
/// RM's default runlist context-switch timeout: 0x3fffff ticks of 1.024 us.
const RM_SWITCH_TIMEOUT: Duration = Duration::from_millis(4295);
/// The module's default bound, which the scenario expects to find.
const DEFAULT_BOUND_MS: u32 = 3000;
/// A switch timeout for the unbounded step: short, since it must run out.
const SHORT_SWITCH_TIMEOUT: Duration = Duration::from_millis(300);
/// How long an exiting process's channel stop may take when it does not wait for the bound.
const EXIT_PROMPT: Duration = Duration::from_millis(500);

pub fn run() -> Result<(), String> {
    let old =
        std::fs::read_to_string(PARAM).map_err(|e| format!("read {PARAM}: {e} (the module has no hold bound)"))?;
    let result = steps(old.trim()).and_then(|()| exiting());
    let restored = std::fs::write(PARAM, &old).map_err(|e| format!("restore {PARAM}: {e}"));
    result?;
    restored
}

fn steps(bound: &str) -> Result<(), String> {
    ensure(bound == DEFAULT_BOUND_MS.to_string(), || {
        format!("max_hold_ms is {bound}, not the default {DEFAULT_BOUND_MS}")
    })?;
    let Direct { fake, memory, mut device, .. } = Direct::open(4)?;
    let base = memory.base();

    // No bound: a held fault keeps the switch waiting until RM resets the channel.
    std::fs::write(PARAM, "0\n").map_err(|e| format!("write 0 to {PARAM}: {e}"))?;
    let va = base + PAGE;
    stall_held(&fake, &mut device, va)?;
    let unbounded = fake.preempt(GPU, SHORT_SWITCH_TIMEOUT).map_err(|e| format!("preempt: {e}"))?;
    ensure(unbounded.killed == 1 && unbounded.waited_ns >= SHORT_SWITCH_TIMEOUT.as_nanos() as u64, || {
        format!("with no bound, a switch waiting on a held fault: {unbounded:?}")
    })?;
    let (events, _) = fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
    ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_CHANNEL_RESET && e.va == va), || {
        format!("no channel reset logged: {events:?}")
    })?;
    println!(
        "preemption: with no bound, a switch waited {:?} on a held fault, then the channel was reset",
        Duration::from_nanos(unbounded.waited_ns)
    );

    // The default bound: the module completes the hold, the warp resumes at the replay, and the
    // switch is done before RM's timeout. (The killed warp's fault, still held, expires too.)
    std::fs::write(PARAM, format!("{DEFAULT_BOUND_MS}\n"))
        .map_err(|e| format!("write {DEFAULT_BOUND_MS} to {PARAM}: {e}"))?;
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let va = base + 2 * PAGE;
    // Taken before the fault is held: the module measures from the hold itself.
    let held = Instant::now();
    stall_held(&fake, &mut device, va)?;
    let bounded = fake.preempt(GPU, RM_SWITCH_TIMEOUT).map_err(|e| format!("preempt: {e}"))?;
    let waited = Duration::from_nanos(bounded.waited_ns);
    let since_held = held.elapsed();
    ensure(bounded.killed == 0, || {
        format!("under the default max_hold_ms the channel was reset after {waited:?}: {bounded:?}")
    })?;
    ensure(since_held >= Duration::from_millis(DEFAULT_BOUND_MS.into()), || {
        format!("the switch was done {since_held:?} after the hold, before the bound")
    })?;
    let (events, _) = fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
    ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_RESUMED && e.va == va), || {
        format!("the held warp did not resume: {events:?}")
    })?;
    ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_SWITCHED), || format!("no switch logged: {events:?}"))?;
    println!("preemption: under the default max_hold_ms {DEFAULT_BOUND_MS}, the switch waited {waited:?} (RM's default timeout {RM_SWITCH_TIMEOUT:?})");
    Ok(())
}

/// A process exits with a fault held: the module stops holding its faults and nvidia-uvm
/// replays, so the channel stops at once instead of after the bound.
fn exiting() -> Result<(), String> {
    let Direct { fake, memory, mut device, .. } = Direct::open(4)?;
    let va = memory.base() + PAGE;
    stall_held(&fake, &mut device, va)?;
    let stop = fake.exit(GPU, RM_SWITCH_TIMEOUT).map_err(|e| format!("exit: {e}"))?;
    let waited = Duration::from_nanos(stop.waited_ns);
    ensure(stop.killed == 0 && waited < EXIT_PROMPT, || {
        format!(
            "the exiting process's channel stopped after {waited:?} (killed {}): it waited on the hold",
            stop.killed
        )
    })?;
    let (events, _) = fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
    ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_RESUMED && e.va == va), || {
        format!("the held warp was not serviced before the stop: {events:?}")
    })?;
    println!("preemption: an exiting process's channel stopped {waited:?} after its exit began, a fault of it held");
    Ok(())
}
