//! wic-report: regenerates `docs/evaluation.md` and its figures. It runs the ten applications
//! both ways on the emulator (paper Fig. 12, 14, 15), the thread-count sweep (Fig. 16) and the
//! fast-path benchmarks, draws the figures as SVG next to the paper's stated values, and fills
//! the template's `{{name}}` fields; the template holds the prose and the figures measured
//! elsewhere (the real GPU, the kernel VM), each labelled with where it ran.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use wic_bench::paper::{self, PaperApp};
use wic_bench::svg::{self, Series};
use wic_bench::{summary, Results, Settings};
use wic_emu::apps;
use wic_emu::compare::{
    calibration_summary, compare, compare_in_place_and_copy, geomean_speedup, geomean_speedup_over_push, percent,
    Comparison,
};
use wic_emu::host_fill::{self, Cost};
use wic_emu::validation::{self, Validation};
use wic_emu::{corun, workload, Calibration, Mode, Workload};

/// The sweep's thread counts and applications (the paper's Fig. 16).
const SWEEP_THREADS: [u32; 4] = [64, 1 << 10, 1 << 14, 1 << 20];
const SWEEP_APPS: [&str; 4] = ["C_CG", "C_H3D", "G_BFS", "G_STN"];
/// The plane of the two things the hardware decides and the stock driver cannot show for WIC:
/// the fault path's latencies, as factors of the calibration's, and what a fault-stalled warp
/// costs, as the memory progress beside it (`None`: the measured one; 1.0: a free stall,
/// arithmetic included).
const PLANE_LATENCY: [f64; 4] = [0.1, 0.3, 1.0, 3.0];
const PLANE_STALL: [Option<f64>; 4] = [None, Some(0.1), Some(0.5), Some(1.0)];

/// Runs a workload takes in the report's comparisons: alg1, push, and WIC both in place and
/// with wicd copying (`compare_in_place_and_copy`).
const RUNS_PER_ROW: usize = Mode::COMPARED.len() + 1;

/// One point of the plane for device/apps' programs: each one's comparisons, WIC in place
/// and with wicd copying.
struct AppPlanePoint {
    latency: f64,
    stall: Option<f64>,
    rows: Vec<(Comparison, Comparison)>,
}

/// One point of the plane: WIC's geometric-mean speedup over push and over naive polling, in
/// place and (`_copy`) with wicd copying host producers' batches.
struct PlanePoint {
    latency: f64,
    stall: Option<f64>,
    over_push: f64,
    over_naive: f64,
    over_push_copy: f64,
    over_naive_copy: f64,
}

impl PlanePoint {
    fn new(latency: f64, stall: Option<f64>, rows: &[(Comparison, Comparison)]) -> Self {
        let (in_place, copy) = (|| rows.iter().map(|r| &r.0), || rows.iter().map(|r| &r.1));
        Self {
            latency,
            stall,
            over_push: geomean_speedup_over_push(in_place()),
            over_naive: geomean_speedup(in_place()),
            over_push_copy: geomean_speedup_over_push(copy()),
            over_naive_copy: geomean_speedup(copy()),
        }
    }
}

#[derive(Debug, Parser)]
#[command(about = "Regenerates docs/evaluation.md and its figures from the emulator and the benchmarks")]
struct Args {
    /// The template, with `{{name}}` fields.
    #[arg(long, default_value = "docs/evaluation.template.md")]
    template: PathBuf,
    /// Where evaluation.md and figures/ are written.
    #[arg(long, default_value = "docs")]
    out: PathBuf,
    /// Two applications, two sweep sizes, short benchmark loops: checks the report, measures
    /// nothing worth publishing.
    #[arg(long)]
    quick: bool,
    /// Emulator and benchmark seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads for the emulator (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Runs of `wic-bench --json` recorded on other machines, shown next to this one's.
    #[arg(long, default_value = "bench/results")]
    recorded: PathBuf,
    /// Leaves out the kernel path in the VM (which builds `wic-vmtest` and boots a kernel with
    /// tests/vm/run.sh); the report then says it was not run. `--quick` implies it.
    #[arg(long)]
    no_vm: bool,
    /// The co-run measured on a GPU (`device/bench/corun.cu`'s JSON lines), which the model's
    /// co-run is set beside.
    #[arg(long, default_value = "device/bench/results/corun-h200-2026-11-28.jsonl")]
    corun: PathBuf,
    /// The committed GPU runs of device/apps' programs (`validation::MEASURED`'s files), which
    /// describe the programs and which the model is validated against.
    #[arg(long, default_value = validation::RESULTS_DIR)]
    device_results: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wic-report: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let template = std::fs::read_to_string(&args.template).map_err(|e| format!("{}: {e}", args.template.display()))?;
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cal = Calibration::built_in();
    let started = Instant::now();
    let mut fields = Fields::default();

    let apps = if args.quick {
        pick(&["C_CG", "G_STN"])?.into_iter().map(|w| w.with_threads(1 << 10)).collect()
    } else {
        workload::all()
    };
    eprintln!("wic-report: {} applications, naive and WIC, on the emulator", apps.len());
    let both = compare_in_place_and_copy(&apps, &cal, args.seed, threads, progress("applications"));
    check_both(&both)?;
    let apps_seconds = started.elapsed().as_secs_f64();

    let sweep_started = Instant::now();
    let sweep_threads: &[u32] = if args.quick { &SWEEP_THREADS[..2] } else { &SWEEP_THREADS };
    let sweep_apps = pick(if args.quick { &SWEEP_APPS[..2] } else { &SWEEP_APPS })?;
    let mut sweep = Vec::new();
    for &count in sweep_threads {
        eprintln!("wic-report: sweep, {count} consumer threads per kernel");
        let set: Vec<Workload> = sweep_apps.iter().cloned().map(|w| w.with_threads(count)).collect();
        let rows = compare(&set, &cal, args.seed, threads, progress("sweep"));
        check_messages(&rows)?;
        sweep.push((count, rows));
    }
    let sweep_seconds = sweep_started.elapsed().as_secs_f64();

