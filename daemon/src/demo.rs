//! `wicd demo`: the ten workloads with the naive baseline (alg1, the paper's Algorithm 1),
//! wic.cuh's push and WIC, on the emulated GPU through the real engine, run on worker threads
//! with progress on stderr; then what each mode's waiting costs a neighbour kernel beside it
//! (`wic_emu::corun`).

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use wic_emu::compare::{geomean_speedup, geomean_speedup_over_push, percent, Comparison, RowError, RunOutcome};
use wic_emu::sim::memory_estimate;
use wic_emu::{corun, Calibration, Mode, Workload};

/// Progress line on stderr: `[3/20] C_CG fault done (1.2s)`.
pub fn stderr_progress(started: Instant) -> impl FnMut(usize, usize, &RunOutcome) {
    move |done, total, outcome| {
        let (workload, mode, what) = match outcome {
            Ok(report) => (report.workload, report.mode, "done"),
            Err((workload, mode, _)) => (*workload, *mode, "not run"),
        };
        eprint!("\r[{done}/{total}] {workload} {} {what} ({:.1}s)      ", mode.name(), started.elapsed().as_secs_f64());
        if done == total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    }
}

/// The constants of the calibration file at `path` that differ from the built-in ones, a line
/// each with its value and source: what the run took from the file.
pub fn calibration_file_changes(path: &Path, cal: &Calibration) -> String {
    let changed: Vec<String> = cal
        .table()
        .into_iter()
        .zip(Calibration::built_in().table())
        .filter(|(row, built_in)| row != built_in)
        .map(|((name, value, source, measured), _)| {
            format!("  {name} = {value}{}: {source}", if measured { " (measured)" } else { "" })
        })
        .collect();
    if changed.is_empty() {
        return format!("Calibration file {}: every constant as built in.", path.display());
    }
    format!("Calibration file {}, where it differs from the built-in one:\n{}", path.display(), changed.join("\n"))
}

/// How one table runs within the memory at hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Per workload, why it cannot run here (a single run of it needs more memory than is
    /// available), or `None`.
    pub refused: Vec<Option<String>>,
    /// Worker threads: at most the ones asked for, and no more than the available memory holds
    /// of the largest runs at once; at least one.
    pub workers: usize,
}

/// Plans a table of `set` on `threads` workers with `available` bytes of memory (`None`: not
/// known, nothing is refused), from the emulator's estimate of what each run allocates.
pub fn plan(set: &[Workload], threads: usize, available: Option<u64>) -> Plan {
    let Some(available) = available else {
        return Plan { refused: vec![None; set.len()], workers: threads.max(1) };
    };
    let mut runs = Vec::new();
    let refused = set
        .iter()
        .map(|w| {
            let needs = Mode::COMPARED.map(|mode| memory_estimate(w, mode));
            let largest = needs.into_iter().max().unwrap_or(0);
            if largest > available {
                return Some(format!("a run needs about {} of memory, {} is available", gib(largest), gib(available)));
            }
            runs.extend(needs);
            None
        })
        .collect();
    runs.sort_unstable_by(|a, b| b.cmp(a));
    let mut sum = 0u64;
    let fit = runs.iter().take_while(|bytes| {
        sum = sum.saturating_add(**bytes);
        sum <= available
    });
    Plan { refused, workers: fit.count().clamp(1, threads.max(1)) }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Memory the kernel says is available for new allocations (`MemAvailable`), if it says.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The comparison table, one workload a row (a row that could not run says why), plus the
/// geometric-mean speedups of the rows that ran, over push and over alg1. WIC over push
/// leads: the model's push is validated against the GPU (within 25% for the ten programs), its
/// naive baseline (alg1, the paper's Algorithm 1) is not ([`NAIVE_UNVALIDATED`]), so its columns are starred.
pub fn table(rows: &[Result<Comparison, RowError>]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<6} {:>10} {:>10} {:>8} {:>10} {:>9} {:>15} {:>13} {:>10} {:>9} {:>8} {:>9} {:>7}\n",
        "app",
        "push ms",
        "WIC ms",
        "vs push",
        "naive ms*",
        "vs naive*",
        "cons.ovh naive*",
        "cons.ovh WIC",
        "ovl naive*",
        "ovl WIC",
        "WIC ovh",
        "faults",
        "checked"
    ));
    for row in rows {
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                out.push_str(&format!("{:<6} not run: {}\n", e.workload, e.reason));
                continue;
            }
        };
        let engine = row.fault.engine.as_ref().expect("fault runs carry engine stats");
        out.push_str(&format!(
            "{:<6} {:>10.3} {:>10.3} {:>7.3}x {:>10.3} {:>8.3}x {:>15} {:>13} {:>10} {:>9} {:>8} {:>9} {:>7}\n",
            row.naive.workload,
            row.push.runtime_ns as f64 / 1e6,
            row.fault.runtime_ns as f64 / 1e6,
            row.speedup_over_push(),
            row.naive.runtime_ns as f64 / 1e6,
            row.speedup(),
            percent(row.naive.consumer_overhead),
            percent(row.fault.consumer_overhead),
            percent(row.naive.overlap_efficiency),
            percent(row.fault.overlap_efficiency),
            percent(row.fault.daemon_share),
            engine.entries,
            if row.naive.corrupt_messages + row.push.corrupt_messages + row.fault.corrupt_messages == 0 {
                "ok"
            } else {
                "FAILED"
            },
        ));
    }
    if !rows.iter().any(Result::is_ok) {
        out.push_str("no workload ran\n");
        return out;
    }
    let geomean = geomean_speedup(rows.iter().flatten());
    let over_push = geomean_speedup_over_push(rows.iter().flatten());
    out.push_str(&format!(
        "geometric-mean speedup of WIC over push: {over_push:.3}x; over the naive baseline (alg1)*: {geomean:.3}x\n"
    ));
    out.push_str(NAIVE_UNVALIDATED);
    out.push('\n');
    out
}

