//! The emulated GPU: a deterministic discrete-event model of GPUs, the UVM replayable-fault path
//! and wicd, driving the real WIC engine with raw fault-buffer entries, and the paper's ten
//! applications as workloads.

pub mod apps;
pub mod calibration;
pub mod compare;
pub mod corun;
pub mod host_fill;
pub mod payload;
pub mod pool;
pub mod sim;
pub mod validation;
pub mod workload;

pub use calibration::Calibration;
pub use sim::{run, try_run, Mode, RunReport};
pub use workload::Workload;
