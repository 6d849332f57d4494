//! Load: many concurrent clients, each with several channels, over wicd's socket, round after
//! round; memory, descriptors and latency must stay bounded and everything must be reclaimed.
//!
//! Each client has a producer connection that creates its channels (host producers), grants a
//! consumer token for each, publishes every message and destroys the channels, and a consumer
//! connection that attaches with the tokens and consumes every message on a thread of its own,
//! checking each byte and the order (so a message lost or delivered twice is caught). Halfway
//! through a round, every `--abort-every`-th client drops its producer connection without
//! closing anything, while its consumer waits on a channel, and connects again. Rounds run in
//! lockstep so that wicd can be sampled between them with no channel open.
//!
//! By default it starts `wicd serve` (emulated backend) on a private socket, with limits sized
//! for the load; `--socket` runs against a daemon already running instead, which must be idle
//! otherwise (its counters are compared before and after).
//!
//! Progress goes to stderr; stdout gets the summary (latencies, wicd's memory and descriptors,
//! every check), then one line of JSON. Exits 1 if a check fails or a round does not finish (the
//! clients still in it are named), 2 on bad options.

mod client;
mod daemon;
mod gate;
mod latency;
mod payload;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use wic_engine::{EngineConfig, PAGE_SIZE};

use client::{Context, Progress, Shape, Tally};
use daemon::Target;
use gate::Gate;
use report::{Bounds, Report, Snapshot};

/// How often wicd's memory and gauges are sampled while a round runs.
const SAMPLE_PERIOD: Duration = Duration::from_millis(20);
/// What the daemon logs when it refuses a connection past `max_clients`: expected once.
const EXPECTED_REFUSAL: &str = "too many clients: wicd serves at most";

#[derive(Parser)]
#[command(
    name = "wic-load",
    about = "Many concurrent clients with several channels each against wicd; checks that memory, descriptors and latency stay bounded"
)]
struct Args {
    /// Concurrent clients (each a producer and a consumer connection).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    clients: u32,
    /// Channels per client.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    channels: u32,
    /// Rounds: create, exchange, destroy.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Messages per channel and round.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    messages: u32,
    /// Slots per channel.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    slots: u32,
    /// Bytes per consumer warp; a message is one slot generation (warps per batch times this).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(2..))]
    message_bytes: u32,
    /// Client c aborts in round r when (c + r) is a multiple of this; 0: no aborts.
    #[arg(long, default_value_t = 8)]
    abort_every: u32,
    /// How long wicd holds a waiting consumer before timing it out (channel spec).
    #[arg(long, default_value_t = 10_000)]
    hold_timeout_ms: u64,
    /// Run against the wicd listening here instead of starting one.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The wicd binary to start (default: the one next to this program).
    #[arg(long, conflicts_with = "socket")]
    wicd: Option<PathBuf>,
    /// GPUs of the wicd started here (emulated.gpus; default: wicd's). A replay wakes every
    /// consumer waiting on its GPU, so fewer consumers per GPU mean fewer repeated faults.
    #[arg(long, conflicts_with = "socket", value_parser = clap::value_parser!(u16).range(1..))]
    gpus: Option<u16>,
    /// Bound on the 99th percentile of all control requests.
    #[arg(long, default_value_t = 250)]
    max_control_p99_ms: u64,
    /// Bound on wicd's RSS growth from after round 1 to after the last round. Allocator noise
    /// stays near 100 KiB over 20 rounds; one 4 KiB page leaked per channel at 128 x 4 passes
    /// the default within two rounds.
    #[arg(long, default_value_t = 4096)]
    max_rss_growth_kib: u64,
    /// Descriptors wicd may hold at the end beyond its baseline. Each client's descriptors
    /// (its socket, its channels' regions and doorbells) are closed when it goes, and the
    /// monitor connection is open in both samples: the default is none.
    #[arg(long, default_value_t = 0)]
    fd_slack: u64,
    /// How long wicd may take to reclaim everything after a round.
    #[arg(long, default_value_t = 10)]
    reclaim_timeout_s: u64,
    /// How long one round may take before the run is declared stuck.
    #[arg(long, default_value_t = 300)]
    stall_timeout_s: u64,
}

