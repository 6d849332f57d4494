//! One client: a producer connection that owns the client's channels and publishes into them,
//! and a consumer connection that attaches to each by grant and consumes it; round after round,
//! as the main thread opens them. In some rounds the producer drops its connection halfway,
//! without closing anything, and connects again: the daemon must reclaim its channels and wake
//! the consumer held on one of them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wic::{Channel, ChannelSpec, Client, ErrorCode, Producer, Role};

use crate::gate::Gate;
use crate::latency::{Kind, Latencies};
use crate::payload::{self, Stream};

/// How long a producer sleeps at most between checks that its consumer is still there.
const WAIT_STEP: Duration = Duration::from_millis(100);

/// What every client runs, the same for all.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub channels: u32,
    /// Messages per channel and round.
    pub messages: u32,
    pub slots: u32,
    pub message_bytes: u32,
    /// GPUs of the emulated backend: the channels' consumers are spread over them.
    pub gpus: u16,
    /// How long the daemon holds a consumer before completing it with the timeout marker.
    pub hold_timeout: Duration,
    /// Client `c` drops its producer connection halfway through round `r` when
    /// `(c + r) % abort_every == 0`; never if 0.
    pub abort_every: u32,
}

impl Shape {
    pub fn aborts(&self, client: u32, round: u32) -> bool {
        // None for 0: no aborts.
        (client + round).checked_rem(self.abort_every) == Some(0)
    }

    /// The message at which an aborting producer drops its connection.
    pub fn abort_at(&self) -> u32 {
        self.messages / 2
    }

    /// Messages a consumer gets from each channel in a round.
    pub fn consumed_per_channel(&self, aborting: bool) -> u32 {
        if aborting {
            self.abort_at()
        } else {
            self.messages
        }
    }
}

/// Where a client is, for the report of a round that does not finish.
#[derive(Debug, Default)]
pub struct Progress {
    phase: AtomicU8,
    round: AtomicU64,
    published: AtomicU64,
    consumed: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Connecting,
    Idle,
    Creating,
    Attaching,
    Exchanging,
    Destroying,
    Reconnecting,
}

impl Phase {
    /// Names in the order of the variants.
    const NAMES: [&'static str; 7] =
        ["connecting", "idle", "creating", "attaching", "exchanging", "destroying", "reconnecting"];
}

impl Progress {
    fn enter(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    fn start_round(&self, round: u32) {
        self.round.store(u64::from(round), Ordering::Relaxed);
        self.published.store(0, Ordering::Relaxed);
        self.consumed.store(0, Ordering::Relaxed);
    }

    /// Whether the client is inside a round (or still connecting).
    pub fn busy(&self) -> bool {
        self.phase.load(Ordering::Relaxed) != Phase::Idle as u8
    }

    /// One line: the round, the phase and the messages moved in it.
    pub fn describe(&self) -> String {
        format!(
            "round {}, {}, {} published, {} consumed",
            self.round.load(Ordering::Relaxed),
            Phase::NAMES[usize::from(self.phase.load(Ordering::Relaxed))],
            self.published.load(Ordering::Relaxed),
            self.consumed.load(Ordering::Relaxed)
        )
    }
}

/// What all clients share.
pub struct Context {
    pub socket: PathBuf,
    pub shape: Shape,
    /// The clock messages carry their publish time on.
    pub epoch: Instant,
    pub gate: Gate,
    pub progress: Vec<Progress>,
    /// Unexpected failures of all clients so far: the main thread opens no new round after one.
    pub failures: AtomicUsize,
}

/// What one client did over the run.
#[derive(Debug, Default)]
pub struct Tally {
    pub published: u64,
    pub consumed: u64,
    pub bytes_checked: u64,
    pub aborts: u64,
    /// Consumers that saw their channel closed where an abort was to close it.
    pub closed_as_expected: u64,
    pub latencies: Latencies,
    /// What went wrong, each naming the client and round.
    pub failures: Vec<String>,
}

/// Runs client `index` until the main thread ends the run.
pub fn run(index: u32, ctx: &Context) -> Tally {
    let mut tally = Tally::default();
    let progress = &ctx.progress[index as usize];
    progress.enter(Phase::Connecting);
    let mut session = match Session::open(ctx, &mut tally.latencies) {
        Ok(session) => Some(session),
        Err(e) => {
            fail(ctx, &mut tally, format!("client {index}: connecting: {e}"));
            None
        }
    };
    progress.enter(Phase::Idle);
    ctx.gate.finish();
    let mut last = 0;
    while let Some(round) = ctx.gate.next_round(last) {
        last = round;
        progress.start_round(round);
        if let Some(session) = &mut session {
            let this_round = Round { ctx, index, round, progress };
            if let Err(e) = this_round.run(session, &mut tally) {
                fail(ctx, &mut tally, format!("client {index}, round {round}: {e}"));
            }
        }
        progress.enter(Phase::Idle);
        ctx.gate.finish();
    }
    tally
}

fn fail(ctx: &Context, tally: &mut Tally, what: String) {
    ctx.failures.fetch_add(1, Ordering::Relaxed);
    tally.failures.push(what);
}

/// The client's two connections. The producer's is taken out while a round uses it, and stays
/// `None` if reconnecting after an abort failed.
struct Session {
    producer: Option<Client>,
    consumer: Client,
}

impl Session {
    fn open(ctx: &Context, latencies: &mut Latencies) -> Result<Self, String> {
        let producer = connect(ctx, latencies)?;
        let consumer = connect(ctx, latencies)?;
        Ok(Self { producer: Some(producer), consumer })
    }
}

fn connect(ctx: &Context, latencies: &mut Latencies) -> Result<Client, String> {
    latencies.time(Kind::Connect, || Client::connect(Some(&ctx.socket))).map_err(|e| e.to_string())
}

/// How the consumer of a round ended.
#[derive(Debug)]
enum Ending {
    /// Every message of every channel arrived.
    Complete,
    /// A channel was closed under the consumer while it waited for `message` of `channel`: an
    /// abort, or a producer that failed and closed its channels.
    Closed {
        message: u32,
        channel: usize,
    },
    Failed(String),
}

/// What the consumer of a round got.
struct Consumed {
    per_channel: Vec<u32>,
    bytes: u64,
    latencies: Latencies,
    ending: Ending,
}

/// One round of one client; shared with the round's consumer thread.
struct Round<'a> {
    ctx: &'a Context,
    index: u32,
    round: u32,
    progress: &'a Progress,
}

impl Round<'_> {
    fn shape(&self) -> &Shape {
        &self.ctx.shape
    }

