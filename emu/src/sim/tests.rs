//! The model's own checks: its layout and memory limits, and runs at the ends of every
//! calibration range.

mod layout {
    use super::super::*;
    use crate::workload::{all, by_name};

    #[test]
    fn the_engine_keeps_its_default_size_unless_a_workload_needs_more() {
        let default = EngineConfig::default();
        for w in all().into_iter().chain(all().into_iter().map(|w| w.with_threads(16 * 1024))) {
            let config = check(&w).unwrap();
            assert_eq!((config.pool_pages, config.max_slots), (default.pool_pages, ENGINE_SLOTS), "{}", w.name);
        }
        // At a million threads G_GEM's channel takes 6144 slots x (2 runs + 2 PAT pages): more than
        // the default 16K pages, so it used to be refused (a panic in the demo's sweep).
        let gem = by_name("G_GEM").unwrap().with_threads(1 << 20);
        assert_eq!(check(&gem).unwrap().pool_pages, 6144 * 4);
        let report = try_run(&gem, Mode::Fault, &Calibration::built_in(), 1).unwrap();
        assert!(report.messages_checked > 0 && report.corrupt_messages == 0 && report.pool_restored);
    }

    #[test]
    fn a_workload_past_the_models_layout_is_refused_before_anything_is_allocated() {
        // 512M threads: 2^20 CTAs of three requests each; each run needs gigabytes when it starts.
        let gem = by_name("G_GEM").unwrap().with_threads(512 << 20);
        let reason = check(&gem).unwrap_err();
        assert!(reason.contains("3145728 request slots") && reason.contains("1048576"), "{reason}");
        for mode in [Mode::Alg1, Mode::Fault] {
            assert_eq!(try_run(&gem, mode, &Calibration::built_in(), 1).unwrap_err(), reason);
        }
        let mut empty = by_name("C_CG").unwrap();
        empty.phases[0].ctas = 0;
        assert!(check(&empty).unwrap_err().contains("phase 0"));
    }

    #[test]
    fn the_memory_estimate_grows_with_the_workload_and_fault_mode_needs_more() {
        for w in all() {
            let (small, large) = (w.clone().with_threads(1 << 20), w.with_threads(16 << 20));
            let poll = memory_estimate(&large, Mode::Alg1);
            assert!(
                memory_estimate(&large, Mode::Fault) > poll && poll > memory_estimate(&small, Mode::Alg1),
                "{}",
                large.name
            );
        }
        // C_SRS, the largest, at the 16M threads `wicd demo --scale` allows: measured 1.54 GiB.
        let srs = memory_estimate(&by_name("C_SRS").unwrap().with_threads(16 << 20), Mode::Fault);
        assert!((1_650_000_000..2_500_000_000).contains(&srs), "{srs}");
        let mut huge = by_name("C_SRS").unwrap();
        (huge.phases[0].ctas, huge.phases[0].message_bytes) = (u32::MAX, u32::MAX);
        assert_eq!(memory_estimate(&huge, Mode::Fault), u64::MAX, "saturates");
    }
}

mod calibration {
    use super::super::*;
    use crate::calibration::{
        CLOCK_GHZ, FAULT_ENTRIES, GBPS, ISSUE_WEIGHT, LATENCY_NS, PROGRESS, SCHEDULERS_PER_SM, SMS, WARP_IPC,
        WARP_SLOTS_PER_SM,
    };
    use crate::workload::{all, by_name};