    let plane_started = Instant::now();
    let (plane_latency, plane_stall) =
        if args.quick { (&PLANE_LATENCY[1..3], &PLANE_STALL[..2]) } else { (&PLANE_LATENCY[..], &PLANE_STALL[..]) };
    let device_runs = validation::measured_runs(&args.device_results)?;
    let device_apps = apps::workloads(&device_runs, &cal)?;
    let device_apps = if args.quick {
        device_apps.into_iter().filter(|w| ["C_CG", "G_STN"].contains(&w.name)).collect()
    } else {
        device_apps
    };
    let (mut plane, mut plane_runs, mut app_plane) = (Vec::new(), 0, Vec::new());
    for &stall in plane_stall {
        for &latency in plane_latency {
            let point_cal = plane_calibration(&cal, latency, stall);
            eprintln!("wic-report: plane, device/apps, fault path x{latency}, stall {}", stall_label(stall, &cal));
            let app_rows =
                compare_in_place_and_copy(&device_apps, &point_cal, args.seed, threads, progress("plane, device/apps"));
            check_both(&app_rows)?;
            plane_runs += RUNS_PER_ROW * app_rows.len();
            app_plane.push(AppPlanePoint { latency, stall, rows: app_rows });
            // The calibration's own point is the applications' table above: not run again.
            let point_rows = if latency == 1.0 && stall.is_none() {
                None
            } else {
                eprintln!("wic-report: plane, fault path x{latency}, stall {}", stall_label(stall, &cal));
                let rows = compare_in_place_and_copy(&apps, &point_cal, args.seed, threads, progress("plane"));
                check_both(&rows)?;
                plane_runs += RUNS_PER_ROW * rows.len();
                Some(rows)
            };
            plane.push(PlanePoint::new(latency, stall, point_rows.as_deref().unwrap_or(&both)));
        }
    }
    let plane_seconds = plane_started.elapsed().as_secs_f64();
    let (rows, rows_copy): (Vec<Comparison>, Vec<Comparison>) = both.into_iter().unzip();

    eprintln!("wic-report: a host producer's batch, copied, by the copy engine and in place");
    let host_fill_started = Instant::now();
    let host_fill = host_fill::MESSAGE_BYTES
        .iter()
        .map(|&bytes| host_fill::costs(&cal, bytes, args.seed).map(|costs| (bytes, costs)))
        .collect::<Result<Vec<_>, _>>()?;
    let host_fill_seconds = host_fill_started.elapsed().as_secs_f64();

    eprintln!("wic-report: device/apps on the emulator, against their GPU runs");
    let validation_started = Instant::now();
    let validation = validation::validate(&device_runs, &Mode::STOCK_DRIVER, &cal, args.seed);
    let validation_seconds = validation_started.elapsed().as_secs_f64();

    eprintln!("wic-report: the co-run on the emulator, against the GPU's");
    let corun_started = Instant::now();
    let measured_corun = measured_corun(&args.corun)?;
    let corun_rows = model_corun(&cal, &PLANE_STALL, args.seed)?;
    let corun_seconds = corun_started.elapsed().as_secs_f64();

    eprintln!("wic-report: fast-path benchmarks");
    let bench_settings = Settings::new(args.quick, if args.quick { 1 } else { 5 }, args.seed);
    let results = wic_bench::run(&bench_settings, &[]);

    let vm = if args.quick || args.no_vm {
        None
    } else {
        eprintln!("wic-report: kernel path in the VM");
        Some(vm_bench()?)
    };

    let figures = args.out.join("figures");
    std::fs::create_dir_all(&figures).map_err(|e| format!("{}: {e}", figures.display()))?;
    write_figures(&figures, &rows, &sweep, &plane, &cal)?;

    fields.set("machine", results.machine.clone());
    fields.set("calibration", calibration_summary(&cal));
    fields.set("seed", args.seed.to_string());
    fields.set("apps_table", apps_table(&rows, &rows_copy));
    fields.set("apps_seconds", format!("{apps_seconds:.0}"));
    fields.set("apps_runs", (RUNS_PER_ROW * rows.len()).to_string());
    fields.set("geomean_over_push_copy", format!("{:.2}x", geomean_speedup_over_push(&rows_copy)));
    fields.set("host_fill_table", host_fill_table(&host_fill));
    fields.set("host_fill_verdict", host_fill_verdict(&host_fill));
    fields.set("host_fill_seconds", format!("{host_fill_seconds:.1}"));
    fields.set("host_fill_batches", host_fill::BATCHES.to_string());
    fields.set("geomean", format!("{:.2}x", geomean_speedup(&rows)));
    fields.set("geomean_over_push", format!("{:.2}x", geomean_speedup_over_push(&rows)));
    fields.set("paper_geomean", format!("{:.2}x", paper::MEAN_SPEEDUP));
    fields.set("sweep_table", sweep_table(&sweep));
    fields.set("sweep_seconds", format!("{sweep_seconds:.0}"));
    fields.set(
        "sweep_runs",
        (Mode::COMPARED.len() * sweep.iter().map(|(_, rows)| rows.len()).sum::<usize>()).to_string(),
    );
    fields.set("plane_table", plane_table(&plane, &cal));
    fields.set("plane_runs", plane_runs.to_string());
    fields.set("app_plane_table", app_plane_table(&app_plane, &cal));
    fields.set("plane_verdict", plane_verdict(&plane, (&rows, &rows_copy), &app_plane, &cal));
    fields.set("plane_seconds", format!("{plane_seconds:.0}"));
    fields
        .set("validation_sources", validation::MEASURED.iter().map(|(_, source, _)| format!("- {source}\n")).collect());
    fields.set("validation_table", validation_table(&validation));
    fields.set("validation_notes", validation_notes(&validation));
    fields.set("validation_seconds", format!("{validation_seconds:.0}"));
    fields.set("corun_source", args.corun.display().to_string());
    fields.set("corun_table", corun_table(&corun_rows, &measured_corun));
    fields.set("corun_plane", corun_plane(&corun_rows, &cal));
    fields.set("corun_seconds", format!("{corun_seconds:.0}"));
    fields.set("bench_summary", summary(&results).iter().map(|l| format!("- {l}\n")).collect());
    fields.set("bench_recorded", recorded(&args.recorded)?);
    fields.set("bench_interrupter", interrupter_table(&results));
    fields.set("bench_monitor", monitor_table(&results));
    fields.set("bench_batch", batch_table(&results));
    fields.set(
        "vm_where",
        vm.as_ref().map_or("not run in this regeneration (`--no-vm` or `--quick`)".into(), |vm| vm.place.clone()),
    );
    fields.set("vm_table", vm.as_ref().map_or(String::new(), vm_table));
    fields.set("vm_lanes_table", vm.as_ref().map_or(String::new(), vm_lanes_table));
    fields.set("total_seconds", format!("{:.0}", started.elapsed().as_secs_f64()));
    let text = fields.fill(&template)?;
    let out = args.out.join("evaluation.md");
    std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "wic-report: wrote {} and {} in {:.0} s",
        out.display(),
        figures.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The model's co-run: each mode at each gap with the calibration, and WIC's at each stall cost
/// of the plane (fault path as calibrated).
struct CorunRow {
    mode: Mode,
    gap_ns: u64,
    stall: Option<f64>,
    throughput: Vec<f64>,
}

fn model_corun(cal: &Calibration, stalls: &[Option<f64>], seed: u64) -> Result<Vec<CorunRow>, String> {
    let mut rows = Vec::new();
    for mode in Mode::CORUN {
        for gap_ns in corun::GAPS_NS {
            let points: &[Option<f64>] = if mode == Mode::Fault { stalls } else { &[None] };
            for &stall in points {
                let c = plane_calibration(cal, 1.0, stall);
                let throughput = corun::throughput(&c, mode, corun::GENERATIONS, gap_ns, seed)
                    .map_err(|e| format!("co-run, {} at a gap of {gap_ns} ns: {e}", mode.name()))?;
                rows.push(CorunRow { mode, gap_ns, stall, throughput });
            }
        }
    }
    Ok(rows)
}

/// The GPU's co-run by (transport, neighbour, gap in us): the neighbour's throughput; for the
/// fault row (no gap) its progress while the warps were stalled.
fn measured_corun(path: &Path) -> Result<BTreeMap<(String, String, u64), f64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{}: {e}", path.display()))?;
        if v["measurement"] != "corun" {
            continue;
        }
        let (Some(transport), Some(neighbour)) = (v["transport"].as_str(), v["neighbour"].as_str()) else {
            return Err(format!("{}: a corun line without transport or neighbour", path.display()));
        };
        let gap = v["gap_us"].as_f64().unwrap_or(0.0) as u64;
        let key = if transport == "fault" { "progress_while_held" } else { "throughput" };
        let value = v[key].as_f64().ok_or_else(|| format!("{}: {transport} {neighbour}: no {key}", path.display()))?;
        out.insert((transport.to_string(), neighbour.to_string(), gap), value);
    }
    if out.is_empty() {
        return Err(format!("{}: no corun measurement", path.display()));
    }
    Ok(out)
}

