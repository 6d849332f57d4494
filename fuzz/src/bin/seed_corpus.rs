//! Writes the seed corpora, `corpus/<target>/<name>`: a few valid fault entries, protocol
//! frames, ring scripts and ABI calls for the fuzzer to start from. Deterministic; files it
//! does not write (the `regression-*` inputs of fixed bugs) are left alone.
//!
//! `cargo run --bin seed-corpus` in `fuzz/` (no instrumentation needed).

use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};
use wic_engine::fault::{AccessType, FaultEntry, RawFaultEntry};
use wic_fuzz::abi_inputs::{RangesInput, SubmitInput};
use wic_fuzz::differential::{self, Verdicts};
use wic_fuzz::ring::{RingOp, RingScript};
use wic_proto::frame;
use wic_kabi::{WicFaultRecord, WicRingHeader, WIC_ABI_VERSION, WIC_RING_MAGIC};
use wic_proto::message::{
    ChannelInfo, ChannelSpec, ChannelSummary, ErrorCode, FdKind, Producer, Reply, Request, Response, Role, SlotInfo, Stats, Status,
    WireError,
};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus directory");
    std::fs::write(dir.join(name), bytes).expect("write a seed");
}

fn fault_decode() {
    let hex = [
        ("hopper-read-invalid-pte", "00b2dcfe 01000000 00705634 127f0000 efcdab89 23010000 40000000 821500c3"),
        ("va49-negative-write", "0x00000000_00000000_00200000_00000100_00000000_00000000_00000000_860001c0"),
        ("va57-negative-atomic-hub", "00:00:00:00 00:00:00:00 00:b0:ad:de 00:00:00:01 00:00:00:00 00:00:00:00 00:00:00:00 0f:00:14:80"),
    ];
    for (name, text) in hex {
        let raw = RawFaultEntry::from_hex(text).expect("a valid entry");
        write("fault_decode", name, &raw.0);
        write("fault_decode", &format!("{name}.txt"), text.as_bytes());
    }
    let emulated = FaultEntry::replayable_gpc(0x7f00_dead_b000, AccessType::Write, 123_456_789, 0x1_0000_0000, 3, 0x15);
    write("fault_decode", "emulated-gpc-write", &emulated.encode().0);
}

fn frames(messages: &[Vec<u8>]) -> Vec<u8> {
    // wicd's default frame limit, then the frames.
    let mut out = (64u32 << 10).to_le_bytes().to_vec();
    for body in messages {
        out.extend(frame::encode(body));
    }
    out
}

fn json<T: serde::Serialize>(message: &T) -> Vec<u8> {
    serde_json::to_vec(message).expect("messages encode")
}

fn wire_protocol() {
    let spec = ChannelSpec { consumer_gpu: 0, producer: Producer::Gpu { gpu: 1, base_va: 0x7000_0000 }, message_bytes: 4096, slots: 4, timeout_ns: 0 };
    let requests = [
        Request::Hello { version: 1, client: "wicctl".into() },
        Request::CreateChannel { spec, base_va: Some(0x7f00_0000_0000) },
        Request::AttachSpace {},
        Request::Watch { base_va: 0x7f00_0000_0000, length: 1 << 20 },
        Request::Grant { channel: 1, role: Role::Consumer, uid: Some(1000) },
        Request::Attach { token: "wic1-0123456789abcdef".into() },
        Request::Publish { channel: 1, slot: 0 },
        Request::DestroyChannel { channel: 1 },
        Request::Status {},
        Request::Channels {},
        Request::Stats {},
    ];
    write("wire_protocol", "requests", &frames(&requests.iter().map(json).collect::<Vec<_>>()));

    let info = ChannelInfo {
        channel: 1,
        role: Role::Owner,
        spec,
        pages_per_run: 2,
        warps_per_batch: 32,
        batch_bytes: 131_072,
        slots: vec![SlotInfo { runs: [0x10_0000, 0x10_2000], pat: Some([0x20_0000, 0x20_1000]), tag: 7 }],
        fds: vec![FdKind::ConsumerRegion, FdKind::FaultDoorbell, FdKind::ProducerRegion, FdKind::PublishDoorbell],
    };
    let status = Status {
        version: "0.1.0".into(),
        protocol: 1,
        pid: 42,
        backend: "emulated".into(),
        gpus: 2,
        uptime_ns: 1_000_000,
        clients: 1,
        channels: 1,
        held: 0,
        pool_pages: 4096,
        pool_pages_used: 16,
        draining: false,
    };
    let summary = ChannelSummary {
        channel: 1,
        owner_pid: 42,
        owner_uid: 1000,
        spec,
        pages: 16,
        attached: 1,
        publishes: 5,
        deliveries: 5,
        timeouts: 0,
        client_overflows: 0,
    };
    let responses = [
        Response::Ok(Reply::Hello { version: 1, daemon: "wicd 0.1.0".into(), backend: "emulated".into(), warps_per_batch: 32 }),
        Response::Ok(Reply::Channel(info)),
        Response::Ok(Reply::Space { space: 1 }),
        Response::Ok(Reply::Token { token: "wic1-0123456789abcdef".into() }),
        Response::Ok(Reply::Done),
        Response::Ok(Reply::Status(status)),
        Response::Ok(Reply::Channels { channels: vec![summary] }),
        Response::Ok(Reply::Stats(Box::<Stats>::default())),
        Response::Error(WireError::new(ErrorCode::NotFound, "no channel 3")),
    ];
    write("wire_protocol", "responses", &frames(&responses.iter().map(json).collect::<Vec<_>>()));

    // An empty frame (answered), a request, then a header over the limit (the server hangs up).
    let mut stream = frames(&[Vec::new(), json(&Request::Status {})]);
    stream.extend((1u32 << 20).to_le_bytes());
    write("wire_protocol", "empty-then-oversized", &stream);
}

