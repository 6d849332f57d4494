//! The two differential runs: the shim's checks (`shim/wic_validate.h`, compiled from C, see
//! [`crate::shim`]) and the rules of `wic_abi.h` ([`crate::abi_model`]) on the same structured
//! input ([`crate::abi_inputs`]). Each panics at the first verdict on which they differ, and
//! returns the verdicts it saw.

use wic_kabi::{WicRange, WIC_MAX_SPACES, WIC_PAGE_SIZE, WIC_RANGE_PCM};

use crate::abi_inputs::{space_id, IdSpec, RangeOp, RangesInput, SubmitInput, MANY_STEP, SUBMIT_SPACES};
use crate::{abi_model, shim};

/// What one run decided.
#[derive(Debug, Default)]
pub struct Verdicts {
    /// The batch's verdict (`submit_validation` only).
    pub batch: Option<Result<(), i32>>,
    /// Each command's or call's verdict, in order.
    pub calls: Vec<Result<(), i32>>,
}

/// A batch and its commands, against ranges registered first through the shim's register path
/// in spaces 1 to [`SUBMIT_SPACES`] of a process that maps everything.
pub fn submit_validation(input: &SubmitInput) -> Verdicts {
    let mut session = shim::Session::default();
    for id in 1..=SUBMIT_SPACES {
        session.attach(id);
    }
    let everything = [[0, u64::MAX]];
    let mut ranges = Vec::new();
    for spec in &input.ranges {
        let request = spec.request();
        if session.register(&request, &everything).is_ok() {
            ranges.push((request.space_id, request.start));
        }
    }

    let sub = input.batch.request(input.commands.len());
    let batch = shim::check_submit(&sub);
    assert_eq!(batch, abi_model::submit(&sub), "{sub:?}");
    let mut verdicts = Verdicts { batch: Some(batch), calls: Vec::new() };
    for spec in &input.commands {
        let cmd = spec.command(&ranges);
        let space = session.ranges(cmd.space_id);
        let verdict = shim::check_command(&cmd, space);
        assert_eq!(verdict, abi_model::command(&cmd, space), "{cmd:?} in space {space:?}");
        verdicts.calls.push(verdict);
    }
    verdicts
}

/// Registers `r` on both sides; they must agree, range id included.
fn register(shim: &mut shim::Session, model: &mut abi_model::Session, r: &WicRange, mappings: &[[u64; 2]]) -> Result<u32, i32> {
    let verdict = shim.register(r, mappings);
    assert_eq!(verdict, model.register(r, mappings), "{r:?} in {mappings:?}");
    verdict
}

/// A sequence of calls, from a session with space 1 attached; after each step every space must
/// hold the same ranges on both sides.
pub fn shim_ranges(input: &RangesInput) -> Verdicts {
    let mappings = input.mm.mappings();
    let mut shim = shim::Session::default();
    let mut model = abi_model::Session::default();
    shim.attach(1);
    model.attach(1);
    let mut issued = Vec::new();
    let mut verdicts = Verdicts::default();
    for op in &input.ops {
        match *op {
            RangeOp::Attach(space) => {
                shim.attach(space_id(space));
                model.attach(space_id(space));
            }
            RangeOp::Detach(space) => {
                shim.detach(space_id(space));
                model.detach(space_id(space));
            }
            RangeOp::Register { space, kind, start, length, range_id, run_pages } => {
                let r = WicRange { space_id: space_id(space), kind: kind.value(), start: start.value(), length: length.value(), range_id, run_pages };
                let verdict = register(&mut shim, &mut model, &r, &mappings);
                issued.extend(verdict.ok());
                verdicts.calls.push(verdict.map(drop));
            }
            RangeOp::RegisterMany { space, first_page, count } => {
                // From the highest page down: each new range goes first in its space's table,
                // which keeps the shim's insertion scan short.
                for i in (0..u64::from(count) * MANY_STEP).rev() {
                    let start = (u64::from(first_page) + 2 * i) * WIC_PAGE_SIZE;
                    let r = WicRange { space_id: space_id(space), kind: WIC_RANGE_PCM, start, length: WIC_PAGE_SIZE, range_id: 0, run_pages: 0 };
                    let verdict = register(&mut shim, &mut model, &r, &mappings);
                    issued.extend(verdict.ok());
                    verdicts.calls.push(verdict.map(drop));
                }
            }
            RangeOp::Unregister(id) => {
                let range_id = match id {
                    IdSpec::Issued(n) => issued.get(usize::from(n) % issued.len().max(1)).copied().unwrap_or(0),
                    IdSpec::Raw(value) => value,
                };
                let verdict = shim.unregister(range_id);
                assert_eq!(verdict, model.unregister(range_id), "unregister {range_id}");
                verdicts.calls.push(verdict);
            }
        }
        // Ids 0 and WIC_MAX_SPACES + 1 check that neither side has spaces it should not.
        for id in 0..=WIC_MAX_SPACES + 1 {
            assert_eq!(shim.ranges(id).map(<[_]>::to_vec), model.ranges(id), "space {id} after {op:?}");
        }
    }
    verdicts
}