/// The model's co-run beside the GPU's, per mode and kind of neighbour: "model / GPU".
fn corun_table(rows: &[CorunRow], measured: &BTreeMap<(String, String, u64), f64>) -> String {
    let kinds = corun::neighbours();
    let mut t = format!(
        "| mode, gap | {} |\n|---|{}\n",
        kinds.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(" | "),
        "---|".repeat(kinds.len())
    );
    for row in rows.iter().filter(|r| r.stall.is_none()) {
        let gap_us = row.gap_ns / 1000;
        // WIC's held faults beside the GPU's warps stalled on faults the stock driver serves,
        // which have no gap: shown with the back-to-back row only.
        let gpu_name = if row.mode == Mode::Fault { "fault" } else { row.mode.name() };
        let shown = row.mode != Mode::Fault || gap_us == 0;
        let cells: Vec<String> = kinds
            .iter()
            .zip(&row.throughput)
            .map(|((kind, _), model)| {
                let gpu = measured.get(&(gpu_name.to_string(), kind.to_string(), gap_us)).filter(|_| shown);
                format!("{model:.3} / {}", gpu.map_or("-".into(), |g| format!("{g:.3}")))
            })
            .collect();
        let name = if row.mode == Mode::Fault { "fault (WIC; GPU: stalled on stock faults)" } else { row.mode.name() };
        t.push_str(&format!("| {name}, {gap_us} us | {} |\n", cells.join(" | ")));
    }
    t
}

/// WIC's neighbour by the model at each stall cost of the plane, against push's, back to back:
/// arithmetic and memory-bound neighbours.
fn corun_plane(rows: &[CorunRow], cal: &Calibration) -> String {
    let kinds = corun::neighbours();
    let column = |name: &str| kinds.iter().position(|(kind, _)| *kind == name).expect("a neighbour kind of corun");
    let (arithmetic, memory) = (column("fma_ilp"), column("dram_loads"));
    let push = rows.iter().find(|r| r.mode == Mode::Push && r.gap_ns == 0).map(|r| &r.throughput);
    let mut t = String::from(
        "| stall cost (memory progress beside a stalled warp) | WIC, arithmetic | push, arithmetic | WIC, memory-bound | push, memory-bound |\n|---|---|---|---|---|\n",
    );
    for row in rows.iter().filter(|r| r.mode == Mode::Fault && r.gap_ns == 0) {
        let p = |i: usize| push.map_or("-".into(), |v| format!("{:.3}", v[i]));
        t.push_str(&format!(
            "| {} | {:.3} | {} | {:.3} | {} |\n",
            stall_label(row.stall, cal),
            row.throughput[arithmetic],
            p(arithmetic),
            row.throughput[memory],
            p(memory)
        ));
    }
    t
}

/// The verdicts of every run recorded in `dir` (`wic-bench --json`), file by file.
fn recorded(dir: &Path) -> Result<String, String> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    files.sort();
    if files.is_empty() {
        return Ok(format!("(no recorded runs in {})", dir.display()));
    }
    let mut text = String::new();
    for path in files {
        let json = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let results: Results = serde_json::from_str(&json).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        text += &format!(
            "- {} (`{}/{name}`):
",
            results.machine,
            dir.display()
        );
        for line in summary(&results) {
            text += &format!(
                "  - {line}
"
            );
        }
    }
    Ok(text)
}

/// What `wic-vmtest bench` measured in the VM, and where.
struct VmBench {
    /// Kernel and accelerator, as the harness reported them.
    place: String,
    results: serde_json::Value,
}

