//! Held faults against a system suspend. RM preempts every user channel before the GPUs
//! suspend (NVIDIA's `nv_suspend_devices()`: `nv_preempt_user_channels()`, then
//! `nv_uvm_suspend()`), and a held replayable fault keeps its channel from being preempted.
//! The fake GPU models that: its device's suspend callback switches every GPU out, waiting
//! `suspend_switch_ms` for its stalled warps, and fails the suspend (EIO) after resetting a
//! channel that would not switch. The kernel's own suspend runs for real, stopped after the
//! devices' callbacks (`/sys/power/pm_test` = `devices`).
//!
//! With a hold bound far longer than the switch waits, the module must complete the held
//! fault when the suspend begins (its PM notifier), so that the suspend succeeds, the warp
//! resuming on the timeout marker. The procfs path of NVIDIA's suspend, which runs before the
//! kernel's (nvidia-suspend.service), is driven through the `suspending` parameter: set, it
//! completes held faults at once and keeps new holds to the expiry's shortest period; cleared,
//! holds last as long as the bound again. Every parameter is restored whatever happens.

use std::time::{Duration, Instant};

use wic_kabi::WIC_MARKER_TIMEOUT;
use wic_kernel_io::fakegpu::{self, FakeGpu};

use crate::rig::{ensure, marker, stall_held, wait_events, Direct, GPU};

const MAX_HOLD: &str = wic_kernel_io::device::MAX_HOLD_MS_PARAM;
const SUSPENDING: &str = "/sys/module/wic_shim/parameters/suspending";
const SWITCH: &str = "/sys/module/wic_fakegpu/parameters/suspend_switch_ms";
const PM_TEST: &str = "/sys/power/pm_test";
const PM_TEST_DELAY: &str = "/sys/module/suspend/parameters/pm_test_delay";
const PAGE: u64 = 4096;
/// A bound no step waits for: only the suspend can end the holds in time.
const LONG_BOUND_MS: &str = "60000";
/// How long the fake's suspend waits for a GPU's stalled warps.
const SWITCH_MS: &str = "500";
/// The expiry's shortest period (WIC_EXPIRE_MIN_PERIOD_MS), and what a hold may take beyond it
/// (a run of the work, a replay) on a slow VM.
const MIN_PERIOD: Duration = Duration::from_millis(10);
const SLACK: Duration = Duration::from_millis(500);

pub fn run() -> Result<(), String> {
    let saved: Vec<(&str, String)> = [MAX_HOLD, SUSPENDING, SWITCH, PM_TEST, PM_TEST_DELAY]
        .into_iter()
        .filter_map(|path| Some((path, std::fs::read_to_string(path).ok()?)))
        .collect();
    let result = steps();
    let _ = std::fs::write(SUSPENDING, "0\n");
    for (path, old) in &saved {
        // /sys/power/pm_test lists every level, the current one in brackets.
        let old = if *path == PM_TEST { current_level(old) } else { old.trim().to_string() };
        let _ = std::fs::write(path, format!("{old}\n"));
    }
    result
}

fn steps() -> Result<(), String> {
    let levels = std::fs::read_to_string(PM_TEST).map_err(|e| format!("read {PM_TEST}: {e} (no CONFIG_PM_DEBUG)"))?;
    ensure(levels.contains("devices"), || format!("{PM_TEST} offers no devices level: {levels}"))?;
    write(MAX_HOLD, LONG_BOUND_MS)?;
    write(SWITCH, SWITCH_MS)?;
    write(PM_TEST, "devices")?;
    // 5 s by default: the test level's pause before the resume.
    if std::path::Path::new(PM_TEST_DELAY).exists() {
        write(PM_TEST_DELAY, "0")?;
    }
    let Direct { fake, memory, mut device, .. } = Direct::open(8)?;
    let base = memory.base();

    // The kernel's suspend with a held fault: completed by the notifier, the switch done.
    let va = base + PAGE;
    stall_held(&fake, &mut device, va)?;
    std::fs::write("/sys/power/state", "freeze\n")
        .map_err(|e| format!("suspend with a fault held under a {LONG_BOUND_MS} ms bound failed: {e}"))?;
    let (events, _) = fake.events(4096, 0).map_err(|e| format!("events: {e}"))?;
    ensure(!events.iter().any(|e| e.kind == fakegpu::EVENT_CHANNEL_RESET), || {
        format!("the suspend reset a channel: {events:?}")
    })?;
    ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_RESUMED && e.va == va), || {
        format!("the held warp did not resume before the suspend: {events:?}")
    })?;
    ensure(events.iter().any(|e| e.kind == fakegpu::EVENT_SWITCHED), || format!("no switch logged: {events:?}"))?;
    ensure(marker(&memory, va) == WIC_MARKER_TIMEOUT, || {
        format!("the warp resumed on {:#x}, not the timeout marker", marker(&memory, va))
    })?;
    let after = std::fs::read_to_string(SUSPENDING).map_err(|e| format!("read {SUSPENDING}: {e}"))?;
    ensure(after.trim() == "N", || format!("{SUSPENDING} is {after:?} after the resume"))?;
    println!("suspend: a fault held under a {LONG_BOUND_MS} ms bound was completed with the timeout marker when the suspend began; the suspend succeeded");

    // NVIDIA's procfs suspend, before the kernel's: the parameter ends the hold at once...
    fake.reset().map_err(|e| format!("fake-GPU reset: {e}"))?;
    let va = base + 2 * PAGE;
    stall_held(&fake, &mut device, va)?;
    write(SUSPENDING, "1")?;
    resumed_within(&fake, va, SLACK, "a held fault when suspending was set")?;
    // ...and a fault held after it lasts one short period.
    let va = base + 3 * PAGE;
    let held = Instant::now();
    stall_held(&fake, &mut device, va)?;
    resumed_within(&fake, va, MIN_PERIOD * 2 + SLACK, "a fault held while suspending")?;
    let short = held.elapsed();
    // Cleared: a hold lasts as long as the bound again.
    write(SUSPENDING, "0")?;
    let va = base + 4 * PAGE;
    stall_held(&fake, &mut device, va)?;
    std::thread::sleep(SLACK);
    let state = fake.page_state(GPU, va).map_err(|e| format!("page state: {e}"))?;
    ensure(state & fakegpu::PAGE_STALLED != 0, || "after suspending was cleared a hold still ended early".into())?;
    println!("suspend: with suspending set, a held fault was completed at once and a new hold lasted {short:?}; cleared, holds last the bound");
    Ok(())
}

fn resumed_within(fake: &FakeGpu, va: u64, limit: Duration, what: &str) -> Result<(), String> {
    wait_events(fake, limit, |seen| seen.iter().any(|e| e.kind == fakegpu::EVENT_RESUMED && e.va == va))
        .map(drop)
        .map_err(|e| format!("{what} was not completed within {limit:?}: {e}"))
}

fn write(path: &str, value: &str) -> Result<(), String> {
    std::fs::write(path, format!("{value}\n")).map_err(|e| format!("write {value} to {path}: {e}"))
}

/// The bracketed level of `/sys/power/pm_test`'s list.
fn current_level(list: &str) -> String {
    list.split_whitespace().find_map(|word| word.strip_prefix('[')?.strip_suffix(']')).unwrap_or("none").to_string()
}
