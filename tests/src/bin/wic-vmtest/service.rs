//! The real `wicd` on the shim backend, driven through libwic as an application drives it:
//! the application hands its (fake) UVM file over the socket, places a channel in its own
//! memory, and a held warp gets the bytes a host producer publishes. Then the service's
//! lifecycle: a timed-out wait, a destroyed channel and a departed client give their pages
//! back, `kill -9` completes every held fault with the daemon-gone marker, a restarted wicd
//! takes over, and SIGTERM completes held faults with the stopping marker. A GPU producer's
//! channel gets the bytes the producer GPU stored in its own memory (copied by the module, not
//! read from the process's stale copy), and times out and survives `kill -9` the same way.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use wic::{abi, capi, Channel, Client};
use wic_engine::fault::AccessType;
use wic_kabi::{WIC_MARKER_CHANNEL_CLOSED, WIC_MARKER_DAEMON_GONE, WIC_MARKER_DAEMON_STOPPING, WIC_MARKER_TIMEOUT};
use wic_kernel_io::fakegpu::{self, FakeGpu};
use wic_proto::message::{ChannelSpec, ErrorCode, Producer, Stats};

use crate::death::BOUND;
use crate::rig::{ensure, fault, marker, wait_events, Memory, GPU};

pub(crate) const SOCKET: &str = "/run/wic/wicd.sock";
pub(crate) const LOG: &str = "/tmp/wicd.log";
/// The fake GPU's model of Confidential Computing.
const CONF_COMPUTING: &str = "/sys/module/wic_fakegpu/parameters/conf_computing";
/// `[shim] gpu_sharing = "warn"`: see [`Wicd::start`].
const WARN_CONFIG: &str = "/tmp/wicd-warn.toml";
/// Start-up and shutdown allowance: the kernel runs under emulation.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);
/// A channel timeout no step waits out: the longest that wicd accepts under the module's
/// default `max_hold_ms` of 3 s (`longest_timeout_ns`: 2.25 s).
pub(crate) const LONG_NS: u64 = 2_250_000_000;

/// A `wicd serve --backend shim` child.
pub(crate) struct Wicd(Child);

impl Wicd {
    /// A wicd that attaches whatever NVML says of the GPUs (the VM has no NVIDIA driver: the
    /// default, `refuse`, would refuse every attachment; `gpu_sharing` checks that it does).
    pub(crate) fn start() -> Result<Self, String> {
        std::fs::write(WARN_CONFIG, "[shim]\ngpu_sharing = \"warn\"\n").map_err(|e| format!("{WARN_CONFIG}: {e}"))?;
        Self::start_with(&["--config", WARN_CONFIG])
    }

