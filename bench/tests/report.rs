//! `wic-report --quick` fills the whole template and writes every figure; a template naming a
//! field the program does not know is refused, so template and program cannot drift apart.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wic-report-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn report(template: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wic-report"))
        .arg("--quick")
        .arg("--template")
        .arg(template)
        .arg("--out")
        .arg(out)
        .arg("--recorded")
        .arg(workspace().join("bench/results"))
        .arg("--corun")
        .arg(workspace().join("device/bench/results/corun-h200-2026-11-28.jsonl"))
        .arg("--device-results")
        .arg(workspace().join("device/bench/results"))
        .output()
        .expect("run wic-report")
}

#[test]
fn the_quick_report_fills_every_field_and_writes_every_figure() {
    let out = scratch("full");
    let run = report(&workspace().join("docs/evaluation.template.md"), &out);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let text = std::fs::read_to_string(out.join("evaluation.md")).expect("evaluation.md");
    assert!(!text.contains("{{") && !text.contains("}}"), "a field was left unfilled");
    for app in ["C_CG", "G_STN"] {
        assert!(text.lines().any(|l| l.starts_with(&format!("| {app} |"))), "no row for {app}");
    }
    // A row a message size, each way's busy time and delivery in microseconds.
    for size in ["64 B", "1 KiB", "4 KiB", "16 KiB", "64 KiB"] {
        let row =
            text.lines().find(|l| l.starts_with(&format!("| {size} |"))).unwrap_or_else(|| panic!("no {size} row"));
        assert_eq!(row.matches(" us |").count(), 6, "{row}");
    }
    // The plane's cells: in place / copying, over push (over naive polling).
    let plane = text.lines().find(|l| l.starts_with("| measured (")).expect("the plane's first row");
    assert!(plane.contains("x / ") && plane.contains("x (") && plane.contains("x)"), "{plane}");
    for needed in [
        "Geometric-mean speedup",
        "interrupter at 16K pages",
        "monitor:",
        "batch of 256 entries",
        "| memory progress beside a stalled warp",
        "| message per warp (batch of 16 warps) | wicd busy per batch: copy (CPU) | copy (CE) | in place |",
        "- copy (CE) against copy (CPU): ",
        "- in place against copy (CPU): ",
        "| WIC in place beats push at | WIC copying beat push at |",
        "- The programs of `device/apps` for which WIC beats push at the calibration's point: in place ",
        "| mode, gap | fma_chain |",
        "| fault (WIC; GPU: stalled on stock faults), 0 us |",
        "not run in this regeneration",
        "bench/results/",
    ] {
        assert!(text.contains(needed), "the report lacks `{needed}`");
    }
    let linked: Vec<&str> = text
        .match_indices("](figures/")
        .map(|(i, _)| &text[i + 2..i + 2 + text[i + 2..].find(')').expect("a closed link")])
        .collect();
    assert_eq!(linked.len(), 6, "{linked:?}");
    for figure in linked {
        let svg = std::fs::read_to_string(out.join(figure)).unwrap_or_else(|e| panic!("{figure}: {e}"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{figure} is not an SVG document");
        assert!(svg.contains("<rect class=\"bar\"") || svg.contains("<polyline"), "{figure} draws nothing");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_template_with_an_unknown_field_is_refused() {
    let out = scratch("unknown");
    let template = out.join("template.md");
    std::fs::write(&template, "{{no_such_field}}\n").expect("template");
    let run = report(&template, &out);
    assert!(!run.status.success());
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("unknown field {{no_such_field}}"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&out);
}
