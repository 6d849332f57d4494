//! `/etc/wic/wicd.toml`: every key has a default, unknown keys are errors (a typo must not
//! silently fall back to a default).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use wic_engine::{EngineConfig, Nanos};
use wic_types::uvm_gpu::Uuid;

use crate::service::sharing::SharingPolicy;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub service: ServiceConfig,
    pub engine: EngineSection,
    pub emulated: EmulatedConfig,
    pub shim: ShimConfig,
    pub limits: Limits,
}

/// Which GPU backend runs the engine's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// The shim if its device node exists; else the emulated GPU, unless wic_shim is installed
    /// for the running kernel (then the shim was expected, and wicd refuses to start).
    Auto,
    Emulated,
    Shim,
}

/// `[service]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    pub socket: PathBuf,
    pub socket_mode: String,
    pub socket_group: String,
    pub backend: BackendChoice,
    pub device: PathBuf,
    /// nvidia-uvm's tools node, through which the emulated backend observes real GPU faults.
    pub uvm_tools: PathBuf,
    pub log_level: String,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            socket: wic_proto::DEFAULT_SOCKET.into(),
            socket_mode: "0660".into(),
            socket_group: "wic".into(),
            backend: BackendChoice::Auto,
            device: "/dev/wic".into(),
            uvm_tools: "/dev/nvidia-uvm-tools".into(),
            log_level: "info".into(),
        }
    }
}

/// `[engine]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSection {
    pub pool_pages: u32,
    pub warps_per_batch: u32,
    pub max_slots: u32,
}

impl Default for EngineSection {
    fn default() -> Self {
        let engine = EngineConfig::default();
        Self { pool_pages: engine.pool_pages, warps_per_batch: engine.warps_per_batch, max_slots: engine.max_slots }
    }
}

/// `[emulated]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmulatedConfig {
    pub gpus: u16,
}

impl Default for EmulatedConfig {
    fn default() -> Self {
        Self { gpus: 4 }
    }
}

/// How the shim backend hands command batches to the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubmissionChoice {
    /// One io_uring command per batch chunk.
    IoUring,
    /// One ioctl per batch chunk.
    Ioctl,
}

/// `[shim]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShimConfig {
    pub submission: SubmissionChoice,
    /// Whether a command batch that names several applications' address spaces runs as one
    /// lane per space, the lanes at once (io_uring only); off, as one chain.
    pub parallel_activation: bool,
    /// How long to retry while the device is still held by a previous session (a restart:
    /// the module completes the old session's held faults before it lets a new one in).
    pub open_wait_ms: u64,
    /// At each attach, what to do about GPUs that would time-slice other contexts with held
    /// faults (compute mode not EXCLUSIVE_PROCESS, no MIG), as NVML reports them.
    pub gpu_sharing: SharingPolicy,
    /// The GPUs wic may hold faults on, by UUID as `nvidia-smi -L` prints them (`GPU-…`, or
    /// `MIG-…` for a MIG instance); empty: every GPU. Channels whose GPUs are not listed are
    /// refused, and only the listed GPUs are judged by `gpu_sharing`.
    pub gpus: Vec<String>,
}

impl Default for ShimConfig {
    fn default() -> Self {
        Self {
            submission: SubmissionChoice::IoUring,
            parallel_activation: true,
            open_wait_ms: 2000,
            gpu_sharing: SharingPolicy::Refuse,
            gpus: Vec::new(),
        }
    }
}

impl ShimConfig {
    /// `gpus` as UUIDs, or which entry is not one.
    pub fn allowed_gpus(&self) -> Result<Vec<Uuid>, String> {
        self.gpus
            .iter()
            .map(|text| {
                Uuid::parse(text).ok_or_else(|| {
                    format!("shim.gpus: `{text}` is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints it)")
                })
            })
            .collect()
    }

    /// The backend's submission path.
    pub fn submission(&self) -> wic_kernel_io::Submission {
        match self.submission {
            SubmissionChoice::IoUring => wic_kernel_io::Submission::Uring,
            SubmissionChoice::Ioctl => wic_kernel_io::Submission::Ioctl,
        }
    }
}

