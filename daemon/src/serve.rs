//! `wicd serve`: the daemon proper. Loads the configuration, starts the fast path, listens on
//! the socket (bound here or passed by systemd), tells systemd it is ready, feeds the
//! watchdog while the fast path answers, reloads on SIGHUP and stops cleanly on SIGTERM.

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tokio::signal::unix::{signal, SignalKind};
use wic_engine::Engine;
use wic_kernel_io::ShimSession;

use crate::config::{BackendChoice, Config};
use crate::logging::{self, LevelHandle};
use crate::service::backend::{Backend, BackendTraits};
use crate::service::control::{Control, DataplaneHandle};
use crate::service::dataplane;
use crate::service::emulated::SharedMemoryGpus;
use crate::service::hold::longest_timeout_ns;
use crate::service::registry::Capacity;
use crate::service::server::{self, Shared};
use crate::service::sharing::GpuRules;
use crate::service::shim::ShimGpus;
use crate::systemd;

/// Where the configuration is read from when `--config` is not given (if it exists).
const DEFAULT_CONFIG: &str = "/etc/wic/wicd.toml";

/// `wicd serve` options; they override the configuration file.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Configuration file (default: /etc/wic/wicd.toml if present, else built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Socket path (overrides service.socket).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Backend (overrides service.backend).
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// Emulated GPUs (overrides emulated.gpus).
    #[arg(long)]
    pub gpus: Option<u16>,
}

/// The configuration file read when none is named: [`DEFAULT_CONFIG`], if it exists.
pub fn default_config() -> Option<PathBuf> {
    Path::new(DEFAULT_CONFIG).exists().then(|| DEFAULT_CONFIG.into())
}

impl ServeArgs {
    fn config_path(&self) -> Option<PathBuf> {
        self.config.clone().or_else(default_config)
    }

    fn load(&self) -> Result<Config, String> {
        let mut config = match self.config_path() {
            Some(path) => Config::load(&path)?,
            None => Config::default(),
        };
        if let Some(socket) = &self.socket {
            config.service.socket = socket.clone();
        }
        if let Some(backend) = self.backend {
            config.service.backend = backend;
        }
        if let Some(gpus) = self.gpus {
            config.emulated.gpus = gpus;
        }
        Ok(config)
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(args: ServeArgs) -> Result<(), String> {
    let config = args.load()?;
    let level = logging::init(logging::parse_level(&config.service.log_level)?);
    let nofile = raise_descriptor_limit()?;
    let (handle, fast_path, backend, gpus) = start_fast_path(&config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let result = runtime.block_on(serve(args, config, level, handle, backend, gpus, nofile));
    fast_path.join().map_err(|_| "the fast path panicked".to_string())?;
    result
}

/// Raises the soft descriptor limit to the hard one, and returns it. wicd holds several
/// descriptors per channel (shared regions and doorbells) and one per connection, so the usual
/// soft limit of 1024 would refuse channels after a few hundred; the hard limit is the
/// administrator's choice (`LimitNOFILE=` in the unit), and the limits are checked against it.
fn raise_descriptor_limit() -> Result<u64, String> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| format!("getrlimit(RLIMIT_NOFILE): {e}"))?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|e| format!("setrlimit(RLIMIT_NOFILE, {hard}): {e}"))?;
        tracing::info!("descriptor limit raised from {soft} to {hard}");
    }
    Ok(hard)
}

/// Starts the fast path on the configured backend; returns its handle and thread, what the
/// backend is and how many GPUs the daemon knows of (0: the shim learns GPU ids from the
/// faults themselves).
fn start_fast_path(config: &Config) -> Result<(DataplaneHandle, JoinHandle<()>, BackendTraits, u16), String> {
    // The engine validates the configuration before the backend sizes anything by it.
    let engine = Engine::new(config.engine()).map_err(|e| format!("engine configuration: {e}"))?;
    let device = &config.service.device;
    let shim = match config.service.backend {
        BackendChoice::Emulated => false,
        BackendChoice::Auto if !device.exists() => {
            if let Some(kernel) = shim_installed_for_running_kernel() {
                return Err(format!(
                    "{} is missing although wic_shim is installed for kernel {kernel}: wic_shim is not loaded \
                     (sudo modprobe wic_shim; the kernel log says why it was refused), so the shim backend \
                     cannot run; service.backend = \"emulated\" runs without it",
                    device.display()
                ));
            }
            false
        }
        BackendChoice::Auto | BackendChoice::Shim => true,
    };
    if !shim {
        let gpus = config.emulated.gpus;
        let backend = SharedMemoryGpus::new(gpus, engine.config(), &config.service.uvm_tools);
        let traits = backend.traits();
        let (handle, thread) = dataplane::spawn(engine, backend)?;
        return Ok((handle, thread, traits, gpus));
    }
    let wait = Duration::from_millis(config.shim.open_wait_ms);
    let mut session = ShimSession::open(device, wait, config.shim.submission(), engine.config()).map_err(|e| {
        format!("{}: {e} (is wic_shim loaded? service.backend = \"emulated\" runs without it)", device.display())
    })?;
    session.set_parallel(config.shim.parallel_activation);
    tracing::info!("{}: session opened", device.display());
    let backend = ShimGpus::new(session);
    let traits = backend.traits();
    let (handle, thread) = dataplane::spawn(engine, backend)?;
    Ok((handle, thread, traits, 0))
}

