//! Differential: the shim's checks and bookkeeping of `WIC_IOC_REGISTER` and
//! `WIC_IOC_UNREGISTER` (`shim/wic_validate.h`, compiled from C) against the rules of
//! `wic_abi.h` (`src/abi_model.rs`), through a sequence of calls in a fake process: every call
//! must get the same verdict and range id from both, and every space must hold the same ranges
//! after every step. See `wic_fuzz::differential::shim_ranges`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wic_fuzz::abi_inputs::RangesInput;

fuzz_target!(|input: RangesInput| {
    wic_fuzz::differential::shim_ranges(&input);
});
