//! The nvidia-uvm hook against NVIDIA's real driver source: Debian's `nvidia-open-kernel-source`
//! (550.163.01, from trixie's contrib, downloaded by `tests/nvidia/debian-source.sh` with apt on a
//! private list derived from the system's own sources) is patched by
//! `shim/nvidia-uvm/apply-hook.sh`, and `shim/nvidia-uvm/check-driver.sh` builds the hook's
//! objects with `W=1` (any warning in our code fails) against the installed kernel headers.
//! Where the DKMS test below cannot run, `--full` also builds the real `nvidia.ko` (Debian ships
//! the RM core, `nv-kernel.o_binary`) and the patched `nvidia-uvm.ko`, then `wic_shim.ko` against
//! their `Module.symvers`, and checks that every `uvm_wic_*` symbol the shim imports is exported
//! with the same CRC. Nothing is loaded: there is no GPU.
//!
//! `WIC_NVIDIA_SOURCE` names another source (a tree or Debian's tarball), always built whole.
//! Without one, the package is downloaded into `target/nvidia-source` when running as root (as CI
//! does); where it cannot be had (not root, no network, no apt) the test says why and skips,
//! unless `WIC_REQUIRE_NVIDIA_SOURCE` is set (as `.ci/run` sets it): then that is a failure.
//!
//! Then DKMS, as the administrator of a server runs it, into the machine's module tree (as root,
//! with `dkms`, where no NVIDIA driver is installed): Debian's `nvidia-open-kernel-dkms` tree in
//! `/usr/src/nvidia-current-open-<version>` as wic's build finds it, a DKMS package standing for
//! NVIDIA's driver with `nvidia.ko` and `nvidia-uvm.ko` in `updates/dkms` (as the CUDA repository
//! installs them), and the wic package in `/usr/src/wic-<version>` as deploy/dkms/README.md
//! installs it: `dkms build` and `dkms install` for the installed kernel, the CRCs of the installed
//! pair, which nvidia-uvm modprobe picks with and without wic's rule, the rebuild for a second
//! kernel by `dkms autoinstall`, a driver upgrade that makes wic's build stale, and `dkms remove`.
//! NVIDIA's files must stay byte for byte what they were. What the test put on the system is
//! removed afterwards, and at the next run after a killed one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use wic_tests::{kernel_with_headers, scratch, target_dir, wic_modprobe_dry_run, workspace, write_stand_in_modules};

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
        assert!(
            std::env::var_os("WIC_REQUIRE_NVIDIA_SOURCE").is_none(),
            "WIC_REQUIRE_NVIDIA_SOURCE is set but no kernel headers are under /lib/modules/*/build"
        );
        println!("SKIPPED: the compile check against NVIDIA's driver source did not run: no kernel headers under /lib/modules/*/build");
        return;
    }
    // The modules themselves are built by the DKMS test where it runs (Debian's source, as
    // root, with dkms), which checks the CRCs of the installed pair: here they would be built
    // once more. A source named in WIC_NVIDIA_SOURCE is always built whole.
    let full = std::env::var_os("WIC_NVIDIA_SOURCE").is_some_and(|v| !v.is_empty()) || dkms_test_blocked().is_some();
    let mut command = Command::new("bash");
    command.arg(workspace().join("shim/nvidia-uvm/check-driver.sh"));
    if full {
        command.arg("--full");
    }
    let check = run(command.arg(&source));
    let out = text(&check);
    println!("{out}");
    assert!(check.status.success() && out.contains("PASS "), "check-driver.sh {} failed:\n{out}", source.display());
    // With --full, nvidia-uvm.ko is built (with nvidia.ko, or alone when NVIDIA's own nvidia.ko
    // does not build against this kernel) and the shim's imports are checked against its exports.
    assert!(
        !full
            || out.contains("nvidia-uvm.ko built")
                && out.contains("wic_shim.ko built")
                && out.contains("exports and CRCs"),
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

/// Marks what the DKMS test put on the system (NVIDIA's tree copied into /usr/src, the stand-in
/// package's source, the second kernel's module directory), so that a run killed before it
/// cleaned up is cleaned up by the next.
const COPIED_MARK: &str = ".wic-test-copy";
/// The DKMS package standing for NVIDIA's (below).
const NVIDIA_STAND_IN: &str = "wictest-nvidia";
/// A second kernel release for DKMS: the installed kernel's headers under another name, as DKMS
/// sees a kernel that an upgrade installed. Nothing built for it is loaded. Its numbers sort
/// below every real kernel's, so `kernel_with_headers()` never picks it.
const SECOND_KERNEL: &str = "0.0.0-wictest";

fn dkms(args: &[&str]) -> Output {
    run(Command::new("dkms").args(args).env_remove("WIC_NVIDIA_SRC"))
}

/// Why DKMS cannot be used here, if it cannot: it needs root, and dkms installed.
fn dkms_unusable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    let installed = Command::new("dkms").arg("--version").output().is_ok_and(|o| o.status.success());
    (!installed).then(|| "dkms is not installed (CI installs it from Debian main)".into())
}