    fn stream(&self, channel: usize) -> Stream {
        Stream { client: self.index, round: self.round, channel: channel as u32 }
    }

    fn run(&self, session: &mut Session, tally: &mut Tally) -> Result<(), String> {
        let aborting = self.shape().aborts(self.index, self.round);
        let producer = session.producer.take().ok_or("no producer connection: reconnecting after an abort failed")?;
        let mut owned = match self.create(&producer, tally) {
            Ok(owned) => owned,
            Err(e) => {
                session.producer = Some(producer);
                return Err(e);
            }
        };
        self.progress.enter(Phase::Attaching);
        let attached = match self.attach(&owned, &session.consumer, &mut tally.latencies) {
            Ok(attached) => attached,
            Err(e) => {
                self.destroy(owned, tally);
                session.producer = Some(producer);
                return Err(e);
            }
        };
        self.progress.enter(Phase::Exchanging);
        let gave_up = AtomicBool::new(false);
        let mut producer = Some(producer);
        let (produced, consumed) = std::thread::scope(|scope| {
            let consumer = scope.spawn(|| self.consume(&attached, &gave_up));
            let connection = producer.as_ref().expect("taken only below");
            let produced = self.produce(&owned, connection, aborting, &gave_up, &mut tally.latencies);
            match &produced {
                Ok(_) if aborting => {
                    // Gone without a word: the daemon must reclaim the channels and wake the
                    // consumer waiting on one of them.
                    drop(std::mem::take(&mut owned));
                    producer = None;
                }
                Ok(_) => {}
                // The consumer may wait for a message that will not come: closing wakes it.
                Err(_) => self.destroy(std::mem::take(&mut owned), tally),
            }
            (produced, consumer.join().expect("consumers report failures, they do not panic"))
        });
        for handle in attached {
            // An attached handle closes locally: nothing to fail but the unmapping.
            let _ = handle.close();
        }
        tally.bytes_checked += consumed.bytes;
        tally.consumed += consumed.per_channel.iter().map(|&n| u64::from(n)).sum::<u64>();
        tally.latencies.merge(consumed.latencies);
        if let Ok(published) = produced {
            tally.published += published;
        }
        let checked = self.check(aborting, produced.err(), consumed.ending, &consumed.per_channel, tally);
        self.destroy(owned, tally);
        session.producer = match producer {
            Some(kept) => Some(kept),
            None => {
                tally.aborts += 1;
                self.progress.enter(Phase::Reconnecting);
                Some(connect(self.ctx, &mut tally.latencies)?)
            }
        };
        checked
    }