/// Under the comparison table: why its alg1 columns (headed `naive`) are starred.
pub const NAIVE_UNVALIDATED: &str = "\
* not validated: the model has no part for nvidia-uvm's thrashing mitigation (throttling, then
  pinning and mapping remotely a page two processors keep writing), which sets the cost of
  the naive baseline (alg1, the paper's Algorithm 1) on a GPU; its alg1 runs miss the GPU's by
  large factors (docs/evaluation.md).";

/// One row of the co-run table: consumers waiting in `mode` for a host that publishes every
/// `gap_ns`, and the neighbour's throughput beside them over alone per kind of
/// [`corun::neighbours`], or why the model could not run it.
#[derive(Debug)]
pub struct CorunRow {
    pub mode: Mode,
    pub gap_ns: u64,
    pub throughput: Result<Vec<f64>, String>,
}

/// The co-run's runs, as wic-report runs them: every mode of [`Mode::CORUN`] at every gap of
/// [`corun::GAPS_NS`].
fn corun_runs() -> Vec<(Mode, u64)> {
    Mode::CORUN.iter().flat_map(|&mode| corun::GAPS_NS.map(|gap_ns| (mode, gap_ns))).collect()
}

/// The co-run's rows, in [`corun_runs`]'s order, run on up to `workers` threads.
pub fn corun_rows(cal: &Calibration, seed: u64, workers: usize) -> Vec<CorunRow> {
    let row = |&(mode, gap_ns): &(Mode, u64)| CorunRow {
        mode,
        gap_ns,
        throughput: corun::throughput(cal, mode, corun::GENERATIONS, gap_ns, seed),
    };
    wic_emu::pool::run_in_order(&corun_runs(), workers, row, |_, _, _| {})
}

/// A mode as the demo names it: Algorithm 1 is its naive baseline, held faults are WIC (its
/// host producers writing in place unless the label says otherwise).
pub fn mode_label(mode: Mode) -> &'static str {
    match mode {
        Mode::Alg1 => "naive (alg1)",
        Mode::Fault => "WIC",
        Mode::FaultCopy => "WIC (copy)",
        Mode::FaultCopyEngine => "WIC (copy engine)",
        other => other.name(),
    }
}

/// The ways `--host-fill` takes, by name: how WIC's host producers' batches reach their runs.
pub const HOST_FILLS: [(&str, Mode); 3] =
    [("in-place", Mode::Fault), ("copy", Mode::FaultCopy), ("copy-engine", Mode::FaultCopyEngine)];

