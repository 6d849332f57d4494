//! The co-run on the model: what consumers waiting in each mode cost another kernel that shares
//! every SM with them, as `device/bench/corun.cu` measures it on a GPU. One block of 4 warps per
//! SM waits for a host producer's 256-byte messages, a generation of every block per publish,
//! back to back or a gap apart; beside them, 8 warps per SM of a neighbour whose work spends a
//! share of its time on memory accesses that leave the SM. The run is the model's own
//! ([`crate::sim::try_run_beside`]): the neighbour's speed at each moment follows from the SM's
//! state by the rules the model's warps go by (issue sharing, progress beside a fault-stalled
//! warp and beside warps spinning on host memory), nothing fitted to the co-run's results. Its
//! modes are [`Mode::CORUN`].

use crate::sim::{try_run_beside, Neighbour};
use crate::workload::{memory_share, Endpoint, Phase, ProduceOrder, Workload};
use crate::{Calibration, Mode};

/// Generations of a co-run as wic-report and `wicd demo` run it, and the gaps between the
/// host's publishes: back to back and 1 ms apart, the ends of the GPU run's gaps.
pub const GENERATIONS: u32 = 200;
pub const GAPS_NS: [u64; 2] = [0, 1_000_000];

/// The consumers' shape, `corun.cu`'s: warps per SM, bytes of a warp's message.
pub const CONSUMER_WARPS: u32 = 4;
const MESSAGE_BYTES: u32 = 256;
/// The neighbour's warps per SM, `corun.cu`'s.
pub const NEIGHBOUR_WARPS: u32 = 8;
/// A consumer warp's use of its message: a load per lane and the checks of its stamp.
const USE_INSTR: u64 = 64;

/// A kind of neighbour, `corun.cu`'s, by the share of its time alone on memory accesses that
/// leave the SM: its arithmetic kernels none, its L2- and DRAM-bound loads all of it, and its
/// second consumer (C_SRS's reduction over device memory, 0.5 flop per byte) the share the model
/// gives that intensity.
pub fn neighbours() -> [(&'static str, f64); 5] {
    [("fma_chain", 0.0), ("fma_ilp", 0.0), ("l2_loads", 1.0), ("dram_loads", 1.0), ("consumer", memory_share(0.5))]
}

/// The consumers of `generations` generations on `sms` SMs, the host producing a generation
/// every `gap_ns` (at its publish's own pace for 0).
pub fn workload(sms: u32, generations: u32, gap_ns: u64) -> Workload {
    Workload {
        name: "corun",
        title: "consumers beside a neighbour kernel",
        pattern: "streaming",
        model: "unidirectional",
        iterations: 1,
        phases: vec![Phase {
            producer: Endpoint::Host,
            consumer: Endpoint::Gpu(0),
            ctas: sms,
            warps_per_cta: CONSUMER_WARPS,
            requests_per_warp: generations,
            c1_instr: 0,
            c2_instr: USE_INSTR,
            memory_share: 0.0,
            jitter: 0.0,
            independent_ctas: 0.0,
            request_probability: 1.0,
            message_bytes: MESSAGE_BYTES,
            order: ProduceOrder::RequestMajor,
            produce_ns: gap_ns.div_ceil(u64::from(sms)),
            producer_lanes: 1,
            producer_start_ns: 0,
            produce_spread: 0.0,
            publish_slots: sms,
            sends_back: false,
            host_compute_ns: 0,
        }],
    }
}

/// The neighbour's throughput beside the consumers over alone, per kind of [`neighbours`], for
/// the consumers of [`workload`] waiting in `mode`.
pub fn throughput(cal: &Calibration, mode: Mode, generations: u32, gap_ns: u64, seed: u64) -> Result<Vec<f64>, String> {
    let kinds: Vec<Neighbour> =
        neighbours().iter().map(|&(_, memory_share)| Neighbour { warps: NEIGHBOUR_WARPS, memory_share }).collect();
    let (_, speeds) = try_run_beside(&workload(cal.gpu.sms.value, generations, gap_ns), mode, cal, seed, &kinds)?;
    Ok(speeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        Calibration::built_in()
    }

    #[test]
    fn waiting_that_costs_nothing_leaves_the_neighbour_its_speed() {
        // push's waiters neither spin nor stall in the model: only their tiny use of each
        // message shares issue with the neighbour.
        let push = throughput(&cal(), Mode::Push, 20, 0, 1).unwrap();
        assert!(push.iter().all(|&t| t > 0.98 && t <= 1.0), "{push:?}");
    }

    #[test]
    fn held_faults_stop_memory_bound_neighbours_and_spare_arithmetic() {
        let cal = cal();
        let wic = throughput(&cal, Mode::Fault, 20, 0, 1).unwrap();
        let (arithmetic, memory) = (wic[1], wic[3]);
        // While faults are held the memory-bound neighbour goes at the measured stall progress;
        // the run has moments with none held, so it ends above it but far below push.
        assert!(memory < 0.5 && memory > cal.stall.memory_progress.value, "{wic:?}");
        assert!(arithmetic > 0.9, "{wic:?}");
    }

    #[test]
    fn spinning_on_host_memory_costs_memory_bound_neighbours_what_the_calibration_says() {
        let cal = cal();
        let poll = throughput(&cal, Mode::Poll, 20, 0, 1).unwrap();
        let spin = cal.poll.host_spin_memory_progress.value;
        assert!(poll[3] >= spin * 0.99 && poll[3] < 0.2, "{poll:?}");
        assert!(poll[0] > 0.9, "{poll:?}");
    }
}