impl Args {
    fn shape(&self, gpus: u16) -> Shape {
        Shape {
            channels: self.channels,
            messages: self.messages,
            slots: self.slots,
            message_bytes: self.message_bytes,
            gpus,
            hold_timeout: Duration::from_millis(self.hold_timeout_ms),
            abort_every: self.abort_every,
        }
    }

    /// Producers that may be between connections at once, in one round.
    fn aborts_per_round(&self) -> u32 {
        if self.abort_every == 0 {
            0
        } else {
            self.clients.div_ceil(self.abort_every)
        }
    }

    /// wicd's configuration for this load: exactly the connections and channels per client it
    /// needs (so the limit itself can be probed), a pool and slot table that hold all channels
    /// at once, never smaller than the defaults, the socket in this user's group (the default
    /// group, `wic`, may not exist here) and the GPU count if one is given.
    fn config(&self) -> Result<String, String> {
        let engine = EngineConfig::default();
        let pages_per_run = (u64::from(engine.warps_per_batch) * u64::from(self.message_bytes)).div_ceil(PAGE_SIZE);
        let slots = u64::from(self.clients) * u64::from(self.channels) * u64::from(self.slots);
        let pages = slots * 2 * pages_per_run;
        let emulated = self.gpus.map_or_else(String::new, |gpus| format!("[emulated]\ngpus = {gpus}\n\n"));
        let group = nix::unistd::Group::from_gid(nix::unistd::getgid())
            .ok()
            .flatten()
            .ok_or("this user's group has no name to give wicd")?;
        Ok(format!(
            "[service]\nsocket_group = \"{}\"\n\n{emulated}\
             [engine]\npool_pages = {}\nmax_slots = {}\n\n\
             [limits]\nmax_clients = {}\nmax_channels_per_client = {}\n",
            group.name,
            pages.max(u64::from(engine.pool_pages)),
            slots.max(u64::from(engine.max_slots)),
            self.max_clients(),
            self.channels
        ))
    }

    /// Two connections per client, the monitor's, and room for the producers that reconnect
    /// before wicd has noticed their old connection is gone.
    fn max_clients(&self) -> u32 {
        2 * self.clients + 1 + self.aborts_per_round()
    }
}

/// Raises this process's descriptor limit to the hard limit: two sockets per client and three
/// descriptors per channel pass the usual soft limit of 1024 soon. A wicd started here inherits
/// it.
fn raise_fd_limit() -> Result<(), String> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit through a pointer to a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(format!("getrlimit: {}", std::io::Error::last_os_error()));
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads one rlimit from a live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn snapshot(target: &mut Target) -> Result<Snapshot, String> {
    Ok(Snapshot { status: target.status()?, stats: target.stats()?, usage: target.usage()? })
}

/// Highest values seen while the rounds ran.
#[derive(Default)]
struct Peaks {
    rss_kib: u64,
    fds: Option<u64>,
    channels: u32,
    clients: u32,
    /// Why a sample could not be taken (the daemon stopped answering, say).
    error: Option<String>,
}