/// Builds `wic-vmtest` and runs its bench in a VM booted by tests/vm/run.sh; the harness's
/// own output is passed through, and its verdict decides.
fn vm_bench() -> Result<VmBench, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "-q", "-p", "wic-tests", "--bin", "wic-vmtest"])
        .status()
        .map_err(|e| format!("cargo build of wic-vmtest: {e}"))?;
    if !built.success() {
        return Err("cargo build of wic-vmtest failed".into());
    }
    let out_dir = Path::new("target/vm-bench");
    let run = std::process::Command::new("tests/vm/run.sh")
        .args(["--out", "target/vm-bench", "--bin", "target/release/wic-vmtest", "--", "wic-vmtest", "bench"])
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("tests/vm/run.sh (run wic-report from the workspace root, or pass --no-vm): {e}"))?;
    let log = String::from_utf8_lossy(&run.stderr);
    eprint!("{log}");
    // The harness's last word is `WIC-VM: PASS (<accelerator>, <seconds> s)`.
    let accel = log.lines().find_map(|l| l.strip_prefix("WIC-VM: PASS (")).and_then(|rest| rest.split(',').next());
    let (true, Some(accel)) = (run.status.success(), accel) else {
        return Err(format!("the VM bench failed (console: {}/console.log); --no-vm leaves it out", out_dir.display()));
    };
    let path = out_dir.join("kernel-bench.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let results: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let kernel = results["kernel"].as_str().unwrap_or("an unknown kernel");
    let how = if accel == "kvm" { "KVM" } else { "software CPU emulation (TCG)" };
    Ok(VmBench { place: format!("Linux {kernel} under qemu with {how}"), results })
}

/// Per submission path, p50 / p99 per fault at each batch size.
fn vm_table(vm: &VmBench) -> String {
    let rows = vm.results["results"].as_array().cloned().unwrap_or_default();
    let mut batches: Vec<u64> = rows.iter().filter_map(|r| r["batch"].as_u64()).collect();
    batches.sort_unstable();
    batches.dedup();
    let mut text = String::from("| submission |");
    for batch in &batches {
        text += &format!(" batch {batch} p50 / p99 |");
    }
    text += &format!("\n|---|{}\n", "---|".repeat(batches.len()));
    for (submission, name) in [("io_uring", "io_uring (`IORING_OP_URING_CMD`)"), ("ioctl", "ioctl (`WIC_IOC_SUBMIT`)")]
    {
        text += &format!("| {name} |");
        for batch in &batches {
            let cell = rows.iter().find(|r| r["submission"] == submission && r["batch"].as_u64() == Some(*batch));
            text += &match cell {
                Some(r) => format!(" {} / {} |", micros(&r["p50_us"]), micros(&r["p99_us"])),
                None => " - |".into(),
            };
        }
        text += "\n";
    }
    text
}

/// Per placement of the two applications' channels, a batch's execution as one chain and as a
/// lane each, and their ratio pair by pair.
fn vm_lanes_table(vm: &VmBench) -> String {
    let mut text = String::from(
        "| two applications on | batches each way | one chain p50 | a lane each p50 | chain over lanes, pair by pair: \
         p25 / p50 / p75 |\n|---|---|---|---|---|\n",
    );
    for row in vm.results["lanes"].as_array().cloned().unwrap_or_default() {
        let spaces = match row["gpus"].as_u64() {
            Some(1) => "one GPU".to_string(),
            Some(n) => format!("{n} GPUs, one each"),
            None => "-".into(),
        };
        let ratio = |key: &str| row[key].as_f64().map_or("-".into(), |r| format!("{r:.2}"));
        text += &format!(
            "| {spaces} | {} | {} | {} | {} / {} / {} |\n",
            row["batches"],
            micros(&row["chain_p50_us"]),
            micros(&row["lanes_p50_us"]),
            ratio("ratio_p25"),
            ratio("ratio_p50"),
            ratio("ratio_p75")
        );
    }
    text
}

/// A latency in microseconds, in ms from 10 ms up.
fn micros(value: &serde_json::Value) -> String {
    match value.as_f64() {
        Some(us) if us >= 10_000.0 => format!("{:.1} ms", us / 1000.0),
        Some(us) => format!("{us:.0} us"),
        None => "-".into(),
    }
}

fn pick(names: &[&str]) -> Result<Vec<Workload>, String> {
    names.iter().map(|n| workload::by_name(n).ok_or_else(|| format!("no workload {n}"))).collect()
}

fn progress(what: &'static str) -> impl FnMut(usize, usize, &wic_emu::RunReport) {
    move |done, total, report| eprintln!("  {what} [{done}/{total}] {} {}", report.workload, report.mode.name())
}

/// [`check_messages`] for both ways of WIC's.
fn check_both(rows: &[(Comparison, Comparison)]) -> Result<(), String> {
    check_messages(rows.iter().flat_map(|(in_place, copy)| [in_place, copy]))
}

/// A report built on corrupted deliveries would be worthless: refuse it.
fn check_messages<'a>(rows: impl IntoIterator<Item = &'a Comparison>) -> Result<(), String> {
    match rows.into_iter().find(|r| {
        r.naive.corrupt_messages + r.fault.corrupt_messages > 0 || !r.fault.pool_restored || !r.fault.pfq_empty
    }) {
        Some(bad) => Err(format!("{}: corrupted messages or state left behind in the emulator", bad.naive.workload)),
        None => Ok(()),
    }
}

fn or_dash(x: Option<f64>, show: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "–".into(), show)
}

fn paper_of(row: &Comparison) -> Option<&'static PaperApp> {
    paper::app_named(row.naive.workload)
}

/// The applications' table, WIC's host producers writing in place; `copy`: the same rows with
/// wicd copying their batches, whose WIC runtime stands beside.
fn apps_table(rows: &[Comparison], copy: &[Comparison]) -> String {
    let mut t = String::from(
        "| app | naive ms | push ms | WIC ms | WIC ms, wicd copying | speedup | WIC over push | paper speedup | consumer overhead naive / WIC | overlap naive / WIC | paper overlap WIC | wicd busy | paper host overhead | faults handled |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (row, copy) in rows.iter().zip(copy) {
        let paper = paper_of(row);
        let faults = row.fault.engine.as_ref().map_or(0, |e| e.entries);
        t.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2}x | {:.2}x | {} | {} / {} | {} / {} | {} | {} | {} | {} |\n",
            row.naive.workload,
            row.naive.runtime_ns as f64 / 1e6,
            row.push.runtime_ns as f64 / 1e6,
            row.fault.runtime_ns as f64 / 1e6,
            copy.fault.runtime_ns as f64 / 1e6,
            row.speedup(),
            row.speedup_over_push(),
            or_dash(paper.and_then(|p| p.speedup), |s| format!("≈{s:.2}x")),
            percent(row.naive.consumer_overhead),
            percent(row.fault.consumer_overhead),
            percent(row.naive.overlap_efficiency),
            percent(row.fault.overlap_efficiency),
            or_dash(paper.and_then(|p| p.overlap_wic), |o| format!("≈{}", percent(o))),
            percent(row.fault.daemon_share),
            or_dash(paper.and_then(|p| p.host_overhead), percent),
            faults,
        ));
    }
    t
}

