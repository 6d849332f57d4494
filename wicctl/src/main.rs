//! wicctl: query a running wicd and decode GPU fault-buffer entries.

// Input reaches this crate from clients, devices and files: failures are errors, never panics.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod render;
mod watch;

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::{Args, Parser, Subcommand};
use wic_proto::client::{Client, ClientError, Timeout};
use wic_proto::message::{ErrorCode, Reply, Request, Stats, Status};
use wic_types::fault::{RawFaultEntry, VaWidth};

/// Longest `--watch` interval: a day. Longer ones are surely typos.
const MAX_WATCH_SECS: f64 = 86_400.0;

/// What `wicctl --help` says about the exit status.
const EXIT_STATUS_HELP: &str = "\
Exit status: 0 done; 1 wicd cannot be reached, refused, timed out or answered nonsense (or the
output could not be written); 2 bad arguments or a malformed $WIC_TIMEOUT_MS; 3 wicd is stopping,
or hung up after answering the hello (it stopped, e.g. during stats --watch); 4 drain --wait
ran out with channels left, or the drain was undone meanwhile.";

/// How often `drain` asks wicd how many channels are left.
const DRAIN_POLL: Duration = Duration::from_secs(1);

#[derive(Parser, Debug)]
#[command(version, about, after_help = EXIT_STATUS_HELP)]
struct Cli {
    /// The socket wicd listens on ($WIC_SOCKET, unless empty, overrides the built-in default).
    #[arg(long, global = true, value_name = "PATH", default_value_os_t = wic_proto::socket_path(None))]
    socket: PathBuf,
    /// Longest wait for wicd in milliseconds, for the whole command (with --watch, for each
    /// sample): 1 to 3600000, or 0 for none [default: $WIC_TIMEOUT_MS, else 10000].
    #[arg(long, global = true, value_name = "MS", value_parser = Timeout::parse)]
    timeout_ms: Option<Timeout>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show the daemon's version, backend and load.
    Status(JsonArg),
    /// List channels with their owners and counters: every channel for root and wicd's user.
    ///
    /// Root and the daemon's own user see every channel; any other user sees the channels of
    /// their uid and those they attached to through a grant.
    Channels(JsonArg),
    /// Show the engine and backend statistics.
    Stats(StatsArgs),
    /// Print the statistics in the Prometheus text exposition format.
    Metrics,
    /// Decode a raw 32-byte fault-buffer entry given as 64 hex digits (no daemon needed).
    DecodeFault(DecodeFaultArgs),
    /// Refuse new channels and wait until those there are have ended, before wicd is stopped
    /// or restarted (root and wicd's user only).
    ///
    /// A fault on a channel's pages while no wicd runs is served with the page's old contents:
    /// stop wicd only once this says the channels have ended. The drain lasts until `--undo`
    /// or wicd's restart; channels that exist keep working meanwhile. --timeout-ms bounds each
    /// request, not the wait.
    Drain(DrainArgs),
}

#[derive(Args, Debug)]
struct DrainArgs {
    /// Undo a drain: wicd creates channels again.
    #[arg(long, conflicts_with_all = ["no_wait", "wait"])]
    undo: bool,
    /// Only start the drain; do not wait for the channels to end.
    #[arg(long, conflicts_with = "wait")]
    no_wait: bool,
    /// Give up waiting after SECS seconds (exit status 4; the drain stays on) [default: wait
    /// until the channels have ended].
    #[arg(long, value_name = "SECS", value_parser = parse_interval)]
    wait: Option<Duration>,
}

