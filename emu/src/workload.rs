//! The ten applications of the WIC paper (Table 2) as communication-pattern models.
//!
//! A workload is a number of iterations of one or more phases; a phase is one communication: a
//! producer (host or GPU) fills one slot per consumer CTA and request, and a consumer kernel on a
//! GPU runs C1 (independent work), waits for its data, then runs C2 (dependent work). The access
//! pattern sets the order in which the producer finishes slots relative to the consumer's order;
//! the communication model sets the phases, requests per warp and request probability.
//!
//! The sizes are chosen from each application's structure (how much independent work precedes a
//! communication, how many communications an iteration has); none is fitted to a result.

/// Who produces or consumes in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Host,
    Gpu(u16),
}

/// Order in which the producer completes the slots of a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProduceOrder {
    /// Slot order: streaming and adjacent patterns.
    Sequential,
    /// A fresh random permutation each iteration: random and scatter-gather patterns.
    Shuffled,
    /// Request by request: message r of every CTA before message r + 1 of any, as when each
    /// producer lane (a block on the other GPU) streams one CTA's messages in order.
    RequestMajor,
}

/// One communication of an iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub producer: Endpoint,
    /// A host consumer (the GPU-to-host half of CPU-GPU alternating models) reads the result with
    /// one copy after the kernel, the same in every mode.
    pub consumer: Endpoint,
    pub ctas: u32,
    pub warps_per_cta: u32,
    pub requests_per_warp: u32,
    /// Instructions per warp before the first request, and after each request.
    pub c1_instr: u64,
    pub c2_instr: u64,
    /// Share of C1's and C2's time alone spent on memory accesses that leave the SM (L1 misses),
    /// which make no progress while a warp of the SM is stalled on a fault (`Calibration::stall`):
    /// `1 / (1 + intensity / balance)`, the kernel's arithmetic intensity (flop per byte of device
    /// memory) against the H100's balance, [`H100_BALANCE`] flop per byte.
    pub memory_share: f64,
    /// Each warp's work is scaled by a uniform factor in [1 - jitter, 1 + jitter].
    pub jitter: f64,
    /// Fraction of CTAs that never communicate (independent threads, paper Fig. 7).
    pub independent_ctas: f64,
    /// Probability that a CTA communicates in an iteration (probabilistic model).
    pub request_probability: f64,
    pub message_bytes: u32,
    pub order: ProduceOrder,
    /// Producer: time to produce one slot, parallel producer lanes, delay before it starts.
    pub produce_ns: u64,
    pub producer_lanes: u32,
    pub producer_start_ns: u64,
    /// Each slot's production time is scaled by a uniform factor in [1 - spread, 1 + spread].
    pub produce_spread: f64,
    /// Slots a host producer hands over in one publish (one copy and its ready words, as
    /// wic.cuh's publish_many() does), in the order it produces them.
    pub publish_slots: u32,
    /// An exchange: after each message's work the warp sends one of its own to the producer
    /// GPU, and waits until the send is out (`Sim::send_ns`; under WIC a PAT fault of its own,
    /// `Sim::wic_send`).
    pub sends_back: bool,
    /// Host compute after a host consumer's copy.
    pub host_compute_ns: u64,
}

/// A named application model.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: &'static str,
    pub title: &'static str,
    pub pattern: &'static str,
    pub model: &'static str,
    pub iterations: u32,
    pub phases: Vec<Phase>,
}

impl Workload {
    /// Number of GPUs the workload uses.
    pub fn gpus(&self) -> u16 {
        let ends = self.phases.iter().flat_map(|p| [p.producer, p.consumer]);
        ends.filter_map(|e| match e {
            Endpoint::Gpu(g) => Some(g + 1),
            Endpoint::Host => None,
        })
        .max()
        .unwrap_or(1)
    }

    /// The same workload with every GPU-consumer phase resized to `threads` threads.
    pub fn with_threads(mut self, threads: u32) -> Self {
        for phase in self.phases.iter_mut().filter(|p| p.consumer != Endpoint::Host) {
            let warps = threads.div_ceil(32).max(1);
            phase.warps_per_cta = warps.min(16);
            phase.ctas = warps.div_ceil(phase.warps_per_cta);
        }
        self
    }
}

