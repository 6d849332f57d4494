//! A small in-process stand-in for wicd, for the unit tests: it speaks the socket protocol,
//! hands out real shared regions and doorbells, and plays the daemon's side of the fast paths
//! (deliver published host data into the faulting run, map it, replay).

use std::collections::HashMap;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};
use wic_proto::frame;
use wic_proto::message::{
    ChannelInfo, ChannelSpec, ErrorCode, FdKind, Producer, Reply, Request, Response, Role, SlotInfo, Stats, WireError,
};
use wic_proto::shm::{
    ChannelState, ConsumerLayout, ConsumerRegion, ProducerLayout, ProducerRegion, PAGE_MAPPED, PAGE_UNMAPPED,
};
use wic_types::{ErrorMarker, FaultEntry, RawFaultEntry, VaWidth, PAGE_SIZE};

/// Warps per batch the fake daemon lays channels out with.
const WARPS_PER_BATCH: u32 = 4;

/// The test pattern: byte `i` of slot `slot`, generation `generation`, as the C examples use it.
pub(crate) fn pattern(slot: u32, generation: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(slot * 7).wrapping_add(generation.wrapping_mul(13)) as u8)
        .collect()
}

struct FakeChannel {
    id: u32,
    owner: u64,
    info: ChannelInfo,
    consumer: ConsumerRegion,
    consumer_fd: OwnedFd,
    fault_bell: EventFd,
    producer: Option<(ProducerRegion, OwnedFd, EventFd)>,
    ring_get: u64,
    /// Faults waiting for data: (slot, side).
    pending: Vec<(u32, usize)>,
}

#[derive(Default)]
struct State {
    next_channel: u32,
    channels: HashMap<u32, FakeChannel>,
    tokens: HashMap<String, (u32, Role)>,
    conns: HashMap<u64, UnixStream>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    hold: AtomicBool,
    fail_next: Mutex<Option<ErrorMarker>>,
    state: Mutex<State>,
    next_conn: AtomicU64,
}