fn thread_label(threads: u32) -> String {
    match threads {
        t if t >= 1 << 20 && t % (1 << 20) == 0 => format!("{}M", t >> 20),
        t if t >= 1 << 10 && t % (1 << 10) == 0 => format!("{}K", t >> 10),
        t => t.to_string(),
    }
}

fn sweep_table(sweep: &[(u32, Vec<Comparison>)]) -> String {
    let Some((_, first)) = sweep.first() else { return String::new() };
    let names: Vec<&str> = first.iter().map(|r| r.naive.workload).collect();
    let mut t = format!("| threads | {} |\n|---|{}\n", names.join(" | "), "---|".repeat(names.len()));
    for (threads, rows) in sweep {
        let cells: Vec<String> = rows.iter().map(|r| format!("{:.2}x", r.speedup())).collect();
        t.push_str(&format!("| {} | {} |\n", thread_label(*threads), cells.join(" | ")));
    }
    t
}

/// The emulated runtime of each device application in each mode next to its GPU run.
fn validation_table(rows: &[Validation]) -> String {
    let mut out = String::from("| app | mode | measured ms | emulated ms | error |\n|---|---|---|---|---|\n");
    for row in rows {
        let (emulated, error) = match (&row.emulated_ms, row.error()) {
            (Ok(ms), Some(error)) => (format!("{ms:.3}"), signed_percent(error)),
            (Err(why), _) => ("not run".to_string(), why.clone()),
            (Ok(_), None) => unreachable!("a run's error is known"),
        };
        out.push_str(&format!(
            "| {} | {} | {:.3} | {emulated} | {error} |\n",
            row.app,
            row.mode.name(),
            row.measured_ms
        ));
    }
    out
}

/// A signed whole percentage; one that rounds to zero has no sign.
fn signed_percent(share: f64) -> String {
    let percent = (100.0 * share).round();
    if percent == 0.0 {
        "0%".into()
    } else {
        format!("{percent:+.0}%")
    }
}

/// How many rows are within the tolerance; the others by the mechanism the model lacks for
/// them; then what each description approximates.
fn validation_notes(rows: &[Validation]) -> String {
    let misses = |r: &&Validation| r.error().is_none_or(|e| e.abs() > validation::TOLERANCE);
    // The no-wait rows give back what the descriptions were built from: not counted.
    let predicted = rows.iter().filter(|r| r.mode != Mode::NoWait).count();
    let mut out = format!(
        "{} of the {predicted} predicted rows (all but `nowait`) are within {:.0}%. The others, by the mechanism the model lacks for them:\n\n",
        predicted - rows.iter().filter(misses).count(),
        100.0 * validation::TOLERANCE
    );
    let mut by_mechanism: Vec<(&str, Vec<String>)> = Vec::new();
    for row in rows.iter().filter(misses) {
        let app = apps::by_name(row.app).expect("rows come from the descriptions");
        let mechanism = app.missing.iter().find(|(mode, _)| *mode == row.mode).map_or("not named", |(_, m)| *m);
        let error = row.error().map_or("not run".into(), signed_percent);
        let label = format!("{} {} ({error})", row.app, row.mode.name());
        match by_mechanism.iter_mut().find(|(m, _)| *m == mechanism) {
            Some((_, labels)) => labels.push(label),
            None => by_mechanism.push((mechanism, vec![label])),
        }
    }
    for (mechanism, labels) in by_mechanism {
        out.push_str(&format!("- {}: {mechanism}.\n", labels.join(", ")));
    }
    out.push_str("\nWhat the descriptions approximate:\n\n");
    for app in apps::all().iter().filter(|a| !a.estimates.is_empty()) {
        out.push_str(&format!("- {}: {}.\n", app.name, app.estimates));
    }
    out
}

/// Per program of device/apps: WIC's speedup over push and over alg1 at the calibration's
/// point and at the plane's most favourable one, and the points where WIC beats push; each
/// cell in place / with wicd copying.
fn app_plane_table(points: &[AppPlanePoint], cal: &Calibration) -> String {
    let Some(calibrated) = points.iter().find(|p| p.latency == 1.0 && p.stall.is_none()) else { return String::new() };
    let best = best_point(points, cal);
    let mut t = format!(
        "| app | over push, calibration | over alg1, calibration | over push, fault path {} and stall {} | over alg1, there | WIC in place beats push at | WIC copying beat push at |\n|---|---|---|---|---|---|---|\n",
        latency_label(best.latency),
        stall_label(best.stall, cal)
    );
    let both = |(in_place, copy): &(Comparison, Comparison), ratio: fn(&Comparison) -> f64| {
        format!("{:.2}x / {:.2}x", ratio(in_place), ratio(copy))
    };
    for (index, row) in calibrated.rows.iter().enumerate() {
        let there = &best.rows[index];
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            row.0.naive.workload,
            both(row, Comparison::speedup_over_push),
            both(row, Comparison::speedup),
            both(there, Comparison::speedup_over_push),
            both(there, Comparison::speedup),
            wins_label(points, index, |r| &r.0, cal),
            wins_label(points, index, |r| &r.1, cal),
        ));
    }
    t
}

/// The plane's most favourable point for WIC: the fastest fault path, the cheapest stall.
fn best_point<'a>(points: &'a [AppPlanePoint], cal: &Calibration) -> &'a AppPlanePoint {
    let stall_rank = |p: &AppPlanePoint| p.stall.map_or(0.0, |s| s.max(cal.stall.memory_progress.value));
    points
        .iter()
        .min_by(|a, b| a.latency.total_cmp(&b.latency).then(stall_rank(b).total_cmp(&stall_rank(a))))
        .expect("a point")
}

