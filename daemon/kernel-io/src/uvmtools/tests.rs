use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::AsFd;
use std::path::Path;
use std::ptr::NonNull;

use nix::errno::Errno;

use super::abi::*;
use super::queue::{page_size, QueueMemory};
use super::*;

// The numbers below are those of the headers of NVIDIA/open-gpu-kernel-modules tag 580.142
// (kernel-open/nvidia-uvm/uvm_ioctl.h, uvm_types.h; x86-64), the same in every 580.x tag.

/// uvm_ioctl.h: the request numbers (`UVM_IOCTL_BASE(i)` is `i` on Linux).
#[test]
fn request_numbers_match_uvm_ioctl_h() {
    assert_eq!(UVM_TOOLS_INIT_EVENT_TRACKER, 56);
    assert_eq!(UVM_TOOLS_SET_NOTIFICATION_THRESHOLD, 57);
    assert_eq!(UVM_TOOLS_EVENT_QUEUE_ENABLE_EVENTS, 58);
    assert_eq!(UVM_TOOLS_EVENT_QUEUE_DISABLE_EVENTS, 59);
    assert_eq!(UVM_TOOLS_FLUSH_EVENTS, 67);
    assert_eq!(UVM_TOOLS_INIT_EVENT_TRACKER_V2, 76);
}

/// uvm_ioctl.h: `UVM_TOOLS_INIT_EVENT_TRACKER_PARAMS` is 56 bytes; queueBuffer 0,
/// queueBufferSize 8, controlBuffer 16, processor 24, allProcessors 40, uvmFd 44, rmStatus 48.
#[test]
fn init_event_tracker_params_layout() {
    type P = InitEventTrackerParams;
    assert_eq!(size_of::<P>(), 56);
    assert_eq!(
        [offset_of!(P, queue_buffer), offset_of!(P, queue_buffer_size), offset_of!(P, control_buffer)],
        [0, 8, 16]
    );
    assert_eq!([offset_of!(P, processor), offset_of!(P, all_processors), offset_of!(P, uvm_fd)], [24, 40, 44]);
    assert_eq!(offset_of!(P, rm_status), 48);
}

/// uvm_ioctl.h: SET_NOTIFICATION_THRESHOLD 8 bytes (rmStatus 4), ENABLE/DISABLE_EVENTS 16
/// bytes (rmStatus 8), FLUSH_EVENTS 4 bytes.
#[test]
fn small_params_layout() {
    assert_eq!(size_of::<SetNotificationThresholdParams>(), 8);
    assert_eq!(offset_of!(SetNotificationThresholdParams, rm_status), 4);
    assert_eq!(size_of::<EventQueueEventsParams>(), 16);
    assert_eq!(offset_of!(EventQueueEventsParams, rm_status), 8);
    assert_eq!(size_of::<FlushEventsParams>(), 4);
}

/// uvm_types.h: `UvmToolsEventControlData` is 528 bytes: get_ahead 0, get_behind 4,
/// put_ahead 8, put_behind 12, dropped[64] 16.
#[test]
fn control_data_layout() {
    type C = ToolsEventControlData;
    assert_eq!(size_of::<C>(), 528);
    assert_eq!(
        [offset_of!(C, get_ahead), offset_of!(C, get_behind), offset_of!(C, put_ahead), offset_of!(C, put_behind)],
        [0, 4, 8, 12]
    );
    assert_eq!(offset_of!(C, dropped), 16);
    assert_eq!(EVENT_NUM_TYPES_ALL, 64);
}

/// uvm_types.h: `UvmEventEntry_V2` is 72 bytes, 8-byte aligned.
#[test]
fn entry_layout() {
    assert_eq!(size_of::<EventEntryV2>(), 72);
    assert_eq!(std::mem::align_of::<EventEntryV2>(), 8);
}

