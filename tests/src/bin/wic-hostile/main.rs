//! A hostile local client of wicd, for the end-to-end tests (`tests/tests/hostile_clients.rs`).
//! The test runs it as another uid, as an unprivileged member of the socket's group would be;
//! it tries to make wicd hold more than its share and prints what it got, one `key value...`
//! line per finding, for the test to check. Every wait is bounded.

use std::io::{BufRead, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use wic_proto::client::{Client, ClientError};
use wic_proto::frame;
use wic_proto::message::{ChannelSpec, Producer, Reply, Request, Response, Role};

#[derive(Parser)]
enum Attack {
    /// Opens connections that never say hello, reports which wicd accepted, holds them until a
    /// line arrives on stdin, then reports how many wicd closed within `wait_ms`.
    Silent {
        socket: PathBuf,
        connections: u32,
        #[arg(long, default_value_t = 10_000)]
        wait_ms: u64,
    },
    /// Creates channels on `connections` connections, `per_connection` each, until refused;
    /// holds them until a line arrives on stdin.
    Channels {
        socket: PathBuf,
        connections: u32,
        per_connection: u32,
        #[arg(long, default_value_t = 1)]
        slots: u32,
        #[arg(long, default_value_t = 64)]
        message_bytes: u32,
    },
    /// Creates `channels` channels and issues up to `per_channel` grant tokens for each, until
    /// refused; holds them until a line arrives on stdin.
    Grants { socket: PathBuf, channels: u32, per_channel: u32 },
    /// Opens `connections` connections that say hello and then nothing, reports how many were
    /// served, and holds them until a line arrives on stdin.
    Idle { socket: PathBuf, connections: u32 },
    /// A well-behaved user: connects, creates a channel, grants and attaches to it.
    Behave { socket: PathBuf },
}

fn main() -> ExitCode {
    let result = match Attack::parse() {
        Attack::Silent { socket, connections, wait_ms } => silent(&socket, connections, Duration::from_millis(wait_ms)),
        Attack::Channels { socket, connections, per_connection, slots, message_bytes } => {
            channels(&socket, connections, per_connection, spec(slots, message_bytes))
        }
        Attack::Grants { socket, channels, per_channel } => grants(&socket, channels, per_channel),
        Attack::Idle { socket, connections } => idle(&socket, connections),
        Attack::Behave { socket } => behave(&socket),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wic-hostile: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What became of a connection that has sent nothing.
#[derive(Debug, PartialEq)]
enum Silent {
    /// Still open, nothing to read.
    Open,
    /// wicd sent a refusal (its code) and hung up.
    Refused(String),
    /// wicd hung up without a word.
    Closed,
}

fn peek(stream: &UnixStream) -> Result<Silent, String> {
    let mut byte = [0u8; 1];
    // SAFETY: recv into a live one-byte buffer of a socket this function borrows.
    let got =
        unsafe { libc::recv(stream.as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match got {
        0 => Ok(Silent::Closed),
        1 => {
            let mut stream = stream;
            let mut header = [0u8; frame::HEADER_BYTES];
            stream.read_exact(&mut header).map_err(|e| format!("refusal header: {e}"))?;
            let len = frame::body_len(header, 1 << 16).map_err(|e| e.to_string())?;
            let mut body = vec![0u8; len];
            stream.read_exact(&mut body).map_err(|e| format!("refusal body: {e}"))?;
            match serde_json::from_slice::<Response>(&body) {
                Ok(Response::Error(e)) => Ok(Silent::Refused(e.code.name().to_owned())),
                other => Err(format!("a silent connection got {other:?}")),
            }
        }
        _ => match std::io::Error::last_os_error() {
            e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Silent::Open),
            e if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(Silent::Closed),
            e => Err(format!("peek: {e}")),
        },
    }
}

/// Whether wicd has written to (or closed) a connection, without reading.
fn has_bytes(stream: &UnixStream) -> bool {
    let mut byte = [0u8; 1];
    // SAFETY: recv into a live one-byte buffer of a socket this function borrows.
    let got =
        unsafe { libc::recv(stream.as_raw_fd(), byte.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    got >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

fn wait_for_stdin() {
    let _ = std::io::stdin().lock().read_line(&mut String::new());
}

fn silent(socket: &Path, connections: u32, wait: Duration) -> Result<(), String> {
    let mut streams = Vec::new();
    for _ in 0..connections {
        streams.push(UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?);
    }
    // Refusals are sent at once, but wicd may be slow to get to them: wait until no more come.
    let started = Instant::now();
    let (mut answered, mut stable_since) = (0, Instant::now());
    while started.elapsed() < Duration::from_secs(5) && stable_since.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(50));
        let now = streams.iter().filter(|stream| has_bytes(stream)).count();
        if now != answered {
            (answered, stable_since) = (now, Instant::now());
        }
    }
    let mut open = Vec::new();
    let mut refused = Vec::new();
    for stream in streams {
        match peek(&stream)? {
            Silent::Open => open.push(stream),
            Silent::Refused(code) => refused.push(code),
            Silent::Closed => return Err("wicd closed a connection at once, without a refusal".into()),
        }
    }
    println!("accepted {}", open.len());
    println!("refused {} {}", refused.len(), refused.first().map_or("-", String::as_str));
    wait_for_stdin();
    let start = Instant::now();
    let mut closed = 0;
    while start.elapsed() < wait && closed < open.len() {
        std::thread::sleep(Duration::from_millis(50));
        closed = open.iter().map(peek).filter(|s| matches!(s, Ok(Silent::Closed))).count();
    }
    println!("closed {closed} {}", start.elapsed().as_millis());
    Ok(())
}

fn idle(socket: &Path, connections: u32) -> Result<(), String> {
    let mut clients = Vec::new();
    let mut refusal = None;
    for _ in 0..connections {
        match Client::connect(socket, "wic-hostile") {
            Ok(client) => clients.push(client),
            Err(e) => {
                refusal = Some(e);
                break;
            }
        }
    }
    report("connected", &[clients.len() as u32], refusal);
    wait_for_stdin();
    Ok(())
}

fn connect(socket: &Path) -> Result<Client, String> {
    Client::connect(socket, "wic-hostile").map_err(|e| format!("connect: {e}"))
}

fn spec(slots: u32, message_bytes: u32) -> ChannelSpec {
    ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes, slots, timeout_ns: 0 }
}

/// A small channel: one slot of 64-byte messages.
fn small() -> ChannelSpec {
    spec(1, 64)
}

fn create(client: &mut Client, spec: ChannelSpec) -> Result<u32, ClientError> {
    match client.call(&Request::CreateChannel { spec, base_va: None })? {
        Reply::Channel(info) => Ok(info.channel),
        other => Err(ClientError::Decode(format!("create got {other:?}"))),
    }
}

/// Prints `key counts... first-refusal`, the refusal as `CODE message`.
fn report(key: &str, counts: &[u32], refusal: Option<ClientError>) {
    let counts: Vec<String> = counts.iter().map(u32::to_string).collect();
    let refusal = match refusal {
        Some(ClientError::Refused(e)) => format!("{} {}", e.code.name(), e.message),
        Some(other) => format!("ERROR {other}"),
        None => "-".into(),
    };
    println!("{key} {} | {refusal}", counts.join(" "));
}

fn channels(socket: &Path, connections: u32, per_connection: u32, spec: ChannelSpec) -> Result<(), String> {
    let mut clients = Vec::new();
    let mut counts = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..connections {
        let mut client = connect(socket)?;
        let mut created = 0;
        while created < per_connection {
            match create(&mut client, spec) {
                Ok(_) => created += 1,
                Err(e) => {
                    refusals.push(e);
                    break;
                }
            }
        }
        counts.push(created);
        clients.push(client);
    }
    // The last refusal: the per-uid bound, once per-connection ones came before it.
    report("created", &counts, refusals.pop());
    wait_for_stdin();
    Ok(())
}

fn grants(socket: &Path, channels: u32, per_channel: u32) -> Result<(), String> {
    let mut client = connect(socket)?;
    let mut counts = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..channels {
        let channel = create(&mut client, small()).map_err(|e| format!("create: {e}"))?;
        let mut granted = 0;
        while granted < per_channel {
            match client.call(&Request::Grant { channel, role: Role::Consumer, uid: None }) {
                Ok(Reply::Token { .. }) => granted += 1,
                Ok(other) => return Err(format!("grant got {other:?}")),
                Err(e) => {
                    refusals.push(e);
                    break;
                }
            }
        }
        counts.push(granted);
    }
    // The last refusal: the per-uid bound, once per-channel ones came before it.
    report("granted", &counts, refusals.pop());
    wait_for_stdin();
    Ok(())
}

fn behave(socket: &Path) -> Result<(), String> {
    let mut owner = connect(socket)?;
    let channel = create(&mut owner, small()).map_err(|e| format!("create: {e}"))?;
    let token = match owner.call(&Request::Grant { channel, role: Role::Consumer, uid: None }) {
        Ok(Reply::Token { token }) => token,
        other => return Err(format!("grant: {other:?}")),
    };
    let mut consumer = connect(socket)?;
    match consumer.call(&Request::Attach { token }) {
        Ok(Reply::Channel(info)) if info.channel == channel => {}
        other => return Err(format!("attach: {other:?}")),
    }
    owner.call(&Request::DestroyChannel { channel }).map_err(|e| format!("destroy: {e}"))?;
    println!("served");
    Ok(())
}