    /// The slowest GPU, fault path and links a calibration file may describe (`slow`), or the
    /// fastest.
    fn extreme(slow: bool) -> Calibration {
        let end = |r: &std::ops::RangeInclusive<u32>, low: bool| if low { *r.start() } else { *r.end() };
        let endf = |r: &std::ops::RangeInclusive<f64>, low: bool| if low { *r.start() } else { *r.end() };
        let mut cal = Calibration::built_in();
        cal.gpu.sms.value = end(&SMS, slow);
        cal.gpu.warp_slots_per_sm.value = end(&WARP_SLOTS_PER_SM, slow);
        cal.gpu.schedulers_per_sm.value = end(&SCHEDULERS_PER_SM, slow);
        cal.gpu.clock_ghz.value = endf(&CLOCK_GHZ, slow);
        cal.gpu.warp_ipc.value = endf(&WARP_IPC, slow);
        cal.fault.buffer_entries.value = end(&FAULT_ENTRIES, slow);
        cal.fault.batch_max.value = end(&FAULT_ENTRIES, slow);
        for (_, latency) in cal.latencies_mut() {
            *latency = if slow { *LATENCY_NS.end() } else { *LATENCY_NS.start() };
        }
        for rate in [&mut cal.link.pcie_gbps.value, &mut cal.link.nvlink_gbps.value, &mut cal.host.memcpy_gbps.value] {
            *rate = endf(&GBPS, slow);
        }
        cal.poll.issue_weight.value = endf(&ISSUE_WEIGHT, !slow);
        cal.stall.compute_progress.value = endf(&PROGRESS, slow);
        cal.stall.memory_progress.value = endf(&PROGRESS, slow);
        cal
    }

    /// Every workload every way (WIC's three ways with host producers) at the ends of every
    /// calibration range, at 16K consumer threads: each run finishes, none panics (overflow
    /// checks are on in tests), and every message arrives intact.
    #[test]
    fn every_workload_runs_at_the_ends_of_every_calibration_range() {
        for slow in [true, false] {
            let cal = extreme(slow);
            for w in all().into_iter().map(|w| w.with_threads(16 << 10)) {
                let host_fed = w.phases.iter().any(|p| p.producer == Endpoint::Host);
                let wic_ways: &[Mode] =
                    if host_fed { &[Mode::Fault, Mode::FaultCopy, Mode::FaultCopyEngine] } else { &[Mode::Fault] };
                for &mode in [Mode::Alg1, Mode::Push].iter().chain(wic_ways) {
                    let report =
                        try_run(&w, mode, &cal, 1).unwrap_or_else(|e| panic!("{} {}: {e}", w.name, mode.name()));
                    assert!(
                        report.messages_checked > 0 && report.corrupt_messages == 0,
                        "{} {}: {report:?}",
                        w.name,
                        mode.name()
                    );
                    assert!(report.pool_restored && report.pfq_empty, "{} {}", w.name, mode.name());
                }
            }
        }
    }

    /// A `Calibration` built in code is not checked: a latency of `u64::MAX` used to overflow the
    /// clock (a panic with overflow checks, a wrapped time without). The run ends as an error.
    #[test]
    fn a_clock_past_the_limit_ends_the_run_as_an_error() {
        let w = crate::workload::by_name("C_CG").unwrap().with_threads(64);
        for index in 0..12 {
            let mut cal = Calibration::built_in();
            *cal.latencies_mut()[index].1 = u64::MAX;
            for mode in [Mode::Alg1, Mode::Fault] {
                match try_run(&w, mode, &cal, 1) {
                    Ok(report) => assert!(report.runtime_ns <= CLOCK_LIMIT, "latency {index} {}", mode.name()),
                    Err(e) => assert!(e.contains("the emulated clock would pass 4611686018427387904 ns"), "{e}"),
                }
            }
        }
        let mut cal = Calibration::built_in();
        cal.fault.interrupt_to_bh_ns.value = u64::MAX;
        assert!(try_run(&w, Mode::Fault, &cal, 1).is_err(), "every fault goes through the bottom half");
        cal.gpu.clock_ghz.value = 1e-300;
        assert!(try_run(&w, Mode::Alg1, &cal, 1).is_err(), "compute that takes forever");
    }

    /// device/bench/stall_cost.cu's measurement on an H100 (committed with the calibration it
    /// gave): the median progress, beside fault-stalled warps, of the work kinds in `works`.
    fn measured_progress(works: &[&str]) -> f64 {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../device/bench/results/stall-cost-h100-2026-11-26.jsonl");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut progress: Vec<f64> = text
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
            .filter(|r| {
                r["measurement"] == "stall_cost"
                    && r["pages"] == "host_resident"
                    && r.get("stalls_on").is_none()
                    && works.iter().any(|w| r["work"] == *w)
            })
            .map(|r| r["progress_while_stalled"].as_f64().expect("a number"))
            .collect();
        assert!(!progress.is_empty(), "no {works:?} in {path}");
        progress.sort_by(f64::total_cmp);
        let n = progress.len();
        if n % 2 == 1 {
            progress[n / 2]
        } else {
            (progress[n / 2 - 1] + progress[n / 2]) / 2.0
        }
    }