/// `[limits]`: all of them apply live on reload. What one client, and one user, can make wicd
/// hold is bounded, so that a member of the socket's group cannot deny service to the others,
/// and a few connections are kept for the operators (root and wicd's own user) whatever the
/// others do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_frame_bytes: usize,
    pub max_clients: u32,
    /// Of `max_clients`, the connections only operators may take.
    pub reserved_clients: u32,
    pub max_clients_per_uid: u32,
    pub max_channels_per_client: u32,
    pub max_channels_per_uid: u32,
    /// Slots (engine tags, shared by every user) the channels of one uid may hold together.
    pub max_slots_per_uid: u32,
    /// Pages the channels of one uid may hold together: of wicd's pool on the emulated
    /// backend, counted alike on the shim.
    pub max_pages_per_uid: u32,
    /// Of the channels wicd can hold (its descriptor limit's), the last ones free, which only
    /// operators may take; likewise of the engine's slots and of the pool's pages.
    pub reserved_channels: u32,
    pub reserved_slots: u32,
    pub reserved_pages: u32,
    /// Address spaces the connections of one uid may have attached at once.
    pub max_spaces_per_uid: u32,
    /// Unused grant tokens a channel may have outstanding.
    pub max_grants_per_channel: u32,
    /// Unused grant tokens of all the channels of one user.
    pub max_grants_per_uid: u32,
    pub max_message_bytes: u32,
    pub default_timeout_ms: u64,
    /// How long a new connection has to say hello.
    pub hello_timeout_ms: u64,
    /// How long the rest of a request may take to arrive once its first byte has, and how long
    /// a client may take to read a reply.
    pub request_timeout_ms: u64,
    /// How long a user's connection that said hello may sit idle holding nothing (no channel,
    /// no attachment, no address space) while users hold three quarters of the connections they
    /// may take or more; it is then closed to make room. 0: never.
    pub idle_close_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 64 << 10,
            max_clients: 256,
            reserved_clients: 4,
            max_clients_per_uid: 64,
            max_channels_per_client: 64,
            max_channels_per_uid: 256,
            max_slots_per_uid: 1024,
            max_pages_per_uid: 4096,
            reserved_channels: 16,
            reserved_slots: 256,
            reserved_pages: 1024,
            max_spaces_per_uid: 32,
            max_grants_per_channel: 64,
            max_grants_per_uid: 1024,
            max_message_bytes: 1 << 20,
            default_timeout_ms: 1000,
            hello_timeout_ms: 5000,
            request_timeout_ms: 10_000,
            idle_close_ms: 60_000,
        }
    }
}

impl Limits {
    /// The hold timeout of a channel created without one.
    pub fn default_timeout_ns(&self) -> Nanos {
        self.default_timeout_ms.saturating_mul(1_000_000)
    }