/// uvm_types.h: `UvmEventGpuFaultInfo_V2` is 40 bytes: eventType 0, faultType 1, gpuIndex 2,
/// gpcId/channelId 4, clientId 6, address 8, timeStamp 16, timeStampGpu 24, batchId 32,
/// clientType 36, accessType 37.
#[test]
fn gpu_fault_info_v2_layout() {
    type F = GpuFaultInfoV2;
    assert_eq!(size_of::<F>(), 40);
    assert_eq!(
        [
            offset_of!(F, event_type),
            offset_of!(F, fault_type),
            offset_of!(F, gpu_index),
            offset_of!(F, gpc_or_channel_id)
        ],
        [0, 1, 2, 4]
    );
    assert_eq!([offset_of!(F, client_id), offset_of!(F, address), offset_of!(F, time_stamp)], [6, 8, 16]);
    assert_eq!([offset_of!(F, time_stamp_gpu), offset_of!(F, batch_id)], [24, 32]);
    assert_eq!([offset_of!(F, client_type), offset_of!(F, access_type)], [36, 37]);
}

/// uvm_types.h: `UvmEventGpuFaultReplayInfo_V2` is 24 bytes: eventType 0, clientType 1,
/// gpuIndex 2, batchId 4, timeStamp 8, timeStampGpu 16.
#[test]
fn gpu_fault_replay_info_v2_layout() {
    type R = GpuFaultReplayInfoV2;
    assert_eq!(size_of::<R>(), 24);
    assert_eq!(
        [offset_of!(R, event_type), offset_of!(R, client_type), offset_of!(R, gpu_index), offset_of!(R, batch_id)],
        [0, 1, 2, 4]
    );
    assert_eq!([offset_of!(R, time_stamp), offset_of!(R, time_stamp_gpu)], [8, 16]);
}

/// uvm_types.h: `UvmEventFatalFaultInfo_V2` is 24 bytes: eventType 0, faultType 1,
/// accessType 2, reason 3, processorIndex 4, address 8, timeStamp 16.
#[test]
fn fatal_fault_info_v2_layout() {
    type F = FatalFaultInfoV2;
    assert_eq!(size_of::<F>(), 24);
    assert_eq!([offset_of!(F, access_type), offset_of!(F, reason), offset_of!(F, processor_index)], [2, 3, 4]);
    assert_eq!([offset_of!(F, address), offset_of!(F, time_stamp)], [8, 16]);
}

/// uvm_types.h: UvmEventType numbering and the enable bits the tracker uses.
#[test]
fn event_numbering() {
    assert_eq!((EVENT_TYPE_GPU_FAULT, EVENT_TYPE_GPU_FAULT_REPLAY, EVENT_TYPE_FATAL_FAULT), (3, 4, 6));
    assert_eq!((EVENT_TYPE_EVICTION, EVENT_NUM_TYPES), (14, 15));
    assert_eq!(EventTracker::DEFAULT_EVENTS, 0b101_1000);
    // Only types 1..EVENT_NUM_TYPES are valid without the driver's test mode.
    assert_eq!(EventTracker::DEFAULT_EVENTS & !((1 << EVENT_NUM_TYPES) - 2), 0);
}

fn fault(gpu: u16, address: u64, batch: u32, cpu_ns: u64, gpu_ns: u64) -> GpuFaultInfoV2 {
    GpuFaultInfoV2 {
        event_type: EVENT_TYPE_GPU_FAULT,
        fault_type: 2,
        gpu_index: gpu,
        gpc_or_channel_id: 7,
        client_id: 9,
        address,
        time_stamp: cpu_ns,
        time_stamp_gpu: gpu_ns,
        batch_id: batch,
        client_type: CLIENT_TYPE_GPC,
        access_type: ACCESS_TYPE_READ,
        padding16bits: 0,
    }
}