/// The points of the plane where program `index`'s WIC (the way `way` picks) beats push.
fn win_points(
    points: &[AppPlanePoint],
    index: usize,
    way: fn(&(Comparison, Comparison)) -> &Comparison,
) -> impl Iterator<Item = &AppPlanePoint> {
    points.iter().filter(move |p| way(&p.rows[index]).speedup_over_push() > 1.0)
}

fn wins_label(
    points: &[AppPlanePoint],
    index: usize,
    way: fn(&(Comparison, Comparison)) -> &Comparison,
    cal: &Calibration,
) -> String {
    let wins: Vec<String> = win_points(points, index, way)
        .map(|p| format!("{}, stall {}", latency_label(p.latency), stall_label(p.stall, cal)))
        .collect();
    match wins.len() {
        0 => "nowhere".to_string(),
        n if n == points.len() => "everywhere on the plane".to_string(),
        _ => wins.join("; "),
    }
}

/// The rows of `rows` whose WIC beats push, with its speedup over push: `C_CG (1.09x), ...`.
fn beating_push<'a>(rows: impl IntoIterator<Item = &'a Comparison>) -> String {
    let names: Vec<String> = rows
        .into_iter()
        .filter(|r| r.speedup_over_push() > 1.0)
        .map(|r| format!("{} ({:.2}x)", r.naive.workload, r.speedup_over_push()))
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// What the plane says, in words from its numbers: the paper's patterns (`patterns`, the rows
/// at the calibration's point, in place and copying) and the programs of device/apps for which
/// WIC beats push, in place and with wicd copying.
fn plane_verdict(
    plane: &[PlanePoint],
    patterns: (&[Comparison], &[Comparison]),
    app_plane: &[AppPlanePoint],
    cal: &Calibration,
) -> String {
    let mut out = String::new();
    let calibrated = plane.iter().find(|p| p.latency == 1.0 && p.stall.is_none());
    let best = |over: fn(&PlanePoint) -> f64| plane.iter().max_by(|a, b| over(a).total_cmp(&over(b)));
    let at = |p: &PlanePoint| format!("fault path {}, stall {}", latency_label(p.latency), stall_label(p.stall, cal));
    if let (Some(c), Some(in_place), Some(copy)) = (calibrated, best(|p| p.over_push), best(|p| p.over_push_copy)) {
        let wins = |over: fn(&PlanePoint) -> f64| plane.iter().filter(|p| over(p) > 1.0).count();
        out.push_str(&format!(
            "- The paper's patterns, geometric mean of WIC over push: {:.2}x in place at the calibration's point (copying: {:.2}x); at best {:.2}x ({}), copying {:.2}x ({}). WIC beats push at {} of the plane's {} points in place, at {} copying.\n",
            c.over_push,
            c.over_push_copy,
            in_place.over_push,
            at(in_place),
            copy.over_push_copy,
            at(copy),
            wins(|p| p.over_push),
            plane.len(),
            wins(|p| p.over_push_copy),
        ));
    }
    out.push_str(&format!(
        "- The paper's patterns for which WIC beats push at the calibration's point (WIC over push): in place {}; copying {}.\n",
        beating_push(patterns.0),
        beating_push(patterns.1)
    ));
    let Some(calibrated) = app_plane.iter().find(|p| p.latency == 1.0 && p.stall.is_none()) else { return out };
    let anywhere = |way: fn(&(Comparison, Comparison)) -> &Comparison| {
        let names: Vec<String> = (0..calibrated.rows.len())
            .filter_map(|index| {
                let best = win_points(app_plane, index, way)
                    .map(|p| way(&p.rows[index]).speedup_over_push())
                    .max_by(f64::total_cmp)?;
                Some(format!("{} (up to {best:.2}x)", way(&calibrated.rows[index]).naive.workload))
            })
            .collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let closest = |way: fn(&(Comparison, Comparison)) -> &Comparison| {
        let mut rows: Vec<&Comparison> = calibrated.rows.iter().map(way).collect();
        rows.sort_by(|a, b| b.speedup_over_push().total_cmp(&a.speedup_over_push()));
        rows.iter()
            .take(2)
            .map(|r| format!("{} {:.2}x", r.naive.workload, r.speedup_over_push()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out.push_str(&format!(
        "- The programs of `device/apps` for which WIC beats push at the calibration's point: in place {}; copying {} (closest in place: {}; copying: {}).\n",
        beating_push(calibrated.rows.iter().map(|r| &r.0)),
        beating_push(calibrated.rows.iter().map(|r| &r.1)),
        closest(|r| &r.0),
        closest(|r| &r.1),
    ));
    out.push_str(&format!(
        "- Those for which it beats push anywhere on the plane: in place {}; copying {}.\n",
        anywhere(|r| &r.0),
        anywhere(|r| &r.1)
    ));
    out
}

/// wicd's busy time per batch and the delivery latency, by message size, for each way of
/// [`Mode::HOST_FILLS`].
fn host_fill_table(rows: &[(u32, [Cost; 3])]) -> String {
    let names = Mode::HOST_FILLS.map(host_fill_name);
    let mut t = format!(
        "| message per warp (batch of {} warps) | wicd busy per batch: {} | {} | {} | delivery: {} | {} | {} |\n|---|---|---|---|---|---|---|\n",
        host_fill::WARPS,
        names[0],
        names[1],
        names[2],
        names[0],
        names[1],
        names[2]
    );
    for (bytes, costs) in rows {
        let us = |ns: f64| format!("{:.1} us", ns / 1000.0);
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            size_label(*bytes),
            us(costs[0].busy_per_batch_ns),
            us(costs[1].busy_per_batch_ns),
            us(costs[2].busy_per_batch_ns),
            us(costs[0].delivery_ns),
            us(costs[1].delivery_ns),
            us(costs[2].delivery_ns),
        ));
    }
    t
}

fn host_fill_name(mode: Mode) -> &'static str {
    match mode {
        Mode::FaultCopy => "copy (CPU)",
        Mode::FaultCopyEngine => "copy (CE)",
        Mode::Fault => "in place",
        other => other.name(),
    }
}

/// 64 B, 1 KiB, 64 KiB.
fn size_label(bytes: u32) -> String {
    if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

/// Which way wins where, in words from the table's numbers: each pair of ways, the sizes at
/// which the first takes less of wicd's time and delivers sooner, and by how much.
fn host_fill_verdict(rows: &[(u32, [Cost; 3])]) -> String {
    let index = |mode: Mode| Mode::HOST_FILLS.iter().position(|m| *m == mode).expect("a way of host_fill's");
    let (cpu, ce, in_place) = (index(Mode::FaultCopy), index(Mode::FaultCopyEngine), index(Mode::Fault));
    let mut out = String::new();
    for (a, b) in [(ce, cpu), (in_place, cpu), (ce, in_place)] {
        let (name_a, name_b) = (host_fill_name(Mode::HOST_FILLS[a]), host_fill_name(Mode::HOST_FILLS[b]));
        let mut line = format!("- {name_a} against {name_b}:");
        for (what, unit, of) in [
            ("takes less of wicd's thread", " a batch", (|c: &Cost| c.busy_per_batch_ns) as fn(&Cost) -> f64),
            ("delivers sooner", "", |c: &Cost| c.delivery_ns),
        ] {
            // A lead under 1% is no lead: a few nanoseconds of head words beside microseconds.
            let lead = |costs: &[Cost; 3]| of(&costs[b]) - of(&costs[a]);
            let tie = |costs: &[Cost; 3]| lead(costs).abs() <= 0.01 * of(&costs[b]);
            let ahead: Vec<(u32, f64)> = rows
                .iter()
                .filter(|(_, costs)| !tie(costs))
                .map(|(bytes, costs)| (*bytes, lead(costs)))
                .filter(|(_, d)| *d > 0.0)
                .collect();
            let sizes = if ahead.len() == rows.len() {
                "at every size".to_string()
            } else if ahead.is_empty() && rows.iter().all(|(_, costs)| tie(costs)) {
                "at no size (within 1% at every size)".to_string()
            } else if ahead.is_empty() {
                "at no size".to_string()
            } else {
                format!("at {}", ahead.iter().map(|(b, _)| size_label(*b)).collect::<Vec<_>>().join(", "))
            };
            let by = match (ahead.first(), ahead.last()) {
                (Some(first), Some(last)) => format!(
                    " (by {:.1} us{unit} at {} to {:.1} us at {})",
                    first.1 / 1000.0,
                    size_label(first.0),
                    last.1 / 1000.0,
                    size_label(last.0)
                ),
                _ => String::new(),
            };
            line.push_str(&format!(" {what} {sizes}{by};"));
        }
        line.pop();
        line.push_str(".\n");
        out.push_str(&line);
    }
    out
}

/// The calibration at a point of the plane.
fn plane_calibration(cal: &Calibration, latency: f64, stall: Option<f64>) -> Calibration {
    let mut c = cal.clone();
    c.scale_fault_path(latency);
    if let Some(progress) = stall {
        c.stall.memory_progress.value = progress.max(cal.stall.memory_progress.value);
        if progress >= 1.0 {
            c.stall.compute_progress.value = 1.0;
        }
    }
    c
}

fn stall_label(stall: Option<f64>, cal: &Calibration) -> String {
    match stall {
        None => format!("measured ({})", cal.stall.memory_progress.value),
        Some(p) if p >= 1.0 => "free".into(),
        Some(p) => p.to_string(),
    }
}

fn latency_label(latency: f64) -> String {
    if latency == 1.0 {
        "x1 (calibration)".into()
    } else {
        format!("x{latency}")
    }
}

/// The plane's points of its first stall cost: one per fault-path factor (the points run stall
/// by stall, every factor for each).
fn plane_row(plane: &[PlanePoint]) -> &[PlanePoint] {
    let n = plane.iter().take_while(|p| p.stall == plane[0].stall).count();
    &plane[..n]
}

/// WIC over push (over naive polling), one row per stall cost, one column per fault-path factor;
/// each figure in place / with wicd copying.
fn plane_table(plane: &[PlanePoint], cal: &Calibration) -> String {
    let columns = plane_row(plane);
    let header: Vec<String> = columns.iter().map(|p| latency_label(p.latency)).collect();
    let mut t = format!(
        "| memory progress beside a stalled warp \\ fault path | {} |\n|---|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for row in plane.chunks(columns.len().max(1)) {
        let cells: Vec<String> = row
            .iter()
            .map(|p| {
                format!(
                    "{:.2}x / {:.2}x ({:.2}x / {:.2}x)",
                    p.over_push, p.over_push_copy, p.over_naive, p.over_naive_copy
                )
            })
            .collect();
        t.push_str(&format!("| {} | {} |\n", stall_label(row[0].stall, cal), cells.join(" | ")));
    }
    t
}

fn plane_figure(plane: &[PlanePoint], cal: &Calibration) -> String {
    let columns = plane_row(plane);
    let labels: Vec<String> = columns.iter().map(|p| latency_label(p.latency)).collect();
    let way = |name: &'static str, over: fn(&PlanePoint) -> f64| {
        plane.chunks(columns.len().max(1)).map(move |row| Series {
            name: format!("{name}, stall: {}", stall_label(row[0].stall, cal)),
            values: row.iter().map(|p| Some(over(p))).collect(),
        })
    };
    let series: Vec<Series> =
        way("in place", |p| p.over_push).chain(way("wicd copying", |p| p.over_push_copy)).collect();
    svg::lines(
        "WIC over push (geometric mean, ten applications) by fault-path latency and stall cost, in place and wicd copying, emulator",
        "fault-path latencies, factor of the calibration's",
        "WIC over push",
        &labels,
        &series,
        Some(1.0),
    )
}

fn write_figures(
    dir: &Path,
    rows: &[Comparison],
    sweep: &[(u32, Vec<Comparison>)],
    plane: &[PlanePoint],
    cal: &Calibration,
) -> Result<(), String> {
    let apps: Vec<String> = rows.iter().map(|r| r.naive.workload.to_string()).collect();
    let of = |f: &dyn Fn(&Comparison) -> Option<f64>| rows.iter().map(f).collect::<Vec<_>>();
    let series = |name: &str, values: Vec<Option<f64>>| Series { name: name.into(), values };
    let paper_series =
        |name: &str, f: &dyn Fn(&PaperApp) -> Option<f64>| series(name, of(&|r| paper_of(r).and_then(f)));
    let figures = [
        (
            "fig12-speedup.svg",
            svg::grouped_bars(
                "Speedup of WIC over naive polling (paper Fig. 12a)",
                "speedup",
                &apps,
                &[
                    series("emulator", of(&|r| Some(r.speedup()))),
                    paper_series("paper (its text, approximate)", &|p| p.speedup),
                ],
                Some(1.0),
            ),
        ),
        (
            "fig12-consumer-overhead.svg",
            svg::grouped_bars(
                "Consumer SM time lost waiting for data (paper Fig. 12b), emulator",
                "share of consumer time",
                &apps,
                &[
                    series("naive", of(&|r| Some(r.naive.consumer_overhead))),
                    series("WIC", of(&|r| Some(r.fault.consumer_overhead))),
                ],
                None,
            ),
        ),
        (
            "fig14-overlap.svg",
            svg::grouped_bars(
                "Waiting time overlapped with computation (paper Fig. 14)",
                "overlap efficiency",
                &apps,
                &[
                    series("emulator naive", of(&|r| Some(r.naive.overlap_efficiency))),
                    series("emulator WIC", of(&|r| Some(r.fault.overlap_efficiency))),
                    paper_series("paper WIC (its text)", &|p| p.overlap_wic),
                ],
                Some(paper::WIC_OVERLAP),
            ),
        ),
        (
            "fig15-overhead.svg",
            svg::grouped_bars(
                "Host-side cost of WIC: wicd busy share of the runtime (paper Fig. 15)",
                "share of runtime",
                &apps,
                &[
                    series("emulator: wicd busy", of(&|r| Some(r.fault.daemon_share))),
                    paper_series("paper host-side overhead", &|p| p.host_overhead),
                ],
                Some(paper::HOST_OVERHEAD),
            ),
        ),
        ("fig16-sweep.svg", sweep_figure(sweep)),
        ("plane-wic-over-push.svg", plane_figure(plane, cal)),
    ];
    for (name, text) in figures {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn sweep_figure(sweep: &[(u32, Vec<Comparison>)]) -> String {
    let labels: Vec<String> = sweep.iter().map(|(t, _)| thread_label(*t)).collect();
    let names: Vec<&str> =
        sweep.first().map(|(_, rows)| rows.iter().map(|r| r.naive.workload).collect()).unwrap_or_default();
    let series: Vec<Series> = names
        .iter()
        .enumerate()
        .map(|(i, name)| Series {
            name: (*name).into(),
            values: sweep.iter().map(|(_, rows)| Some(rows[i].speedup())).collect(),
        })
        .collect();
    svg::lines(
        "Speedup of WIC over naive polling by consumer threads (paper Fig. 16), emulator",
        "consumer threads per kernel",
        "speedup",
        &labels,
        &series,
        Some(1.0),
    )
}

fn interrupter_table(results: &Results) -> String {
    let mut t = String::from(
        "| pages | pool | segment tree ns | bitmap first fit ns | bitmap / segment tree |\n|---|---|---|---|---|\n",
    );
    for r in &results.interrupter {
        t.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1}x |\n",
            thread_label(r.pages),
            if r.fragmented { "fragmented" } else { "empty" },
            r.segment_tree_ns,
            r.bitmap_ns,
            r.speedup
        ));
    }
    t
}

fn monitor_table(results: &Results) -> String {
    let mut t = String::from(
        "| registered pages | ns / entry (active set) | M entries/s | ns / entry (uniform over all pages) | with delivery ns / entry | decode alone ns / entry | monitor / decode | over the smallest size, paired in time |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in &results.monitor {
        t.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}x | {:.2}x |\n",
            thread_label(r.registered_pages),
            r.monitor_ns,
            r.monitor_entries_per_s / 1e6,
            r.uniform_ns,
            r.round_ns,
            r.decode_ns,
            r.monitor_over_decode,
            r.paired_over_smallest
        ));
    }
    t
}