    fn spec(&self, channel: u32) -> ChannelSpec {
        let shape = self.shape();
        let spread = (self.index * shape.channels + channel) % u32::from(shape.gpus);
        ChannelSpec {
            consumer_gpu: spread as u16,
            producer: Producer::Host,
            message_bytes: shape.message_bytes,
            slots: shape.slots,
            timeout_ns: shape.hold_timeout.as_nanos() as u64,
        }
    }

    /// Creates the round's channels; on failure destroys those already created.
    fn create(&self, producer: &Client, tally: &mut Tally) -> Result<Vec<Channel>, String> {
        self.progress.enter(Phase::Creating);
        let mut owned = Vec::new();
        for channel in 0..self.shape().channels {
            let spec = self.spec(channel);
            match tally.latencies.time(Kind::Create, || producer.create_channel(&spec)) {
                Ok(created) => owned.push(created),
                Err(e) => {
                    self.destroy(owned, tally);
                    return Err(format!("creating channel {channel}: {e}"));
                }
            }
        }
        Ok(owned)
    }

    /// Grants a consumer token for each channel and attaches the consumer connection with it.
    fn attach(&self, owned: &[Channel], consumer: &Client, latencies: &mut Latencies) -> Result<Vec<Channel>, String> {
        let mut attached = Vec::new();
        for (index, channel) in owned.iter().enumerate() {
            let token = latencies
                .time(Kind::Grant, || channel.grant(Role::Consumer, None))
                .map_err(|e| format!("granting channel {index}: {e}"))?;
            let handle = latencies
                .time(Kind::Attach, || consumer.attach(&token))
                .map_err(|e| format!("attaching to channel {index}: {e}"))?;
            attached.push(handle);
        }
        Ok(attached)
    }

    /// Destroys the channels; failures are recorded (the daemon's gauges at the end of the round
    /// show whether anything stayed behind).
    fn destroy(&self, owned: Vec<Channel>, tally: &mut Tally) {
        if owned.is_empty() {
            return;
        }
        self.progress.enter(Phase::Destroying);
        for (index, channel) in owned.into_iter().enumerate() {
            if let Err(e) = tally.latencies.time(Kind::Destroy, || channel.close()) {
                fail(
                    self.ctx,
                    tally,
                    format!("client {}, round {}: destroying channel {index}: {e}", self.index, self.round),
                );
            }
        }
    }

    /// Publishes every message of the round, channel after channel, each once its slot's
    /// previous message is delivered, and reads the daemon's stats halfway; an aborting
    /// producer stops halfway instead ([`Round::abort`]). Returns the messages published.
    fn produce(
        &self,
        owned: &[Channel],
        producer: &Client,
        aborting: bool,
        gave_up: &AtomicBool,
        latencies: &mut Latencies,
    ) -> Result<u64, String> {
        let shape = self.shape();
        let Some(first) = owned.first() else { return Ok(0) };
        let mut buf = vec![0u8; first.info().batch_bytes as usize];
        let mut published = 0;
        for message in 0..shape.messages {
            if message == shape.abort_at() {
                if aborting {
                    return self.abort(owned, message, &mut buf, gave_up).map(|extra| published + extra);
                }
                latencies.time(Kind::Stats, || producer.stats()).map_err(|e| format!("stats: {e}"))?;
            }
            for (index, channel) in owned.iter().enumerate() {
                let slot = message % shape.slots;
                let sent = self
                    .wait_delivered(channel, slot, gave_up)
                    .and_then(|()| self.publish(channel, index, message, &mut buf));
                sent.map_err(|e| format!("channel {index} (wicd's {}), message {message}: {e}", channel.id()))?;
                published += 1;
            }
        }
        Ok(published)
    }

    /// The producer's side of an abort at `message`: once everything published so far is
    /// delivered (so the consumer waits for `message` of the first channel), publishes
    /// `message` on every other channel, data nobody will consume. Returns those publishes; the
    /// caller then drops the connection.
    fn abort(&self, owned: &[Channel], message: u32, buf: &mut [u8], gave_up: &AtomicBool) -> Result<u64, String> {
        for (index, channel) in owned.iter().enumerate() {
            for slot in 0..self.shape().slots {
                self.wait_delivered(channel, slot, gave_up)
                    .map_err(|e| format!("channel {index} before the abort: {e}"))?;
            }
        }
        for (index, channel) in owned.iter().enumerate().skip(1) {
            self.publish(channel, index, message, buf).map_err(|e| format!("channel {index} before the abort: {e}"))?;
        }
        Ok(owned.len().saturating_sub(1) as u64)
    }

