//! A host producer's batch into its run, three ways, by message size: wicd's CPU copy
//! ([`Mode::FaultCopy`]), nvidia-uvm's copy engine into GPU-resident pages
//! ([`Mode::FaultCopyEngine`], a lower bound: no copy-engine set-up latency is measured, so none
//! is charged) and the producer writing the run in place ([`Mode::Fault`]). One block of
//! [`WARPS`] consumer warps waits for each batch, one batch at a time, far enough apart that
//! none waits for another: what each way costs wicd's thread per batch and how long a batch
//! takes from its publish to its warps, on the model's own runs (docs/evaluation.md's table,
//! which wic-report fills from [`costs`]).

use crate::sim::try_run;
use crate::workload::{Endpoint, Phase, ProduceOrder, Workload};
use crate::{Calibration, Mode};

/// Message bytes per warp of the table's rows.
pub const MESSAGE_BYTES: [u32; 5] = [64, 1 << 10, 4 << 10, 16 << 10, 64 << 10];

/// Consumer warps per batch, the engine's default batch.
pub const WARPS: u32 = 16;

/// Batches a run delivers, one after another.
pub const BATCHES: u32 = 20;

/// Time from a batch's consumers asking for it to its publish: far longer than the fault
/// path takes to hand their fault to wicd, so every batch finds its warps held, and each run
/// is one batch alone.
const GAP_NS: u64 = 200_000;

/// What one way costs for one message size, over [`BATCHES`] batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// wicd's busy time per batch: the consumers' fault entry and the publish through the
    /// engine, and the completion's submission (with the copy, or the head words, where its
    /// thread writes them).
    pub busy_per_batch_ns: f64,
    /// From the producer's publish call to the warps' receiving their messages (wicd's
    /// wake-up, the submission, the replay).
    pub delivery_ns: f64,
}

/// [`BATCHES`] batches of [`WARPS`] messages of `message_bytes`, each published alone by a host
/// thread to one block whose warps wait for it already.
pub fn workload(message_bytes: u32) -> Workload {
    Workload {
        name: "host_fill",
        title: "one block waiting for a host producer's batches, one at a time",
        pattern: "streaming",
        model: "unidirectional",
        iterations: BATCHES,
        phases: vec![Phase {
            producer: Endpoint::Host,
            consumer: Endpoint::Gpu(0),
            ctas: 1,
            warps_per_cta: WARPS,
            requests_per_warp: 1,
            c1_instr: 0,
            c2_instr: 64,
            memory_share: 0.0,
            jitter: 0.0,
            independent_ctas: 0.0,
            request_probability: 1.0,
            message_bytes,
            order: ProduceOrder::Sequential,
            produce_ns: GAP_NS,
            producer_lanes: 1,
            producer_start_ns: 0,
            produce_spread: 0.0,
            publish_slots: 1,
            sends_back: false,
            host_compute_ns: 0,
        }],
    }
}

/// The three ways' costs for `message_bytes` per warp, in [`Mode::HOST_FILLS`]' order; an error if a run
/// did not end or delivered a message that was not its producer's.
pub fn costs(cal: &Calibration, message_bytes: u32, seed: u64) -> Result<[Cost; 3], String> {
    let w = workload(message_bytes);
    let mut out = [Cost { busy_per_batch_ns: 0.0, delivery_ns: 0.0 }; 3];
    for (cost, mode) in out.iter_mut().zip(Mode::HOST_FILLS) {
        let report = try_run(&w, mode, cal, seed).map_err(|e| format!("{} B, {}: {e}", message_bytes, mode.name()))?;
        let expected = u64::from(BATCHES * WARPS);
        if (report.messages_checked, report.corrupt_messages, report.error_markers) != (expected, 0, 0) {
            return Err(format!("{message_bytes} B, {}: messages not delivered intact: {report:?}", mode.name()));
        }
        *cost = Cost {
            busy_per_batch_ns: report.daemon_busy_ns as f64 / f64::from(BATCHES),
            delivery_ns: report.mean_delivery_ns,
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wic_engine::PAGE_SIZE;

    /// With every batch alone, each way costs what its mechanism says, constant for constant:
    /// wicd's thread pays the copy (none in place, the head words only), never the consumers'
    /// read across PCIe of a host-resident run, which delays their data instead; the copy
    /// engine's DMA, which overlaps the submission's page-table work, delays the batch only
    /// where it takes longer, and leaves a GPU-resident run with no read across PCIe.
    #[test]
    fn each_way_costs_its_mechanism() {
        let cal = Calibration::built_in();
        for bytes in MESSAGE_BYTES {
            let [copy, engine, in_place] = costs(&cal, bytes, 1).unwrap();
            let len = u64::from(bytes * WARPS);
            let pages = len.div_ceil(PAGE_SIZE);
            let d = &cal.daemon;
            let per_page = d.per_page_ns.value * 2 * pages;
            let read = cal.pcie_ns(pages * PAGE_SIZE);
            let thread = (2 * d.engine_per_entry_ns.value + d.submission_ns.value + per_page) as f64;
            assert_eq!(copy.busy_per_batch_ns, thread + cal.memcpy_ns(len) as f64, "{bytes}");
            assert_eq!(in_place.busy_per_batch_ns, thread + cal.memcpy_ns(8 * pages) as f64, "{bytes}");
            assert_eq!(engine.busy_per_batch_ns, thread, "{bytes}");
            let start = (d.publish_ns.value + d.wakeup_ns.value + d.engine_per_entry_ns.value) as f64;
            let replay = cal.fault.replay_ns.value as f64;
            let dma = (d.submission_ns.value + cal.pcie_ns(len)).max(d.submission_ns.value + per_page);
            assert_eq!(
                copy.delivery_ns,
                start + copy.busy_per_batch_ns - thread + (d.submission_ns.value + per_page + read) as f64 + replay
            );
            assert_eq!(
                in_place.delivery_ns,
                start + in_place.busy_per_batch_ns - thread + (d.submission_ns.value + per_page + read) as f64 + replay
            );
            assert_eq!(engine.delivery_ns, start + dma as f64 + replay, "{bytes}");
            assert!(in_place.delivery_ns < copy.delivery_ns, "{bytes}");
        }
    }
}