    fn check(&self) -> Result<(), String> {
        if self.max_frame_bytes < 256 {
            return Err("limits.max_frame_bytes must be at least 256".into());
        }
        let positive = [
            ("max_clients", u64::from(self.max_clients)),
            ("max_clients_per_uid", u64::from(self.max_clients_per_uid)),
            ("max_channels_per_client", u64::from(self.max_channels_per_client)),
            ("max_channels_per_uid", u64::from(self.max_channels_per_uid)),
            ("max_slots_per_uid", u64::from(self.max_slots_per_uid)),
            ("max_pages_per_uid", u64::from(self.max_pages_per_uid)),
            ("max_spaces_per_uid", u64::from(self.max_spaces_per_uid)),
            ("max_grants_per_channel", u64::from(self.max_grants_per_channel)),
            ("max_grants_per_uid", u64::from(self.max_grants_per_uid)),
            ("max_message_bytes", u64::from(self.max_message_bytes)),
            ("default_timeout_ms", self.default_timeout_ms),
            ("hello_timeout_ms", self.hello_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(format!("limits.{key} must be positive"));
        }
        if self.reserved_clients >= self.max_clients {
            return Err(format!(
                "limits.reserved_clients ({}) must leave room below max_clients ({}) for other users",
                self.reserved_clients, self.max_clients
            ));
        }
        Ok(())
    }
}

/// Largest `engine.pool_pages`: 4 GiB of pool, about 40 MB of daemon tables.
pub const MAX_POOL_PAGES: u32 = 1 << 20;
/// Largest `engine.max_slots`: about 20 MB of daemon tables.
pub const MAX_SLOTS: u32 = 1 << 16;
/// Largest `engine.warps_per_batch`: every warp of 32 full-size thread blocks.
pub const MAX_WARPS_PER_BATCH: u32 = 1024;

impl EngineSection {
    /// Bounds checked before anything is sized by these values.
    fn check(&self) -> Result<(), String> {
        let bounded = [
            ("pool_pages", self.pool_pages, MAX_POOL_PAGES),
            ("max_slots", self.max_slots, MAX_SLOTS),
            ("warps_per_batch", self.warps_per_batch, MAX_WARPS_PER_BATCH),
        ];
        for (key, value, max) in bounded {
            if !(1..=max).contains(&value) {
                return Err(format!("engine.{key} = {value} is out of range: 1 to {max}"));
            }
        }
        Ok(())
    }
}

/// The largest configuration file wicd reads: the documented file is a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of the configuration file at `path`, read so that no file can stop or swell the
/// thread that reads it (wicd's control thread, on SIGHUP): opened without blocking (a FIFO with
/// no writer), refused unless it is a regular file or `/dev/null` (a FIFO, `/dev/zero`, a
/// directory), and read only up to [`MAX_CONFIG_BYTES`], which a longer file exceeds as a
/// refusal.
fn read_config(path: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| e.to_string())?;
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    // /dev/null stands for an empty file, as for any program that reads one.
    let null = metadata.file_type().is_char_device() && metadata.rdev() == libc::makedev(1, 3);
    if !metadata.is_file() && !null {
        return Err("not a regular file: refused (a FIFO or a device could stop or swell wicd)".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("larger than {MAX_CONFIG_BYTES} bytes: refused"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".into())
}

impl Config {
    /// Reads and checks `path` (a regular file of at most [`MAX_CONFIG_BYTES`]).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = read_config(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and checks a configuration text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: Self = toml::from_str(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        self.socket_mode()?;
        crate::logging::parse_level(&self.service.log_level)?;
        self.limits.check()?;
        self.engine.check()?;
        let reserves = [
            ("reserved_slots", self.limits.reserved_slots, "engine.max_slots", self.engine.max_slots),
            ("reserved_pages", self.limits.reserved_pages, "engine.pool_pages", self.engine.pool_pages),
        ];
        for (key, reserved, of, total) in reserves {
            if reserved >= total {
                return Err(format!("limits.{key} ({reserved}) must leave room below {of} ({total}) for other users"));
            }
        }
        if self.emulated.gpus == 0 {
            return Err("emulated.gpus must be at least 1".into());
        }
        self.shim.allowed_gpus()?;
        Ok(())
    }

    /// The socket's permission bits.
    pub fn socket_mode(&self) -> Result<u32, String> {
        let text = self.service.socket_mode.trim_start_matches("0o");
        u32::from_str_radix(text, 8).ok().filter(|mode| *mode <= 0o777).ok_or_else(|| {
            format!("service.socket_mode `{}` is not an octal mode like \"0660\"", self.service.socket_mode)
        })
    }

    /// The engine configuration these settings describe.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            pool_pages: self.engine.pool_pages,
            warps_per_batch: self.engine.warps_per_batch,
            max_slots: self.engine.max_slots,
            ..EngineConfig::default()
        }
    }

    /// What a reload cannot change, described for the log.
    pub fn needs_restart(&self, new: &Self) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.engine != new.engine {
            changed.push("[engine]");
        }
        if self.emulated != new.emulated {
            changed.push("[emulated]");
        }
        if self.shim != new.shim {
            changed.push("[shim]");
        }
        let (old, next) = (&self.service, &new.service);
        if (&old.socket, &old.socket_mode, &old.socket_group) != (&next.socket, &next.socket_mode, &next.socket_group) {
            changed.push("service.socket*");
        }
        if (old.backend, &old.device, &old.uvm_tools) != (next.backend, &next.device, &next.uvm_tools) {
            changed.push("service.backend/device/uvm_tools");
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_example_is_the_defaults() {
        let example = include_str!("../../deploy/wicd.toml");
        assert_eq!(Config::parse(example).unwrap(), Config::default());
    }

    /// `Config::load` on another thread, which must answer within a few seconds.
    fn load_in_time(path: &Path) -> Result<Config, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_owned();
        std::thread::spawn(move || {
            let _ = tx.send(Config::load(&path));
        });
        rx.recv_timeout(std::time::Duration::from_secs(5)).expect("load() did not return within 5 s")
    }