/// The `--json` switch of the commands that have nothing else.
#[derive(Args, Debug)]
struct JsonArg {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct StatsArgs {
    /// Print JSON instead of text; with --watch, one compact object per line.
    #[arg(long)]
    json: bool,
    /// Repeat every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS", value_parser = parse_interval)]
    watch: Option<Duration>,
    /// Stop after N samples.
    #[arg(long, value_name = "N", requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
}

#[derive(Args, Debug)]
struct DecodeFaultArgs {
    /// The entry, byte 0 first; `0x`, blanks, `_` and `:` are ignored, so it may span arguments.
    #[arg(value_name = "HEX", required = true, num_args = 1..)]
    hex: Vec<String>,
    /// Width of the GPU's virtual addresses: 49 (Volta to Ada) or 57 (Hopper).
    #[arg(long, value_name = "BITS", default_value = "57", value_parser = parse_va_bits)]
    va_bits: VaWidth,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Parses a `--watch` interval: seconds, fractions allowed.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let secs: f64 = text.parse().map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= MAX_WATCH_SECS) {
        return Err(format!("the interval must be more than 0 and at most {MAX_WATCH_SECS} seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `--va-bits`.
fn parse_va_bits(text: &str) -> Result<VaWidth, String> {
    match text {
        "49" => Ok(VaWidth::Bits49),
        "57" => Ok(VaWidth::Bits57),
        _ => Err(format!("`{text}` is not a VA width: use 49 or 57")),
    }
}

/// Why a command failed; decides the exit status ([`EXIT_STATUS_HELP`]).
#[derive(Debug)]
enum Failure {
    /// wicd could not be reached, refused, timed out or answered nonsense: status 1.
    Daemon(String),
    /// The arguments are wrong: status 2, as for clap's own errors.
    Usage(String),
    /// wicd said it is stopping, or hung up after the hello: status 3.
    Stopped(String),
    /// Writing the output failed.
    Output(io::Error),
    /// `drain` ended with channels left: status 4.
    NotDrained(String),
}

impl Failure {
    fn exit_code(&self) -> ExitCode {
        match self {
            Self::Daemon(_) | Self::Output(_) => ExitCode::from(1),
            Self::Usage(_) => ExitCode::from(2),
            Self::Stopped(_) => ExitCode::from(3),
            Self::NotDrained(_) => ExitCode::from(4),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Daemon(message) | Self::Usage(message) | Self::Stopped(message) | Self::NotDrained(message) => {
                f.write_str(message)
            }
            Self::Output(e) => write!(f, "cannot write the output: {e}"),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Output(e)
    }
}

/// A session with wicd that remembers its socket and timeout, for error messages.
struct Session {
    client: Client,
    path: PathBuf,
    /// How long the command, or one sample of `--watch`, may take.
    timeout: Timeout,
    /// When the command, or the sample, started.
    since: Instant,
}

impl Session {
    /// Connects to the daemon at `path`; `timeout` (`None`: `$WIC_TIMEOUT_MS`) bounds the whole
    /// command, so that one of several requests (`metrics`) also ends in time when run from a
    /// timer.
    fn connect(path: &Path, timeout: Option<Timeout>) -> Result<Self, Failure> {
        let timeout = match timeout {
            Some(timeout) => timeout,
            None => Timeout::from_env().map_err(Failure::Usage)?,
        };
        let since = Instant::now();
        match Client::connect_with_timeout(path, "wicctl", timeout) {
            Ok(client) => Ok(Self { client, path: path.to_owned(), timeout, since }),
            Err(e) => Err(daemon_failure(path, timeout, e, false)),
        }
    }

    /// Gives the next requests the whole timeout again: each sample of `--watch` has its own.
    fn restart_clock(&mut self) {
        self.since = Instant::now();
    }

    /// Sends `request` and returns the reply, by the command's deadline.
    fn call(&mut self, request: &Request) -> Result<Reply, Failure> {
        if let Some(limit) = self.timeout.limit() {
            self.client.set_timeout(Timeout::after(limit.saturating_sub(self.since.elapsed())));
        }
        self.client.call(request).map_err(|e| daemon_failure(&self.path, self.timeout, e, true))
    }

    /// Sends a request that wicd grants to operators alone.
    fn call_as_operator(&mut self, request: &Request) -> Result<Reply, Failure> {
        self.call(request).map_err(|failure| match failure {
            Failure::Daemon(message) if message.contains(PERMISSION_HINT) => {
                Failure::Daemon(message.replace(PERMISSION_HINT, "only root and wicd's own user may ask this"))
            }
            // serde's word for an op it does not know: a wicd older than the request.
            Failure::Daemon(message) if message.contains("unknown variant") => {
                Failure::Daemon(format!("{message}; this wicd is older than wicctl and cannot do this: upgrade it"))
            }
            other => other,
        })
    }

    fn status(&mut self) -> Result<Status, Failure> {
        match self.call(&Request::Status {})? {
            Reply::Status(status) => Ok(status),
            other => Err(self.unexpected("status", &other)),
        }
    }

    fn stats(&mut self) -> Result<Stats, Failure> {
        match self.call(&Request::Stats {})? {
            Reply::Stats(stats) => Ok(*stats),
            other => Err(self.unexpected("stats", &other)),
        }
    }

    /// The failure for a reply of the wrong kind.
    fn unexpected(&self, request: &str, reply: &Reply) -> Failure {
        Failure::Daemon(format!("wicd at {} answered {request} with {reply:?}", self.path.display()))
    }
}

/// What a refusal for want of permission suggests, for the requests anyone in the group may make.
const PERMISSION_HINT: &str = "are you in the `wic` group?";

/// Explains a client error, naming the socket and what usually causes it. `greeted`: wicd had
/// answered the hello, so its hanging up now means it stopped.
fn daemon_failure(path: &Path, timeout: Timeout, error: ClientError, greeted: bool) -> Failure {
    let at = path.display();
    match error.code() {
        ErrorCode::Stopping => return Failure::Stopped(format!("wicd is stopping (socket {at})")),
        // Between requests wicd hangs up only when it stops.
        ErrorCode::Connect if greeted => return Failure::Stopped(format!("wicd stopped (socket {at})")),
        _ => {}
    }
    Failure::Daemon(match error {
        ClientError::Connect(e) => {
            let why = match e.kind() {
                io::ErrorKind::NotFound => {
                    "no such socket; is wicd running? (--socket or $WIC_SOCKET choose another)".to_owned()
                }
                io::ErrorKind::ConnectionRefused => "connection refused; is wicd running?".to_owned(),
                io::ErrorKind::PermissionDenied => format!("permission denied; {PERMISSION_HINT}"),
                _ => {
                    // The client puts the path in front of the system's message; it is said already.
                    let text = e.to_string();
                    let reason = text.strip_prefix(&format!("{at}: ")).unwrap_or(&text).to_owned();
                    format!("{reason}; is wicd running?")
                }
            };
            format!("cannot connect to wicd at {at}: {why}")
        }
        ClientError::TimedOut(_) => format!(
            "timed out: wicd at {at} did not answer within {timeout}; is it stopped or overloaded? \
             (--timeout-ms or $WIC_TIMEOUT_MS set the limit)"
        ),
        ClientError::Refused(e) if e.code == ErrorCode::Permission => {
            format!("wicd at {at} refused: {e}; {PERMISSION_HINT}")
        }
        other => format!("{other} (socket {at})"),
    })
}

/// Runs the command line, writing what it prints to `out`.
fn run(cli: Cli, out: &mut dyn Write) -> Result<(), Failure> {
    match cli.command {
        Command::Status(JsonArg { json }) => {
            let status = Session::connect(&cli.socket, cli.timeout_ms)?.status()?;
            if json {
                writeln!(out, "{}", to_json_pretty(&status))?;
            } else {
                out.write_all(render::status(&status).as_bytes())?;
            }
        }
        Command::Channels(JsonArg { json }) => {
            let mut session = Session::connect(&cli.socket, cli.timeout_ms)?;
            let channels = match session.call(&Request::Channels {})? {
                Reply::Channels { channels } => channels,
                other => return Err(session.unexpected("channels", &other)),
            };
            if json {
                writeln!(out, "{}", to_json_pretty(&channels))?;
            } else {
                out.write_all(render::channels(&channels).as_bytes())?;
            }
        }
        Command::Stats(args) => stats(&mut Session::connect(&cli.socket, cli.timeout_ms)?, &args, out)?,
        Command::Metrics => {
            let mut session = Session::connect(&cli.socket, cli.timeout_ms)?;
            let stats = session.stats()?;
            let status = session.status()?;
            out.write_all(render::metrics(&stats, &status).as_bytes())?;
        }
        Command::Drain(args) => drain(&mut Session::connect(&cli.socket, cli.timeout_ms)?, &args, out)?,
        Command::DecodeFault(args) => {
            let raw = RawFaultEntry::from_hex(&args.hex.join(" "))
                .map_err(|e| Failure::Usage(format!("bad fault entry: {e}")))?;
            if args.json {
                writeln!(out, "{}", to_json_pretty(&render::fault_json(&raw, args.va_bits)))?;
            } else {
                out.write_all(render::fault_text(&raw, args.va_bits).as_bytes())?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// `wicctl drain`: starts (or undoes) the drain, then waits, saying what is left whenever that
/// changes, until no channel is left.
fn drain(session: &mut Session, args: &DrainArgs, out: &mut dyn Write) -> Result<(), Failure> {
    match session.call_as_operator(&Request::Drain { on: !args.undo })? {
        Reply::Done => {}
        other => return Err(session.unexpected("drain", &other)),
    }
    if args.undo {
        writeln!(out, "drain undone: wicd creates channels again")?;
        return Ok(());
    }
    writeln!(out, "draining: wicd refuses new channels (wicctl drain --undo ends this)")?;
    out.flush()?;
    if args.no_wait {
        return Ok(());
    }
    let started = Instant::now();
    let mut told = None;
    loop {
        session.restart_clock();
        let status = session.status()?;
        if !status.draining {
            return Err(Failure::NotDrained("the drain was undone (wicctl drain --undo) while waiting".into()));
        }
        if status.channels == 0 && status.held == 0 {
            writeln!(out, "drained: no channels left; wicd may be stopped or restarted now")?;
            return Ok(());
        }
        let left = (status.channels, status.held);
        if told != Some(left) {
            let waited = started.elapsed().as_secs();
            writeln!(out, "{waited} s: waiting for {} channels to end ({} held faults)", left.0, left.1)?;
            out.flush()?;
            told = Some(left);
        }
        let pause = match args.wait {
            Some(limit) => {
                let remaining = limit.saturating_sub(started.elapsed());
                if remaining.is_zero() {
                    return Err(Failure::NotDrained(format!(
                        "{} channels are left after {limit:?}; the drain stays on (wicctl channels lists them, \
                         wicctl drain --undo ends it)",
                        status.channels
                    )));
                }
                remaining.min(DRAIN_POLL)
            }
            None => DRAIN_POLL,
        };
        std::thread::sleep(pause);
    }
}

/// `value` as indented JSON.
fn to_json_pretty(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).expect("protocol types always serialize")
}

/// `wicctl stats`, once or, with `--watch`, repeatedly.
fn stats(session: &mut Session, args: &StatsArgs, out: &mut dyn Write) -> Result<(), Failure> {
    let count = match args.watch {
        Some(_) => args.count,
        None => Some(1),
    };
    let mut ticker = watch::Ticker::new(args.watch.unwrap_or_default(), count);
    // The previous sample's time and faults_completed, for the rate.
    let mut previous: Option<(Instant, u64)> = None;
    while ticker.wait() {
        if previous.is_some() {
            session.restart_clock();
        }
        let stats = session.stats()?;
        let now = Instant::now();
        match (args.json, args.watch.is_some()) {
            (true, true) => writeln!(out, "{}", serde_json::to_string(&stats).expect("Stats always serialize"))?,
            (true, false) => writeln!(out, "{}", to_json_pretty(&stats))?,
            (false, watching) => {
                if watching {
                    let separator = if previous.is_some() { "\n" } else { "" };
                    write!(out, "{separator}{}", render::watch_header(&watch::utc_timestamp(SystemTime::now())))?;
                }
                let rate = previous.and_then(|(then, completed)| {
                    let secs = now.duration_since(then).as_secs_f64();
                    // A smaller count means the daemon restarted: no rate for that interval.
                    let delta = stats.faults_completed.checked_sub(completed)?;
                    (secs > 0.0).then(|| delta as f64 / secs)
                });
                out.write_all(render::stats(&stats, rate).as_bytes())?;
            }
        }
        // Pipes are block-buffered: each sample must reach the reader when it is taken.
        out.flush()?;
        previous = Some((now, stats.faults_completed));
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = io::stdout().lock();
    match run(cli, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`wicctl stats --watch | head`): nothing left to do.
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("wicctl: {failure}");
            failure.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    use wic_proto::frame;
    use wic_proto::message::{Response, WireError};
    use wic_types::fault::{AccessType, FaultEntry};

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn command_line_checks_its_values() {
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("wicctl").chain(args.iter().copied()));
        let ok = parse(&["--socket", "/tmp/x.sock", "stats", "--watch", "0.5", "--count", "3"]).unwrap();
        assert_eq!(ok.socket, Path::new("/tmp/x.sock"));
        let Command::Stats(args) = ok.command else { panic!("stats") };
        assert_eq!((args.watch, args.count), (Some(Duration::from_millis(500)), Some(3)));
        for bad in [
            &["stats", "--watch", "0"][..],
            &["stats", "--watch", "-1"],
            &["stats", "--watch", "NaN"],
            &["stats", "--watch", "1e9"],
            &["stats", "--count", "2"],
            &["stats", "--watch", "1", "--count", "0"],
            &["decode-fault", "00", "--va-bits", "48"],
            &["decode-fault"],
        ] {
            let err = parse(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
        }
        // The socket option also works after the subcommand.
        let late = parse(&["status", "--socket", "/tmp/y.sock"]).unwrap();
        assert_eq!(late.socket, Path::new("/tmp/y.sock"));
    }

    /// Runs `args` and returns its output or failure.
    fn run_args(args: &[&str]) -> Result<String, Failure> {
        let cli = Cli::try_parse_from(std::iter::once("wicctl").chain(args.iter().copied())).unwrap();
        let mut out = Vec::new();
        run(cli, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn decode_fault_accepts_split_hex_and_rejects_bad_hex() {
        let entry = FaultEntry::replayable_gpc(0x7f12_3456_7000, AccessType::Read, 99, 0x1000, 2, 7);
        let hex = entry.encode().to_hex();
        let (first, second) = hex.split_at(32);
        let text = run_args(&["decode-fault", &format!("0x{first}"), second]).unwrap();
        assert!(text.contains("0x00007f1234567000") && text.contains("VIRT_READ"), "{text}");
        let json = run_args(&["decode-fault", "--json", &hex]).unwrap();
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(json["access_type"], "VIRT_READ");

        for bad in [&hex[..60], "zz"] {
            let failure = run_args(&["decode-fault", bad]).unwrap_err();
            assert!(matches!(failure, Failure::Usage(_)), "{failure:?}");
            assert_eq!(failure.exit_code(), ExitCode::from(2));
            assert!(failure.to_string().starts_with("bad fault entry: "), "{failure}");
        }
    }

    #[test]
    fn a_missing_daemon_is_explained() {
        let path = std::env::temp_dir().join(format!("wicctl-test-{}-absent.sock", std::process::id()));
        let failure = run_args(&["--socket", path.to_str().unwrap(), "status"]).unwrap_err();
        assert_eq!(failure.exit_code(), ExitCode::from(1));
        let message = failure.to_string();
        assert!(message.contains(path.to_str().unwrap()) && message.contains("is wicd running"), "{message}");
    }

    /// A daemon on a fresh socket that answers `hello`, then each request with `answer`, or
    /// hangs up where that is `None`; it serves one connection after the other.
    fn fake_daemon(name: &str, answer: impl Fn(&Request) -> Option<Response> + Send + Sync + 'static) -> PathBuf {
        let path = std::env::temp_dir().join(format!("wicctl-test-{}-{name}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let answer = std::sync::Arc::new(answer);
        std::thread::spawn(move || {
            // Each connection on its own thread, as wicd serves them: one may wait on another.
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let mut header = [0u8; frame::HEADER_BYTES];
                    // A failed read is the client hanging up.
                    while stream.read_exact(&mut header).is_ok() {
                        let mut body = vec![0u8; frame::body_len(header, 1 << 20).unwrap()];
                        stream.read_exact(&mut body).unwrap();
                        let response = match serde_json::from_slice::<Request>(&body).unwrap() {
                            Request::Hello { .. } => Response::Ok(Reply::Hello {
                                version: wic_proto::PROTOCOL_VERSION,
                                daemon: "test".into(),
                                backend: "emulated".into(),
                                warps_per_batch: 16,
                            }),
                            request => match answer(&request) {
                                Some(response) => response,
                                None => break,
                            },
                        };
                        stream.write_all(&frame::encode(&serde_json::to_vec(&response).unwrap())).unwrap();
                    }
                });
            }
        });
        path
    }

    /// A fake daemon whose `faults_completed` grows by 10 with each stats request; it stops
    /// (hangs up) instead of answering request `stop_at`.
    fn counting_daemon(name: &str, stop_at: Option<u64>) -> PathBuf {
        let served = std::sync::atomic::AtomicU64::new(0);
        fake_daemon(name, move |request| {
            assert_eq!(request, &Request::Stats {});
            let n = served.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            (Some(n) != stop_at)
                .then(|| Response::Ok(Reply::Stats(Box::new(Stats { faults_completed: 10 * n, ..Stats::default() }))))
        })
    }

    #[test]
    fn stats_watch_prints_json_lines() {
        let path = counting_daemon("json-lines", None);
        let socket = path.to_str().unwrap();
        let text = run_args(&["--socket", socket, "stats", "--json", "--watch", "0.01", "--count", "3"]);
        let _ = std::fs::remove_file(&path);
        let completed: Vec<u64> =
            text.unwrap().lines().map(|line| serde_json::from_str::<Stats>(line).unwrap().faults_completed).collect();
        assert_eq!(completed, [10, 20, 30]);
    }

    #[test]
    fn stats_watch_prints_headers_and_rates() {
        let path = counting_daemon("human", None);
        let text = run_args(&["--socket", path.to_str().unwrap(), "stats", "--watch", "0.01", "--count", "2"]).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(text.lines().filter(|l| l.starts_with("--- ") && l.ends_with("Z ---")).count(), 2, "{text}");
        // Only the second sample has a previous one to take a rate from.
        assert_eq!(text.matches("faults_completed_per_sec").count(), 1, "{text}");
    }

    #[test]
    fn metrics_and_refusals_through_a_daemon() {
        let path = fake_daemon("metrics", |request| {
            Some(match request {
                Request::Stats {} => Response::Ok(Reply::Stats(Box::new(Stats { replays: 77, ..Stats::default() }))),
                Request::Status {} => Response::Ok(Reply::Status(Status {
                    version: "9.9.9".into(),
                    protocol: 1,
                    pid: 1,
                    backend: "shim".into(),
                    gpus: 1,
                    uptime_ns: 5_000_000_000,
                    clients: 1,
                    channels: 0,
                    held: 0,
                    pool_pages: 0,
                    pool_pages_used: 0,
                    draining: false,
                })),
                _ => Response::Error(WireError::new(ErrorCode::Permission, "not for you")),
            })
        });
        let socket = path.to_str().unwrap();
        let text = run_args(&["--socket", socket, "metrics"]).unwrap();
        assert!(text.lines().any(|l| l == "wic_replays_total 77"), "{text}");
        assert!(text.lines().any(|l| l == "wic_uptime_seconds 5"), "{text}");
        assert!(text.contains(r#"wic_info{version="9.9.9",backend="shim"} 1"#), "{text}");
        let failure = run_args(&["--socket", socket, "channels"]).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(failure.exit_code(), ExitCode::from(1));
        assert!(failure.to_string().contains("`wic` group"), "{failure}");
    }

    /// A daemon that takes `drain` and reports `left` channels at each status, then none; its
    /// status says `draining` as the last drain request set it.
    fn draining_daemon(name: &str, left: &'static [u32]) -> PathBuf {
        let draining = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let asked = std::sync::atomic::AtomicUsize::new(0);
        fake_daemon(name, move |request| {
            use std::sync::atomic::Ordering::Relaxed;
            Some(match request {
                Request::Drain { on } => {
                    draining.store(*on, Relaxed);
                    Response::Ok(Reply::Done)
                }
                Request::Status {} => {
                    let channels = left.get(asked.fetch_add(1, Relaxed)).copied().unwrap_or(0);
                    Response::Ok(Reply::Status(Status {
                        version: "0.1.0".into(),
                        protocol: 1,
                        pid: 1,
                        backend: "shim".into(),
                        gpus: 0,
                        uptime_ns: 0,
                        clients: 1,
                        channels,
                        held: channels.min(1),
                        pool_pages: 0,
                        pool_pages_used: 0,
                        draining: draining.load(Relaxed),
                    }))
                }
                other => panic!("drain asked {other:?}"),
            })
        })
    }

    #[test]
    fn drain_waits_for_the_channels_to_end_saying_what_is_left() {
        let path = draining_daemon("drain", &[2, 2, 1]);
        let text = run_args(&["--socket", path.to_str().unwrap(), "drain"]);
        let _ = std::fs::remove_file(&path);
        let text = text.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("draining: wicd refuses new channels"), "{text}");
        assert!(lines[1].ends_with("waiting for 2 channels to end (1 held faults)"), "{text}");
        assert!(lines[2].ends_with("waiting for 1 channels to end (1 held faults)"), "{text}");
        assert!(lines[3].starts_with("drained: no channels left"), "{text}");
    }

    #[test]
    fn drain_gives_up_after_its_wait_and_the_drain_stays_on() {
        let path = draining_daemon("drain-wait", &[3; 64]);
        let started = Instant::now();
        let failure = run_args(&["--socket", path.to_str().unwrap(), "drain", "--wait", "0.2"]).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
        assert_eq!(failure.exit_code(), ExitCode::from(4));
        assert!(failure.to_string().starts_with("3 channels are left after"), "{failure}");
    }

    #[test]
    fn drain_undone_while_waiting_fails_and_undo_says_so() {
        // Each status comes from a fresh connection's view of the same daemon: a second wicctl
        // undoes the drain while the first waits.
        let path = draining_daemon("drain-undo", &[1; 64]);
        let socket = path.to_str().unwrap().to_owned();
        let waiting = std::thread::spawn({
            let socket = socket.clone();
            move || run_args(&["--socket", &socket, "drain"])
        });
        std::thread::sleep(Duration::from_millis(300));
        let undone = run_args(&["--socket", &socket, "drain", "--undo"]).unwrap();
        let failure = waiting.join().unwrap().unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(undone.trim(), "drain undone: wicd creates channels again");
        assert_eq!(failure.exit_code(), ExitCode::from(4));
        assert!(failure.to_string().contains("the drain was undone"), "{failure}");
    }

    #[test]
    fn drain_refused_names_who_may() {
        let path =
            fake_daemon("drain-refused", |_| Some(Response::Error(WireError::new(ErrorCode::Permission, "operators"))));
        let failure = run_args(&["--socket", path.to_str().unwrap(), "drain", "--no-wait"]).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(failure.exit_code(), ExitCode::from(1));
        let message = failure.to_string();
        assert!(message.contains("only root and wicd's own user") && !message.contains("group"), "{message}");
        let old = fake_daemon("drain-old", |_| {
            Some(Response::Error(WireError::new(
                ErrorCode::Invalid,
                "unknown variant `drain`, expected one of `hello`",
            )))
        });
        let failure = run_args(&["--socket", old.to_str().unwrap(), "drain", "--no-wait"]).unwrap_err();
        let _ = std::fs::remove_file(&old);
        assert!(failure.to_string().contains("this wicd is older than wicctl"), "{failure}");
        let clash = Cli::try_parse_from(["wicctl", "drain", "--undo", "--wait", "5"]);
        assert!(clash.is_err(), "--undo with --wait was taken");
    }

    #[test]
    fn stats_watch_says_when_wicd_stops() {
        let path = counting_daemon("stops", Some(3));
        let cli =
            Cli::try_parse_from(["wicctl", "--socket", path.to_str().unwrap(), "stats", "--json", "--watch", "0.01"])
                .unwrap();
        let mut out = Vec::new();
        let failure = run(cli, &mut out).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 2, "two samples before it stopped");
        assert_eq!(failure.to_string(), format!("wicd stopped (socket {})", path.display()));
        assert_eq!(failure.exit_code(), ExitCode::from(3));
    }

    #[test]
    fn a_daemon_that_is_stopping_is_said_to_be() {
        let path =
            fake_daemon("stopping", |_| Some(Response::Error(WireError::new(ErrorCode::Stopping, "shutting down"))));
        let failure = run_args(&["--socket", path.to_str().unwrap(), "status"]).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(failure.to_string(), format!("wicd is stopping (socket {})", path.display()));
        assert_eq!(failure.exit_code(), ExitCode::from(3));
    }

    #[test]
    fn timeouts_are_checked_and_bound_the_whole_command() {
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("wicctl").chain(args.iter().copied()));
        assert_eq!(
            parse(&["status", "--timeout-ms", "250"]).unwrap().timeout_ms,
            Some(Timeout::after(Duration::from_millis(250)))
        );
        assert_eq!(parse(&["--timeout-ms", "0", "metrics"]).unwrap().timeout_ms, Some(Timeout::NEVER));
        assert_eq!(parse(&["metrics"]).unwrap().timeout_ms, None, "the environment decides");
        for bad in ["-1", "ten", "3600001", ""] {
            assert_eq!(parse(&["status", "--timeout-ms", bad]).unwrap_err().exit_code(), 2, "{bad:?}");
        }

        // Each answer comes after 200 ms: metrics' two requests take 400 ms in all, more than
        // the 300 ms it is given although each alone is quicker.
        let path = fake_daemon("slow", |request| {
            std::thread::sleep(Duration::from_millis(200));
            Some(match request {
                Request::Stats {} => Response::Ok(Reply::Stats(Box::default())),
                _ => Response::Error(WireError::new(ErrorCode::Invalid, "stats only")),
            })
        });
        let start = Instant::now();
        let failure = run_args(&["--socket", path.to_str().unwrap(), "--timeout-ms", "300", "metrics"]).unwrap_err();
        let took = start.elapsed();
        let _ = std::fs::remove_file(&path);
        assert!(failure.to_string().starts_with("timed out: wicd at "), "{failure}");
        assert!(failure.to_string().contains("did not answer within 300 ms"), "{failure}");
        assert_eq!(failure.exit_code(), ExitCode::from(1));
        assert!(took < Duration::from_millis(600), "took {took:?}");
    }

    #[test]
    fn channels_help_says_who_sees_which_channels() {
        let command = Cli::command();
        let channels = command.find_subcommand("channels").unwrap();
        let short = channels.get_about().unwrap().to_string();
        assert!(short.contains("every channel for root and wicd's user"), "{short}");
        let long = channels.get_long_about().unwrap().to_string();
        assert!(long.contains("their uid and those they attached to through a grant"), "{long}");
    }
}
