//! wic's kernel modules in a real kernel: Debian's kernel booted under qemu (tests/vm/run.sh)
//! with wic_fakegpu.ko and wic_shim.ko loaded, and the scenarios of `wic-vmtest` run against
//! them (a held fault delivered byte for byte, a PAT fault, a daemon killed with faults held,
//! hostile ioctls, fault storms past the ring and the held table, a fault buffer full of held faults dropping another application's fault, a fault dropped in the OVERFLOW latch's race brought back by the deferred replay, a fault the daemon never completes completed by the module after `max_hold_ms`, a held fault keeping a context switch waiting until the module's default bound ends it, and the real wicd serving a libwic application on the shim backend). A warning, oops or panic logged by the kernel fails the test as surely as a
//! failed scenario.

use std::path::Path;

use wic_tests::{binary, built, scratch, vm};

#[test]
fn the_modules_hold_and_complete_faults_in_a_real_kernel() {
    if let Some(why) = vm::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let out = scratch("vm-scenarios");
    let driver = Path::new(env!("CARGO_BIN_EXE_wic-vmtest"));
    built();
    let wicd = binary("wicd");
    let run = vm::run(&out, &[driver, &wicd], &[], &["sh", "-c", "lsmod && wic-vmtest all"], 600);
    assert!(run.ok, "the VM run failed:\n{}", run.report());
    for module in ["wic_shim", "wic_fakegpu"] {
        assert!(
            run.console.lines().any(|line| line.split_whitespace().next() == Some(module)),
            "{module} is not in lsmod:\n{}",
            run.report()
        );
    }
    let scenarios: Vec<&str> = run
        .console
        .lines()
        .find_map(|line| line.trim().strip_prefix("SCENARIOS "))
        .map(|list| list.split_whitespace().collect())
        .unwrap_or_default();
    assert!(!scenarios.is_empty(), "wic-vmtest all named no scenarios:\n{}", run.report());
    for scenario in scenarios {
        assert!(
            run.console.contains(&format!("PASS {scenario}")),
            "scenario {scenario} did not pass:\n{}",
            run.report()
        );
    }
}