/// Removes what an earlier run of the DKMS test left: its DKMS packages (wic of a test
/// version, the NVIDIA stand-in), then its marked directories.
fn remove_leftovers() {
    if dkms_unusable().is_some() {
        return;
    }
    let entries = |dir: &str| -> Vec<PathBuf> {
        std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path()).collect()
    };
    for path in entries("/usr/src") {
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if let Some(version) = name.strip_prefix("wic-").filter(|v| v.starts_with("0.0.0-test")) {
            dkms(&["remove", "-m", "wic", "-v", version, "--all"]);
            let _ = std::fs::remove_dir_all(&path);
        } else if let Some(version) = name.strip_prefix(&format!("{NVIDIA_STAND_IN}-")) {
            dkms(&["remove", "-m", NVIDIA_STAND_IN, "-v", version, "--all"]);
        }
    }
    // Registrations whose source is gone already (a failed removal).
    for path in entries("/var/lib/dkms/wic") {
        let version = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if version.starts_with("0.0.0-test") {
            dkms(&["remove", "-m", "wic", "-v", &version, "--all"]);
            let _ = std::fs::remove_dir_all(&path);
        }
    }
    // The stand-in package is the test's alone.
    let stand_in = format!("/var/lib/dkms/{NVIDIA_STAND_IN}");
    for path in entries(&stand_in) {
        let version = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        dkms(&["remove", "-m", NVIDIA_STAND_IN, "-v", &version, "--all"]);
    }
    let _ = std::fs::remove_dir_all(&stand_in);
    for path in entries("/usr/src").into_iter().chain(entries("/lib/modules")) {
        if path.join(COPIED_MARK).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// What the DKMS test put on the system, removed when dropped (after a failed assertion too):
/// its DKMS packages, then its directories, and the module index of the installed kernel
/// rebuilt.
struct Installed {
    kver: String,
    packages: Vec<(String, String)>,
    dirs: Vec<PathBuf>,
}

impl Installed {
    /// A directory the test creates, marked as the test's.
    fn create(&mut self, dir: &Path) {
        assert!(!dir.exists(), "{} exists: not the test's to replace", dir.display());
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        std::fs::write(dir.join(COPIED_MARK), "").expect("mark the test's directory");
        self.dirs.push(dir.to_path_buf());
    }

    /// `dkms add` of the source in /usr/src/NAME-VERSION, removed again when dropped.
    fn add(&mut self, name: &str, version: &str) {
        let add = dkms(&["add", "-m", name, "-v", version]);
        assert!(add.status.success(), "dkms add {name}/{version}: {}", text(&add));
        self.packages.push((name.into(), version.into()));
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        for (name, version) in &self.packages {
            dkms(&["remove", "-m", name, "-v", version, "--all"]);
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
        let _ = Command::new("depmod").arg("-a").arg(&self.kver).output();
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

/// Debian's 550.163.01 calls `pci_resize_resource()` with three arguments; bookworm's current
/// kernel declares a fourth, `exclude_bars` (a stable backport), so NVIDIA's own nvidia.ko no
/// longer builds against it: NVIDIA's 580 tests for the argument in its conftest and passes 0.
/// The copy the DKMS test installs passes 0 where the kernel's header declares it, so that the
/// packaging is tested here. Only nvidia.ko's BAR resizing is touched, which wic's build
/// compiles only to resolve nvidia-uvm's symbols and never installs. Says what it changed.
fn adapt_to_kernel(tree: &Path, kver: &str) -> Option<String> {
    let header = ["source", "build"]
        .iter()
        .find_map(|dir| std::fs::read_to_string(format!("/lib/modules/{kver}/{dir}/include/linux/pci.h")).ok())?;
    let at = header.find("int __must_check pci_resize_resource(")?;
    let declaration = &header[at..at + header[at..].find(';')?];
    if !declaration.contains("exclude_bars") {
        return None;
    }
    let file = tree.join("nvidia/nv-pci.c");
    let code = std::fs::read_to_string(&file).ok()?;
    let call = "pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size)";
    code.contains(call).then(|| {
        std::fs::write(&file, code.replace(call, "pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size, 0)"))
            .expect("nv-pci.c");
        format!("nvidia/nv-pci.c passes exclude_bars = 0 to pci_resize_resource() as {kver} declares it")
    })
}

/// Registers, builds and installs for `kernels` a DKMS package standing for NVIDIA's driver of
/// `version` as NVIDIA's CUDA repository lays it out: `nvidia.ko` and `nvidia-uvm.ko` in
/// `updates/dkms`, the very names wic's package must never overwrite. Its modules are small
/// stand-ins (`write_stand_in_modules`): building NVIDIA's real ones takes minutes and tests
/// nothing of wic's package, whose own build compiles NVIDIA's real source.
fn install_nvidia_stand_in(installed: &mut Installed, version: &str, kernels: &[&str]) {
    let dir = Path::new("/usr/src").join(format!("{NVIDIA_STAND_IN}-{version}"));
    installed.create(&dir);
    write_stand_in_modules(&dir, version, version, false);
    std::fs::write(
        dir.join("dkms.conf"),
        format!(
            "PACKAGE_NAME=\"{NVIDIA_STAND_IN}\"\nPACKAGE_VERSION=\"{version}\"\n\
             MAKE[0]=\"make -C ${{kernel_source_dir}} M=${{dkms_tree}}/${{PACKAGE_NAME}}/${{PACKAGE_VERSION}}/build modules\"\n\
             CLEAN=\"true\"\n\
             BUILT_MODULE_NAME[0]=\"nvidia\"\nDEST_MODULE_LOCATION[0]=\"/updates/dkms\"\n\
             BUILT_MODULE_NAME[1]=\"nvidia-uvm\"\nDEST_MODULE_LOCATION[1]=\"/updates/dkms\"\n\
             AUTOINSTALL=\"yes\"\n"
        ),
    )
    .expect("the stand-in's dkms.conf");
    installed.add(NVIDIA_STAND_IN, version);
    for kernel in kernels {
        let install = dkms(&["install", "-m", NVIDIA_STAND_IN, "-v", version, "-k", kernel]);
        assert!(install.status.success(), "dkms install {NVIDIA_STAND_IN}/{version} -k {kernel}: {}", text(&install));
    }
}

/// The module files of `kernel`'s `updates/dkms` whose names start with `name` and a dot.
fn installed_module(kernel: &str, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(format!("/lib/modules/{kernel}/updates/dkms"))
        .ok()?
        .filter_map(|d| d.ok())
        .map(|d| d.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}.ko"))))
}

/// The contents of NVIDIA's (the stand-in's) two modules for each of `kernels`.
fn nvidias_files(kernels: &[&str]) -> Vec<(PathBuf, Vec<u8>)> {
    kernels
        .iter()
        .flat_map(|kernel| ["nvidia", "nvidia-uvm"].map(|name| (kernel, name)))
        .map(|(kernel, name)| {
            let path = installed_module(kernel, name).unwrap_or_else(|| panic!("no {name}.ko for {kernel}"));
            let bytes = std::fs::read(&path).expect("NVIDIA's module");
            (path, bytes)
        })
        .collect()
}

/// Checks that each file of `files` still holds its bytes.
fn assert_unchanged(files: &[(PathBuf, Vec<u8>)], when: &str) {
    for (path, bytes) in files {
        assert!(std::fs::read(path).is_ok_and(|now| &now == bytes), "{when}: NVIDIA's {} was changed", path.display());
    }
}

fn modinfo(path: &Path, field: &str) -> String {
    text(&run(Command::new("modinfo").args(["-F", field]).arg(path))).trim().to_string()
}

/// What `modprobe -n -v` plans for `args` on `kernel`, with only the configuration in `conf`.
fn planned(conf: &Path, kernel: &str, args: &[&str]) -> String {
    let out = run(Command::new("modprobe").arg("-C").arg(conf).args(["-S", kernel, "-n", "-v"]).args(args));
    assert!(out.status.success(), "modprobe -n -v {args:?}: {}", text(&out));
    text(&out)
}

/// Why the DKMS test cannot run on this machine, if it cannot. It installs into the machine's
/// module tree and runs `dkms autoinstall`: never where NVIDIA's driver is installed for any
/// kernel, nor where other DKMS packages would be built by it. What a killed run left counts too
/// (its cleanup comes first in the DKMS test, under [`machine_lock`]).
fn dkms_test_blocked() -> Option<String> {
    if let Some(why) = dkms_unusable() {
        return Some(why);
    }
    let status = dkms(&["status"]);
    if !status.status.success() {
        return Some(format!("dkms status failed: {}", text(&status)));
    }
    // What would choose another source than the one the test installs.
    if Path::new("/etc/wic/nvidia-src").exists() {
        return Some("/etc/wic/nvidia-src names this machine's NVIDIA source".into());
    }
    let listed = String::from_utf8_lossy(&status.stdout).trim().to_string();
    if !listed.is_empty() {
        return Some(format!("dkms has packages installed, which dkms autoinstall would build: {listed}"));
    }
    if Path::new(&format!("/lib/modules/{SECOND_KERNEL}")).exists() {
        return Some(format!("/lib/modules/{SECOND_KERNEL} exists and is not the test's"));
    }
    let unmarked = |dir: &Path| !dir.join(COPIED_MARK).exists();
    let source = std::fs::read_dir("/usr/src")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("nvidia")) && unmarked(p));
    if let Some(source) = source {
        return Some(format!("{} holds an NVIDIA driver's source", source.display()));
    }
    nvidia_module_under(Path::new("/lib/modules"))
        .map(|module| format!("{} is an NVIDIA driver's module", module.display()))
}

/// The modules of NVIDIA's driver, by file name before `.ko`: `nvidia`, and those starting with
/// one of these (Debian's `nvidia-current-open-uvm` included). The kernel's own modules named
/// after NVIDIA (`nvidia-wmi-ec-backlight`) are not the driver's.
const NVIDIA_MODULES: [&str; 6] =
    ["nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem", "nvidia-current", "nvidia-vgpu"];

/// A module of NVIDIA's driver ([`NVIDIA_MODULES`]) anywhere under `dir`, for any kernel.
fn nvidia_module_under(dir: &Path) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        // Symbolic links (a kernel's build and source trees) lead out of the module tree.
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            if let Some(found) = nvidia_module_under(&path) {
                return Some(found);
            }
        } else if let Some((stem, _)) = name.split_once(".ko").filter(|_| kind.is_file()) {
            if stem == "nvidia" || NVIDIA_MODULES.iter().any(|m| stem.starts_with(m)) {
                return Some(path);
            }
        }
    }
    None
}

