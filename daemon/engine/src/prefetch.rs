//! A cache prefetch hint for the fault path, which looks ahead at the state of the entries it is
//! about to handle so that their cache misses overlap instead of coming one entry at a time.

/// Starts loading the cache line that holds `value`. Only a hint: no result depends on it, and
/// on targets without the instruction it does nothing.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 reads nothing architecturally and cannot fault, and SSE, which it
    // needs, is part of the x86_64 baseline; the address comes from a live reference.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
