//! The module selection of a server with wic installed, against the real kmod (depmod, modprobe,
//! modinfo) on a module tree laid out as NVIDIA's and wic's DKMS packages lay it out, with small
//! stand-in modules built here: NVIDIA's `nvidia.ko` and `nvidia-uvm.ko` in `kernel/`, wic's hooked
//! nvidia-uvm installed under its own name (`updates/dkms/nvidia-uvm-wic.ko`, as
//! `deploy/dkms/dkms.conf`'s `DEST_MODULE_NAME` installs it) and `wic_shim.ko`.
//!
//! Without `deploy/modprobe/00-wic.conf`, `modprobe nvidia-uvm` loads NVIDIA's file. With it,
//! modprobe runs `deploy/modprobe/wic-modprobe`, which loads wic's module when it was built for
//! the installed nvidia release and NVIDIA's otherwise (through a distribution's own rule when
//! there is one, as Debian's), and refuses wic_shim then; the rule comes first whatever the
//! other files are named. NVIDIA's file is never changed. Needs kernel headers (CI installs
//! them for the kernel VM): without them the test says so and skips, unless
//! `WIC_REQUIRE_NVIDIA_SOURCE` is set, as CI sets it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wic_tests::{kernel_with_headers, scratch, wic_modprobe_dry_run, workspace, write_stand_in_modules};

const NVIDIA: &str = "550.163.01";
const OLD_NVIDIA: &str = "550.144.03";
/// Debian's rule for nvidia-uvm (nvidia-kernel-support), which redirects it to its own file name.
const DEBIAN_RULE: &str = "install nvidia-uvm modprobe nvidia ; modprobe -i nvidia-current-open-uvm $CMDLINE_OPTS\n";
/// A soft dependency some distributions declare, which makes modprobe run nvidia-uvm's install
/// rule again while wic's module loads nvidia.
const SOFTDEP: &str = "softdep nvidia post: nvidia-uvm\n";

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// Builds the stand-in modules into `dir` for `kver`: nvidia, an nvidia-uvm of `uvm_version`
/// and, when `hooked`, wic_shim (`write_stand_in_modules`).
fn build(dir: &Path, kver: &str, uvm_version: &str, hooked: bool) {
    write_stand_in_modules(dir, NVIDIA, uvm_version, hooked);
    let out = run(Command::new("make")
        .arg("-C")
        .arg(format!("/lib/modules/{kver}/build"))
        .arg(format!("M={}", dir.display()))
        .arg("modules"));
    assert!(out.status.success(), "building the stand-in modules: {}", text(&out));
}

struct Tree {
    root: PathBuf,
    kver: String,
    modules: PathBuf,
}

impl Tree {
    fn modprobe(&self, args: &[&str]) -> Output {
        run(Command::new("modprobe")
            .arg("-d")
            .arg(&self.root)
            .arg("-C")
            .arg(self.root.join("etc/modprobe.d"))
            .args(["-S", &self.kver])
            .args(args))
    }

    /// What `modprobe -n -v module` would do.
    fn dry_run(&self, module: &str) -> String {
        let out = self.modprobe(&["-n", "-v", module]);
        assert!(out.status.success(), "modprobe -n -v {module}: {}", text(&out));
        text(&out)
    }

    /// What wic-modprobe would run for `module` in this tree (`wic_modprobe_dry_run`).
    fn wic_modprobe(&self, module: &str) -> (bool, String) {
        wic_modprobe_dry_run(Some(&self.root), &self.kver, module)
    }

    fn depmod(&self) {
        let out = run(Command::new("depmod").arg("-b").arg(&self.root).arg(&self.kver));
        assert!(out.status.success(), "depmod: {}", text(&out));
    }
}

