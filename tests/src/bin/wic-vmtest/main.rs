//! The test driver that runs inside the kernel VM (tests/vm): real `wic_shim.ko` with
//! `wic_fakegpu.ko` standing in for nvidia-uvm, driven by the daemon's own shim backend
//! (crate wic-kernel-io) and engine.
//!
//! Usage: `wic-vmtest SCENARIO...` with scenarios `deliver`, `daemon-death`, `hostile`, `busy`,
//! `storms`, `overflow`, `race`, `closing`, `max-hold`, `preemption`, `suspend`, `service` and `in-place` (need `wicd` on the PATH), `concurrent`, `bench` or `all` (all but `bench`). Prints `PASS name` or `FAIL name: why` per scenario
//! and exits non-zero if any failed. `bench` prints its results as a file block for the
//! harness (`WIC-VM-FILE-BEGIN kernel-bench.json`).

mod bench;
mod busy;
mod closing;
mod concurrent;
mod death;
mod deliver;
mod hostile;
mod inplace;
mod maxhold;
mod overflow;
mod preemption;
mod race;
mod rig;
mod service;
mod storms;
mod suspend;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(death::HOLDER_ARG) {
        return death::holder(&args[1..]);
    }
    let mut scenarios: Vec<&str> = args.iter().map(String::as_str).collect();
    if scenarios.is_empty() || scenarios == ["all"] {
        scenarios = vec![
            "deliver",
            "daemon-death",
            "hostile",
            "busy",
            "storms",
            "overflow",
            "race",
            "closing",
            "max-hold",
            "preemption",
            "suspend",
            "service",
            "in-place",
            "concurrent",
        ];
        // The list the kernel VM test checks, each for its PASS line.
        println!("SCENARIOS {}", scenarios.join(" "));
    }
    let mut failed = 0;
    for name in scenarios {
        let result = match name {
            "deliver" => deliver::run(),
            "daemon-death" => death::run(),
            "hostile" => hostile::run(),
            "busy" => busy::run(),
            "storms" => storms::run(),
            "overflow" => overflow::run(),
            "race" => race::run(),
            "closing" => closing::run(),
            "max-hold" => maxhold::run(),
            "preemption" => preemption::run(),
            "suspend" => suspend::run(),
            "service" => service::run(),
            "in-place" => inplace::run(),
            "concurrent" => concurrent::run(),
            "bench" => bench::run(),
            other => Err(format!("unknown scenario {other:?} (deliver, daemon-death, hostile, busy, storms, overflow, race, closing, max-hold, preemption, suspend, service, in-place, concurrent, bench, all)")),
        };
        match result {
            Ok(()) => println!("PASS {name}"),
            Err(why) => {
                failed += 1;
                println!("FAIL {name}: {why}");
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