fn replay(gpu: u16, batch: u32, cpu_ns: u64, gpu_ns: u64) -> GpuFaultReplayInfoV2 {
    GpuFaultReplayInfoV2 {
        event_type: EVENT_TYPE_GPU_FAULT_REPLAY,
        client_type: CLIENT_TYPE_GPC,
        gpu_index: gpu,
        batch_id: batch,
        time_stamp: cpu_ns,
        time_stamp_gpu: gpu_ns,
    }
}

/// A queue and control block in ordinary memory, and a producer that follows the driver's
/// `enqueue_event` (uvm_tools.c): full when one free slot is left before `get_behind`, the
/// dropped counter of the type incremented then; otherwise the entry is written at
/// `put_behind` and the next index stored to `put_ahead` and `put_behind`.
struct FakeQueue {
    mem: Vec<u64>,
    count: u32,
}

const CONTROL_WORDS: usize = size_of::<ToolsEventControlData>() / 8;

impl FakeQueue {
    fn new(count: u32) -> Self {
        Self { mem: vec![0; CONTROL_WORDS + count as usize * 9], count }
    }

    fn control(&mut self) -> NonNull<u8> {
        NonNull::new(self.mem.as_mut_ptr().cast()).unwrap()
    }

    fn entries(&mut self) -> NonNull<u8> {
        NonNull::new(self.mem[CONTROL_WORDS..].as_mut_ptr().cast()).unwrap()
    }

    fn u32_at(&self, offset: usize) -> u32 {
        let word = self.mem[offset / 8];
        match offset % 8 {
            0 => word as u32,
            _ => (word >> 32) as u32,
        }
    }

    fn set_u32_at(&mut self, offset: usize, value: u32) {
        let word = &mut self.mem[offset / 8];
        *word = match offset % 8 {
            0 => (*word & !0xffff_ffff) | u64::from(value),
            _ => (*word & 0xffff_ffff) | (u64::from(value) << 32),
        };
    }

    fn get_ahead(&self) -> u32 {
        self.u32_at(offset_of!(ToolsEventControlData, get_ahead))
    }

    fn get_behind(&self) -> u32 {
        self.u32_at(offset_of!(ToolsEventControlData, get_behind))
    }

    /// Returns whether the event was queued (or dropped).
    fn enqueue(&mut self, entry: EventEntryV2) -> bool {
        let mask = self.count - 1;
        let get_behind = self.get_behind() & mask;
        let put_behind = self.u32_at(offset_of!(ToolsEventControlData, put_behind)) & mask;
        if (self.count + get_behind - put_behind) & mask == 1 {
            self.mem[offset_of!(ToolsEventControlData, dropped) / 8 + usize::from(entry.event_type())] += 1;
            return false;
        }
        let slot = CONTROL_WORDS + put_behind as usize * 9;
        for (i, chunk) in entry.bytes.chunks_exact(8).enumerate() {
            self.mem[slot + i] = u64::from_ne_bytes(chunk.try_into().unwrap());
        }
        let next = (put_behind + 1) & mask;
        self.set_u32_at(offset_of!(ToolsEventControlData, put_ahead), next);
        self.set_u32_at(offset_of!(ToolsEventControlData, put_behind), next);
        true
    }

    fn reader(&mut self) -> EventQueue {
        let (control, entries, count) = (self.control(), self.entries(), self.count);
        // SAFETY: the fake outlives the reader in every test; both areas are 8-byte
        // aligned parts of `mem` of the sizes the reader expects.
        unsafe { EventQueue::new(control, entries, count) }.unwrap()
    }
}

fn addresses(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .map(|e| match e {
            Event::Fault(f) => f.address,
            Event::Fatal(f) => f.address,
            Event::Replay(r) => u64::from(r.batch_id),
        })
        .collect()
}

