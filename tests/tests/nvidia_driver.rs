//! The nvidia-uvm hook against NVIDIA's real driver source: Debian's `nvidia-open-kernel-source`
//! (550.163.01, from trixie's contrib, downloaded by `tests/nvidia/debian-source.sh` with apt on a
//! private list derived from the system's own sources) is patched by
//! `shim/nvidia-uvm/apply-hook.sh`, and `shim/nvidia-uvm/check-driver.sh --full` builds the hook's
//! objects with `W=1` (any warning in our code fails), the real `nvidia.ko` (Debian ships the
//! RM core, `nv-kernel.o_binary`) and the patched `nvidia-uvm.ko` against the installed kernel
//! headers, then `wic_shim.ko` against their `Module.symvers`, and checks that every `uvm_wic_*`
//! symbol the shim imports is exported with the same CRC. Nothing is loaded: there is no GPU.
//!
//! `WIC_NVIDIA_SOURCE` names another source (a tree or Debian's tarball). Without one, the
//! package is downloaded into `target/nvidia-source` when running as root (as CI does); where it
//! cannot be had (not root, no network, no apt) the test says why and skips, unless
//! `WIC_REQUIRE_NVIDIA_SOURCE` is set (as `.ci/run` sets it): then that is a failure.
//!
//! Then DKMS, as a user of Debian's `nvidia-open-kernel-dkms` would run it: its tree in
//! `/usr/src/nvidia-current-open-<version>`, the wic package in `/usr/src/wic-<version>` as
//! deploy/dkms/README.md installs it, `dkms add` and `dkms build` for the installed kernel
//! headers, and the two modules checked. As root with `dkms` installed (CI installs it from
//! Debian main); what the test put on the system is removed afterwards.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use wic_tests::{kernel_with_headers, scratch, target_dir, workspace};

/// Debian's tarball of the kernel-open tree, inside the unpacked package.
const TARBALL: &str = "nvidia-open-kernel-source/usr/src/nvidia-open-kernel.tar.xz";
/// Debian's packages of NVIDIA's open kernel modules: the source tarball and the DKMS tree.
const PACKAGES: [&str; 2] = ["nvidia-open-kernel-source", "nvidia-open-kernel-dkms"];

/// Held by each test that downloads or builds: one download, and one driver build at a time
/// (each takes both cores of a small machine for minutes).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Where the packages are downloaded and unpacked.
fn download_dir() -> PathBuf {
    target_dir().parent().expect("target/<profile>").join("nvidia-source")
}

fn run(command: &mut Command) -> Output {
    command.output().unwrap_or_else(|e| panic!("run {command:?}: {e}"))
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The source to check, or why there is none.
fn source() -> Result<PathBuf, String> {
    if let Some(given) = std::env::var_os("WIC_NVIDIA_SOURCE").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(given));
    }
    downloaded().map(|dir| dir.join(TARBALL))
}

/// The directory holding Debian's packages unpacked (downloaded once, as root), or why not.
fn downloaded() -> Result<PathBuf, String> {
    let dir = download_dir();
    if PACKAGES.iter().all(|p| dir.join(p).is_dir()) {
        return Ok(dir);
    }
    if !nix::unistd::geteuid().is_root() {
        return Err(format!(
            "Debian's {} are not in {} and only root downloads them (tests/nvidia/debian-source.sh)",
            PACKAGES.join(" and "),
            dir.display()
        ));
    }
    let fetch =
        run(Command::new("bash").arg(workspace().join("tests/nvidia/debian-source.sh")).arg(&dir).args(PACKAGES));
    if !fetch.status.success() || !PACKAGES.iter().all(|p| dir.join(p).is_dir()) {
        return Err(format!("Debian's {} cannot be had here: {}", PACKAGES.join(" and "), text(&fetch).trim()));
    }
    Ok(dir)
}

