//! The C ABI of `wic.h`, mirrored in Rust: the `#[repr(C)]` structs and every constant.
//!
//! `tests/abi.rs` compiles a C program against `ffi/include/wic.h` and checks that every size,
//! field offset and constant printed by it matches what this module says, both ways: a field or
//! a constant present on one side only fails the test.

use std::ffi::c_int;

use wic_proto::message::{ErrorCode, Role};
use wic_types::ErrorMarker;

/// `WIC_VERSION_MAJOR`.
pub const WIC_VERSION_MAJOR: u32 = 0;
/// `WIC_VERSION_MINOR`.
pub const WIC_VERSION_MINOR: u32 = 1;
/// `WIC_VERSION_PATCH`.
pub const WIC_VERSION_PATCH: u32 = 0;

/// `WIC_OK`: success.
pub const WIC_OK: c_int = 0;

/// The C return value of an error: `-(code)`.
pub const fn err(code: ErrorCode) -> c_int {
    -(code as c_int)
}

/// `WIC_EINVALID`.
pub const WIC_EINVALID: c_int = err(ErrorCode::Invalid);
/// `WIC_EPERMISSION`.
pub const WIC_EPERMISSION: c_int = err(ErrorCode::Permission);
/// `WIC_ENOT_FOUND`.
pub const WIC_ENOT_FOUND: c_int = err(ErrorCode::NotFound);
/// `WIC_EEXHAUSTED`.
pub const WIC_EEXHAUSTED: c_int = err(ErrorCode::Exhausted);
/// `WIC_EBUSY`.
pub const WIC_EBUSY: c_int = err(ErrorCode::Busy);
/// `WIC_ETIMED_OUT`.
pub const WIC_ETIMED_OUT: c_int = err(ErrorCode::TimedOut);
/// `WIC_ECLOSED`.
pub const WIC_ECLOSED: c_int = err(ErrorCode::Closed);
/// `WIC_ESTOPPING`.
pub const WIC_ESTOPPING: c_int = err(ErrorCode::Stopping);
/// `WIC_EPROTOCOL`.
pub const WIC_EPROTOCOL: c_int = err(ErrorCode::Protocol);
/// `WIC_ECONNECT`.
pub const WIC_ECONNECT: c_int = err(ErrorCode::Connect);
/// `WIC_EUNSUPPORTED`.
pub const WIC_EUNSUPPORTED: c_int = err(ErrorCode::Unsupported);
/// `WIC_EIO`.
pub const WIC_EIO: c_int = err(ErrorCode::Io);
/// `WIC_ESTALE`.
pub const WIC_ESTALE: c_int = err(ErrorCode::Stale);
/// `WIC_ESTREAM`.
pub const WIC_ESTREAM: c_int = err(ErrorCode::Stream);

/// `WIC_TOKEN_LEN`: bytes of a grant token buffer, 32 hex digits and a NUL.
pub const WIC_TOKEN_LEN: usize = 33;

/// `WIC_ERROR_MARKER_MAGIC`: the high half of the word a device consumer finds at the start of
/// its run instead of data when the request failed.
pub const WIC_ERROR_MARKER_MAGIC: u64 = ErrorMarker::MAGIC;

/// `enum wic_producer_kind`: `WIC_PRODUCER_HOST`, a host thread publishes through libwic.
pub const WIC_PRODUCER_HOST: u16 = 0;
/// `enum wic_producer_kind`: `WIC_PRODUCER_GPU`, a kernel on another GPU publishes.
pub const WIC_PRODUCER_GPU: u16 = 1;

/// `enum wic_role`: `WIC_ROLE_OWNER`.
pub const WIC_ROLE_OWNER: u32 = 0;
/// `enum wic_role`: `WIC_ROLE_PRODUCER`.
pub const WIC_ROLE_PRODUCER: u32 = 1;
/// `enum wic_role`: `WIC_ROLE_CONSUMER`.
pub const WIC_ROLE_CONSUMER: u32 = 2;

/// The `enum wic_role` value of `role`.
pub fn role_to_c(role: Role) -> u32 {
    match role {
        Role::Owner => WIC_ROLE_OWNER,
        Role::Producer => WIC_ROLE_PRODUCER,
        Role::Consumer => WIC_ROLE_CONSUMER,
    }
}

/// The role an `enum wic_role` value names, if any.
pub fn role_from_c(value: i64) -> Option<Role> {
    match value {
        v if v == i64::from(WIC_ROLE_OWNER) => Some(Role::Owner),
        v if v == i64::from(WIC_ROLE_PRODUCER) => Some(Role::Producer),
        v if v == i64::from(WIC_ROLE_CONSUMER) => Some(Role::Consumer),
        _ => None,
    }
}

use wic_types::c_struct;