/// Held by the DKMS test while it changes the machine: one run at a time across processes (two
/// checkouts, two CI jobs), so that one's cleanup never removes what another is using.
/// The lock file is in DKMS's own tree, which only root writes: no other user can take it, plant a
/// link there or own the file.
fn machine_lock() -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open("/var/lib/dkms/.wic-dkms-test.lock")
        .expect("the lock file");
    // SAFETY: flock on a descriptor this function owns; it blocks until the lock is free.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) };
    assert_eq!(locked, 0, "flock: {}", std::io::Error::last_os_error());
    file
}

/// The CRCs of the `uvm_wic_*` symbols `module` exports: each `__crc_<symbol>` is the offset of
/// its CRC, a 32-bit word, in the module's `__kcrctab` or `__kcrctab_gpl` section.
fn exported_crcs(module: &Path, scratch: &Path) -> Vec<(String, u32)> {
    let symbols = run(Command::new("objdump").arg("-t").arg(module));
    assert!(symbols.status.success(), "objdump -t {}: {}", module.display(), text(&symbols));
    let section = |name: &str| {
        let file = scratch.join(name);
        let copy = run(Command::new("objcopy")
            .args(["-O", "binary", &format!("--only-section={name}")])
            .arg(module)
            .arg(&file));
        assert!(copy.status.success(), "objcopy {name} of {}: {}", module.display(), text(&copy));
        std::fs::read(&file).expect("a CRC table")
    };
    let mut tables = std::collections::HashMap::new();
    let mut crcs = Vec::new();
    // "<offset> l       __kcrctab_gpl\t<size> __crc_<symbol>"
    for line in String::from_utf8_lossy(&symbols.stdout).lines() {
        let Some((place, name)) = line.split_once('\t') else { continue };
        let Some(symbol) = name.split_whitespace().last().and_then(|n| n.strip_prefix("__crc_")) else { continue };
        let (Some(offset), Some(table)) = (place.split_whitespace().next(), place.split_whitespace().last()) else {
            continue;
        };
        if !symbol.starts_with("uvm_wic_") || !table.starts_with("__kcrctab") {
            continue;
        }
        let at = usize::from_str_radix(offset, 16).expect("an offset");
        let bytes = tables.entry(table.to_string()).or_insert_with(|| section(table));
        let word: [u8; 4] = bytes[at..at + 4].try_into().expect("4 bytes");
        crcs.push((symbol.to_string(), u32::from_le_bytes(word)));
    }
    crcs
}