#[test]
fn reads_and_decodes_what_the_driver_writes() {
    let mut fake = FakeQueue::new(8);
    let mut queue = fake.reader();
    assert!(fake.enqueue(EventEntryV2::from_info(fault(1, 0x7f00_0000_1000, 5, 1_000, 50_000))));
    let mut migration = EventEntryV2::ZERO;
    migration.bytes[0] = EVENT_TYPE_MIGRATION;
    assert!(fake.enqueue(migration));
    assert!(fake.enqueue(EventEntryV2::from_info(replay(1, 5, 1_600, 52_000))));
    let fatal = FatalFaultInfoV2 {
        event_type: EVENT_TYPE_FATAL_FAULT,
        fault_type: 6,
        access_type: ACCESS_TYPE_WRITE,
        reason: 3,
        processor_index: 2,
        padding16bits: 0,
        address: 0xdead_0000,
        time_stamp: 2_000,
    };
    assert!(fake.enqueue(EventEntryV2::from_info(fatal)));
    assert_eq!(queue.pending(), 4);

    let mut out = Vec::new();
    assert_eq!(queue.read(&mut out), 4);
    assert_eq!(
        out,
        [
            Event::Fault(GpuFault {
                gpu_index: 1,
                address: 0x7f00_0000_1000,
                access: EventAccessType::Read,
                fault_type: EventFaultType::InvalidPte,
                client: ClientType::Gpc,
                gpc_or_channel: 7,
                client_id: 9,
                batch_id: 5,
                cpu_ns: 1_000,
                gpu_ns: 50_000,
            }),
            Event::Replay(GpuReplay {
                gpu_index: 1,
                client: ClientType::Gpc,
                batch_id: 5,
                cpu_ns: 1_600,
                gpu_ns: 52_000
            }),
            Event::Fatal(FatalFault {
                processor_index: 2,
                address: 0xdead_0000,
                access: EventAccessType::Write,
                fault_type: EventFaultType::Fatal(6),
                reason: 3,
                cpu_ns: 2_000,
            }),
        ]
    );
    assert_eq!(queue.skipped(), 1);
    assert_eq!((fake.get_ahead(), fake.get_behind()), (4, 4));
    assert_eq!(queue.pending(), 0);
    assert_eq!(queue.read(&mut out), 0);
}

#[test]
fn wraps_around() {
    let mut fake = FakeQueue::new(8);
    let mut queue = fake.reader();
    let mut out = Vec::new();
    let mut next = 0u64;
    for round in 0..10 {
        let n = [5, 6, 7, 3][round % 4];
        for _ in 0..n {
            assert!(fake.enqueue(EventEntryV2::from_info(fault(1, next, 0, 0, 0))));
            next += 1;
        }
        assert_eq!(queue.read(&mut out), n);
        assert_eq!(fake.get_behind(), (next % 8) as u32, "indices stay reduced modulo the size");
    }
    assert_eq!(addresses(&out), (0..next).collect::<Vec<_>>());
    assert_eq!((queue.dropped(), queue.skipped(), queue.bad_put()), (0, 0, 0));
}

#[test]
fn a_full_queue_holds_one_less_than_its_size_and_counts_drops() {
    let mut fake = FakeQueue::new(4);
    let mut queue = fake.reader();
    for address in 0..5 {
        let queued = fake.enqueue(EventEntryV2::from_info(fault(1, address, 0, 0, 0)));
        assert_eq!(queued, address < 3, "event {address}");
    }
    assert!(!fake.enqueue(EventEntryV2::from_info(replay(1, 0, 0, 0))));
    assert_eq!(
        (queue.dropped(), queue.dropped_of(EVENT_TYPE_GPU_FAULT), queue.dropped_of(EVENT_TYPE_GPU_FAULT_REPLAY)),
        (3, 2, 1)
    );
    let mut out = Vec::new();
    assert_eq!(queue.read(&mut out), 3);
    assert_eq!(addresses(&out), [0, 1, 2]);
    // The freed slots take new events, across the end of the queue.
    for address in 10..13 {
        assert!(fake.enqueue(EventEntryV2::from_info(fault(1, address, 0, 0, 0))));
    }
    out.clear();
    assert_eq!(queue.read(&mut out), 3);
    assert_eq!(addresses(&out), [10, 11, 12]);
}