/// `--host-fill`'s value: the WIC mode of a name of [`HOST_FILLS`].
pub fn parse_host_fill(text: &str) -> Result<Mode, String> {
    HOST_FILLS.iter().find(|(name, _)| name.eq_ignore_ascii_case(text.trim())).map(|&(_, mode)| mode).ok_or_else(|| {
        let names: Vec<&str> = HOST_FILLS.iter().map(|(name, _)| *name).collect();
        format!("`{text}` is not a way to fill a host producer's run (one of {})", names.join(", "))
    })
}

/// The legend's line on how the WIC columns' host producers hand over their batches in `wic`.
pub fn host_fill_legend(wic: Mode) -> &'static str {
    match wic {
        Mode::FaultCopy => "WIC's host producers: wicd copies each batch into its run (--host-fill copy, as before in place).",
        Mode::FaultCopyEngine => {
            "WIC's host producers: a copy engine fills GPU-resident runs, set-up not charged (--host-fill copy-engine)."
        }
        _ => "WIC's host producers write each batch in place; wicd writes 8 bytes a page (--host-fill copy: wicd copies it).",
    }
}

/// A co-run row's name: its mode and the gap between publishes, `WIC, 1000 us`.
pub fn corun_row_label(row: &CorunRow) -> String {
    format!("{}, {} us", mode_label(row.mode), row.gap_ns / 1000)
}

/// The co-run table: one row per mode and gap, one column per kind of neighbour (a row the
/// model could not run says why), then [`CORUN_NOTE`].
pub fn corun_table(rows: &[CorunRow]) -> String {
    let label_width = rows.iter().map(|row| corun_row_label(row).len()).max().unwrap_or(0).max("mode, gap".len());
    let mut out = String::from(
        "What waiting costs the work beside it (emulated; neighbour's throughput beside the consumers over alone)\n",
    );
    out.push_str(&format!("{:<label_width$}", "mode, gap"));
    for (kind, _) in corun::neighbours() {
        out.push_str(&format!(" {kind:>10}"));
    }
    out.push('\n');
    for row in rows {
        let label = corun_row_label(row);
        match &row.throughput {
            Ok(throughput) => {
                out.push_str(&format!("{label:<label_width$}"));
                for value in throughput {
                    out.push_str(&format!(" {value:>10.3}"));
                }
                out.push('\n');
            }
            Err(reason) => out.push_str(&format!("{label:<label_width$} not run: {reason}\n")),
        }
    }
    out.push_str(CORUN_NOTE);
    out.push('\n');
    out
}