    /// The measurement the stall model is built from, run through the model: one SM, 8 warps
    /// of work (a CTA that never waits) beside 8 warps stalled on a fault (a CTA whose data
    /// comes late), for work of no memory share (the benchmark's eight FMA chains) and of all
    /// memory (its L2, DRAM and TLB-missing loads). The work's speed while the others are
    /// stalled (the overlap efficiency: useful work per waiting time) is the measured one, and
    /// the built-in constants are the measurement's medians.
    #[test]
    fn work_beside_fault_stalled_warps_goes_at_the_measured_speed() {
        let compute = measured_progress(&["fma_ilp"]);
        let memory = measured_progress(&["l2_loads", "dram_loads", "tlb_misses"]);
        let built_in = Calibration::built_in();
        assert!((built_in.stall.compute_progress.value - compute).abs() < 5e-4, "{compute}");
        assert!((built_in.stall.memory_progress.value - memory).abs() < 5e-4, "{memory}");
        for (memory_share, measured) in [(0.0, compute), (1.0, memory)] {
            let mut cal = Calibration::built_in();
            cal.gpu.sms.value = 1;
            cal.gpu.warp_slots_per_sm.value = 16;
            let phase = Phase {
                producer: Endpoint::Host,
                consumer: Endpoint::Gpu(0),
                ctas: 2,
                warps_per_cta: 8,
                requests_per_warp: 1,
                c1_instr: 1_000,
                c2_instr: 10_000_000,
                memory_share,
                jitter: 0.0,
                independent_ctas: 0.5,
                request_probability: 1.0,
                message_bytes: 256,
                order: ProduceOrder::Sequential,
                produce_ns: 50_000,
                producer_lanes: 1,
                producer_start_ns: 0,
                produce_spread: 0.2,
                publish_slots: 1,
                sends_back: false,
                host_compute_ns: 0,
            };
            let w = Workload {
                name: "stall_cost",
                title: "work beside fault-stalled warps",
                pattern: "-",
                model: "-",
                iterations: 1,
                phases: vec![phase],
            };
            let report = try_run(&w, Mode::Fault, &cal, 1).expect("the run ends");
            let modelled = report.overlap_efficiency;
            assert!((modelled / measured - 1.0).abs() < 0.02, "memory share {memory_share}: {modelled} vs {measured}");
        }
    }

    /// Phases whose CTAs differ in size share one engine, laid out for the largest: the smaller
    /// ones' messages used to be read at the wrong offsets (a panic past the producer's buffer,
    /// or corrupt messages), in every mode that moves data.
    #[test]
    fn phases_of_different_cta_sizes_get_their_own_messages() {
        let c_cg = by_name("C_CG").unwrap().with_threads(4096);
        let wide = Phase { warps_per_cta: 4, message_bytes: 1000, ctas: 64, ..c_cg.phases[0].clone() };
        let narrow = Phase { warps_per_cta: 1, message_bytes: 3572, ctas: 132, requests_per_warp: 2, ..wide.clone() };
        let w = Workload { iterations: 2, phases: vec![wide, narrow], ..c_cg };
        let expected = 2 * (64 * 4 + 132 * 2);
        for mode in [Mode::Fault, Mode::Push, Mode::Poll, Mode::NoWait, Mode::Alg1] {
            let report = try_run(&w, mode, &Calibration::built_in(), 1).expect("the run ends");
            assert_eq!(report.messages_checked, expected, "{}", mode.name());
            assert_eq!((report.corrupt_messages, report.error_markers), (0, 0), "{}", mode.name());
        }
    }