#[test]
fn starts_at_get_behind_and_survives_a_bad_put() {
    let mut fake = FakeQueue::new(8);
    fake.set_u32_at(offset_of!(ToolsEventControlData, get_behind), 6);
    fake.set_u32_at(offset_of!(ToolsEventControlData, put_behind), 6);
    let mut queue = fake.reader();
    assert_eq!(fake.get_ahead(), 6);
    for address in 0..4 {
        assert!(fake.enqueue(EventEntryV2::from_info(fault(1, address, 0, 0, 0))));
    }
    let mut out = Vec::new();
    assert_eq!(queue.read(&mut out), 4);
    assert_eq!(addresses(&out), [0, 1, 2, 3]);
    assert_eq!(fake.get_behind(), 2);
    // An index no driver writes is reduced and counted, never followed out of the queue.
    fake.set_u32_at(offset_of!(ToolsEventControlData, put_behind), 0xffff_fff3);
    out.clear();
    assert_eq!(queue.read(&mut out), 1);
    assert!(queue.bad_put() >= 1);
    assert_eq!(fake.get_behind(), 3);
}

#[test]
fn refuses_sizes_the_driver_refuses() {
    let mut fake = FakeQueue::new(8);
    let (control, entries) = (fake.control(), fake.entries());
    for count in [0, 1, 6] {
        // SAFETY: as in `FakeQueue::reader`; the size is refused before any access.
        assert!(matches!(unsafe { EventQueue::new(control, entries, count) }, Err(UvmToolsError::Layout(_))));
    }
    let dir = std::env::temp_dir();
    let borrowed = fake_fd();
    for entries in [0, 3, EventTracker::MAX_QUEUE_ENTRIES * 2] {
        assert!(matches!(EventTracker::attach(borrowed.as_fd(), &dir, entries), Err(UvmToolsError::Layout(_))));
    }
}

#[test]
fn queue_memory_is_page_aligned_as_the_driver_checks() {
    let page = page_size();
    let memory = QueueMemory::new(1024).unwrap();
    assert_eq!(memory.control().as_ptr() as usize % page, 0);
    assert_eq!(memory.queue().as_ptr() as usize % page, 0);
    assert!(memory.queue_offset >= size_of::<ToolsEventControlData>());
    assert!(memory.len >= memory.queue_offset + 1024 * size_of::<EventEntryV2>());
    assert_eq!(memory.len % page, 0);
    // The reader works on it as on the fake: fresh memory is an empty queue at index 0.
    // SAFETY: `memory` outlives the reader; both areas are page aligned and sized.
    let mut queue = unsafe { EventQueue::new(memory.control(), memory.queue(), 1024) }.unwrap();
    assert_eq!((queue.pending(), queue.dropped()), (0, 0));
}

#[test]
fn trackers_and_readers_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<EventTracker>();
    send::<EventQueue>();
    send::<FaultStats>();
}

fn fake_fd() -> File {
    File::open("/dev/null").unwrap()
}

#[test]
fn attach_reports_a_missing_device() {
    let missing = Path::new("/nonexistent/nvidia-uvm-tools");
    let err = EventTracker::attach(fake_fd().as_fd(), missing, 1024).err().unwrap();
    assert!(matches!(err, UvmToolsError::Open(ref e) if e.kind() == io::ErrorKind::NotFound), "{err}");
}