/// Under the co-run table: what its columns are, and which rows the GPU contradicts. The GPU's
/// figures are quoted from its committed run (a test reads them back).
pub const CORUN_NOTE: &str = "\
One block of 4 consumer warps per SM waits for a host producer beside 8 warps per SM of each
neighbour: fma_chain and fma_ilp arithmetic, l2_loads and dram_loads memory-bound, consumer a
second consumer (C_SRS's work); 1 = as fast as alone. The naive (alg1) rows are not validated:
the model leaves out nvidia-uvm's thrashing mitigation, which pins a page that keeps moving, and
back to back puts memory-bound neighbours far below the 23 to 30% an H200 left them
(docs/evaluation.md). The GPU's measured table: device/README.md, \"What waiting costs the work
beside it\".";

/// What the model takes from a GPU and what it cannot know, printed under every demo. Each figure
/// is quoted from a committed measurement or the built-in calibration (a test reads them back),
/// so the demo cannot drift from the hardware it cites.
pub const MODEL_LIMITS: &str = "\
What the model takes from a GPU, and what it cannot know: a warp stalled on a fault costs the
other warps of its SM what an H100 measured (stock driver, device/bench/stall_cost.cu): their
arithmetic goes on at 0.956 of its speed, their memory accesses that leave the SM at 0.00385,
so memory-bound work all but stops while a fault is outstanding. How much of each application's
work is memory is derived from its arithmetic intensity, not measured. push's waits take its
measured one-way time (5650 ns from a host thread, 6384 ns from a kernel on another GPU) plus
the transfer, and a host thread publishes one batch per 2346 ns. A spinning warp takes 0.014 of
a computing warp's issue share: on an H100 8 warps spinning on host memory slowed the arithmetic
beside them 1.014x (memory-bound work 32.5x, which the model applies to wic.cuh's poll). The
workloads are the paper's communication patterns. The model also runs the programs of
device/apps, described from their measured no-wait runs: with push it comes within 25% of the
GPU for 10 of the 10, but it has no part for how nvidia-uvm treats pages two processors keep
writing, which sets the cost of the naive baseline on a GPU (docs/evaluation.md). In those H100
runs push ran the ten programs 3.9x faster than the paper's Algorithm 1 made correct.
Read the speedups as the model's, not as a prediction for a GPU.";

#[cfg(test)]
mod tests {
    use super::*;
    use wic_emu::validation;

    fn committed(path: &str) -> String {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn a_calibration_file_is_shown_by_what_it_changes() {
        let path = Path::new("cal.toml");
        let built_in = Calibration::built_in();
        assert_eq!(calibration_file_changes(path, &built_in), "Calibration file cal.toml: every constant as built in.");
        let text = wic_emu::calibration::set_measured(wic_emu::calibration::BUILT_IN, "daemon.per_page_ns", 7, "here")
            .unwrap();
        let shown = calibration_file_changes(path, &Calibration::from_toml(&text).unwrap());
        assert_eq!(
            shown,
            "Calibration file cal.toml, where it differs from the built-in one:\n  daemon.per_page_ns = 7 (measured): here"
        );
    }

    /// The figures MODEL_LIMITS quotes are the built-in calibration's and those of the files it
    /// names, rounded as printed.
    #[test]
    fn the_model_limits_quote_the_committed_measurements() {
        let cal = wic_emu::Calibration::built_in();
        let (compute, memory) = (cal.stall.compute_progress.value, cal.stall.memory_progress.value);
        assert!(MODEL_LIMITS.contains(&format!("arithmetic goes on at {compute} of its speed")), "{compute}");
        assert!(MODEL_LIMITS.contains(&format!("leave the SM at {memory},")), "{memory}");
        let push = &cal.push;
        let (host, peer, publish) =
            (push.host_one_way_ns.value, push.peer_one_way_ns.value, push.host_publish_ns.value);
        assert!(MODEL_LIMITS.contains(&format!("one-way time ({host} ns from a host thread, {peer} ns from")));
        assert!(MODEL_LIMITS.contains(&format!("one batch per {publish} ns")), "{publish}");
        let weight = cal.poll.issue_weight.value;
        assert!(MODEL_LIMITS.contains(&format!("A spinning warp takes {weight} of")), "{weight}");
        let poll_arith = committed("device/bench/results/transport-h100-2026-11-26-validation.jsonl")
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r["measurement"] == "waiting_cost" && r["waiters"] == "poll" && r["work"] == "arith")
            .expect("the poll spinners beside arithmetic")["slowdown"]
            .as_f64()
            .unwrap();
        assert!(MODEL_LIMITS.contains(&format!("slowed the arithmetic\nbeside them {poll_arith:.3}x")), "{poll_arith}");
        let memory = 1.0 / cal.poll.host_spin_memory_progress.value;
        assert!(MODEL_LIMITS.contains(&format!("(memory-bound work {memory:.1}x,")), "{memory}");
        let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(validation::RESULTS_DIR);
        let runs = validation::measured_runs(&results).unwrap();
        let cal_rows = validation::validate(&runs, &[Mode::Push], &cal, 1);
        let close = cal_rows.iter().filter(|r| r.error().is_some_and(|e| e.abs() <= validation::TOLERANCE)).count();
        assert!(MODEL_LIMITS.contains(&format!("GPU for {close} of the {}", cal_rows.len())), "{close}");
        let median = |app: &str, mode: &str| {
            wic_emu::apps::find_run(&runs, app, mode).and_then(|r| r.number("median_ms").ok()).unwrap()
        };
        let apps = wic_emu::apps::all();
        let log_sum: f64 = apps.iter().map(|a| (median(a.name, "alg1") / median(a.name, "push")).ln()).sum();
        let alg1_over_push = (log_sum / apps.len() as f64).exp();
        assert!(
            MODEL_LIMITS.contains(&format!("push ran the ten programs {alg1_over_push:.1}x faster")),
            "{alg1_over_push}"
        );
    }

    /// Every mode of the co-run at every gap, named as the demo names them, one column per kind
    /// of neighbour; a row the model could not run says why, and the note follows.
    #[test]
    fn the_corun_table_has_a_row_per_mode_and_gap_and_a_column_per_neighbour() {
        let mut rows: Vec<CorunRow> = corun_runs()
            .into_iter()
            .enumerate()
            .map(|(i, (mode, gap_ns))| CorunRow {
                mode,
                gap_ns,
                throughput: Ok((0..5).map(|kind| 0.1 * i as f64 + 0.01 * f64::from(kind) + 0.0004).collect()),
            })
            .collect();
        rows.push(CorunRow { mode: Mode::Fault, gap_ns: 10_000, throughput: Err("too many SMs".into()) });
        let text = corun_table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "What waiting costs the work beside it (emulated; neighbour's throughput beside the consumers over alone)"
        );
        let header: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(header, ["mode,", "gap", "fma_chain", "fma_ilp", "l2_loads", "dram_loads", "consumer"], "{text}");
        let labels: Vec<&str> = lines[2..10].iter().map(|line| line.split(" us ").next().unwrap_or("")).collect();
        assert_eq!(
            labels,
            [
                "push, 0",
                "push, 1000",
                "poll, 0",
                "poll, 1000",
                "naive (alg1), 0",
                "naive (alg1), 1000",
                "WIC, 0",
                "WIC, 1000"
            ],
            "{text}"
        );
        let cells = |line: &str| line.split(" us ").nth(1).unwrap_or("").split_whitespace().count();
        assert!(lines[2..10].iter().all(|line| cells(line) == 5), "{text}");
        let naive: Vec<&str> = lines[6].split(" us ").nth(1).unwrap_or("").split_whitespace().collect();
        assert_eq!(naive, ["0.400", "0.410", "0.420", "0.430", "0.440"], "{text}");
        assert_eq!(
            lines[10].split_whitespace().collect::<Vec<_>>(),
            ["WIC,", "10", "us", "not", "run:", "too", "many", "SMs"]
        );
        assert!(text.ends_with(&format!("{CORUN_NOTE}\n")), "{text}");
    }

    /// The co-run runs in the table's order, every run ran, and the note's claims hold: the setup is the
    /// model's, the GPU's figures are its committed run's, and the model's alg1 rows are far
    /// below them.
    #[test]
    fn the_corun_runs_every_mode_at_every_gap_and_its_note_holds() {
        let rows = corun_rows(&wic_emu::Calibration::built_in(), 1, 2);
        assert_eq!(rows.iter().map(|row| (row.mode, row.gap_ns)).collect::<Vec<_>>(), corun_runs());
        assert!(rows.iter().all(|row| row.throughput.is_ok()), "{rows:?}");
        let note = CORUN_NOTE.replace('\n', " ");
        let (consumers, neighbours) = (corun::CONSUMER_WARPS, corun::NEIGHBOUR_WARPS);
        assert!(note.contains(&format!("{consumers} consumer warps per SM")), "{consumers}");
        assert!(note.contains(&format!("beside {neighbours} warps per SM")), "{neighbours}");
        assert!(corun::neighbours().iter().all(|(kind, _)| note.contains(kind)), "{note}");

        // The GPU's naive baseline beside the neighbours whose time alone is all memory, back
        // to back.
        let kinds = corun::neighbours();
        let memory_bound: Vec<usize> = (0..kinds.len()).filter(|&i| kinds[i].1 == 1.0).collect();
        let gpu: Vec<f64> = committed("device/bench/results/corun-h200-2026-11-28.jsonl")
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["measurement"] == "corun" && r["transport"] == "alg1" && r["gap_us"] == 0)
            .filter(|r| memory_bound.iter().any(|&i| r["neighbour"] == kinds[i].0))
            .map(|r| r["throughput"].as_f64().unwrap())
            .collect();
        assert_eq!(gpu.len(), memory_bound.len());
        let (least, most) = gpu.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &t| (lo.min(t), hi.max(t)));
        let quoted = format!("far below the {:.0} to {:.0}% an H200 left them", 100.0 * least, 100.0 * most);
        assert!(note.contains(&quoted), "{quoted}");
        let naive = rows.iter().find(|r| r.mode == Mode::Alg1 && r.gap_ns == 0).unwrap().throughput.as_ref().unwrap();
        assert!(memory_bound.iter().all(|&i| naive[i] < least / 10.0), "{naive:?}");
    }

    use wic_emu::workload::by_name;

    /// `--host-fill` names each way of WIC's, in place by default, and the legend says which
    /// way the WIC columns ran, in one line short enough for the legend.
    #[test]
    fn host_fill_picks_a_way_of_wics_and_the_legend_names_it() {
        assert_eq!(parse_host_fill("in-place"), Ok(Mode::Fault));
        assert_eq!(parse_host_fill("Copy"), Ok(Mode::FaultCopy));
        assert_eq!(parse_host_fill("copy-engine"), Ok(Mode::FaultCopyEngine));
        let e = parse_host_fill("dma").unwrap_err();
        assert!(e.contains("`dma`") && e.contains("in-place, copy, copy-engine"), "{e}");
        for (name, mode) in HOST_FILLS {
            let line = host_fill_legend(mode);
            assert!(!line.contains('\n') && line.len() <= 120, "{line}");
            assert!(line.contains(if mode == Mode::Fault { "in place" } else { name }), "{line}");
            assert!(mode.is_wic() && mode_label(mode).starts_with("WIC"));
        }
        assert_eq!(mode_label(Mode::Fault), "WIC");
    }

    #[test]
    fn plan_refuses_a_row_whose_run_does_not_fit_and_runs_the_rest_on_fewer_workers() {
        let set =
            vec![by_name("C_SRS").unwrap().with_threads(4 << 20), by_name("G_BFS").unwrap().with_threads(4 << 20)];
        let srs = memory_estimate(&set[0], wic_emu::Mode::Fault);
        // Poll, push, fault: the fault run is the largest.
        let bfs = Mode::COMPARED.map(|m| memory_estimate(&set[1], m));
        assert!(srs > bfs[0] + bfs[1] + bfs[2] && bfs[2] > bfs[0].max(bfs[1]));
        assert_eq!(plan(&set, 8, None), Plan { refused: vec![None, None], workers: 8 });
        assert_eq!(
            plan(&set, 8, Some(u64::MAX)),
            Plan { refused: vec![None, None], workers: 6 },
            "no more workers than runs fit"
        );
        // Room for G_BFS's three runs at once but not for C_SRS's fault run.
        let tight = plan(&set, 8, Some(srs - 1));
        let why = tight.refused[0].as_deref().expect("C_SRS refused");
        assert!(why.contains("GiB of memory") && why.contains("available"), "{why}");
        assert_eq!((tight.refused[1].as_ref(), tight.workers), (None, 3));
        // Room for one G_BFS run at a time.
        assert_eq!(plan(&set, 8, Some(bfs[2])).workers, 1);
        assert_eq!(plan(&set, 0, None).workers, 1);
    }

    #[test]
    fn available_memory_is_read_from_the_kernel() {
        let bytes = available_memory().expect("Linux reports MemAvailable");
        assert!(bytes > 1 << 20, "{bytes}");
    }

    #[test]
    fn a_row_that_did_not_run_says_why_and_the_mean_is_over_the_others() {
        let cal = wic_emu::Calibration::built_in();
        let cg = by_name("C_CG").unwrap().with_threads(64);
        let row = || {
            let [naive, push, fault] = Mode::COMPARED.map(|m| wic_emu::run(&cg, m, &cal, 1));
            Comparison { naive, push, fault }
        };
        let (speedup, over_push) = (row().speedup(), row().speedup_over_push());
        let refused = RowError { workload: "G_GEM", reason: "no room".into() };
        let text = table(&[Ok(row()), Err(refused.clone()), Ok(row())]);
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 5 + NAIVE_UNVALIDATED.lines().count(), "{text}");
        assert!(lines[1].starts_with("C_CG ") && lines[1].ends_with(" ok"), "{text}");
        assert_eq!(lines[2], "G_GEM  not run: no room");
        assert_eq!(
            lines[4],
            format!("geometric-mean speedup of WIC over push: {over_push:.3}x; over the naive baseline (alg1)*: {speedup:.3}x")
        );
        // WIC over push leads the row, the naive figures after it.
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!((cells[3], cells[5]), (format!("{over_push:.3}x").as_str(), format!("{speedup:.3}x").as_str()));
        assert!(text.ends_with(&format!("{NAIVE_UNVALIDATED}\n")), "{text}");
        assert_eq!(table(&[Err(refused)]).lines().last(), Some("no workload ran"));
    }
}