fn ring_header(entries: u32, head: u64) -> WicRingHeader {
    WicRingHeader {
        magic: WIC_RING_MAGIC,
        abi_version: WIC_ABI_VERSION,
        entries,
        record_size: std::mem::size_of::<WicFaultRecord>() as u32,
        head,
        tail: head,
        ..Default::default()
    }
}

fn fault_ring() {
    use RingOp::{Publish, Read, Scribble, SetHead, Tear};
    let scripts = [
        ("clean", ring_header(256, 0), 0, vec![Publish(5), Read(100), Publish(3), Read(2), Read(10)]),
        ("wraps-around", ring_header(4, 0), 0, vec![Publish(3), Read(2), Publish(4), Read(10), Publish(4), Read(1), Read(10)]),
        ("torn-record", ring_header(8, 0), 0, vec![Publish(3), Tear { slot: 1, seq: 77 }, Read(10)]),
        ("sequence-wraps", ring_header(8, u64::MAX - 2), 0, vec![Publish(6), Read(10)]),
        ("head-out-of-range", ring_header(8, 0), 0, vec![Publish(2), SetHead(1 << 40), Read(100), SetHead(3), Read(100)]),
        ("scribbled-header", ring_header(8, 0), 0, vec![Publish(2), Scribble { word: 0, value: 0 }, Read(1), Read(1)]),
        ("short-mapping", ring_header(256, 0), -64, vec![Read(1)]),
    ];
    for (name, header, len_adjust, ops) in scripts {
        let script = RingScript { header: RingScript::header_image(&header), len_adjust, ops };
        let bytes = script.to_bytes();
        assert_eq!(RingScript::parse(&bytes), script, "the ring script format does not round-trip");
        write("fault_ring", name, &bytes);
    }
}

/// Deterministic pseudo-random bytes, 15 in 16 of them 0 (so that most fields decode as 0 and
/// most calls are nearly valid).
struct SparseBytes(u64);

impl SparseBytes {
    fn next(&mut self) -> u64 {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn input(&mut self) -> Vec<u8> {
        let len = 32 + (self.next() % 480) as usize;
        (0..len).map(|_| if self.next().is_multiple_of(16) { self.next() as u8 } else { 0 }).collect()
    }
}

/// Writes seed `name` of `target`: the first input of a fixed pseudo-random sequence that
/// decodes as `T` and whose run's verdicts meet `goal`, whatever `arbitrary`'s byte format.
fn search<T: for<'a> Arbitrary<'a>>(target: &str, name: &str, run: fn(&T) -> Verdicts, goal: impl Fn(&Verdicts) -> bool) {
    let mut bytes = SparseBytes(0x5749_4346 ^ name.len() as u64);
    for _ in 0..100_000 {
        let data = bytes.input();
        let Ok(input) = T::arbitrary_take_rest(Unstructured::new(&data)) else { continue };
        if goal(&run(&input)) {
            write(target, name, &data);
            return;
        }
    }
    panic!("no input reached the goal of {target}/{name}");
}

fn accepted(verdicts: &Verdicts) -> usize {
    verdicts.calls.iter().filter(|v| v.is_ok()).count()
}

fn refused_with(verdicts: &Verdicts, errno: i32) -> bool {
    verdicts.calls.contains(&Err(errno))
}

fn abi_calls() {
    let batch_ok = |v: &Verdicts| v.batch == Some(Ok(()));
    let submit: fn(&SubmitInput) -> Verdicts = differential::submit_validation;
    search("submit_validation", "accepted-batch", submit, |v| batch_ok(v) && accepted(v) >= 2);
    search("submit_validation", "out-of-range", submit, |v| batch_ok(v) && accepted(v) >= 1 && refused_with(v, libc::ERANGE));
    search("submit_validation", "no-such-space-or-gpu", submit, |v| refused_with(v, libc::ENOENT) && refused_with(v, libc::ENODEV));

    let ranges: fn(&RangesInput) -> Verdicts = differential::shim_ranges;
    search("shim_ranges", "register-unregister", ranges, |v| accepted(v) >= 3 && v.calls.last() == Some(&Ok(())));
    search("shim_ranges", "overlapping", ranges, |v| accepted(v) >= 2 && refused_with(v, libc::EEXIST));
    search("shim_ranges", "unmapped", ranges, |v| refused_with(v, libc::EFAULT));
    search("shim_ranges", "session-full", ranges, |v| refused_with(v, libc::ENOSPC));
}

fn main() {
    fault_decode();
    wire_protocol();
    fault_ring();
    abi_calls();
}