    fn publish(&self, channel: &Channel, index: usize, message: u32, buf: &mut [u8]) -> Result<(), String> {
        payload::fill(buf, self.stream(index), u64::from(message), payload::stamp(self.ctx.epoch));
        channel.publish_copy(message % self.shape().slots, buf).map_err(|e| e.to_string())?;
        self.progress.published.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until `slot`'s last message is delivered, while the consumer is still there, for
    /// at most twice the hold timeout (a consumer held longer has been timed out).
    fn wait_delivered(&self, channel: &Channel, slot: u32, gave_up: &AtomicBool) -> Result<(), String> {
        let patience = 2 * self.shape().hold_timeout;
        let deadline = Instant::now() + patience;
        loop {
            match channel.wait_writable(slot, WAIT_STEP) {
                Ok(()) => return Ok(()),
                Err(e) if e.code() != ErrorCode::TimedOut => return Err(e.to_string()),
                Err(_) if gave_up.load(Ordering::Relaxed) => return Err("its consumer gave up".into()),
                Err(_) if Instant::now() > deadline => {
                    return Err(format!("slot {slot} not delivered within {patience:?}"))
                }
                Err(_) => {}
            }
        }
    }

    /// Consumes every message of every channel in publish order, checking each byte; stops at
    /// the first channel closed under it or the first wrong message.
    fn consume(&self, attached: &[Channel], gave_up: &AtomicBool) -> Consumed {
        let shape = self.shape();
        let mut got = Consumed {
            per_channel: vec![0; attached.len()],
            bytes: 0,
            latencies: Latencies::default(),
            ending: Ending::Complete,
        };
        let Some(first) = attached.first() else { return got };
        let mut buf = vec![0u8; first.info().batch_bytes as usize];
        for message in 0..shape.messages {
            for (index, channel) in attached.iter().enumerate() {
                let checked = match channel.consume(message % shape.slots, &mut buf) {
                    Ok(len) if len == buf.len() => payload::check(&buf, self.stream(index), u64::from(message)),
                    Ok(len) => Err(format!("{len} of {} bytes", buf.len())),
                    Err(e) if e.code() == ErrorCode::Closed => {
                        got.ending = Ending::Closed { message, channel: index };
                        return got;
                    }
                    Err(e) => Err(e.to_string()),
                };
                match checked {
                    Ok(published_ns) => {
                        got.latencies
                            .record(Kind::Delivery, payload::stamp(self.ctx.epoch).saturating_sub(published_ns));
                        got.per_channel[index] += 1;
                        got.bytes += buf.len() as u64;
                        self.progress.consumed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        got.ending = Ending::Failed(format!(
                            "channel {index} (wicd's {}), message {message}: {e}",
                            channel.id()
                        ));
                        gave_up.store(true, Ordering::Relaxed);
                        return got;
                    }
                }
            }
        }
        got
    }

    /// Whether the round went as it must: all messages through, or for an abort, exactly those
    /// before it and then the first channel closed under the waiting consumer.
    fn check(
        &self,
        aborting: bool,
        produce_error: Option<String>,
        ending: Ending,
        per_channel: &[u32],
        tally: &mut Tally,
    ) -> Result<(), String> {
        let shape = self.shape();
        match (produce_error, ending) {
            // A consumer that found a wrong message is the cause of whatever the producer saw.
            (_, Ending::Failed(e)) => return Err(format!("consumer: {e}")),
            (Some(e), _) => return Err(format!("producer: {e}")),
            (None, Ending::Complete) if !aborting => {}
            (None, Ending::Closed { message, channel: 0 }) if aborting && message == shape.abort_at() => {
                tally.closed_as_expected += 1
            }
            (None, ending) => {
                let expected = if aborting {
                    format!("the first channel closed at message {}", shape.abort_at())
                } else {
                    "all messages".into()
                };
                return Err(format!("the consumer ended with {ending:?}, expected {expected}"));
            }
        }
        let due = shape.consumed_per_channel(aborting);
        match per_channel.iter().position(|&n| n != due) {
            Some(index) => Err(format!("channel {index}: {} messages consumed, {due} due", per_channel[index])),
            None => Ok(()),
        }
    }
}