/// The running kernel's release when its module index lists wic_shim (installed, by DKMS or
/// by hand, for this kernel). An index that exists but cannot be read is said in the log: the
/// check is then blind.
fn shim_installed_for_running_kernel() -> Option<String> {
    let kernel = nix::sys::utsname::uname().ok()?.release().to_string_lossy().into_owned();
    let path = Path::new("/lib/modules").join(&kernel).join("modules.dep");
    match std::fs::read_to_string(&path) {
        Ok(index) => index_lists_shim(&index).then_some(kernel),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!("cannot read {}: {e}; cannot tell whether wic_shim is installed", path.display());
            None
        }
    }
}

/// Whether a modules.dep lists wic_shim.ko (compressed or not).
fn index_lists_shim(modules_dep: &str) -> bool {
    modules_dep.lines().filter_map(|line| line.split(':').next()).any(|path| {
        let name = path.rsplit('/').next().unwrap_or(path);
        name == "wic_shim.ko" || name.starts_with("wic_shim.ko.")
    })
}

/// A socket path this process bound, removed again on exit.
struct BoundSocket(PathBuf);

impl Drop for BoundSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn bind(config: &Config) -> Result<(tokio::net::UnixListener, Option<BoundSocket>), String> {
    if let Some(listener) = systemd::activated_listener()? {
        listener.set_nonblocking(true).map_err(|e| format!("activated socket: {e}"))?;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(|e| format!("activated socket: {e}"))?;
        tracing::info!("using the socket passed by systemd");
        return Ok((listener, None));
    }
    let path = &config.service.socket;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    remove_stale_socket(path)?;
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bound = BoundSocket(path.clone());
    let mode = config.socket_mode()?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match nix::unistd::Group::from_name(&config.service.socket_group) {
        Ok(Some(group)) => {
            if let Err(e) = nix::unistd::chown(path, None, Some(group.gid)) {
                tracing::warn!("cannot give {} to group {}: {e}", path.display(), config.service.socket_group);
            }
        }
        _ => tracing::warn!(
            "group {} does not exist: {} stays in the daemon's group",
            config.service.socket_group,
            path.display()
        ),
    }
    tracing::info!("listening on {} (mode {mode:04o})", path.display());
    Ok((listener, Some(bound)))
}

/// Clears `path` for binding: only a socket nobody listens on is removed, and only one of
/// wicd's own user (or root's). Anything else there is a configuration mistake to report, never
/// a file to delete.
fn remove_stale_socket(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if !meta.file_type().is_socket() {
        return Err(format!(
            "{}: exists and is not a socket; refusing to replace it (choose another --socket or service.socket)",
            path.display()
        ));
    }
    let uid = nix::unistd::geteuid().as_raw();
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(format!(
            "{}: a socket of uid {}, not wicd's (uid {uid}) or root's; refusing to remove it",
            path.display(),
            meta.uid()
        ));
    }
    // Only a refused connection proves nobody listens; a busy or unreachable listener (full
    // backlog, no permission) is left alone. Non-blocking, so a wedged listener cannot hang
    // the start.
    match probe_listener(path) {
        Err(nix::errno::Errno::ECONNREFUSED) => {}
        Ok(()) | Err(nix::errno::Errno::EAGAIN) => {
            return Err(format!("{}: another wicd is already listening", path.display()));
        }
        Err(e) => {
            return Err(format!(
                "{}: cannot tell whether another wicd listens ({e}); refusing to remove it",
                path.display()
            ))
        }
    }
    std::fs::remove_file(path).map_err(|e| format!("stale socket {}: {e}", path.display()))?;
    tracing::info!("{}: removed the stale socket of an earlier wicd", path.display());
    Ok(())
}

/// Connects to the socket at `path` without waiting: `ECONNREFUSED` when nobody listens.
fn probe_listener(path: &Path) -> nix::Result<()> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let probe = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    connect(probe.as_raw_fd(), &UnixAddr::new(path)?)
}