impl Peaks {
    fn sample(&mut self, target: &mut Target) {
        let taken = target.usage().and_then(|usage| Ok((usage, target.status()?)));
        match taken {
            Ok((usage, status)) => {
                self.rss_kib = self.rss_kib.max(usage.rss_kib);
                self.fds = self.fds.max(usage.fds);
                self.channels = self.channels.max(status.channels);
                self.clients = self.clients.max(status.clients);
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// The lines of wicd's log that warn or report an error, but for the one expected refusal.
fn log_problems(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| (line.contains(" WARN ") || line.contains(" ERROR ")) && !line.contains(EXPECTED_REFUSAL))
        .map(str::to_owned)
        .collect()
}

fn run(args: &Args) -> Result<Report, String> {
    raise_fd_limit()?;
    let started = Instant::now();
    let mut target = match &args.socket {
        Some(socket) => Target::existing(socket)?,
        None => {
            let wicd = match &args.wicd {
                Some(path) => path.clone(),
                None => std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("wicd"),
            };
            Target::start(&wicd, &args.config()?)?
        }
    };
    let baseline = snapshot(&mut target)?;
    let gpus = baseline.status.gpus.max(1);
    let reclaim_timeout = Duration::from_secs(args.reclaim_timeout_s);
    let stall_timeout = Duration::from_secs(args.stall_timeout_s);
    let clients = args.clients as usize;
    let ctx = Arc::new(Context {
        socket: target.socket.clone(),
        shape: args.shape(gpus),
        epoch: Instant::now(),
        gate: Gate::default(),
        progress: (0..clients).map(|_| Progress::default()).collect(),
        failures: AtomicUsize::new(0),
    });
    let threads: Vec<_> = (0..args.clients)
        .map(|index| {
            let ctx = Arc::clone(&ctx);
            std::thread::Builder::new()
                .name(format!("client-{index}"))
                .spawn(move || client::run(index, &ctx))
                .map_err(|e| format!("starting client thread {index}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut peaks = Peaks::default();
    peaks.sample(&mut target);
    if !ctx.gate.wait_finished(clients, stall_timeout, SAMPLE_PERIOD, || peaks.sample(&mut target)) {
        return Err(stuck(&ctx, &mut target, "connecting", stall_timeout));
    }
    peaks.sample(&mut target);
    let all_connected = baseline.status.clients + 2 * args.clients;
    let limit_refusal = match args.socket {
        Some(_) => None,
        None => Some(fill_to_the_limit(&mut target, all_connected, args.max_clients(), reclaim_timeout)?),
    };
    eprintln!("wic-load: {} clients connected in {:.1} s", args.clients, started.elapsed().as_secs_f64());

    let mut rounds_run = 0;
    let mut after_first_round = None;
    let mut after_last_round = None;
    let mut slowest_reclaim = Duration::ZERO;
    let mut unreclaimed = Vec::new();
    for round in 1..=args.rounds {
        ctx.gate.open(round);
        if !ctx.gate.wait_finished(clients, stall_timeout, SAMPLE_PERIOD, || peaks.sample(&mut target)) {
            return Err(stuck(&ctx, &mut target, &format!("round {round}"), stall_timeout));
        }
        rounds_run = round;
        let (status, took, reclaimed) = target.wait_for(reclaim_timeout, |s| {
            (s.channels, s.pool_pages_used, s.held) == (baseline.status.channels, baseline.status.pool_pages_used, 0)
        })?;
        slowest_reclaim = slowest_reclaim.max(took);
        if !reclaimed {
            unreclaimed.push(format!(
                "after round {round}: {} channels, {} pages used, {} held after {reclaim_timeout:?}",
                status.channels, status.pool_pages_used, status.held
            ));
        }
        let usage = target.usage()?;
        if round == 1 {
            after_first_round = Some(usage);
        }
        after_last_round = Some(usage);
        eprintln!(
            "wic-load: round {round}/{}: {:.1} s, wicd RSS {} KiB, {} descriptors, reclaimed in {:.1} ms",
            args.rounds,
            started.elapsed().as_secs_f64(),
            usage.rss_kib,
            usage.fds.map_or_else(|| "?".into(), |n| n.to_string()),
            took.as_secs_f64() * 1e3
        );
        if ctx.failures.load(Ordering::Relaxed) > 0 {
            eprintln!("wic-load: stopping after round {round}: a client failed");
            break;
        }
    }
    ctx.gate.stop();
    let mut totals = Tally::default();
    for thread in threads {
        let tally = thread.join().map_err(|_| "a client thread panicked".to_string())?;
        totals.published += tally.published;
        totals.consumed += tally.consumed;
        totals.bytes_checked += tally.bytes_checked;
        totals.aborts += tally.aborts;
        totals.closed_as_expected += tally.closed_as_expected;
        totals.latencies.merge(tally.latencies);
        totals.failures.extend(tally.failures);
    }
    if let Some(e) = peaks.error.take() {
        totals.failures.push(format!("sampling wicd: {e}"));
    }
    // Every client is gone: wicd must come back to where it started. Its status counts a client
    // gone before the last of its descriptors is closed, so the descriptors get the same time to
    // follow; one still open after it is a leak.
    target.wait_for(reclaim_timeout, |s| {
        (s.clients, s.channels, s.pool_pages_used, s.held)
            == (baseline.status.clients, baseline.status.channels, baseline.status.pool_pages_used, 0)
    })?;
    let closing = Instant::now();
    while let (Some(now), Some(base)) = (target.usage()?.fds, baseline.usage.fds) {
        if now <= base + args.fd_slack || closing.elapsed() > reclaim_timeout {
            break;
        }
        std::thread::sleep(SAMPLE_PERIOD);
    }
    let end = snapshot(&mut target)?;
    let shape = ctx.shape;
    let due = |per_abort: u64, per_round: u64| {
        (0..args.clients)
            .flat_map(|c| (1..=rounds_run).map(move |r| (c, r)))
            .map(|(c, r)| if shape.aborts(c, r) { per_abort } else { per_round })
            .sum::<u64>()
    };
    let channels = u64::from(args.channels);
    let log_path = target.log_path();
    let log = log_path.as_ref().map(|path| std::fs::read_to_string(path).unwrap_or_default());
    let stopped = target.stop();
    let log_problems = log.as_deref().map(log_problems);
    Ok(Report {
        clients: args.clients,
        channels: args.channels,
        rounds: rounds_run,
        messages: args.messages,
        slots: args.slots,
        message_bytes: args.message_bytes,
        published: totals.published,
        consumed: totals.consumed,
        consumed_due: due(
            channels * u64::from(shape.consumed_per_channel(true)),
            channels * u64::from(shape.consumed_per_channel(false)),
        ),
        bytes_checked: totals.bytes_checked,
        aborts: totals.aborts,
        aborts_due: due(1, 0),
        closed_as_expected: totals.closed_as_expected,
        publishes_at_aborts: totals.aborts * channels.saturating_sub(1),
        latencies: totals.latencies,
        failures: totals.failures,
        baseline,
        after_first_round,
        after_last_round,
        peak_rss_kib: peaks.rss_kib.max(end.usage.rss_kib),
        peak_fds: peaks.fds,
        peak_channels: peaks.channels,
        peak_clients: peaks.clients,
        end,
        slowest_reclaim,
        unreclaimed,
        limit_refusal,
        log_path,
        log_problems,
        stopped,
        elapsed: started.elapsed(),
        bounds: Bounds {
            control_p99: Duration::from_millis(args.max_control_p99_ms),
            rss_growth_kib: args.max_rss_growth_kib,
            fd_slack: args.fd_slack,
        },
    })
}

/// Why a round did not finish: where wicd stands and the clients still in the round.
fn stuck(ctx: &Context, target: &mut Target, what: &str, timeout: Duration) -> String {
    let mut report = format!("{what} did not finish within {timeout:?}; ");
    match target.status() {
        Ok(s) => {
            report.push_str(&format!("wicd has {} clients, {} channels, {} held faults", s.clients, s.channels, s.held))
        }
        Err(e) => report.push_str(&format!("wicd does not answer: {e}")),
    }
    if let Some(path) = target.log_path() {
        report.push_str(&format!("; its log is {}", path.display()));
    }
    for (index, progress) in ctx.progress.iter().enumerate().filter(|(_, progress)| progress.busy()) {
        report.push_str(&format!("\n  client {index}: {}", progress.describe()));
    }
    report
}

/// With every client connected (`connected` in all), opens connections up to `max_clients`,
/// checks that one more is refused, and closes them again.
fn fill_to_the_limit(
    target: &mut Target,
    connected: u32,
    max_clients: u32,
    timeout: Duration,
) -> Result<Result<(), String>, String> {
    let (status, _, all_in) = target.wait_for(timeout, |s| s.clients == connected)?;
    if !all_in {
        return Ok(Err(format!("{} clients registered, {connected} expected", status.clients)));
    }
    let mut fillers = Vec::new();
    for _ in connected..max_clients {
        match wic::Client::connect(Some(&target.socket)) {
            Ok(filler) => fillers.push(filler),
            Err(e) => return Ok(Err(format!("a connection below max_clients was refused: {e}"))),
        }
    }
    let refusal = target.expect_refusal();
    drop(fillers);
    let (status, _, back) = target.wait_for(timeout, |s| s.clients == connected)?;
    if !back {
        return Ok(Err(format!("{} clients registered after the probe, {connected} expected", status.clients)));
    }
    Ok(refusal)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(report) => {
            let checks = report.checks();
            report.print(&checks);
            println!("{}", report.json(&checks));
            if checks.iter().all(|c| c.ok) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            println!("wic-load: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