    /// A host producer's publish of several slots pays the host's publish cost once and copies
    /// them in one go; copies follow each other on PCIe; poll pays more the more warps spin on
    /// host memory; no-wait needs no producer at all.
    #[test]
    fn host_publishes_group_slots_share_pcie_and_poll_pays_for_its_spinners() {
        let cal = Calibration::built_in();
        let phase = Phase {
            producer: Endpoint::Host,
            consumer: Endpoint::Gpu(0),
            ctas: 132,
            warps_per_cta: 1,
            requests_per_warp: 1,
            c1_instr: 0,
            c2_instr: 1_000,
            memory_share: 0.5,
            jitter: 0.0,
            independent_ctas: 0.0,
            request_probability: 1.0,
            message_bytes: 65_536,
            order: ProduceOrder::Sequential,
            produce_ns: 1_000_000,
            producer_lanes: 132,
            producer_start_ns: 0,
            produce_spread: 0.0,
            publish_slots: 1,
            sends_back: false,
            host_compute_ns: 0,
        };
        let workload = |publish_slots| Workload {
            name: "publish",
            title: "host publishes",
            pattern: "-",
            model: "-",
            iterations: 2,
            phases: vec![Phase { publish_slots, ..phase.clone() }],
        };
        let runtime = |w: &Workload, mode, cal: &Calibration| {
            let report = try_run(w, mode, cal, 1).expect("the run ends");
            assert_eq!((report.messages_checked, report.corrupt_messages), (264, 0));
            report.runtime_ns
        };
        let (one_by_one, grouped) = (workload(1), workload(132));
        let copies = transfer_ns(132 * 65_536, cal.link.pcie_gbps.value);
        let push = runtime(&grouped, Mode::Push, &cal);
        // Each iteration: the production, the iteration's copies one after another, the one way.
        assert!(push >= 2 * (1_000_000 + copies + cal.push.host_one_way_ns.value), "{push}");
        // One by one, the host thread's 132 publishes follow each other.
        let serial = runtime(&one_by_one, Mode::Push, &cal);
        assert!(serial >= 2 * (1_000_000 + 132 * cal.push.host_publish_ns.value), "{serial}");
        assert!(serial > push, "{serial} vs {push}");
        let poll = runtime(&grouped, Mode::Poll, &cal);
        let mut no_spinner_cost = cal.clone();
        no_spinner_cost.poll.host_one_way_per_spinner_ns.value = 0;
        no_spinner_cost.poll.host_publish_per_spinner_ns.value = 0;
        assert!(poll > runtime(&grouped, Mode::Poll, &no_spinner_cost) + 2 * 100 * 359, "{poll}");
        assert!(runtime(&grouped, Mode::NoWait, &cal) < 1_000_000);
    }