/// The H100 SXM5's FP32 rate over its memory bandwidth (datasheet: 67 TFLOP/s, 3.35 TB/s): the
/// arithmetic intensity at which a kernel's memory and arithmetic take equally long.
pub const H100_BALANCE: f64 = 67.0 / 3.35;

/// [`Phase::memory_share`] of a kernel of `intensity` flop per byte of device memory.
pub fn memory_share(intensity: f64) -> f64 {
    1.0 / (1.0 + intensity / H100_BALANCE)
}

/// A GPU-consumer phase with the defaults shared by the models below.
fn consumer_phase(producer: Endpoint, consumer: u16) -> Phase {
    Phase {
        producer,
        consumer: Endpoint::Gpu(consumer),
        ctas: 1056,
        warps_per_cta: 16,
        requests_per_warp: 1,
        c1_instr: 20_000,
        c2_instr: 10_000,
        memory_share: memory_share(0.0),
        jitter: 0.3,
        independent_ctas: 0.0,
        request_probability: 1.0,
        message_bytes: 256,
        order: ProduceOrder::Sequential,
        produce_ns: 2_000,
        producer_lanes: 8,
        producer_start_ns: 0,
        produce_spread: 0.2,
        publish_slots: 1,
        sends_back: false,
        host_compute_ns: 0,
    }
}

/// The GPU-to-host half of a CPU-GPU alternating iteration.
fn host_consumer_phase(from: u16, bytes_per_cta: u32, host_compute_ns: u64) -> Phase {
    Phase {
        producer: Endpoint::Gpu(from),
        consumer: Endpoint::Host,
        message_bytes: bytes_per_cta,
        host_compute_ns,
        ..consumer_phase(Endpoint::Gpu(from), from)
    }
}