async fn serve(
    args: ServeArgs,
    config: Config,
    level: LevelHandle,
    handle: DataplaneHandle,
    backend: BackendTraits,
    gpus: u16,
    nofile: u64,
) -> Result<(), String> {
    let stop_fast_path = |handle: DataplaneHandle| async move {
        let _ = handle.ask(|reply| Control::Shutdown { reply }).await;
    };
    // Signals before the socket: once it accepts connections, a SIGTERM must stop wicd
    // cleanly, not kill it by the default action.
    let signals = || -> std::io::Result<_> {
        Ok((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?))
    };
    let capacity = Capacity {
        nofile,
        warps_per_batch: config.engine().warps_per_batch,
        slots: u64::from(config.engine.max_slots),
        pool_pages: u64::from(config.engine.pool_pages),
        pages_from_pool: backend.pages_from_pool,
    };
    // Only a backend that holds real GPU faults stalls anybody (the shim; the emulated
    // backend's GPUs are shared memory).
    let gpu_rules = if backend.holds_gpu_faults {
        Some(GpuRules { sharing: config.shim.gpu_sharing, allowed: config.shim.allowed_gpus()? })
    } else {
        None
    };
    let ready = signals()
        .map_err(|e| format!("signal handlers: {e}"))
        .and_then(|signals| {
            Ok((signals, Shared::new(config.limits, capacity, handle.clone(), backend, gpus, gpu_rules)?))
        })
        .and_then(|(signals, shared)| Ok((signals, shared, bind(&config)?)));
    let ((mut terminate, mut interrupt, mut hangup), shared, (listener, bound)) = match ready {
        Ok(ready) => ready,
        Err(e) => {
            stop_fast_path(handle).await;
            return Err(e);
        }
    };
    let accept = tokio::spawn(server::accept_loop(listener, shared.clone()));
    let refusals = tokio::spawn(log_left_out_refusals(shared.clone()));
    let watchdog = systemd::watchdog_interval().map(|every| tokio::spawn(feed_watchdog(handle.clone(), every)));
    let name = backend.name;
    tracing::info!(backend = name, gpus, "wicd {} ready", env!("CARGO_PKG_VERSION"));
    if let Some(bound) = backend.hold_bound {
        if let Some(bound_ms) = (bound.read_ms)() {
            if config.limits.default_timeout_ns() > longest_timeout_ns(bound_ms) {
                tracing::warn!(
                    "limits.default_timeout_ms {} is not well below {} {bound_ms}: channels created without a timeout are refused",
                    config.limits.default_timeout_ms,
                    bound.what
                );
            }
        }
    }
    systemd::notify(&format!("READY=1\nSTATUS=serving, {name} backend"));
    let mut config = config;
    loop {
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => reload(&args, &mut config, &level, &shared),
        }
    }
    tracing::info!("stopping: completing held faults");
    systemd::notify("STOPPING=1");
    accept.abort();
    refusals.abort();
    if let Some(task) = watchdog {
        task.abort();
    }
    stop_fast_path(handle).await;
    drop(bound);
    tracing::info!("stopped");
    Ok(())
}

/// Re-reads the configuration: the log level and limits apply now, the rest at restart.
fn reload(args: &ServeArgs, config: &mut Config, level: &LevelHandle, shared: &Arc<Shared>) {
    systemd::notify("RELOADING=1");
    match args.load() {
        Ok(new) => {
            let restart = config.needs_restart(&new);
            if !restart.is_empty() {
                tracing::warn!("reload: {} changed; that takes effect at the next restart", restart.join(", "));
            }
            if let Err(e) = shared.set_limits(new.limits) {
                tracing::error!("reload failed, keeping the running configuration: {e}");
                systemd::notify("READY=1");
                return;
            }
            if let Ok(new_level) = logging::parse_level(&new.service.log_level) {
                level.set(new_level);
            }
            config.service.log_level = new.service.log_level;
            config.limits = new.limits;
            tracing::info!("configuration reloaded");
        }
        Err(e) => tracing::error!("reload failed, keeping the running configuration: {e}"),
    }
    systemd::notify("READY=1");
}

/// Reports, once a second, the refusals the log's rate limit left out.
async fn log_left_out_refusals(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(crate::service::quota::REFUSAL_PERIOD);
    loop {
        tick.tick().await;
        shared.log_left_out_refusals();
    }
}

/// Sends `WATCHDOG=1` only while the fast path answers, so a wedged engine gets restarted.
async fn feed_watchdog(handle: DataplaneHandle, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let alive = tokio::time::timeout(every, handle.ask(|reply| Control::Snapshot { reply })).await;
        if matches!(alive, Ok(Ok(_))) {
            systemd::notify("WATCHDOG=1");
        } else {
            tracing::error!("fast path did not answer within {every:?}; withholding the watchdog");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::index_lists_shim;

    #[test]
    fn the_module_index_says_whether_wic_shim_is_installed() {
        let nvidia_only = "kernel/nvidia/nvidia-uvm.ko: kernel/nvidia/nvidia.ko\nkernel/nvidia/nvidia.ko:\n";
        assert!(!index_lists_shim(nvidia_only));
        assert!(!index_lists_shim("updates/dkms/wic_shim_other.ko:\nextra/not_wic_shim.ko:\n"));
        for listed in ["updates/dkms/wic_shim.ko: updates/dkms/nvidia-uvm-wic.ko", "updates/dkms/wic_shim.ko.xz:"] {
            assert!(index_lists_shim(&format!("{nvidia_only}{listed}\n")), "{listed}");
        }
    }
}