    /// An exchange's warps send one message back per message taken, each keeping the warp for
    /// the link and the transport's one way; warps of CTAs that take nothing send nothing; under
    /// WIC a send costs the model's path of one fault.
    #[test]
    fn exchanges_send_once_per_message_taken_and_only_from_receiving_ctas() {
        let cal = Calibration::built_in();
        let phase = Phase {
            producer: Endpoint::Gpu(1),
            consumer: Endpoint::Gpu(0),
            ctas: 132,
            warps_per_cta: 1,
            requests_per_warp: 3,
            c1_instr: 100_000,
            c2_instr: 1_000,
            memory_share: 0.0,
            jitter: 0.0,
            independent_ctas: 0.5,
            request_probability: 1.0,
            message_bytes: 512,
            order: ProduceOrder::RequestMajor,
            produce_ns: 0,
            producer_lanes: 396,
            producer_start_ns: 0,
            produce_spread: 0.0,
            publish_slots: 1,
            sends_back: true,
            host_compute_ns: 0,
        };
        let exchange = Workload {
            name: "exchange",
            title: "an exchange",
            pattern: "-",
            model: "-",
            iterations: 2,
            phases: vec![phase.clone()],
        };
        let one_way = Workload { phases: vec![Phase { sends_back: false, ..phase }], ..exchange.clone() };
        let receiving = 66 * 3 * 2;
        for (mode, send) in [
            (Mode::Push, transfer_ns(512, cal.link.nvlink_gbps.value) + cal.push.peer_one_way_ns.value),
            (Mode::Poll, transfer_ns(512, cal.link.nvlink_gbps.value) + cal.poll.peer_one_way_ns.value),
        ] {
            let with = try_run(&exchange, mode, &cal, 1).expect("the run ends");
            let without = try_run(&one_way, mode, &cal, 1).expect("the run ends");
            assert_eq!((with.sends, with.messages_checked), (receiving, receiving), "{}", mode.name());
            assert_eq!(without.sends, 0);
            // The data is there before the first request: every send is on the warp's path.
            let added = with.runtime_ns as f64 - without.runtime_ns as f64;
            assert!((added / (2.0 * 3.0 * send as f64) - 1.0).abs() < 0.02, "{}: {added}", mode.name());
        }
        // Under WIC a send is a PAT write of its own, which wicd services; the other GPU's
        // consumer, waiting already, gets the message completed. Each keeps its warp at least
        // for the path of one fault alone.
        let with = try_run(&exchange, Mode::Fault, &cal, 1).expect("the run ends");
        let without = try_run(&one_way, Mode::Fault, &cal, 1).expect("the run ends");
        assert_eq!(with.sends, receiving);
        let (engine, base) = (with.engine.clone().unwrap(), without.engine.clone().unwrap());
        assert_eq!(engine.pat_publishes - base.pat_publishes, receiving, "one PAT write a block and message");
        assert_eq!(engine.delivered - base.delivered, receiving, "every message sent is completed to the other GPU");
        assert_eq!(engine.timed_out, 0, "no wait for a send timed out");
        assert!(with.pfq_empty && with.corrupt_messages == 0, "{with:?}");
        let (f, d) = (&cal.fault, &cal.daemon);
        let one_fault = [
            f.interrupt_to_bh_ns.value,
            f.batch_fixed_ns.value,
            f.per_fault_ns.value,
            d.wakeup_ns.value,
            d.engine_per_entry_ns.value,
            d.submission_ns.value,
            d.per_page_ns.value,
            f.replay_ns.value,
        ]
        .into_iter()
        .sum::<u64>();
        let added = with.runtime_ns.saturating_sub(without.runtime_ns);
        assert!(added >= 2 * 3 * one_fault, "{added} ns for 6 sends, one fault alone takes {one_fault}");
        assert_eq!(try_run(&exchange, Mode::NoWait, &cal, 1).expect("the run ends").sends, 0);

        // Blocks of several warps send one message together: one PAT write a block, the other
        // warps stalled on the same page or finding it serviced.
        let wide = Workload { phases: vec![Phase { warps_per_cta: 4, ..phase.clone() }], ..exchange.clone() };
        let report = try_run(&wide, Mode::Fault, &cal, 1).expect("the run ends");
        let base = try_run(
            &Workload {
                phases: vec![Phase { warps_per_cta: 4, sends_back: false, ..phase.clone() }],
                ..exchange.clone()
            },
            Mode::Fault,
            &cal,
            1,
        )
        .expect("the run ends");
        let (engine, base) = (report.engine.unwrap(), base.engine.unwrap());
        assert_eq!(report.sends, 4 * receiving);
        assert_eq!(engine.pat_publishes - base.pat_publishes, receiving, "one PAT write a block and message");
        assert_eq!((engine.timed_out, report.corrupt_messages), (0, 0));

        // Only an exchange between two GPUs sends back.
        let host = Workload { phases: vec![Phase { producer: Endpoint::Host, ..phase }], ..exchange };
        assert!(try_run(&host, Mode::Fault, &cal, 1).unwrap_err().contains("only an exchange between two GPUs"));
    }

    /// push delivers every message intact without a fault, and its waits are as long as the
    /// measured one-way time makes them: host producers on PCIe, GPU producers on NVLink.
    #[test]
    fn push_waits_for_the_measured_one_way_time_and_never_faults() {
        for name in ["C_CG", "G_STN"] {
            let w = by_name(name).unwrap().with_threads(4096);
            let cal = Calibration::built_in();
            let report = try_run(&w, Mode::Push, &cal, 1).expect("push runs");
            assert!(report.messages_checked > 0 && report.corrupt_messages == 0, "{name}: {report:?}");
            assert_eq!(report.gpu_faults, 0, "{name}");
            let mut slower = cal.clone();
            slower.push.host_one_way_ns.value *= 100;
            slower.push.peer_one_way_ns.value *= 100;
            let slow = try_run(&w, Mode::Push, &slower, 1).expect("push runs");
            assert!(slow.runtime_ns > report.runtime_ns, "{name}: {} vs {}", slow.runtime_ns, report.runtime_ns);
        }
    }