#[test]
fn the_hook_builds_into_nvidias_real_driver_and_the_shim_links_against_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let source = match source() {
        Ok(source) => source,
        Err(why) => {
            assert!(std::env::var_os("WIC_REQUIRE_NVIDIA_SOURCE").is_none(), "WIC_REQUIRE_NVIDIA_SOURCE is set: {why}");
            println!("SKIPPED: the compile check against NVIDIA's driver source did not run: {why}");
            return;
        }
    };
    if kernel_with_headers().is_none() {
        println!("SKIPPED: the compile check against NVIDIA's driver source did not run: no kernel headers under /lib/modules/*/build");
        return;
    }
    let check =
        run(Command::new("bash").arg(workspace().join("shim/nvidia-uvm/check-driver.sh")).arg("--full").arg(&source));
    let out = text(&check);
    println!("{out}");
    assert!(
        check.status.success() && out.contains("PASS "),
        "check-driver.sh --full {} failed:\n{out}",
        source.display()
    );
    // nvidia-uvm.ko is built (with nvidia.ko, or alone when NVIDIA's own nvidia.ko does not build
    // against this kernel) and the shim's imports are checked against its exports.
    assert!(
        out.contains("nvidia-uvm.ko built") && out.contains("wic_shim.ko built") && out.contains("exports and CRCs"),
        "the full build did not run:\n{out}"
    );
}

/// A fake kernel-open tree: its Kbuild names `version`, and its nvidia-uvm holds `uvm_gpu_h`.
fn fake_tree(dir: &Path, version: &str, uvm_gpu_h: &str) {
    std::fs::create_dir_all(dir.join("kernel-open/nvidia-uvm")).expect("fake tree");
    std::fs::write(dir.join("kernel-open/Kbuild"), format!("ccflags-y += -DNV_VERSION_STRING=\\\"{version}\\\"\n"))
        .expect("Kbuild");
    std::fs::write(dir.join("kernel-open/nvidia-uvm/uvm_gpu.h"), uvm_gpu_h).expect("uvm_gpu.h");
}

fn apply_hook(tree: &Path) -> Output {
    run(Command::new("bash").arg(workspace().join("shim/nvidia-uvm/apply-hook.sh")).arg(tree))
}

#[test]
fn apply_hook_refuses_a_release_it_does_not_support_naming_it() {
    let dir = scratch("apply-hook-refusals");
    for (version, uvm_gpu_h, why) in [
        ("535.261.03", "", "NVIDIA 535.261.03 is not supported"),
        ("560.35.03", "", "NVIDIA 560.35.03 is not supported"),
        ("570.86.15", "uvm_fault_buffer_info_t fault_buffer_info;\n", "fault_buffer_info"),
    ] {
        let tree = dir.join(version);
        fake_tree(&tree, version, uvm_gpu_h);
        let refused = apply_hook(&tree);
        let out = text(&refused);
        assert_eq!(refused.status.code(), Some(2), "apply-hook.sh on {version}: {out}");
        assert!(
            out.contains(why) && out.contains("550, 570 (570.133.07 or later), 575, 580, 590 and 595"),
            "apply-hook.sh on {version}: {out}"
        );
        assert!(!tree.join("kernel-open/nvidia-uvm/uvm_wic.c").exists(), "{version} was patched anyway");
    }
}

#[test]
fn apply_hook_refuses_a_supported_release_the_patch_does_not_fit_and_changes_nothing() {
    let dir = scratch("apply-hook-misfit");
    let tree = dir.join("tree");
    fake_tree(&tree, "580.142", "uvm_fault_buffer_t fault_buffer;\n");
    let before = std::fs::read(tree.join("kernel-open/nvidia-uvm/uvm_gpu.h")).expect("uvm_gpu.h");
    let refused = apply_hook(&tree);
    let out = text(&refused);
    assert_eq!(refused.status.code(), Some(3), "a supported release the patch does not fit: {out}");
    assert!(out.contains("does not apply to NVIDIA 580.142"), "{out}");
    assert_eq!(
        std::fs::read(tree.join("kernel-open/nvidia-uvm/uvm_gpu.h")).expect("uvm_gpu.h"),
        before,
        "the tree was changed"
    );
    assert!(!tree.join("kernel-open/nvidia-uvm/uvm_wic.c").exists());
}

