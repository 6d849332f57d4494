//! Logs through `tracing` to stderr: plain lines without timestamps or colour under journald
//! (it stamps them itself), a reloadable level for SIGHUP.

use std::io::IsTerminal;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;
use tracing_subscriber::reload;

/// Changes the level of the installed subscriber.
pub struct LevelHandle(reload::Handle<LevelFilter, tracing_subscriber::Registry>);

/// Parses a configured level name.
pub fn parse_level(name: &str) -> Result<LevelFilter, String> {
    name.parse::<LevelFilter>().map_err(|_| format!("log level `{name}` is not one of error, warn, info, debug, trace"))
}

/// Installs the global subscriber at `level`.
pub fn init(level: LevelFilter) -> LevelHandle {
    let (filter, handle) = reload::Layer::new(level);
    let under_journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let format = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false);
    let registry = tracing_subscriber::registry().with(filter);
    if under_journald {
        registry.with(format.without_time().with_ansi(false)).init();
    } else {
        registry.with(format.with_ansi(std::io::stderr().is_terminal())).init();
    }
    LevelHandle(handle)
}

impl LevelHandle {
    /// Applies a new level.
    pub fn set(&self, level: LevelFilter) {
        if let Err(e) = self.0.reload(level) {
            tracing::warn!("cannot change the log level: {e}");
        }
    }
}