    /// Calibrations a file may hold can still lead the model where it cannot follow; the run
    /// says so. A fault path slower than the channels' 1 s timeout used to panic (a GPU producer
    /// found its PAT page still mapped after a timed-out wait); a replay slower than the other
    /// GPU's fault service made a flag page shared by two GPUs migrate back and forth forever.
    #[test]
    fn a_run_the_model_cannot_follow_ends_as_an_error_not_a_panic_or_a_hang() {
        let bfs = by_name("G_BFS").unwrap();
        // As the case was found: before a stalled warp slowed the others of its SM.
        let mut slow_faults = Calibration::built_in();
        slow_faults.stall.compute_progress.value = 1.0;
        slow_faults.stall.memory_progress.value = 1.0;
        for (_, latency) in slow_faults.latencies_mut().into_iter().take(5) {
            *latency = 1_000_000_000;
        }
        // Seed 2: whether a wait times out before its producer's next write depends on where
        // the CTAs run and in which order slots are produced.
        let e = try_run(&bfs, Mode::Fault, &slow_faults, 2).unwrap_err();
        assert!(e.contains("producer found its PAT page still mapped") && e.contains("1 s timeout"), "{e}");

        let mut slow_replay = Calibration::built_in();
        slow_replay.fault.replay_ns.value = 1_000_000;
        let e = try_run(&bfs.with_threads(1024), Mode::Alg1, &slow_replay, 1).unwrap_err();
        assert!(
            e.starts_with("the run is stuck at ") && e.contains(" events and faults without a warp finishing"),
            "{e}"
        );
    }
}

/// WIC's host producers write their batches in place ([`Mode::Fault`]); wicd then writes only
/// each page's head word and maps the run, where it used to copy the batch ([`Mode::FaultCopy`]).
mod in_place {
    use super::super::*;
    use crate::host_fill;
    use crate::workload::by_name;

    /// Every message a consumer reads in place is its producer's, byte for byte, as after a
    /// copy: the producer's stores and wicd's head words together make the batch (a head left
    /// unwritten, or written from another slot or generation, fails the consumers' check). Runs
    /// alternate between a slot's two runs, phases of smaller CTAs fill the first part of a run,
    /// and GPU producers are untouched.
    #[test]
    fn in_place_delivers_the_same_bytes_as_the_copy_path() {
        let c_cg = by_name("C_CG").unwrap().with_threads(4096);
        let wide = Phase { warps_per_cta: 4, message_bytes: 5000, ctas: 64, ..c_cg.phases[0].clone() };
        let narrow = Phase { warps_per_cta: 1, message_bytes: 3572, ctas: 132, requests_per_warp: 2, ..wide.clone() };
        let mixed = Workload { iterations: 3, phases: vec![wide, narrow], ..c_cg };
        let mut set: Vec<Workload> =
            ["C_SRS", "C_CG", "C_FE", "C_H3D"].iter().map(|n| by_name(n).unwrap().with_threads(4096)).collect();
        set.push(mixed);
        set.push(host_fill::workload(64 << 10));
        let cal = Calibration::built_in();
        for w in &set {
            let copy = try_run(w, Mode::FaultCopy, &cal, 1).expect("the copy run ends");
            let in_place = try_run(w, Mode::Fault, &cal, 1).expect("the in-place run ends");
            for r in [&copy, &in_place] {
                assert!(r.messages_checked > 0, "{}", w.name);
                assert_eq!((r.corrupt_messages, r.error_markers), (0, 0), "{} {}", w.name, r.mode.name());
                assert!(r.pool_restored && r.pfq_empty, "{} {}", w.name, r.mode.name());
            }
            assert_eq!(in_place.messages_checked, copy.messages_checked, "{}", w.name);
            let (a, b) = (in_place.engine.as_ref().unwrap(), copy.engine.as_ref().unwrap());
            assert!(a.in_place_publishes > 0 && a.in_place_publishes == a.host_publishes, "{}: {a:?}", w.name);
            assert_eq!((a.in_place_missed, b.in_place_publishes), (0, 0), "{}", w.name);
            assert_eq!((a.delivered, a.host_publishes), (b.delivered, b.host_publishes), "{}", w.name);
        }
        // Between GPUs nothing changes: the producer kernel's batches go through its PAT pages.
        let stn = by_name("G_STN").unwrap().with_threads(4096);
        let (copy, in_place) =
            (try_run(&stn, Mode::FaultCopy, &cal, 1).unwrap(), try_run(&stn, Mode::Fault, &cal, 1).unwrap());
        assert_eq!((in_place.runtime_ns, in_place.daemon_busy_ns), (copy.runtime_ns, copy.daemon_busy_ns));
        assert_eq!(in_place.engine.unwrap().in_place_publishes, 0);
    }