/// The ten applications of paper Table 2.
pub fn all() -> Vec<Workload> {
    use Endpoint::{Gpu, Host};
    vec![
        Workload {
            name: "C_SRS",
            title: "satellite image processing and distribution",
            pattern: "streaming",
            model: "unidirectional",
            iterations: 6,
            // Each 4-byte pixel read once and transformed with a few operations: 0.5 flop/B.
            phases: vec![Phase {
                message_bytes: 1024,
                c1_instr: 16_000,
                produce_ns: 3_000,
                memory_share: memory_share(0.5),
                ..consumer_phase(Host, 0)
            }],
        },
        Workload {
            name: "C_CG",
            title: "conjugate gradients",
            pattern: "random",
            model: "alternating",
            iterations: 6,
            phases: vec![
                // Sparse matrix-vector product: 2 flop per 12-byte nonzero (value and column).
                Phase {
                    order: ProduceOrder::Shuffled,
                    c1_instr: 24_000,
                    c2_instr: 12_000,
                    produce_ns: 2_500,
                    memory_share: memory_share(2.0 / 12.0),
                    ..consumer_phase(Host, 0)
                },
                host_consumer_phase(0, 64, 40_000),
            ],
        },
        Workload {
            name: "C_FE",
            title: "finite element mini-application",
            pattern: "random",
            model: "alternating",
            iterations: 6,
            phases: vec![
                // Element assembly (a few hundred flop per element's ~100 bytes), then CG.
                Phase {
                    order: ProduceOrder::Shuffled,
                    c1_instr: 28_000,
                    c2_instr: 16_000,
                    message_bytes: 512,
                    produce_ns: 3_000,
                    memory_share: memory_share(3.0),
                    ..consumer_phase(Host, 0)
                },
                host_consumer_phase(0, 128, 60_000),
            ],
        },
        Workload {
            name: "C_H3D",
            title: "halo exchange on a 3D cube",
            pattern: "adjacent",
            model: "multiple",
            iterations: 4,
            // 7-point stencil: 8 flop per point read and written (8 bytes).
            phases: vec![Phase {
                requests_per_warp: 3,
                c1_instr: 8_000,
                c2_instr: 6_000,
                produce_ns: 1_200,
                producer_lanes: 12,
                memory_share: memory_share(1.0),
                ..consumer_phase(Host, 0)
            }],
        },
        Workload {
            name: "G_BFS",
            title: "breadth-first search",
            pattern: "random",
            model: "probabilistic",
            iterations: 8,
            // Graph traversal: loads and compare-and-swaps, no arithmetic to speak of.
            phases: vec![Phase {
                order: ProduceOrder::Shuffled,
                request_probability: 0.4,
                c1_instr: 10_000,
                c2_instr: 6_000,
                produce_ns: 800,
                memory_share: memory_share(0.0),
                ..consumer_phase(Gpu(1), 0)
            }],
        },
        Workload {
            name: "G_BS",
            title: "bitonic sort (global merge)",
            pattern: "scatter-gather",
            model: "multiple",
            iterations: 4,
            // Scenario 1: the other GPU's sorted runs exist before the merge kernel needs them.
            // Compare-and-swap passes: one comparison per 8 bytes read and written.
            phases: vec![Phase {
                order: ProduceOrder::Shuffled,
                requests_per_warp: 2,
                c1_instr: 12_000,
                c2_instr: 8_000,
                produce_ns: 100,
                producer_lanes: 64,
                memory_share: memory_share(1.0 / 8.0),
                ..consumer_phase(Gpu(1), 0)
            }],
        },
        Workload {
            name: "G_C2D",
            title: "2D convolution",
            pattern: "adjacent",
            model: "alternating",
            iterations: 4,
            // 3 x 3 filter: 17 flop per output point, 8 bytes read and written (neighbours cached);
            // the seam row one way, then the other.
            phases: [(0, 1), (1, 0)]
                .map(|(from, to)| Phase {
                    c1_instr: 18_000,
                    c2_instr: 12_000,
                    memory_share: memory_share(17.0 / 8.0),
                    ..consumer_phase(Gpu(from), to)
                })
                .to_vec(),
        },
        Workload {
            name: "G_STN",
            title: "stencil",
            pattern: "adjacent",
            model: "multiple",
            iterations: 4,
            // 5-point Jacobi: 5 flop per point read and written (8 bytes).
            phases: vec![Phase {
                requests_per_warp: 2,
                c1_instr: 14_000,
                c2_instr: 8_000,
                produce_ns: 1_500,
                memory_share: memory_share(5.0 / 8.0),
                ..consumer_phase(Gpu(1), 0)
            }],
        },
        Workload {
            name: "G_GEM",
            title: "general matrix multiplication",
            pattern: "streaming",
            model: "multiple",
            iterations: 3,
            // 64 x 64 tiles through shared memory: 2 * 64^3 flop per 2 * 64^2 floats loaded, 16 flop/B.
            phases: vec![Phase {
                requests_per_warp: 3,
                c1_instr: 12_000,
                c2_instr: 9_000,
                produce_ns: 1_000,
                producer_lanes: 16,
                memory_share: memory_share(16.0),
                ..consumer_phase(Gpu(1), 0)
            }],
        },
        Workload {
            name: "G_KMN",
            title: "k-means",
            pattern: "streaming",
            model: "unidirectional",
            iterations: 6,
            // Each 128-byte point against 16 centroids of 32 features: 3 flop each, 12 flop/B.
            phases: vec![Phase {
                c1_instr: 22_000,
                c2_instr: 6_000,
                independent_ctas: 0.1,
                memory_share: memory_share(1536.0 / 128.0),
                ..consumer_phase(Gpu(1), 0)
            }],
        },
    ]
}

/// Looks a workload up by name, case-insensitively.
pub fn by_name(name: &str) -> Option<Workload> {
    all().into_iter().find(|w| w.name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_distinct_workloads_cover_every_pattern_and_model() {
        let all = all();
        assert_eq!(all.len(), 10);
        for pattern in ["streaming", "random", "adjacent", "scatter-gather"] {
            assert!(all.iter().any(|w| w.pattern == pattern), "{pattern}");
        }
        for model in ["unidirectional", "alternating", "multiple", "probabilistic"] {
            assert!(all.iter().any(|w| w.model == model), "{model}");
        }
        assert_eq!(all.iter().filter(|w| w.gpus() == 2).count(), 6);
        assert!(by_name("g_stn").is_some() && by_name("nope").is_none());
    }

    #[test]
    fn thread_scaling_resizes_consumer_kernels() {
        let w = by_name("C_CG").unwrap().with_threads(64);
        assert_eq!((w.phases[0].ctas, w.phases[0].warps_per_cta), (1, 2));
        assert_eq!(w.phases[1].ctas, 1056, "host-consumer phases are untouched");
        let w = by_name("C_CG").unwrap().with_threads(1 << 20);
        assert_eq!((w.phases[0].ctas, w.phases[0].warps_per_cta), (2048, 16));
    }
}
