//! Differential: the shim's checks of a `WIC_IOC_SUBMIT` batch and of each of its commands
//! (`shim/wic_validate.h`, compiled from C) against the rules of `wic_abi.h`
//! (`src/abi_model.rs`): both must accept the same batches and commands, and refuse the others
//! with the same errno. See `wic_fuzz::differential::submit_validation`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use wic_fuzz::abi_inputs::SubmitInput;

fuzz_target!(|input: SubmitInput| {
    wic_fuzz::differential::submit_validation(&input);
});