    /// In place, wicd's thread writes 8 bytes a page where it copied the whole batch: its busy
    /// time per batch falls by exactly the copy's cost at the measured memcpy rate less the
    /// head words', and each batch reaches its warps that much sooner. (Were the head words
    /// charged as the whole batch, nothing would fall.)
    #[test]
    fn wicds_busy_time_per_batch_falls_by_the_copys_cost() {
        let cal = Calibration::built_in();
        for bytes in [64, 1024, 16 << 10] {
            let w = host_fill::workload(bytes);
            let copy = try_run(&w, Mode::FaultCopy, &cal, 1).expect("the copy run ends");
            let in_place = try_run(&w, Mode::Fault, &cal, 1).expect("the in-place run ends");
            let len = u64::from(bytes * host_fill::WARPS);
            let pages = len.div_ceil(PAGE_SIZE);
            let saved = cal.memcpy_ns(len) - cal.memcpy_ns(HEAD_BYTES as u64 * pages);
            assert!(saved > 0 && cal.memcpy_ns(len) > 2 * cal.memcpy_ns(HEAD_BYTES as u64 * pages), "{bytes}");
            let batches = u64::from(host_fill::BATCHES);
            assert_eq!(copy.daemon_busy_ns - in_place.daemon_busy_ns, batches * saved, "{bytes} B a warp");
            assert_eq!(copy.runtime_ns - in_place.runtime_ns, batches * saved, "{bytes} B a warp");
            assert_eq!(copy.mean_delivery_ns - in_place.mean_delivery_ns, saved as f64, "{bytes} B a warp");
        }
    }
}

mod modes {
    use super::super::*;

    /// Each table's modes are drawn from [`Mode::ALL`], once each, and are what their names say:
    /// the stock driver's are exactly the modes that are not WIC's, the host fills exactly
    /// WIC's; a comparison and the co-run run WIC in place.
    #[test]
    fn every_subset_is_drawn_from_the_one_list() {
        let names: Vec<&str> = Mode::ALL.iter().map(|m| m.name()).collect();
        assert!(names.iter().enumerate().all(|(i, n)| !names[..i].contains(n)), "{names:?}");
        let subsets: [&[Mode]; 4] = [&Mode::COMPARED, &Mode::STOCK_DRIVER, &Mode::CORUN, &Mode::HOST_FILLS];
        for subset in subsets {
            assert!(subset.iter().all(|m| Mode::ALL.contains(m)), "{subset:?}");
            assert!(subset.iter().enumerate().all(|(i, m)| !subset[..i].contains(m)), "{subset:?}");
        }
        let sorted = |mut modes: Vec<Mode>| {
            modes.sort_by_key(|m| m.name());
            modes
        };
        let stock: Vec<Mode> = Mode::ALL.into_iter().filter(|m| !m.is_wic()).collect();
        assert_eq!(sorted(Mode::STOCK_DRIVER.to_vec()), sorted(stock));
        let wic: Vec<Mode> = Mode::ALL.into_iter().filter(|m| m.is_wic()).collect();
        assert_eq!(sorted(Mode::HOST_FILLS.to_vec()), sorted(wic));
        assert_eq!(Mode::COMPARED.iter().filter(|m| m.is_wic()).collect::<Vec<_>>(), [&Mode::Fault]);
        assert_eq!(Mode::CORUN.iter().filter(|m| m.is_wic()).collect::<Vec<_>>(), [&Mode::Fault]);
    }
}