    #[test]
    fn only_a_regular_file_of_bounded_size_is_read() {
        let dir = std::env::temp_dir().join(format!("wicd-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.toml");
        std::fs::write(&ok, "[limits]\n").unwrap();
        assert_eq!(load_in_time(&ok).unwrap(), Config::default());
        assert_eq!(load_in_time(Path::new("/dev/null")).unwrap(), Config::default(), "an empty configuration");

        // A FIFO with no writer: a blocking open or read would wait for one for ever.
        let fifo = dir.join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
        let err = load_in_time(&fifo).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");

        // A device behind a symlink: /dev/zero would be read until memory runs out.
        let zero = dir.join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = load_in_time(&zero).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");

        // Larger than the bound: refused by its size, whatever it holds; at the bound, read.
        let line = format!("#{}\n", "x".repeat(1022));
        let at_bound = line.repeat((MAX_CONFIG_BYTES / 1024) as usize);
        let big = dir.join("big.toml");
        std::fs::write(&big, format!("{at_bound}#\n")).unwrap();
        let err = load_in_time(&big).unwrap_err();
        assert!(err.contains(&format!("larger than {MAX_CONFIG_BYTES} bytes")), "{err}");
        std::fs::write(&big, at_bound).unwrap();
        assert_eq!(load_in_time(&big).unwrap(), Config::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn typos_and_bad_values_are_errors_that_name_the_key() {
        let err = Config::parse("[limits]\nmax_clients_typo = 3\n").unwrap_err();
        assert!(err.contains("max_clients_typo"), "{err}");
        let err = Config::parse("[service]\nsocket_mode = \"0999\"\n").unwrap_err();
        assert!(err.contains("socket_mode"), "{err}");
        let err = Config::parse("[service]\nlog_level = \"loud\"\n").unwrap_err();
        assert!(err.contains("loud"), "{err}");
        assert!(Config::parse("[limits]\nmax_frame_bytes = 10\n").is_err());
        assert_eq!(Config::parse("[service]\nsocket_mode = \"0600\"\n").unwrap().socket_mode(), Ok(0o600));
        let err = Config::parse("[limits]\nmax_grants_per_uid = 0\n").unwrap_err();
        assert!(err.contains("max_grants_per_uid"), "{err}");
        let err = Config::parse("[limits]\nmax_clients = 4\nreserved_clients = 4\n").unwrap_err();
        assert!(err.contains("reserved_clients"), "{err}");
        let err = Config::parse("[shim]\ngpus = [\"GPU-0\"]\n").unwrap_err();
        assert!(err.contains("shim.gpus") && err.contains("`GPU-0`"), "{err}");
        let listed = Config::parse("[shim]\ngpus = [\"GPU-6871d114-5c34-a5ec-0b30-451b680ec522\"]\n").unwrap();
        assert_eq!(listed.shim.allowed_gpus().unwrap()[0].to_string(), "6871d114-5c34-a5ec-0b30-451b680ec522");
    }

    #[test]
    fn engine_sizes_are_bounded_before_anything_is_allocated() {
        for (key, value) in
            [("max_slots", 4294967295u64), ("max_slots", 100000000), ("pool_pages", 4294967295), ("warps_per_batch", 0)]
        {
            let err = Config::parse(&format!("[engine]\n{key} = {value}\n")).unwrap_err();
            assert!(err.contains(&format!("engine.{key} = {value}")) && err.contains("1 to"), "{err}");
        }
        let largest = format!("[engine]\nmax_slots = {MAX_SLOTS}\npool_pages = {MAX_POOL_PAGES}\n");
        let config = Config::parse(&largest).unwrap();
        assert!(wic_engine::Engine::new(config.engine()).is_ok(), "the documented maxima are accepted by the engine");
    }

    #[test]
    fn restart_is_required_only_for_structural_changes() {
        let old = Config::default();
        let mut new = old.clone();
        new.limits.max_clients = 3;
        new.service.log_level = "debug".into();
        assert!(old.needs_restart(&new).is_empty());
        new.engine.pool_pages = 1024;
        new.service.socket = "/tmp/x".into();
        assert_eq!(old.needs_restart(&new), vec!["[engine]", "service.socket*"]);
    }
}