#[test]
fn errors_name_the_status() {
    let e = UvmToolsError::Status { call: "UVM_TOOLS_INIT_EVENT_TRACKER_V2", nv_status: NV_ERR_ILLEGAL_ACTION };
    assert!(e.is_not_va_space());
    assert_eq!(
        e.to_string(),
        "UVM_TOOLS_INIT_EVENT_TRACKER_V2: NV_ERR_ILLEGAL_ACTION (0x16) (not an initialized nvidia-uvm VA-space file)"
    );
    let e = UvmToolsError::Ioctl { call: "UVM_TOOLS_INIT_EVENT_TRACKER_V2", errno: Errno::EINVAL };
    assert!(e.to_string().ends_with("(drivers before 565 lack this call)"));
    assert_eq!(UvmToolsError::Status { call: "x", nv_status: 0x1234 }.to_string(), "x: NV_STATUS 0x1234");
}

fn fault_event(gpu: u16, address: u64, batch: u32, cpu_ns: u64, gpu_ns: u64) -> Event {
    Event::decode(&EventEntryV2::from_info(fault(gpu, address, batch, cpu_ns, gpu_ns))).unwrap()
}

fn replay_event(gpu: u16, batch: u32, cpu_ns: u64, gpu_ns: u64) -> Event {
    Event::decode(&EventEntryV2::from_info(replay(gpu, batch, cpu_ns, gpu_ns))).unwrap()
}

#[test]
fn ranges_are_merged_and_half_open() {
    let stats = FaultStats::new([0x3000..0x5000, 0x1000..0x2000, 0x1800..0x3000, 0x9000..0x9000]);
    assert_eq!(stats.ranges(), [(0x1000, 0x5000)]);
    assert!(!stats.watched(0xfff));
    assert!(stats.watched(0x1000));
    assert!(stats.watched(0x4fff));
    assert!(!stats.watched(0x5000));
    assert!(!stats.watched(0x9000));
    let stats = FaultStats::new([0x1000..0x2000, 0x3000..0x4000]);
    assert!(!stats.watched(0x2000) && !stats.watched(0x2fff) && stats.watched(0x3000));
    // Ranges added one by one end up as if given at once.
    let mut grown = FaultStats::new(None);
    for range in [0x3000..0x5000, 0x1000..0x2000, 0x1800..0x3000, 0x9000..0x9000] {
        assert!(grown.watch(range));
    }
    assert_eq!(grown.ranges(), [(0x1000, 0x5000)]);
}

#[test]
fn a_space_watches_a_bounded_number_of_disjoint_ranges() {
    let mut stats = FaultStats::new(None);
    let page = |i: u64| i * 0x2000..i * 0x2000 + 0x1000;
    for i in 0..FaultStats::MAX_RANGES as u64 {
        assert!(stats.watch(page(i)));
    }
    assert!(!stats.watch(page(FaultStats::MAX_RANGES as u64)), "one more disjoint range is refused");
    assert_eq!(stats.ranges().len(), FaultStats::MAX_RANGES, "and changes nothing");
    assert!(stats.watch(0..0x7000), "a range that merges others is taken");
    assert_eq!(stats.ranges().len(), FaultStats::MAX_RANGES - 3);
}

