//! `wic-uvmwatch`: counts and times the GPU faults of a running CUDA process with the stock
//! NVIDIA driver's UVM tools interface (crate wic-kernel-io, module `uvmtools`), the way wicd does
//! for an application that passed it its `/dev/nvidia-uvm` descriptor.
//!
//! ```text
//! wic-uvmwatch watch --pid PID [--fd N] [OPTIONS]
//! wic-uvmwatch run [OPTIONS] -- PROGRAM [ARGS...]
//! OPTIONS: [--range START-END | --range START+LEN]... [--for SECONDS] [--wait SECONDS]
//!          [--entries N] [--tools PATH] [--events] [--no-flush]
//! ```
//!
//! The driver accepts only the process's own VA-space file, not a reopening of
//! `/proc/PID/fd/N`: the program duplicates the process's descriptor with `pidfd_open` and
//! `pidfd_getfd` (Linux 5.6). That needs ptrace permission over the process: root with
//! `CAP_SYS_PTRACE`, or the same user where Yama allows it (`kernel.yama.ptrace_scope` 0, or 1
//! for a descendant). `run` starts PROGRAM as a child, which any scope short of 2 allows, and
//! watches it; `watch` attaches to a running process. Without `--fd` it tries each descriptor of
//! the process that links to `/dev/nvidia-uvm` (CUDA holds two; one is the VA space), retrying
//! for up to `--wait` seconds (default 10) while the process starts CUDA.
//!
//! Faults are counted as watched when their address lies in one of the `--range`s (hex with
//! `0x`, or decimal; none given: every address). Once a second it prints a line: watched and
//! other faults, replays, faults paired with their replay, the latency percentiles (log2
//! buckets, so an upper bound within a factor of two) and maximum, dropped and skipped events.
//! It stops after `--for` seconds, when the process exits, or on SIGINT/SIGTERM (`run` then
//! kills its child), and then prints one JSON line with the totals and histograms.

use std::collections::HashSet;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use serde_json::json;
use wic_engine::Histogram;
use wic_kernel_io::uvmtools::{flush_events, Event, EventTracker, FaultStats, UvmToolsError};

const USAGE: &str = "usage: wic-uvmwatch watch --pid PID [--fd N] [OPTIONS]
       wic-uvmwatch run [OPTIONS] -- PROGRAM [ARGS...]
OPTIONS: [--range START-END | --range START+LEN]... [--for SECONDS] [--wait SECONDS]
         [--entries N] [--tools PATH] [--events] [--no-flush]";

struct Options {
    pid: i32,
    fd: Option<i32>,
    ranges: Vec<Range<u64>>,
    duration: Option<Duration>,
    wait: Duration,
    entries: u32,
    tools: PathBuf,
    print_events: bool,
    flush: bool,
    /// `run`: the program to start and watch.
    command: Vec<String>,
}

fn parse_u64(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => text.replace('_', "").parse(),
    };
    parsed.map_err(|e| format!("{text:?}: {e}"))
}

fn parse_range(text: &str) -> Result<Range<u64>, String> {
    if let Some((start, end)) = text.split_once('-') {
        let (start, end) = (parse_u64(start)?, parse_u64(end)?);
        if start >= end {
            return Err(format!("range {text:?} is empty"));
        }
        Ok(start..end)
    } else if let Some((start, len)) = text.split_once('+') {
        let (start, len) = (parse_u64(start)?, parse_u64(len)?);
        let end = start
            .checked_add(len)
            .filter(|&end| end > start)
            .ok_or_else(|| format!("range {text:?} is empty or overflows"))?;
        Ok(start..end)
    } else {
        Err(format!("range {text:?}: START-END or START+LEN"))
    }
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{text:?} is not a number of seconds"))
}

