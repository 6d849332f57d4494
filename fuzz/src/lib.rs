//! What the fuzz targets in `fuzz_targets/` share: the shim's argument checks compiled from C
//! ([`shim`]) and the model of the documented rules they are compared with ([`abi_model`]),
//! the structured inputs of the two differential targets ([`abi_inputs`]), and the fake fault
//! ring with its input format ([`ring`]). The differential runs live in [`differential`]; see
//! README.md for what each target checks.

pub mod abi_inputs;
pub mod abi_model;
pub mod differential;
pub mod ring;
pub mod shim;