c_struct! {
    /// `struct wic_channel_spec`: what `wic_channel_create` creates.
    pub struct WicChannelSpec = "wic_channel_spec" {
        /// GPU whose warps consume the channel.
        pub consumer_gpu: u16,
        /// `WIC_PRODUCER_HOST` or `WIC_PRODUCER_GPU`.
        pub producer_kind: u16,
        /// Producer GPU (GPU producers only).
        pub producer_gpu: u16,
        /// Must be 0.
        pub reserved: u16,
        /// Bytes of one warp's message.
        pub message_bytes: u32,
        /// Slots of the channel.
        pub slots: u32,
        /// Where the producer GPU's message bytes are (GPU producers only).
        pub producer_base_va: u64,
        /// How long a consumer may wait for data; 0 for the daemon's default.
        pub timeout_ns: u64,
    }
}

c_struct! {
    /// `struct wic_slot_info`: one slot as the device library addresses it.
    pub struct WicSlotInfo = "wic_slot_info" {
        /// First VA of the run read by even and by odd generations.
        pub run_va: [u64; 2],
        /// The slot's PAT pages; 0 for host producers.
        pub pat_va: [u64; 2],
        /// The slot's tag.
        pub tag: u32,
        /// 0.
        pub reserved: u32,
    }
}

c_struct! {
    /// `struct wic_run`: a slot's run lent to its host producer to write in place.
    pub struct WicRun = "wic_run" {
        /// `void *`: the run, in the consumers' pages.
        pub data: usize,
        /// `uint64_t *`: the head word of each page.
        pub heads: usize,
        pub batch_bytes: u64,
        pub pages: u32,
        pub side: u32,
        pub slot: u32,
        /// 0.
        pub reserved: u32,
    }
}

c_struct! {
    /// `struct wic_channel_info`: the channel as the daemon laid it out.
    pub struct WicChannelInfo = "wic_channel_info" {
        pub channel_id: u32,
        /// An `enum wic_role` value.
        pub role: u32,
        pub slots: u32,
        pub message_bytes: u32,
        pub pages_per_run: u32,
        pub warps_per_batch: u32,
        /// Bytes one slot carries per generation.
        pub batch_bytes: u64,
    }
}

c_struct! {
    /// `struct wic_stats`: daemon statistics.
    pub struct WicStats = "wic_stats" {
        pub faults_captured: u64,
        pub faults_held: u64,
        pub faults_completed: u64,
        pub faults_timed_out: u64,
        pub faults_cancelled: u64,
        pub faults_ignored: u64,
        pub dab_updates: u64,
        pub pat_faults: u64,
        pub host_publishes: u64,
        pub fault_buffer_overflows: u64,
        pub replays: u64,
        pub wake_latency_count: u64,
        pub wake_latency_sum_ns: u64,
        pub wake_latency_max_ns: u64,
        pub pfq_depth: u32,
        pub pool_pages: u32,
        pub pool_pages_used: u32,
        pub pool_longest_free_run: u32,
        pub channels: u32,
        pub clients: u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_constants_are_the_negated_codes() {
        let named = [
            WIC_EINVALID,
            WIC_EPERMISSION,
            WIC_ENOT_FOUND,
            WIC_EEXHAUSTED,
            WIC_EBUSY,
            WIC_ETIMED_OUT,
            WIC_ECLOSED,
            WIC_ESTOPPING,
            WIC_EPROTOCOL,
            WIC_ECONNECT,
            WIC_EUNSUPPORTED,
            WIC_EIO,
            WIC_ESTALE,
            WIC_ESTREAM,
        ];
        assert_eq!(named.len(), ErrorCode::ALL.len());
        for (value, code) in named.into_iter().zip(ErrorCode::ALL) {
            assert_eq!(ErrorCode::from_c(value), Some(code));
        }
    }

    #[test]
    fn roles_round_trip() {
        for role in [Role::Owner, Role::Producer, Role::Consumer] {
            assert_eq!(role_from_c(i64::from(role_to_c(role))), Some(role));
        }
        assert_eq!(role_from_c(3), None);
        assert_eq!(role_from_c(-1), None);
    }

    #[test]
    fn version_matches_the_package() {
        let version = format!("{WIC_VERSION_MAJOR}.{WIC_VERSION_MINOR}.{WIC_VERSION_PATCH}");
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn field_lists_are_complete() {
        assert_eq!(WicChannelSpec::FIELDS.len(), 8);
        assert_eq!(std::mem::size_of::<WicChannelSpec>(), 32);
        assert_eq!(std::mem::size_of::<WicSlotInfo>(), 40);
        assert_eq!(std::mem::size_of::<WicChannelInfo>(), 32);
        assert_eq!(WicStats::FIELDS.len(), 20);
    }
}