    /// A wicd with `extra` arguments to `wicd serve`.
    fn start_with(extra: &[&str]) -> Result<Self, String> {
        let log = File::options().create(true).append(true).open(LOG).map_err(|e| format!("{LOG}: {e}"))?;
        let child = Command::new("wicd")
            .args(["serve", "--backend", "shim", "--socket", SOCKET])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start wicd: {e}"))?;
        let mut wicd = Self(child);
        let deadline = Instant::now() + PATIENCE;
        while std::os::unix::net::UnixStream::connect(SOCKET).is_err() {
            if let Some(status) = wicd.0.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("wicd exited at start-up ({status}):\n{}", log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!("wicd did not listen within {PATIENCE:?}:\n{}", log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(wicd)
    }

    pub(crate) fn signal(&self, signal: Signal) -> Result<(), String> {
        kill(Pid::from_raw(self.0.id() as i32), signal).map_err(|e| format!("{signal}: {e}"))
    }

    /// Stops it with SIGTERM and waits for it to end.
    pub(crate) fn stop(mut self) -> Result<(), String> {
        self.signal(Signal::SIGTERM)?;
        self.wait().map(drop)
    }

    /// Waits for the process to end; its exit status.
    fn wait(&mut self) -> Result<std::process::ExitStatus, String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.0.try_wait().map_err(|e| e.to_string())? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("wicd did not exit within {PATIENCE:?}:\n{}", log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Wicd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn log_tail() -> String {
    let log = std::fs::read_to_string(LOG).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The GPU of the GPU producers: another parent GPU than the consumer's.
const PRODUCER_GPU: u16 = 9;

pub(crate) fn spec(slots: u32, timeout_ns: u64) -> ChannelSpec {
    ChannelSpec { consumer_gpu: GPU as u16, producer: Producer::Host, message_bytes: 512, slots, timeout_ns }
}

/// A channel whose producer is a kernel on [`PRODUCER_GPU`], its batches in `memory`.
fn gpu_spec(client: &Client, memory: &mut Memory, slots: u32, timeout_ns: u64) -> Result<ChannelSpec, String> {
    let host = spec(slots, timeout_ns);
    let batch_bytes = u64::from(client.daemon().warps_per_batch) * u64::from(host.message_bytes);
    let batches = memory.take((u64::from(slots) * batch_bytes).next_multiple_of(4096))?;
    Ok(ChannelSpec { producer: Producer::Gpu { gpu: PRODUCER_GPU, base_va: batches }, ..host })
}

/// The producer GPU signals slot `slot`'s generation `generation`: a write to its PAT page,
/// held.
fn signal(fake: &FakeGpu, channel: &Channel, slot: usize, generation: usize) -> Result<(), String> {
    let pat = channel.info().slots[slot].pat.ok_or("a GPU producer's slot without PAT pages")?;
    let (verdicts, _) = fake
        .inject(PRODUCER_GPU.into(), &[fault(pat[generation % 2], AccessType::Write)])
        .map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the PAT write was {verdicts:?}"))
}

/// An application: a libwic session with its space attached.
pub(crate) fn connect(fake: &FakeGpu) -> Result<Client, String> {
    let client = Client::connect(Some(Path::new(SOCKET))).map_err(|e| format!("connect: {e}"))?;
    ensure(client.daemon().backend == "shim", || format!("wicd runs the {} backend", client.daemon().backend))?;
    client.attach_space(fake.fd()).map_err(|e| format!("attach_space: {e}"))?;
    Ok(client)
}

/// A channel placed in `memory`; the first VA of each slot's even run.
pub(crate) fn placed(client: &Client, memory: &mut Memory, spec: &ChannelSpec) -> Result<(Channel, Vec<u64>), String> {
    let bytes = client.placement_bytes(spec).map_err(|e| format!("placement_bytes: {e}"))?;
    let base = memory.take(bytes)?;
    let channel = client.create_channel_at(spec, base).map_err(|e| format!("create_channel_at: {e}"))?;
    let runs: Vec<u64> = channel.info().slots.iter().map(|s| s.runs[0]).collect();
    ensure(runs.iter().all(|va| (base..base + bytes).contains(va)), || {
        format!("runs {runs:x?} are not in the placement at {base:#x}")
    })?;
    Ok((channel, runs))
}

/// Injects read faults on `pages`; all must be held.
pub(crate) fn hold(fake: &FakeGpu, pages: &[u64]) -> Result<(), String> {
    let entries: Vec<_> = pages.iter().map(|va| fault(*va, AccessType::Read)).collect();
    let (verdicts, _) = fake.inject(GPU, &entries).map_err(|e| format!("inject: {e}"))?;
    ensure(verdicts.iter().all(|v| *v == fakegpu::VERDICT_HOLD), || format!("not all held: {verdicts:?}"))
}

/// Waits until wicd's engine holds `depth` requests.
pub(crate) fn held_by_wicd(client: &Client, depth: u32) -> Result<Stats, String> {
    stats_until(client, &format!("{depth} requests held"), |stats| stats.pfq_depth == depth)
}

/// Waits until wicd's stats satisfy `done`.
pub(crate) fn stats_until(client: &Client, what: &str, done: impl Fn(&Stats) -> bool) -> Result<Stats, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let stats = client.stats().map_err(|e| format!("stats: {e}"))?;
        if done(&stats) {
            return Ok(stats);
        }
        if Instant::now() > deadline {
            return Err(format!("wicd never had {what}: {stats:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until every page of `pages` was mapped and a replay followed; the events seen.
pub(crate) fn completed(fake: &FakeGpu, pages: &[u64], timeout: Duration) -> Result<Vec<fakegpu::Event>, String> {
    wait_events(fake, timeout, |seen| {
        let mapped = pages
            .iter()
            .all(|va| seen.iter().any(|e| e.kind == fakegpu::EVENT_MAP && e.va <= *va && *va < e.va + e.length));
        mapped && seen.last().is_some_and(|e| e.kind == fakegpu::EVENT_REPLAY)
    })
}

pub fn run() -> Result<(), String> {
    let _ = std::fs::remove_file(LOG);
    let result = scenario();
    if result.is_err() {
        println!("wicd log:\n{}", log_tail());
    }
    result
}

fn scenario() -> Result<(), String> {
    let fake = FakeGpu::open().map_err(|e| format!("open {}: {e}", fakegpu::DEVICE))?;
    let mut memory = Memory::new(&fake, 32 << 20)?;
    let mut wicd = Wicd::start()?;
    let client = connect(&fake)?;

    // A warp's read is held until the host publishes; then it gets exactly the bytes.
    let (channel, runs) = placed(&client, &mut memory, &spec(2, LONG_NS))?;
    let batch = channel.info().batch_bytes as usize;
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &[runs[0]])?;
    held_by_wicd(&client, 1)?;
    let data: Vec<u8> = (0..batch).map(|i| (i * 7 + 3) as u8).collect();
    channel.publish_copy(0, &data).map_err(|e| format!("publish: {e}"))?;
    completed(&fake, &[runs[0]], PATIENCE)?;
    ensure(memory.read(runs[0], batch) == data, || "the consumer's run does not hold the published bytes".into())?;
    let stats = held_by_wicd(&client, 0)?;
    ensure(
        stats.faults_held == 1
            && stats.faults_completed == 1
            && stats.host_publishes == 1
            && stats.commands_failed == 0
            // The completion's batch, timed: its run mapped and its companion unmapped.
            && stats.submissions.count >= 1
            && stats.submissions.pages >= 2
            && stats.submissions.ns > 0,
        || format!("stats: {stats:?}"),
    )?;
    println!("service: a held warp got the {batch} published bytes through wicd");
    // Consumers are the GPU's warps here: the host has no consume path.
    let consumed = channel.consume(0, &mut vec![0; batch]);
    ensure(consumed.as_ref().is_err_and(|e| e.code() == ErrorCode::Unsupported), || {
        format!("a host consume on the shim backend: {consumed:?}")
    })?;

    // A late duplicate of generation 0's fault, fetched after its run was mapped, is held and
    // recorded, and wicd drops it as stale. Its held entry must not hide generation 2's fault
    // on the same run once generation 1's completion has unmapped it again.
    let [even, odd] = channel.info().slots[0].runs;
    hold(&fake, &[even])?;
    stats_until(&client, "the late duplicate read", |s| s.faults_captured == stats.faults_captured + 1)?;
    for (generation, run) in [(1, odd), (2, even)] {
        fake.reset().map_err(|e| e.to_string())?;
        hold(&fake, &[run])?;
        held_by_wicd(&client, 1).map_err(|e| format!("generation {generation}'s fault: {e}"))?;
        channel.wait_writable(0, PATIENCE).map_err(|e| format!("wait writable: {e}"))?;
        channel.publish_copy(0, &data).map_err(|e| format!("publish: {e}"))?;
        completed(&fake, &[run], PATIENCE)?;
    }
    println!("service: a stale duplicate's held entry did not hide a later generation's fault");

    // Nobody publishes: the wait ends with the timeout marker.
    let (short, short_runs) = placed(&client, &mut memory, &spec(1, 100_000_000))?;
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &[short_runs[0]])?;
    completed(&fake, &[short_runs[0]], PATIENCE)?;
    ensure(marker(&memory, short_runs[0]) == WIC_MARKER_TIMEOUT, || "no timeout marker".into())?;

    // A destroyed channel's pages are no longer held.
    short.close().map_err(|e| format!("destroy: {e}"))?;
    let (verdicts, _) = fake.inject(GPU, &[fault(short_runs[0], AccessType::Read)]).map_err(|e| e.to_string())?;
    ensure(verdicts == [fakegpu::VERDICT_PASS], || format!("a destroyed channel's page was {verdicts:?}"))?;

    // A GPU producer: the consumer's warp waits; the producer's kernel stores its batch in its
    // own GPU's memory and signals through its PAT page; the module copies the bytes from
    // there (the producer GPU's copy engine on a real GPU) into the run, and the producer's
    // write completes.
    let long_gpu = gpu_spec(&client, &mut memory, 2, LONG_NS)?;
    let Producer::Gpu { base_va: batches, .. } = long_gpu.producer else { unreachable!("a GPU producer") };
    let (from_gpu, gpu_runs) = placed(&client, &mut memory, &long_gpu)?;
    let gpu_batch = from_gpu.info().batch_bytes as usize;
    // Its producer is a kernel: the handle has PAT pages and no host publish.
    let pat_va = from_gpu.abi_slot(0).map_err(|e| e.to_string())?.pat_va;
    ensure(pat_va[0] != 0 && pat_va[1] != 0, || format!("a GPU producer's slot has PAT pages {pat_va:x?}"))?;
    ensure(from_gpu.slot_buffer(0).is_err(), || "a GPU producer's channel has no host slot buffer".into())?;
    let published = from_gpu.publish(0);
    ensure(published.as_ref().is_err_and(|e| e.code() == ErrorCode::Unsupported), || {
        format!("a host publish on a GPU producer's channel: {published:?}")
    })?;
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &[gpu_runs[0]])?;
    held_by_wicd(&client, 1)?;
    let stored: Vec<u8> = (0..gpu_batch).map(|i| (i * 13 + 5) as u8).collect();
    fake.gpu_store(PRODUCER_GPU.into(), batches, &stored).map_err(|e| format!("gpu_store: {e}"))?;
    ensure(memory.read(batches, gpu_batch) != stored, || {
        "the process sees the GPU's bytes: the copy would prove nothing".into()
    })?;
    signal(&fake, &from_gpu, 0, 0)?;
    let seen = completed(&fake, &[gpu_runs[0]], PATIENCE)?;
    ensure(memory.read(gpu_runs[0], gpu_batch) == stored, || {
        "the consumer's run does not hold the producer GPU's bytes".into()
    })?;
    let copied_from = seen.iter().find(|e| e.kind == fakegpu::EVENT_COPY && e.va == gpu_runs[0]).map(|e| e.gpu_id);
    ensure(copied_from == Some(PRODUCER_GPU.into()), || {
        format!("the run was copied from GPU {copied_from:?}: {seen:?}")
    })?;
    let pat = from_gpu.info().slots[0].pat.expect("checked by signal");
    let pat_state = fake.page_state(PRODUCER_GPU.into(), pat[0]).map_err(|e| e.to_string())?;
    ensure(pat_state & fakegpu::PAGE_WRITABLE != 0, || {
        format!("the producer's PAT write was not let through: {pat_state:#x}")
    })?;
    let stats = held_by_wicd(&client, 0)?;
    ensure(stats.pat_faults >= 1 && stats.commands_failed == 0, || format!("stats: {stats:?}"))?;
    println!("service: a held warp got the {gpu_batch} bytes GPU {PRODUCER_GPU} stored, copied from its memory");

    // A GPU producer that never signals: the timeout marker, as for a host producer.
    let short_gpu = gpu_spec(&client, &mut memory, 1, 100_000_000)?;
    let (_silent, silent_runs) = placed(&client, &mut memory, &short_gpu)?;
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &[silent_runs[0]])?;
    completed(&fake, &[silent_runs[0]], PATIENCE)?;
    ensure(marker(&memory, silent_runs[0]) == WIC_MARKER_TIMEOUT, || {
        "no timeout marker for a GPU producer's channel".into()
    })?;

    // A client that goes away takes its channels and space with it.
    let other_fake = FakeGpu::open().map_err(|e| e.to_string())?;
    memory.manage(&other_fake)?;
    let other = connect(&other_fake)?;
    let (orphan, orphan_runs) = placed(&other, &mut memory, &spec(1, LONG_NS))?;
    drop(orphan);
    drop(other);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (verdicts, _) =
            other_fake.inject(GPU, &[fault(orphan_runs[0], AccessType::Read)]).map_err(|e| e.to_string())?;
        if verdicts == [fakegpu::VERDICT_PASS] {
            break;
        }
        // Held meanwhile: the reclaim completes it with the closed marker; try again.
        ensure(Instant::now() < deadline, || "a departed client's page is still registered".into())?;
        std::thread::sleep(Duration::from_millis(20));
    }

    // kill -9 with faults held, a GPU producer's channel's among them: the module completes
    // every one.
    let mut pages: Vec<u64> = (0..channel.info().pages_per_run as u64).map(|p| runs[1] + p * 4096).collect();
    pages.push(from_gpu.info().slots[0].runs[1]);
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &pages)?;
    // One request per slot: the engine counts the run's other warps as duplicates, while the
    // module holds every page.
    held_by_wicd(&client, 2)?;
    wicd.signal(Signal::SIGKILL)?;
    let killed = Instant::now();
    wicd.wait()?;
    completed(&fake, &pages, BOUND * 5)?;
    let took = killed.elapsed();
    ensure(took <= BOUND, || format!("held faults completed {took:?} after kill -9, bound {BOUND:?}"))?;
    for va in &pages {
        ensure(marker(&memory, *va) == WIC_MARKER_DAEMON_GONE, || {
            format!("page {va:#x} lacks the daemon-gone marker")
        })?;
    }
    println!("service: kill -9 wicd: {} held faults completed {took:?} later (bound {BOUND:?})", pages.len());
    drop(from_gpu);
    drop(channel);
    drop(client);

    // A restarted wicd takes the device over, here through the C API; SIGTERM completes held
    // faults and exits 0.
    let mut wicd = Wicd::start()?;
    let (client, channel, run) = c_placed(&fake, &mut memory)?;
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &[run])?;
    // SAFETY: a live handle from `c_placed`.
    held_by_wicd(unsafe { &*client }, 1)?;
    wicd.signal(Signal::SIGTERM)?;
    completed(&fake, &[run], PATIENCE)?;
    ensure(marker(&memory, run) == WIC_MARKER_DAEMON_STOPPING, || "no stopping marker after SIGTERM".into())?;
    let status = wicd.wait()?;
    ensure(status.success(), || format!("wicd exited with {status} after SIGTERM:\n{}", log_tail()))?;
    ensure(!PathBuf::from(SOCKET).exists(), || "wicd left its socket behind".into())?;
    // SAFETY: handles from `c_placed`, released once.
    unsafe {
        capi::wic_channel_close(channel);
        capi::wic_disconnect(client);
    }
    gpu_sharing(&fake)?;
    confidential_computing_refused(&fake)?;
    pascal_refused()?;
    pascal_registered_later_fails_the_channel()?;
    timeouts_below_the_module_bound(&fake, &mut memory)?;
    refused_unregister_asked_again(&fake, &mut memory)
}

/// A destroyed channel whose range the module refuses to let go of (nvidia-uvm refuses the
/// closed marker's write, as while suspended): its page stays a wic page, its fault held, until
/// wicd asks again and the module completes it.
fn refused_unregister_asked_again(fake: &FakeGpu, memory: &mut Memory) -> Result<(), String> {
    let wicd = Wicd::start()?;
    let client = connect(fake)?;
    let (channel, runs) = placed(&client, memory, &spec(1, LONG_NS))?;
    fake.reset().map_err(|e| e.to_string())?;
    hold(fake, &runs)?;
    held_by_wicd(&client, 1)?;
    let refuse = fakegpu::Fail { writes: 1000, maps: 0, error: Errno::EAGAIN as u32, flags: 0 };
    fake.fail(refuse).map_err(|e| format!("fail: {e}"))?;
    channel.close().map_err(|e| format!("destroy: {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let (verdicts, _) = fake.inject(GPU, &[fault(runs[0], AccessType::Read)]).map_err(|e| e.to_string())?;
    ensure(verdicts == [fakegpu::VERDICT_HOLD], || format!("the refused range's page was {verdicts:?}"))?;
    fake.fail(fakegpu::Fail::default()).map_err(|e| format!("fail: {e}"))?;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (verdicts, _) = fake.inject(GPU, &[fault(runs[0], AccessType::Read)]).map_err(|e| e.to_string())?;
        if verdicts == [fakegpu::VERDICT_PASS] {
            break;
        }
        ensure(Instant::now() < deadline, || {
            format!("the range is still registered after {PATIENCE:?}:\n{}", log_tail())
        })?;
        std::thread::sleep(Duration::from_millis(20));
    }
    ensure(marker(memory, runs[0]) == WIC_MARKER_CHANNEL_CLOSED, || {
        "the held fault did not get the closed marker".into()
    })?;
    drop(client);
    wicd.stop()
}

/// The module's own bound on a hold (`max_hold_ms`): under its default (3 s) a channel whose
/// timeout is not well below it is refused, and so under a bound written at runtime (500 ms):
/// the module would end the hold first, knowing only the faulting page.
fn timeouts_below_the_module_bound(fake: &FakeGpu, memory: &mut Memory) -> Result<(), String> {
    let param = wic_kernel_io::device::MAX_HOLD_MS_PARAM;
    let default = std::fs::read_to_string(param).map_err(|e| format!("{param}: {e}"))?;
    ensure(default.trim() == "3000", || format!("max_hold_ms defaults to {}, not 3000", default.trim()))?;
    let refused_above = |client: &Client, memory: &mut Memory, bound_ms: u64, timeouts: &[u64]| -> Result<(), String> {
        let bytes = client.placement_bytes(&spec(1, 0)).map_err(|e| format!("placement_bytes: {e}"))?;
        for &timeout_ns in timeouts {
            let refused = client.create_channel_at(&spec(1, timeout_ns), memory.take(bytes)?);
            ensure(
                refused
                    .as_ref()
                    .is_err_and(|e| e.code() == ErrorCode::Invalid && e.to_string().contains("max_hold_ms")),
                || {
                    format!(
                        "a {timeout_ns} ns timeout (0: the default of 1 s) with max_hold_ms {bound_ms}: {refused:?}"
                    )
                },
            )?;
        }
        Ok(())
    };
    let wicd = Wicd::start()?;
    let client = connect(fake)?;
    refused_above(&client, memory, 3000, &[10_000_000_000, LONG_NS + 1])?;
    placed(&client, memory, &spec(1, LONG_NS))
        .map_err(|e| format!("a {LONG_NS} ns timeout with max_hold_ms 3000: {e}"))?;
    drop(client);
    wicd.stop()?;

    std::fs::write(param, "500\n").map_err(|e| format!("{param}: {e}"))?;
    let result = (|| {
        let wicd = Wicd::start()?;
        let client = connect(fake)?;
        // The margin below the bound: a quarter of it, 125 ms, at least 100 ms.
        refused_above(&client, memory, 500, &[10_000_000_000, 500_000_000, 400_000_000, 0])?;
        placed(&client, memory, &spec(1, 100_000_000))
            .map_err(|e| format!("a 100 ms timeout with max_hold_ms 500: {e}"))?;
        // wicd stopped past the module's bound: the module ends the hold itself with the
        // timeout marker, and wicd, resumed, counts it as the module's expiry.
        let (_bounded, bounded_runs) = placed(&client, memory, &spec(1, 300_000_000))?;
        fake.reset().map_err(|e| e.to_string())?;
        hold(fake, &[bounded_runs[0]])?;
        held_by_wicd(&client, 1)?;
        wicd.signal(Signal::SIGSTOP)?;
        let ended = completed(fake, &[bounded_runs[0]], PATIENCE);
        wicd.signal(Signal::SIGCONT)?;
        ended.map_err(|e| format!("the module's bound with wicd stopped: {e}"))?;
        ensure(marker(memory, bounded_runs[0]) == WIC_MARKER_TIMEOUT, || {
            "no timeout marker from the module's bound".into()
        })?;
        let stats = stats_until(&client, "the module's expiry counted", |s| s.faults_expired_in_module == 1)?;
        ensure(stats.faults_timed_out == 1, || format!("the expired hold as a timeout: {stats:?}"))?;
        println!("service: the module's own bound ended a hold while wicd was stopped; wicd counted it");
        let log = std::fs::read_to_string(LOG).unwrap_or_default();
        ensure(log.contains("channels created without a timeout are refused"), || {
            "no warning about the default timeout at start".into()
        })?;
        drop(client);
        wicd.stop()
    })();
    std::fs::write(param, &default).map_err(|e| format!("{param}: {e}"))?;
    result
}

/// The deployment rule at attach: the VM has no NVIDIA driver, so NVML cannot say how the GPUs
/// are shared. `warn` attached anyway and said so in the log; the default, `refuse`, refuses
/// the attachment with the reason.
fn gpu_sharing(fake: &FakeGpu) -> Result<(), String> {
    let log = std::fs::read_to_string(LOG).unwrap_or_default();
    ensure(log.contains("cannot check how the GPUs are shared"), || {
        format!("no warning about the unchecked GPUs:\n{}", log_tail())
    })?;
    attach_refused(fake, &[], "gpu_sharing")
}

/// The GPUs in Confidential Computing mode (the fake GPU's `conf_computing`): nvidia-uvm with
/// the hook refuses the space, and wicd says why.
fn confidential_computing_refused(fake: &FakeGpu) -> Result<(), String> {
    std::fs::write(CONF_COMPUTING, "1\n").map_err(|e| format!("{CONF_COMPUTING}: {e}"))?;
    let refused = attach_refused(fake, &["--config", WARN_CONFIG], "Confidential Computing");
    std::fs::write(CONF_COMPUTING, "0\n").map_err(|e| format!("{CONF_COMPUTING}: {e}"))?;
    refused
}

/// An application whose address space has a Pascal GPU registered: the module cannot hold
/// that GPU's faults, and wicd says so.
fn pascal_refused() -> Result<(), String> {
    let pascal = FakeGpu::open().map_err(|e| e.to_string())?;
    pascal.pre_volta(4).map_err(|e| format!("pre_volta: {e}"))?;
    attach_refused(&pascal, &["--config", WARN_CONFIG], "Pascal")
}

/// A Pascal GPU registered in the application's space after it was attached: the module cannot
/// hold its faults, so its read of a channel's page is serviced without the data. The module
/// tells wicd, which closes the channel: its held fault gets the closed marker, its producer
/// finds it closed when it publishes or waits for a delivery, and its owner's destroy still
/// succeeds.
fn pascal_registered_later_fails_the_channel() -> Result<(), String> {
    const PASCAL: u32 = 4;
    let fake = FakeGpu::open().map_err(|e| e.to_string())?;
    let mut memory = Memory::new(&fake, 1 << 20)?;
    let wicd = Wicd::start()?;
    let client = connect(&fake)?;
    let (channel, runs) = placed(&client, &mut memory, &spec(2, LONG_NS))?;
    fake.reset().map_err(|e| e.to_string())?;
    hold(&fake, &[runs[0]])?;
    held_by_wicd(&client, 1)?;
    fake.pre_volta(PASCAL).map_err(|e| format!("pre_volta: {e}"))?;
    let (verdicts, _) = fake.inject(PASCAL, &[fault(runs[1], AccessType::Read)]).map_err(|e| e.to_string())?;
    ensure(verdicts == [fakegpu::VERDICT_PASS], || format!("the Pascal GPU's fault was {verdicts:?}"))?;
    completed(&fake, &[runs[0]], PATIENCE).map_err(|e| format!("the held fault was not completed: {e}"))?;
    ensure(marker(&memory, runs[0]) == WIC_MARKER_CHANNEL_CLOSED, || {
        format!("the held fault got {:#x}, not the closed marker:\n{}", marker(&memory, runs[0]), log_tail())
    })?;
    // The producer learns it at its publish, once wicd marked the channel closed in their
    // shared state, or else when it waits for the delivery of what it published: which one
    // depends on whether that mark came before the publish, after the closed marker's write.
    let closed = |e: &wic::channel::Error| e.code() == ErrorCode::Closed;
    let published = channel.publish_copy(1, &[1; 8]);
    ensure(published.as_ref().map_or_else(closed, |_| true), || format!("publish: {published:?}"))?;
    if published.is_ok() {
        let waited = channel.wait_writable(1, PATIENCE);
        ensure(waited.as_ref().is_err_and(closed), || {
            format!("waiting for a delivery on the failed channel: {waited:?}")
        })?;
    }
    channel.close().map_err(|e| format!("destroying the failed channel: {e}"))?;
    ensure(log_tail().contains("read a page of the channel without its data"), || {
        format!("wicd's log does not say why:\n{}", log_tail())
    })?;
    println!("service: a Pascal GPU registered after attach read a page of a channel: wicd closed the channel");
    drop(client);
    wicd.stop()
}

/// A wicd started with `wicd_args` refuses `fake`'s space as UNSUPPORTED, saying `why`.
fn attach_refused(fake: &FakeGpu, wicd_args: &[&str], why: &str) -> Result<(), String> {
    let wicd = Wicd::start_with(wicd_args)?;
    let client = Client::connect(Some(Path::new(SOCKET))).map_err(|e| format!("connect: {e}"))?;
    let refused = client.attach_space(fake.fd());
    ensure(refused.as_ref().is_err_and(|e| e.code() == ErrorCode::Unsupported && e.to_string().contains(why)), || {
        format!("attach_space refused, saying {why:?}: {refused:?}")
    })?;
    drop(client);
    wicd.stop()
}

/// `connect` and `placed` through `wic.h`: a one-slot channel placed in `memory`; the
/// handles and the address of the slot's even run.
fn c_placed(fake: &FakeGpu, memory: &mut Memory) -> Result<(*mut Client, *mut Channel, u64), String> {
    let check = |what: &str, rc: i32| ensure(rc == abi::WIC_OK, || format!("{what}: {rc}"));
    let socket = std::ffi::CString::new(SOCKET).expect("no NUL");
    let spec = abi::WicChannelSpec {
        consumer_gpu: GPU as u16,
        producer_kind: abi::WIC_PRODUCER_HOST,
        producer_gpu: 0,
        reserved: 0,
        message_bytes: 512,
        slots: 1,
        producer_base_va: 0,
        timeout_ns: LONG_NS,
    };
    let (mut client, mut channel, mut space, mut bytes) = (std::ptr::null_mut(), std::ptr::null_mut(), 0u32, 0u64);
    let mut slot = abi::WicSlotInfo { run_va: [0; 2], pat_va: [0; 2], tag: 0, reserved: 0 };
    // SAFETY: every pointer is to a live local; handles come from the calls before their use.
    unsafe {
        check("wic_connect", capi::wic_connect(socket.as_ptr(), &mut client))?;
        check("wic_attach_space", capi::wic_attach_space(client, fake.fd().as_raw_fd(), &mut space))?;
        check("wic_placement_bytes", capi::wic_placement_bytes(client, &spec, &mut bytes))?;
        let base = memory.take(bytes)?;
        check("wic_channel_create_at", capi::wic_channel_create_at(client, &spec, base, &mut channel))?;
        check("wic_channel_slot", capi::wic_channel_slot(channel, 0, &mut slot))?;
        ensure(space != 0 && (base..base + bytes).contains(&slot.run_va[0]), || {
            format!("space {space}, run {:#x}", slot.run_va[0])
        })?;
    }
    Ok((client, channel, slot.run_va[0]))
}