/// The fake daemon; stops when dropped.
pub(crate) struct FakeDaemon {
    dir: PathBuf,
    path: PathBuf,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl FakeDaemon {
    /// Listens on a fresh socket and serves until dropped or killed.
    pub(crate) fn start() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "libwic-fake-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("wicd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared::default());
        let accept = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || accept_loop(&listener, &shared))
        };
        let worker = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || worker_loop(&shared))
        };
        Self { dir, path, shared, threads: vec![accept, worker] }
    }

    /// The socket to connect to.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Completes the next fault with `marker` instead of data.
    pub(crate) fn fail_next(&self, marker: ErrorMarker) {
        *self.shared.fail_next.lock().unwrap() = Some(marker);
    }

    /// While set, faults are taken from the ring but never served.
    pub(crate) fn hold_faults(&self, hold: bool) {
        self.shared.hold.store(hold, Ordering::Relaxed);
    }

    /// Stops serving and hangs up on every client, leaving the regions as they are.
    pub(crate) fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for conn in self.shared.state.lock().unwrap().conns.values() {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        for thread in self.threads.drain(..) {
            thread.join().unwrap();
        }
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn accept_loop(listener: &UnixListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
                shared.state.lock().unwrap().conns.insert(id, stream.try_clone().unwrap());
                let shared = Arc::clone(shared);
                // Detached: it ends when the client hangs up or `kill` shuts the socket down.
                thread::spawn(move || serve(stream, id, &shared));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn read_request(stream: &mut UnixStream) -> Option<Request> {
    let mut header = [0u8; frame::HEADER_BYTES];
    stream.read_exact(&mut header).ok()?;
    let mut body = vec![0u8; frame::body_len(header, 1 << 20).ok()?];
    stream.read_exact(&mut body).ok()?;
    Some(serde_json::from_slice(&body).expect("libwic sends valid requests"))
}

fn send(stream: &mut UnixStream, response: &Response, fds: &[RawFd]) -> std::io::Result<()> {
    let bytes = frame::encode(&serde_json::to_vec(response).unwrap());
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsgs };
    let sent = sendmsg::<UnixAddr>(stream.as_raw_fd(), &[IoSlice::new(&bytes)], cmsgs, MsgFlags::empty(), None)?;
    stream.write_all(&bytes[sent..])
}

fn serve(mut stream: UnixStream, conn: u64, shared: &Shared) {
    while let Some(request) = read_request(&mut stream) {
        let mut state = shared.state.lock().unwrap();
        let mut fds = Vec::new();
        let response = match handle(&mut state, conn, request, &mut fds) {
            Ok(reply) => Response::Ok(reply),
            Err(e) => Response::Error(e),
        };
        if send(&mut stream, &response, &fds).is_err() {
            break;
        }
    }
    if shared.stop.load(Ordering::Relaxed) {
        // Killed: a dead daemon cleans nothing up.
        return;
    }
    // The session is over: its channels go with it.
    let mut state = shared.state.lock().unwrap();
    state.conns.remove(&conn);
    let owned: Vec<u32> = state.channels.values().filter(|c| c.owner == conn).map(|c| c.id).collect();
    for id in owned {
        destroy(&mut state, id);
    }
}

fn destroy(state: &mut State, id: u32) -> bool {
    let Some(channel) = state.channels.remove(&id) else { return false };
    channel.consumer.set_state(ChannelState::Closed);
    if let Some((producer, _, _)) = &channel.producer {
        producer.set_state(ChannelState::Closed);
    }
    state.tokens.retain(|_, (channel, _)| *channel != id);
    true
}

/// The reply for `channel` as `role` sees it, and the descriptors that go with it.
fn channel_reply(channel: &FakeChannel, role: Role, fds: &mut Vec<RawFd>) -> Reply {
    let mut info = channel.info.clone();
    info.role = role;
    info.fds.clear();
    if role.may_consume() {
        info.fds.extend([FdKind::ConsumerRegion, FdKind::FaultDoorbell]);
        fds.extend([channel.consumer_fd.as_raw_fd(), channel.fault_bell.as_raw_fd()]);
    }
    if let (true, Some((_, fd, bell))) = (role.may_publish(), &channel.producer) {
        info.fds.extend([FdKind::ProducerRegion, FdKind::PublishDoorbell]);
        fds.extend([fd.as_raw_fd(), bell.as_raw_fd()]);
    }
    Reply::Channel(info)
}

fn create(state: &mut State, conn: u64, spec: ChannelSpec) -> FakeChannel {
    state.next_channel += 1;
    let id = state.next_channel;
    let batch_bytes = u64::from(WARPS_PER_BATCH) * u64::from(spec.message_bytes);
    let pages_per_run = batch_bytes.div_ceil(PAGE_SIZE).max(1) as u32;
    let base = u64::from(id) << 32;
    let run_bytes = u64::from(pages_per_run) * PAGE_SIZE;
    let slots = (0..spec.slots)
        .map(|s| SlotInfo {
            runs: [0, 1].map(|side| base + (u64::from(s) * 2 + side) * run_bytes),
            pat: matches!(spec.producer, Producer::Gpu { .. })
                .then(|| [0, 1].map(|side| base + (1 << 31) + (u64::from(s) * 2 + side) * PAGE_SIZE)),
            tag: s + 1,
        })
        .collect();
    let (consumer, consumer_fd) = ConsumerRegion::create(ConsumerLayout { slots: spec.slots, pages_per_run }).unwrap();
    let bell = || EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC).unwrap();
    let producer = (spec.producer == Producer::Host).then(|| {
        let (region, fd) = ProducerRegion::create(ProducerLayout { slots: spec.slots, batch_bytes }).unwrap();
        (region, fd, bell())
    });
    let info = ChannelInfo {
        channel: id,
        role: Role::Owner,
        spec,
        pages_per_run,
        warps_per_batch: WARPS_PER_BATCH,
        batch_bytes,
        slots,
        fds: Vec::new(),
    };
    FakeChannel {
        id,
        owner: conn,
        info,
        consumer,
        consumer_fd,
        fault_bell: bell(),
        producer,
        ring_get: 0,
        pending: Vec::new(),
    }
}