/// Options of `watch` (`run` false) or `run`.
fn parse_options(args: &[String], run: bool) -> Result<Options, String> {
    let mut options = Options {
        pid: 0,
        fd: None,
        ranges: Vec::new(),
        duration: None,
        wait: Duration::from_secs(10),
        entries: 1 << 14,
        tools: PathBuf::from("/dev/nvidia-uvm-tools"),
        print_events: false,
        flush: true,
        command: Vec::new(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--" if run => {
                options.command = args.by_ref().cloned().collect();
                break;
            }
            "--pid" if !run => options.pid = value()?.parse().map_err(|e| format!("--pid: {e}"))?,
            "--fd" if !run => options.fd = Some(value()?.parse().map_err(|e| format!("--fd: {e}"))?),
            "--range" => options.ranges.push(parse_range(value()?)?),
            "--for" => options.duration = Some(parse_seconds(value()?)?),
            "--wait" => options.wait = parse_seconds(value()?)?,
            "--entries" => options.entries = value()?.parse().map_err(|e| format!("--entries: {e}"))?,
            "--tools" => options.tools = PathBuf::from(value()?),
            "--events" => options.print_events = true,
            "--no-flush" => options.flush = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if run && options.command.is_empty() {
        return Err("run needs -- PROGRAM [ARGS...]".into());
    }
    if !run && options.pid <= 0 {
        return Err("--pid PID is required".into());
    }
    Ok(options)
}

fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags (none) and returns a new descriptor or -1;
    // it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the call just created, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Duplicates descriptor `target_fd` of the process behind `pidfd` into this process (the same
/// open file, close-on-exec here).
fn pidfd_getfd(pidfd: BorrowedFd<'_>, target_fd: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd(2) takes a pidfd, a descriptor number in the other process and flags
    // (none); it returns a new descriptor or -1 and touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the call just created, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The descriptors of `pid` that link to `/dev/nvidia-uvm`, ascending.
fn uvm_fds(pid: i32) -> std::io::Result<Vec<i32>> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(entry.path()).is_ok_and(|target| target.as_os_str() == "/dev/nvidia-uvm") {
            fds.push(fd);
        }
    }
    fds.sort_unstable();
    Ok(fds)
}