/// Marks an NVIDIA tree the DKMS test copied into /usr/src, so that a run killed before it
/// cleaned up is cleaned up by the next.
const COPIED_MARK: &str = ".wic-test-copy";

/// Removes what an earlier run of the DKMS test left: marked NVIDIA trees, and wic packages of
/// a test version.
fn remove_leftovers() {
    for entry in std::fs::read_dir("/usr/src").into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.join(COPIED_MARK).exists() {
            let _ = std::fs::remove_dir_all(&path);
        } else if let Some(version) = name.strip_prefix("wic-").filter(|v| v.starts_with("0.0.0-test")) {
            let _ = Command::new("dkms").args(["remove", "-m", "wic", "-v", version, "--all"]).output();
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// What the DKMS test put on the system, removed when dropped.
struct Installed {
    wic: (String, PathBuf),
    nvidia: Option<PathBuf>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let (version, dir) = &self.wic;
        let _ = Command::new("dkms").args(["remove", "-m", "wic", "-v", version, "--all"]).output();
        let _ = std::fs::remove_dir_all(dir);
        if let Some(nvidia) = &self.nvidia {
            let _ = std::fs::remove_dir_all(nvidia);
        }
    }
}

/// The first compiler error of a build log, when it is in NVIDIA's own nvidia.ko sources and
/// none is in nvidia-uvm or wic's: NVIDIA's release does not build against this kernel (an
/// interface changed under it), which says nothing of the hook.
fn nvidia_own_error(log: &str) -> Option<String> {
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("error:")).collect();
    if errors.iter().any(|l| l.contains("nvidia-uvm/") || l.contains("uvm_wic") || l.contains("/shim/")) {
        return None;
    }
    errors.iter().find(|l| l.contains("/nvidia/") && l.contains(".c:")).map(|l| {
        let l = l.trim();
        l.find("/nvidia/").map_or(l, |at| &l[at + 1..]).to_string()
    })
}