/// The `uvm_wic_*` symbols `module` imports, with the CRCs it was built against.
fn imported_crcs(module: &Path) -> Vec<(String, u32)> {
    let dump = run(Command::new("modprobe").arg("--dump-modversions").arg(module));
    assert!(dump.status.success(), "modprobe --dump-modversions {}: {}", module.display(), text(&dump));
    String::from_utf8_lossy(&dump.stdout)
        .lines()
        .filter_map(|line| {
            let (crc, symbol) = line.split_once(char::is_whitespace)?;
            let symbol = symbol.trim();
            symbol
                .starts_with("uvm_wic_")
                .then(|| (symbol.to_string(), u32::from_str_radix(crc.trim_start_matches("0x"), 16).expect("a CRC")))
        })
        .collect()
}

#[test]
fn dkms_installs_wic_beside_nvidias_package_and_removes_only_its_own() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let skip = |why: String| {
        assert!(
            std::env::var_os("WIC_REQUIRE_NVIDIA_SOURCE").is_none(),
            "WIC_REQUIRE_NVIDIA_SOURCE is set but the DKMS test cannot run: {why}"
        );
        println!("SKIPPED: the DKMS install and removal of the wic package did not run: {why}");
    };
    let Some(kver) = kernel_with_headers() else {
        return skip("no kernel headers under /lib/modules/*/build".into());
    };
    if let Some(why) = dkms_unusable() {
        return skip(why);
    }
    let _machine = machine_lock();
    remove_leftovers();
    if let Some(why) = dkms_test_blocked() {
        return skip(why);
    }
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
    let mut installed = Installed { kver: kver.clone(), packages: Vec::new(), dirs: Vec::new() };

    // NVIDIA's source where Debian's package puts it, for wic's build to find.
    let installed_tree = Path::new("/usr/src").join(tree.file_name().unwrap());
    if installed_tree.exists() {
        return skip(format!("{} exists and is not the test's", installed_tree.display()));
    }
    installed.create(&installed_tree);
    let copy = run(Command::new("cp").arg("-a").arg(format!("{}/.", tree.display())).arg(&installed_tree));
    assert!(copy.status.success(), "copy {}: {}", tree.display(), text(&copy));
    if let Some(change) = adapt_to_kernel(&installed_tree, &kver) {
        println!("NVIDIA's tree adapted to the kernel: {change}");
    }

    // The second kernel: the headers of the installed one under another release.
    let second = Path::new("/lib/modules").join(SECOND_KERNEL);
    installed.create(&second);
    for link in ["build", "source"] {
        if let Ok(target) = std::fs::read_link(format!("/lib/modules/{kver}/{link}")) {
            std::os::unix::fs::symlink(target, second.join(link)).expect("the second kernel's headers");
        }
    }
    let kernels = [kver.as_str(), SECOND_KERNEL];
    install_nvidia_stand_in(&mut installed, &nvidia_version, &kernels);
    let nvidias = nvidias_files(&kernels);

    // wic, as deploy/dkms/README.md installs it, under a version of its own so that a real
    // installation is never touched.
    let wic_version = format!("0.0.0-test{}", std::process::id());
    let wic_dir = Path::new("/usr/src").join(format!("wic-{wic_version}"));
    installed.dirs.push(wic_dir.clone());
    let repo = workspace();
    let source = run(Command::new(repo.join("deploy/dkms/install-source.sh")).arg(&wic_dir).arg(&wic_version));
    assert!(source.status.success(), "install-source.sh: {}", text(&source));
    assert!(!wic_dir.join("shim/wic_shim.ko").exists() && !wic_dir.join("shim/test").exists(), "build output copied");
    installed.add("wic", &wic_version);
    let build = dkms(&["build", "-m", "wic", "-v", &wic_version, "-k", &kver]);
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
    // No --force: nothing of NVIDIA's is replaced.
    let install = dkms(&["install", "-m", "wic", "-v", &wic_version, "-k", &kver]);
    assert!(install.status.success(), "dkms install: {}", text(&install));
    let wics = |kernel: &str| {
        let uvm =
            installed_module(kernel, "nvidia-uvm-wic").unwrap_or_else(|| panic!("no nvidia-uvm-wic.ko for {kernel}"));
        let shim = installed_module(kernel, "wic_shim").unwrap_or_else(|| panic!("no wic_shim.ko for {kernel}"));
        assert_eq!(modinfo(&uvm, "version"), nvidia_version, "{}", uvm.display());
        assert!(
            modinfo(&shim, "depends").split(',').any(|d| d == "nvidia-uvm"),
            "wic_shim.ko does not depend on nvidia-uvm: {}",
            modinfo(&shim, "depends")
        );
        (uvm, shim)
    };
    let (uvm, shim) = wics(&kver);
    assert_unchanged(&nvidias, "after dkms install");
    // wic_shim was built against this very nvidia-uvm: every uvm_wic_* it imports is exported
    // with the same CRC, or the kernel would refuse to load it.
    let exports = exported_crcs(&uvm, &scratch("dkms-crc"));
    let imports = imported_crcs(&shim);
    assert!(!imports.is_empty(), "wic_shim.ko imports no uvm_wic_* symbol with a CRC (no MODVERSIONS?)");
    for import in &imports {
        assert!(exports.contains(import), "wic_shim imports {import:?}; nvidia-uvm-wic exports {exports:?}");
    }
    println!("dkms installed {} and {} beside NVIDIA {nvidia_version}'s package", uvm.display(), shim.display());

    // Which nvidia-uvm modprobe loads: NVIDIA's without wic's rule, wic's with it.
    let conf = scratch("dkms-modprobe");
    let plain = planned(&conf, &kver, &["nvidia-uvm"]);
    assert!(plain.contains("updates/dkms/nvidia-uvm.ko"), "without wic's rule, modprobe nvidia-uvm: {plain}");
    let script = repo.join("deploy/modprobe/wic-modprobe");
    let rule = std::fs::read_to_string(repo.join("deploy/modprobe/00-wic.conf"))
        .unwrap()
        .replace("/usr/lib/wic/wic-modprobe", &script.display().to_string());
    std::fs::write(conf.join("00-wic.conf"), rule).unwrap();
    let ruled = planned(&conf, &kver, &["nvidia-uvm"]);
    assert!(ruled.contains(&format!("install {} nvidia_uvm", script.display())), "with wic's rule: {ruled}");
    let (ok, chosen) = wic_modprobe_dry_run(None, &kver, "nvidia_uvm");
    assert!(ok && chosen.contains("--ignore-install nvidia-uvm-wic opt=1"), "the rule chose: {chosen}");
    let target = planned(&conf, &kver, &["--ignore-install", "nvidia-uvm-wic"]);
    assert!(target.contains("updates/dkms/nvidia-uvm-wic.ko"), "nvidia-uvm-wic resolves to: {target}");

    // A kernel update: its postinst runs `dkms autoinstall` (no --force), which must build and
    // install both of wic's modules.
    // No other DKMS package is installed (dkms_test_blocked), so this builds wic's alone.
    let auto = dkms(&["autoinstall", "-k", SECOND_KERNEL]);
    assert!(auto.status.success(), "dkms autoinstall -k {SECOND_KERNEL}: {}", text(&auto));
    wics(SECOND_KERNEL);
    assert_unchanged(&nvidias, "after the rebuild for a new kernel");

    // A driver upgrade before wic is rebuilt: NVIDIA's package of another release replaces the
    // first, as apt upgrades it. wic's build is refused as stale, naming both releases, and
    // CUDA gets NVIDIA's nvidia-uvm.
    let upgraded = format!("{nvidia_version}.1");
    dkms(&["remove", "-m", NVIDIA_STAND_IN, "-v", &nvidia_version, "--all"]);
    install_nvidia_stand_in(&mut installed, &upgraded, &kernels);
    let (ok, chosen) = wic_modprobe_dry_run(None, &kver, "nvidia_uvm");
    assert!(
        ok && chosen.contains("--ignore-install nvidia-uvm opt=1")
            && chosen.contains(&format!("built for NVIDIA {nvidia_version}, the nvidia module is {upgraded}")),
        "a stale build: {chosen}"
    );
    let (ok, refused) = wic_modprobe_dry_run(None, &kver, "wic_shim");
    assert!(!ok && refused.contains("not loading wic_shim"), "wic_shim with a stale build: {refused}");
    let upgraded_nvidias = nvidias_files(&kernels);

    // Removal deletes wic's two modules from every kernel and nothing else.
    let remove = dkms(&["remove", "-m", "wic", "-v", &wic_version, "--all"]);
    assert!(remove.status.success(), "dkms remove: {}", text(&remove));
    for kernel in kernels {
        for name in ["nvidia-uvm-wic", "wic_shim"] {
            assert!(installed_module(kernel, name).is_none(), "dkms remove left {name} for {kernel}");
        }
    }
    assert_unchanged(&upgraded_nvidias, "after dkms remove");
    std::fs::remove_file(conf.join("00-wic.conf")).unwrap();
    let restored = planned(&conf, &kver, &["nvidia-uvm"]);
    assert!(restored.contains("updates/dkms/nvidia-uvm.ko"), "after removal, modprobe nvidia-uvm: {restored}");
    drop(installed);
}