/// Finds the process's VA-space descriptor and attaches a tracker to it.
fn attach(options: &Options, pidfd: BorrowedFd<'_>) -> Result<(i32, OwnedFd, EventTracker), String> {
    let deadline = Instant::now() + options.wait;
    let mut refused = HashSet::new();
    loop {
        let candidates = match options.fd {
            Some(fd) => vec![fd],
            None => uvm_fds(options.pid).map_err(|e| format!("/proc/{}/fd: {e}", options.pid))?,
        };
        for fd in candidates {
            let uvm = pidfd_getfd(pidfd, fd).map_err(|e| {
                let hint = match e.raw_os_error() {
                    Some(libc::EPERM) => " (needs ptrace permission: root with CAP_SYS_PTRACE, or `wic-uvmwatch run`)",
                    _ => "",
                };
                format!("pidfd_getfd of fd {fd} of process {}: {e}{hint}", options.pid)
            })?;
            match EventTracker::attach(uvm.as_fd(), &options.tools, options.entries) {
                Ok(tracker) => return Ok((fd, uvm, tracker)),
                // Not (yet) a VA space: CUDA's second file, or one not initialized so far.
                Err(e) if e.is_not_va_space() => {
                    if refused.insert(fd) {
                        eprintln!("wic-uvmwatch: fd {fd}: {e}; trying the others");
                    }
                }
                Err(e) => return Err(format!("fd {fd}: {e}")),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no nvidia-uvm VA-space descriptor in process {} after {:?} (has it initialized CUDA?)",
                options.pid, options.wait
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() -> Result<(), String> {
    // No SA_RESTART: poll returns EINTR and the loop sees STOP.
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }.map_err(|e| format!("sigaction {signal}: {e}"))?;
    }
    Ok(())
}

fn describe(event: &Event) -> String {
    match event {
        Event::Fault(f) => format!(
            "fault gpu={} addr={:#x} access={} type={} client={:?} batch={} cpu_ns={} gpu_ns={}",
            f.gpu_index,
            f.address,
            f.access.name(),
            f.fault_type.name(),
            f.client,
            f.batch_id,
            f.cpu_ns,
            f.gpu_ns
        ),
        Event::Replay(r) => {
            format!(
                "replay gpu={} client={:?} batch={} cpu_ns={} gpu_ns={}",
                r.gpu_index, r.client, r.batch_id, r.cpu_ns, r.gpu_ns
            )
        }
        Event::Fatal(f) => format!(
            "fatal processor={} addr={:#x} access={} type={} reason={} cpu_ns={}",
            f.processor_index,
            f.address,
            f.access.name(),
            f.fault_type.name(),
            f.reason,
            f.cpu_ns
        ),
    }
}

/// Takes every waiting event into `stats`.
fn drain(tracker: &mut EventTracker, events: &mut Vec<Event>, stats: &mut FaultStats, print: bool) {
    // A few rounds at most, so a busy queue cannot starve the once-a-second line.
    for _ in 0..16 {
        events.clear();
        if tracker.poll_events(events) == 0 {
            break;
        }
        if print {
            for event in events.iter() {
                println!("{}", describe(event));
            }
        }
        stats.record_all(events.iter());
    }
}

fn micros(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn latency_text(h: &Histogram) -> String {
    match h.quantile(0.5) {
        Some(p50) => format!("p50<={}us max={}us n={}", micros(p50), micros(h.max()), h.count()),
        None => "-".into(),
    }
}

fn histogram_json(h: &Histogram) -> serde_json::Value {
    json!({
        "count": h.count(),
        "sum": h.sum(),
        "min": h.min(),
        "max": h.max(),
        "p50": h.quantile(0.5),
        "p90": h.quantile(0.9),
        "p99": h.quantile(0.99),
        "buckets": h.buckets().map(|(upper, n)| [upper, n]).collect::<Vec<_>>(),
    })
}

fn status_line(seconds: f64, stats: &FaultStats, last_watched: u64, tracker: &EventTracker) -> String {
    let (fatal_watched, fatal_other) = stats.fatal();
    format!(
        "t={seconds:.0}s watched={}(+{}) other={} replays={} paired={} waiting={} unpaired={} lat_cpu {} lat_gpu {} fatal={}/{} dropped={} skipped={}",
        stats.watched_faults(),
        stats.watched_faults() - last_watched,
        stats.other_faults(),
        stats.replays(),
        stats.paired(),
        stats.waiting(),
        stats.unpaired(),
        latency_text(stats.latency_cpu()),
        latency_text(stats.latency_gpu()),
        fatal_watched,
        fatal_other,
        tracker.dropped(),
        tracker.skipped(),
    )
}

/// Watches `options.pid` (`child`, if `run` started it) until the end, printing the lines and the
/// summary.
fn watch(options: &Options, child: Option<&mut Child>) -> Result<(), String> {
    let pidfd = pidfd_open(options.pid).map_err(|e| format!("pidfd_open({}): {e}", options.pid))?;
    let (fd, uvm, mut tracker) = attach(options, pidfd.as_fd())?;
    install_signal_handlers()?;
    let every = std::iter::once(0..u64::MAX).filter(|_| options.ranges.is_empty());
    let mut stats = FaultStats::new(options.ranges.iter().cloned().chain(every));
    println!(
        "attached to process {} fd {fd}: {} queue entries, {} watched range(s){}; CPU times are CLOCK_MONOTONIC_RAW",
        options.pid,
        options.entries,
        stats.ranges().len(),
        if options.ranges.is_empty() { " (every address)" } else { "" },
    );

    let start = Instant::now();
    let end = options.duration.map(|d| start + d);
    let mut next_tick = start + Duration::from_secs(1);
    let mut events = Vec::new();
    let mut last_watched = 0;
    let mut flush_failed = false;
    let reason = loop {
        let now = Instant::now();
        let until = end.map_or(next_tick, |end| end.min(next_tick));
        let wait = until.saturating_duration_since(now);
        let timeout = PollTimeout::try_from(wait.as_micros().div_ceil(1000) as u64).unwrap_or(PollTimeout::MAX);
        let (events_ready, target_exited) = {
            let mut fds = [PollFd::new(tracker.fd(), PollFlags::POLLIN), PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(format!("poll: {e}")),
            }
            let ready =
                |fd: &PollFd<'_>| fd.revents().is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLERR));
            (ready(&fds[0]), ready(&fds[1]))
        };
        if events_ready {
            drain(&mut tracker, &mut events, &mut stats, options.print_events);
        }
        if STOP.load(Ordering::Relaxed) {
            break "signal";
        }
        if target_exited {
            break "target exited";
        }
        let now = Instant::now();
        if end.is_some_and(|end| now >= end) {
            break "time";
        }
        if now >= next_tick {
            if options.flush && !flush_failed {
                match flush_events(uvm.as_fd()) {
                    Ok(()) => {}
                    // The driver's power-management lock was taken: try again next second.
                    Err(UvmToolsError::Ioctl { errno: Errno::EAGAIN, .. }) => {}
                    Err(e) => {
                        eprintln!("wic-uvmwatch: {e}; no more flushes");
                        flush_failed = true;
                    }
                }
            }
            drain(&mut tracker, &mut events, &mut stats, options.print_events);
            println!("{}", status_line(now.duration_since(start).as_secs_f64(), &stats, last_watched, &tracker));
            last_watched = stats.watched_faults();
            next_tick += Duration::from_secs(1);
        }
    };
    if options.flush && !flush_failed {
        let _ = flush_events(uvm.as_fd());
    }
    drain(&mut tracker, &mut events, &mut stats, options.print_events);
    let seconds = start.elapsed().as_secs_f64();
    println!("{}", status_line(seconds, &stats, last_watched, &tracker));
    let target_status = match child {
        Some(child) => {
            if reason != "target exited" {
                let _ = child.kill();
            }
            child.wait().map(|status| status.to_string()).ok()
        }
        None => None,
    };
    let (fatal_watched, fatal_other) = stats.fatal();
    let summary = json!({
        "pid": options.pid,
        "uvm_fd": fd,
        "seconds": seconds,
        "stopped_by": reason,
        "target_status": target_status,
        "ranges": stats.ranges().iter().map(|&(s, e)| [format!("{s:#x}"), format!("{e:#x}")]).collect::<Vec<_>>(),
        "faults_watched": stats.watched_faults(),
        "faults_other": stats.other_faults(),
        "replays": stats.replays(),
        "paired": stats.paired(),
        "unpaired": stats.unpaired(),
        "waiting": stats.waiting(),
        "fatal_watched": fatal_watched,
        "fatal_other": fatal_other,
        "latency_cpu_ns": histogram_json(stats.latency_cpu()),
        "latency_gpu_ns": histogram_json(stats.latency_gpu()),
        "dropped": tracker.dropped(),
        "skipped": tracker.skipped(),
        "queue_entries": options.entries,
    });
    println!("{summary}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let run = match args.first().map(String::as_str) {
        Some("watch") => false,
        Some("run") => true,
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut options = match parse_options(&args[1..], run) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("wic-uvmwatch: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut child = None;
    if run {
        match Command::new(&options.command[0]).args(&options.command[1..]).spawn() {
            Ok(started) => {
                options.pid = started.id() as i32;
                child = Some(started);
            }
            Err(e) => {
                eprintln!("wic-uvmwatch: cannot start {:?}: {e}", options.command[0]);
                return ExitCode::FAILURE;
            }
        }
    }
    let result = watch(&options, child.as_mut());
    if let (Err(_), Some(child)) = (&result, child.as_mut()) {
        let _ = child.kill();
        let _ = child.wait();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wic-uvmwatch: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges() {
        assert_eq!(parse_range("0x1000-0x3000"), Ok(0x1000..0x3000));
        assert_eq!(parse_range("4096+8192"), Ok(4096..12288));
        assert_eq!(parse_range("0x7f00_0000_0000+0x20_0000"), Ok(0x7f00_0000_0000..0x7f00_0020_0000));
        assert!(parse_range("0x3000-0x1000").is_err());
        assert!(parse_range("0x1000+0").is_err());
        assert!(parse_range("0xffffffffffffffff+2").is_err());
        assert!(parse_range("0x1000").is_err());
    }

    #[test]
    fn parses_options() {
        let args: Vec<String> =
            ["--pid", "42", "--range", "0x1000+0x1000", "--for", "2.5", "--events"].map(String::from).into();
        let options = parse_options(&args, false).unwrap();
        assert_eq!((options.pid, options.fd, options.entries), (42, None, 1 << 14));
        assert_eq!(options.ranges.len(), 1);
        assert_eq!(options.ranges[0], 0x1000..0x2000);
        assert_eq!(options.duration, Some(Duration::from_millis(2500)));
        assert!(options.print_events && options.flush);
        assert!(parse_options(&["--fd".to_string(), "3".to_string()], false).is_err(), "the pid is required");
        assert!(parse_options(&["--pid".to_string()], false).is_err());

        let args: Vec<String> = ["--for", "1", "--", "./app", "--for", "x"].map(String::from).into();
        let options = parse_options(&args, true).unwrap();
        assert_eq!(options.command, ["./app", "--for", "x"]);
        assert_eq!(options.duration, Some(Duration::from_secs(1)));
        assert!(parse_options(&["--for".to_string(), "1".to_string()], true).is_err(), "run needs a program");
        assert!(
            parse_options(&["--pid".to_string(), "1".to_string(), "--".to_string(), "x".to_string()], true).is_err()
        );
    }
}
