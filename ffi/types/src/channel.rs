//! What a client asks for when it opens a channel, and the memory such a channel takes.

use crate::{GpuId, Nanos, PAGE_SIZE};

/// Who produces a channel's data. On the wire (`serde`): `"host"`, or
/// `{"gpu":{"gpu":1,"base_va":4096}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case", deny_unknown_fields))]
pub enum Producer {
    /// A host thread publishes through libwic; slot `s` reads `batch_bytes` at offset
    /// `s * batch_bytes` of the channel's host buffer, or the run the producer wrote in place.
    Host,
    /// A kernel on `gpu` publishes by writing the slot's PAT page; slot `s` reads at
    /// `base_va + s * batch_bytes` there.
    Gpu { gpu: GpuId, base_va: u64 },
}

/// What a client asks for when it opens a channel: the same value on the wire, in libwic and
/// in wicd's engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(deny_unknown_fields))]
pub struct ChannelSpec {
    pub consumer_gpu: GpuId,
    pub producer: Producer,
    /// Bytes each warp receives per request.
    pub message_bytes: u32,
    pub slots: u32,
    /// How long a fault may be held before it is completed with
    /// [`crate::ErrorMarker::Timeout`]. A client's 0 asks for wicd's default, which wicd puts
    /// in before its engine opens the channel.
    pub timeout_ns: Nanos,
}

impl ChannelSpec {
    /// Bytes of application memory a channel of this spec occupies when placed on a real GPU:
    /// two runs per slot, then two PAT pages per slot for a GPU producer. `None` for a spec no
    /// channel can have (no slot, or no message byte) or whose size does not fit in 64 bits.
    pub fn placement_bytes(&self, warps_per_batch: u32) -> Option<u64> {
        if self.slots == 0 || self.message_bytes == 0 {
            return None;
        }
        let run_pages = u64::from(pages_for_batch(warps_per_batch, self.message_bytes, PAGE_SIZE as u32));
        let pat_pages = if matches!(self.producer, Producer::Gpu { .. }) { 2 } else { 0 };
        // Two runs of at most u32::MAX pages and two PAT pages cannot overflow.
        u64::from(self.slots).checked_mul(2 * run_pages + pat_pages)?.checked_mul(PAGE_SIZE)
    }
}

/// Pages for a batch of `warps` warps each receiving `bytes_per_warp` bytes:
/// `ceil(total / page_size)`, at least 1, saturating at `u32::MAX`.
///
/// # Panics
/// If `page_size` is 0.
pub fn pages_for_batch(warps: u32, bytes_per_warp: u32, page_size: u32) -> u32 {
    assert!(page_size > 0, "page size must be nonzero");
    // Two u32 factors cannot overflow a u64.
    let total_bytes = u64::from(warps) * u64::from(bytes_per_warp);
    let pages = total_bytes.div_ceil(u64::from(page_size)).max(1);
    u32::try_from(pages).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_for_batch_rounds_up() {
        assert_eq!(pages_for_batch(16, 256, 4096), 1);
        assert_eq!(pages_for_batch(16, 257, 4096), 2);
        assert_eq!(pages_for_batch(32, 256, 4096), 2);
        assert_eq!(pages_for_batch(0, 256, 4096), 1);
        assert_eq!(pages_for_batch(16, 0, 4096), 1);
        assert_eq!(pages_for_batch(u32::MAX, u32::MAX, 4096), u32::MAX);
        assert_eq!(pages_for_batch(u32::MAX, 1, 1), u32::MAX);
        assert_eq!(pages_for_batch(u32::MAX, 2, 2), u32::MAX);
    }
}