#[test]
fn pairs_faults_with_the_replay_of_their_batch() {
    let mut stats = FaultStats::new(Some(0x1000..0x3000));
    stats.record_all(&[
        fault_event(1, 0x1000, 5, 1_000, 10_000), // A
        fault_event(1, 0x2000, 5, 1_100, 10_500), // B
        fault_event(1, 0x9000, 5, 1_150, 10_600), // outside
        fault_event(2, 0x1000, 5, 1_200, 0),      // D, another GPU, no GPU timestamp
        fault_event(1, 0x1000, 6, 1_500, 11_000), // E, the next batch, before batch 5's replay
        replay_event(1, 5, 1_600, 12_000),        // ends A (600 / 2000) and B (500 / 1500)
        replay_event(2, 4, 1_300, 0),             // an earlier batch: D waits
        replay_event(2, 5, 1_250, 5),             // ends D (50; no GPU sample)
    ]);
    assert_eq!((stats.watched_faults(), stats.other_faults(), stats.replays()), (4, 1, 3));
    assert_eq!((stats.paired(), stats.unpaired(), stats.waiting()), (3, 0, 1));

    let cpu = stats.latency_cpu();
    assert_eq!((cpu.count(), cpu.sum(), cpu.max(), cpu.min()), (3, 1_150, 600, Some(50)));
    // 50 in [32, 63], 500 in [256, 511], 600 in [512, 1023].
    assert_eq!(cpu.buckets().collect::<Vec<_>>(), [(63, 1), (511, 1), (1023, 1)]);
    assert_eq!(cpu.quantile(0.5), Some(511));
    let gpu = stats.latency_gpu();
    assert_eq!((gpu.count(), gpu.sum(), gpu.max()), (2, 3_500, 2_000));
    assert_eq!(gpu.buckets().collect::<Vec<_>>(), [(2047, 2)]);

    // E is ended by its own batch's replay.
    stats.record(&replay_event(1, 6, 1_900, 11_700));
    assert_eq!((stats.paired(), stats.waiting()), (4, 0));
    assert_eq!(stats.latency_cpu().max(), 600);
    assert_eq!(stats.latency_gpu().sum(), 3_500 + 700);
}

#[test]
fn a_replay_queued_before_the_fault_was_serviced_does_not_end_it() {
    let mut stats = FaultStats::new(Some(0..u64::MAX));
    stats.record(&replay_event(1, 8, 900, 0));
    stats.record(&fault_event(1, 0x1000, 8, 1_000, 0));
    stats.record(&replay_event(1, 8, 950, 0)); // same batch, but earlier than the fault
    assert_eq!((stats.paired(), stats.waiting()), (0, 1));
    stats.record(&replay_event(1, 8, 1_400, 0));
    assert_eq!((stats.paired(), stats.latency_cpu().sum()), (1, 400));
}

#[test]
fn replays_of_other_client_types_do_not_pair() {
    let mut stats = FaultStats::new(Some(0..u64::MAX));
    stats.record(&fault_event(1, 0x1000, 3, 1_000, 0));
    let mut hub = replay(1, 3, 2_000, 0);
    hub.client_type = CLIENT_TYPE_HUB;
    stats.record(&Event::decode(&EventEntryV2::from_info(hub)).unwrap());
    assert_eq!((stats.paired(), stats.waiting()), (0, 1));
}

#[test]
fn faults_whose_replay_never_comes_are_given_up() {
    let mut stats = FaultStats::new(Some(0..u64::MAX));
    stats.record(&fault_event(1, 0x1000, u32::MAX - 1, 1_000, 0));
    stats.record(&replay_event(1, (u32::MAX - 1).wrapping_add(FaultStats::STALE_BATCHES), 2_000, 0));
    assert_eq!((stats.unpaired(), stats.waiting()), (0, 1), "within the slack (batch ids wrap)");
    stats.record(&replay_event(1, (u32::MAX - 1).wrapping_add(FaultStats::STALE_BATCHES + 1), 2_000, 0));
    assert_eq!((stats.unpaired(), stats.waiting(), stats.paired()), (1, 0, 0));

    for i in 0..=FaultStats::MAX_PENDING as u64 {
        stats.record(&fault_event(1, i, 0, 0, 0));
    }
    assert_eq!((stats.unpaired(), stats.waiting()), (2, FaultStats::MAX_PENDING));
}

#[test]
fn fatal_faults_are_counted_by_range() {
    let mut stats = FaultStats::new(Some(0x1000..0x2000));
    for address in [0x1000, 0x3000, 0x1fff] {
        let fatal = FatalFaultInfoV2 { event_type: EVENT_TYPE_FATAL_FAULT, address, ..Default::default() };
        stats.record(&Event::decode(&EventEntryV2::from_info(fatal)).unwrap());
    }
    assert_eq!(stats.fatal(), (2, 1));
}