#[test]
fn dkms_builds_the_wic_package_against_debians_nvidia_dkms_tree() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let skip = |why: String| println!("SKIPPED: dkms build of the wic package did not run: {why}");
    if !nix::unistd::geteuid().is_root() {
        return skip("not root".into());
    }
    if !Command::new("dkms").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return skip("dkms is not installed (CI installs it from Debian main)".into());
    }
    let Some(kver) = kernel_with_headers() else {
        return skip("no kernel headers under /lib/modules/*/build".into());
    };
    // What would choose another source than the one installed here.
    if Path::new("/etc/wic/nvidia-src").exists() {
        return skip("/etc/wic/nvidia-src names this machine's NVIDIA source".into());
    }
    remove_leftovers();
    let packages = match downloaded() {
        Ok(dir) => dir,
        Err(why) => return skip(why),
    };
    let usr_src = packages.join("nvidia-open-kernel-dkms/usr/src");
    let tree = std::fs::read_dir(&usr_src)
        .expect("the DKMS package's /usr/src")
        .filter_map(|d| d.ok())
        .map(|d| d.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("nvidia-current-open-")))
        .expect("nvidia-current-open-<version> in the DKMS package");
    let nvidia_version =
        tree.file_name().unwrap().to_string_lossy().trim_start_matches("nvidia-current-open-").to_string();
    let installed_tree = Path::new("/usr/src").join(tree.file_name().unwrap());
    // The wic package under a version of its own, so that a real installation is not touched.
    let wic_version = format!("0.0.0-test{}", std::process::id());
    let wic_dir = Path::new("/usr/src").join(format!("wic-{wic_version}"));
    let installed = Installed {
        wic: (wic_version.clone(), wic_dir.clone()),
        nvidia: (!installed_tree.exists()).then(|| installed_tree.clone()),
    };
    if installed.nvidia.is_some() {
        assert!(
            run(Command::new("cp").arg("-a").arg(&tree).arg(&installed_tree)).status.success(),
            "copy {} to /usr/src",
            tree.display()
        );
        std::fs::write(installed_tree.join(COPIED_MARK), "").expect("mark the copy");
    }
    // As deploy/dkms/README.md installs it.
    let repo = workspace();
    let source = run(Command::new(repo.join("deploy/dkms/install-source.sh")).arg(&wic_dir).arg(&wic_version));
    assert!(source.status.success(), "install-source.sh: {}", text(&source));
    assert!(!wic_dir.join("shim/wic_shim.ko").exists() && !wic_dir.join("shim/test").exists(), "build output copied");

    let add = run(Command::new("dkms").args(["add", "-m", "wic", "-v", &wic_version]));
    assert!(add.status.success(), "dkms add: {}", text(&add));
    // Only the DKMS tree: WIC_NVIDIA_SRC and /etc/wic/nvidia-src would override the search.
    let build = run(Command::new("dkms")
        .args(["build", "-m", "wic", "-v", &wic_version, "-k", &kver])
        .env_remove("WIC_NVIDIA_SRC"));
    // In the build directory while it builds and after a failure; moved under the kernel's
    // directory after a success.
    let log = [
        format!("/var/lib/dkms/wic/{wic_version}/{kver}/{}/log/make.log", std::env::consts::ARCH),
        format!("/var/lib/dkms/wic/{wic_version}/build/make.log"),
    ]
    .iter()
    .find_map(|path| std::fs::read_to_string(path).ok())
    .unwrap_or_default();
    if let (false, Some(theirs)) = (build.status.success(), nvidia_own_error(&log)) {
        return skip(format!(
            "NVIDIA {nvidia_version}'s own nvidia.ko does not build against kernel {kver} ({theirs}); the hook itself is checked by the other test"
        ));
    }
    assert!(
        build.status.success(),
        "dkms build: {}\nmake.log:\n{}",
        text(&build),
        log.lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
    assert!(
        log.contains(&format!("NVIDIA {nvidia_version}")),
        "the build did not use NVIDIA {nvidia_version} from {}:\n{log}",
        installed_tree.display()
    );

    let modules = PathBuf::from(format!("/var/lib/dkms/wic/{wic_version}/{kver}/{}/module", std::env::consts::ARCH));
    let module = |name: &str| {
        std::fs::read_dir(&modules)
            .unwrap_or_else(|e| panic!("{}: {e}", modules.display()))
            .filter_map(|d| d.ok())
            .map(|d| d.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}.ko"))))
            .unwrap_or_else(|| panic!("dkms built no {name}.ko in {}", modules.display()))
    };
    let modinfo =
        |path: &Path, field: &str| text(&run(Command::new("modinfo").args(["-F", field]).arg(path))).trim().to_string();
    // Installed under its own name, never over NVIDIA's nvidia-uvm.ko (DEST_MODULE_NAME).
    let uvm = module("nvidia-uvm-wic");
    let shim = module("wic_shim");
    assert_eq!(modinfo(&uvm, "version"), nvidia_version, "{}", uvm.display());
    assert!(
        modinfo(&shim, "depends").split(',').any(|d| d == "nvidia-uvm"),
        "wic_shim.ko does not depend on nvidia-uvm: {}",
        modinfo(&shim, "depends")
    );
    println!(
        "dkms built {} and {} for {kver} from NVIDIA {nvidia_version} ({})",
        uvm.display(),
        shim.display(),
        installed_tree.display()
    );
    drop(installed);
}