fn handle(state: &mut State, conn: u64, request: Request, fds: &mut Vec<RawFd>) -> Result<Reply, WireError> {
    let not_found = || WireError::new(ErrorCode::NotFound, "no such channel");
    match request {
        Request::Hello { .. } => Ok(Reply::Hello {
            version: wic_proto::PROTOCOL_VERSION,
            daemon: "fake".into(),
            backend: "emulated".into(),
            warps_per_batch: 16,
        }),
        Request::CreateChannel { spec, .. } => {
            let channel = create(state, conn, spec);
            let reply = channel_reply(&channel, Role::Owner, fds);
            state.channels.insert(channel.id, channel);
            Ok(reply)
        }
        Request::DestroyChannel { channel } => destroy(state, channel).then_some(Reply::Done).ok_or_else(not_found),
        Request::Grant { channel, role, .. } => {
            if !state.channels.contains_key(&channel) {
                return Err(not_found());
            }
            let token = format!("{:032x}", state.tokens.len() as u128 + 0xabc0_0000);
            state.tokens.insert(token.clone(), (channel, role));
            Ok(Reply::Token { token })
        }
        Request::Attach { token } => {
            let (id, role) = *state.tokens.get(&token).ok_or_else(not_found)?;
            Ok(channel_reply(&state.channels[&id], role, fds))
        }
        Request::Stats {} => Ok(Reply::Stats(Box::new(Stats {
            channels: state.channels.len() as u32,
            clients: state.conns.len() as u32,
            ..Stats::default()
        }))),
        other => Err(WireError::new(ErrorCode::Unsupported, format!("the fake daemon does not do {other:?}"))),
    }
}

fn worker_loop(shared: &Shared) {
    let mut entries = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        {
            let mut state = shared.state.lock().unwrap();
            for channel in state.channels.values_mut() {
                let _ = channel.fault_bell.read();
                entries.clear();
                channel.consumer.take_faults(&mut channel.ring_get, &mut entries);
                if let Some((producer, _, bell)) = &channel.producer {
                    let _ = bell.read();
                    producer.take_published(|_| {});
                }
                for entry in &entries {
                    if let Some(fault) = locate(&channel.info, entry) {
                        if !channel.pending.contains(&fault) {
                            channel.pending.push(fault);
                        }
                    }
                }
                if shared.hold.load(Ordering::Relaxed) {
                    continue;
                }
                let pending = std::mem::take(&mut channel.pending);
                let mut replay = false;
                for (slot, side) in pending {
                    let marker = shared.fail_next.lock().unwrap().take();
                    if serve_fault(channel, slot, side, marker) {
                        replay = true;
                    } else {
                        channel.pending.push((slot, side));
                    }
                }
                if replay {
                    channel.consumer.replay();
                }
            }
        }
        thread::sleep(Duration::from_micros(200));
    }
}

/// The slot and side a fault entry touches.
fn locate(info: &ChannelInfo, entry: &RawFaultEntry) -> Option<(u32, usize)> {
    let va = FaultEntry::decode(entry, VaWidth::Bits49).va;
    info.slots
        .iter()
        .enumerate()
        .find_map(|(slot, s)| s.runs.iter().position(|run| *run == va).map(|side| (slot as u32, side)))
}

/// Fills, maps and delivers the run of `slot` on `side`; false while there is nothing to deliver.
fn serve_fault(channel: &FakeChannel, slot: u32, side: usize, marker: Option<ErrorMarker>) -> bool {
    let layout = channel.consumer.layout();
    let pages = layout.pages_per_run as usize;
    let run = layout.run_page(slot, side);
    if channel.consumer.page_state(run).load(Ordering::Acquire) == PAGE_MAPPED {
        return true;
    }
    if let Some(marker) = marker {
        for page in run..run + pages {
            channel.consumer.write_pages(page, &marker.word().to_ne_bytes());
        }
    } else {
        let Some((producer, _, _)) = &channel.producer else { return false };
        if producer.published(slot).load(Ordering::Acquire) == producer.delivered(slot).load(Ordering::Acquire) {
            return false;
        }
        let mut data = vec![0u8; channel.info.batch_bytes as usize];
        producer.read_data(producer.slot_offset(slot), &mut data);
        channel.consumer.write_pages(run, &data);
        producer.mark_delivered(slot);
    }
    channel.consumer.set_pages(layout.run_page(slot, 1 - side), pages, PAGE_UNMAPPED);
    channel.consumer.set_pages(run, pages, PAGE_MAPPED);
    true
}