#[test]
fn the_rule_loads_wics_nvidia_uvm_only_when_built_for_the_installed_driver() {
    let Some(kver) = kernel_with_headers() else {
        assert!(
            std::env::var_os("WIC_REQUIRE_NVIDIA_SOURCE").is_none(),
            "WIC_REQUIRE_NVIDIA_SOURCE is set but no kernel headers are under /lib/modules/*/build"
        );
        println!("SKIPPED: no kernel headers under /lib/modules/*/build");
        return;
    };
    let dir = scratch("modprobe-rule");
    let (hooked, stock, stale) = (dir.join("hooked"), dir.join("stock"), dir.join("stale"));
    build(&hooked, &kver, NVIDIA, true);
    build(&stock, &kver, NVIDIA, false);
    build(&stale, &kver, OLD_NVIDIA, true);

    let root = dir.join("root");
    let modules = root.join("lib/modules").join(&kver);
    for sub in ["kernel/nvidia", "updates/dkms"] {
        std::fs::create_dir_all(modules.join(sub)).unwrap();
    }
    std::fs::create_dir_all(root.join("etc/modprobe.d")).unwrap();
    for file in ["modules.builtin", "modules.order", "modules.builtin.modinfo"] {
        std::fs::write(modules.join(file), "").unwrap();
    }
    let nvidia_uvm = modules.join("kernel/nvidia/nvidia-uvm.ko");
    std::fs::copy(stock.join("nvidia.ko"), modules.join("kernel/nvidia/nvidia.ko")).unwrap();
    std::fs::copy(stock.join("nvidia-uvm.ko"), &nvidia_uvm).unwrap();
    let wic_uvm = modules.join("updates/dkms/nvidia-uvm-wic.ko");
    std::fs::copy(hooked.join("nvidia-uvm.ko"), &wic_uvm).unwrap();
    std::fs::copy(hooked.join("wic_shim.ko"), modules.join("updates/dkms/wic_shim.ko")).unwrap();
    let tree = Tree { root, kver, modules };
    tree.depmod();

    // Without the rule: NVIDIA's module, whatever sits in updates/.
    let plain = tree.dry_run("nvidia-uvm");
    assert!(plain.contains("kernel/nvidia/nvidia-uvm.ko"), "without wic's rule, modprobe nvidia-uvm: {plain}");

    // With it (its script at the repository's path), before a distribution's rule of a later name.
    let script = workspace().join("deploy/modprobe/wic-modprobe");
    let conf = std::fs::read_to_string(workspace().join("deploy/modprobe/00-wic.conf"))
        .unwrap()
        .replace("/usr/lib/wic/wic-modprobe", &script.display().to_string());
    std::fs::write(tree.root.join("etc/modprobe.d/00-wic.conf"), conf).unwrap();
    std::fs::write(tree.root.join("etc/modprobe.d/nvidia.conf"), DEBIAN_RULE).unwrap();
    for module in ["nvidia-uvm", "nvidia_uvm", "wic_shim"] {
        let planned = tree.dry_run(module);
        assert!(
            planned.contains(&format!("install {}", script.display())),
            "with wic's rule, modprobe {module}: {planned}"
        );
    }
    let (ok, chosen) = tree.wic_modprobe("nvidia_uvm");
    assert!(
        ok && chosen.contains("--ignore-install nvidia-uvm-wic opt=1"),
        "a build of the installed release: {chosen}"
    );
    let target = text(&tree.modprobe(&["-n", "-v", "--ignore-install", "nvidia-uvm-wic"]));
    assert!(target.contains("updates/dkms/nvidia-uvm-wic.ko"), "nvidia-uvm-wic resolves to: {target}");
    let (ok, shim) = tree.wic_modprobe("wic_shim");
    assert!(ok && shim.contains("--ignore-install wic_shim opt=1"), "wic_shim with a matching build: {shim}");

    // A build of another release (the driver was upgraded, wic not rebuilt yet): NVIDIA's own,
    // through the distribution's rule, and wic_shim refused, saying why.
    std::fs::copy(stale.join("nvidia-uvm.ko"), &wic_uvm).unwrap();
    tree.depmod();
    let (ok, chosen) = tree.wic_modprobe("nvidia_uvm");
    assert!(
        ok && chosen.contains("modprobe nvidia ; modprobe -i nvidia-current-open-uvm  'opt=1'"),
        "a stale build, Debian's rule: {chosen}"
    );
    assert!(chosen.contains(&format!("built for NVIDIA {OLD_NVIDIA}, the nvidia module is {NVIDIA}")), "{chosen}");
    let (ok, shim) = tree.wic_modprobe("wic_shim");
    assert!(!ok && shim.contains("not loading wic_shim"), "wic_shim with a stale build: {shim}");
    std::fs::remove_file(tree.root.join("etc/modprobe.d/nvidia.conf")).unwrap();
    let (ok, chosen) = tree.wic_modprobe("nvidia-uvm");
    assert!(ok && chosen.contains("--ignore-install nvidia-uvm opt=1"), "a stale build, no other rule: {chosen}");

    // The running kernel found under PATH=/sbin too (uname is not in /sbin).
    let release = text(&run(Command::new("uname").arg("-r")));
    let out = run(Command::new("/bin/sh")
        .arg(&script)
        .arg("nvidia_uvm")
        .env_clear()
        .env("PATH", "/sbin")
        .env("WIC_MODULES_ROOT", &tree.root)
        .env("WIC_MODPROBE_DRY_RUN", "1"));
    assert!(text(&out).contains(&format!("-S {}", release.trim())), "under PATH=/sbin: {}", text(&out));

    // No wic build for this kernel: NVIDIA's own.
    std::fs::remove_file(&wic_uvm).unwrap();
    tree.depmod();
    let (ok, chosen) = tree.wic_modprobe("nvidia_uvm");
    assert!(
        ok && chosen.contains("--ignore-install nvidia-uvm opt=1") && chosen.contains("no nvidia-uvm-wic.ko"),
        "{chosen}"
    );

    // A soft dependency brings nvidia-uvm's rule back while wic's module loads nvidia: the
    // inner call, which finds the outer one's mark, must do nothing (or it would recurse).
    std::fs::copy(hooked.join("nvidia-uvm.ko"), &wic_uvm).unwrap();
    tree.depmod();
    std::fs::write(tree.root.join("etc/modprobe.d/nvidia-softdep.conf"), SOFTDEP).unwrap();
    let plan = text(&tree.modprobe(&["-n", "-v", "--ignore-install", "nvidia-uvm-wic"]));
    assert!(plan.contains(&format!("install {} nvidia_uvm", script.display())), "no re-entry to guard against: {plan}");
    let inner = run(Command::new("/bin/sh")
        .arg(&script)
        .arg("nvidia_uvm")
        .env("WIC_MODPROBE_ACTIVE", "1")
        .env("WIC_MODULES_ROOT", &tree.root)
        .env("WIC_KERNEL", &tree.kver)
        .env("WIC_MODPROBE_DRY_RUN", "1"));
    assert!(inner.status.success() && text(&inner).is_empty(), "the re-entered rule did something: {}", text(&inner));

    // Rolled back: the rule removed, NVIDIA's file again.
    std::fs::remove_file(tree.root.join("etc/modprobe.d/00-wic.conf")).unwrap();
    assert!(tree.dry_run("nvidia-uvm").contains("kernel/nvidia/nvidia-uvm.ko"));
    assert!(tree.modules.join("kernel/nvidia/nvidia.ko").is_file() && nvidia_uvm.is_file());
}