fn batch_table(results: &Results) -> String {
    let Some(b) = &results.batch else { return String::new() };
    format!(
        "| entries | batches | kernel commands | path p50 / p99 | quietest block: path p50 / p99 (ring read p50) | same-length control p50 / p99: quietest block, whole run | of which (p50): ring to engine, command translation | ring read alone p50 / p99 | path / ring read (p99) |\n|---|---|---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {:.2} / {:.2} us | {:.2} / {:.2} us ({:.2} us) | {:.2} / {:.2} us, {:.2} / {:.2} us | {:.2} us, {:.2} us | {:.2} / {:.2} us | {:.1}x |\n",
        b.entries,
        b.batches,
        b.kernel_commands,
        b.path_p50_us,
        b.path_p99_us,
        b.quiet_path_p50_us,
        b.quiet_path_p99_us,
        b.quiet_ring_read_p50_us,
        b.quiet_control_p50_us,
        b.quiet_control_p99_us,
        b.control_p50_us,
        b.control_p99_us,
        b.take_faults_p50_us,
        b.translate_p50_us,
        b.ring_read_p50_us,
        b.ring_read_p99_us,
        b.path_over_ring_read
    )
}

/// The template's fields and their text.
#[derive(Default)]
struct Fields(BTreeMap<&'static str, String>);

impl Fields {
    fn set(&mut self, name: &'static str, text: String) {
        self.0.insert(name, text.trim_end().to_string());
    }

    /// The template with every `{{name}}` replaced; a field the template names but nobody set,
    /// or one set but never named, is an error, so template and program cannot drift apart.
    fn fill(&self, template: &str) -> Result<String, String> {
        let mut out = String::with_capacity(template.len() * 2);
        let mut used = std::collections::BTreeSet::new();
        let mut rest = template;
        while let Some(open) = rest.find("{{") {
            out.push_str(&rest[..open]);
            let after = &rest[open + 2..];
            let close = after
                .find("}}")
                .ok_or_else(|| format!("unclosed {{{{ in the template near `{}`", &after[..after.len().min(30)]))?;
            let name = &after[..close];
            let text = self.0.get(name).ok_or_else(|| format!("the template names an unknown field {{{{{name}}}}}"))?;
            out.push_str(text);
            used.insert(name.to_string());
            rest = &after[close + 2..];
        }
        out.push_str(rest);
        match self.0.keys().find(|k| !used.contains(**k)) {
            Some(unused) => Err(format!("the template does not use the field {{{{{unused}}}}}")),
            None => Ok(out),
        }
    }
}
