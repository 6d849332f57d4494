//! Producers: a slot's batch made, and published the way the mode does it.

use super::*;

impl Sim<'_> {
    pub(super) fn slot_produced(&mut self, slot: u32) {
        self.progress_at = self.steps;
        let state = &mut self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let generation = state.produced[slot as usize];
        let key = MessageKey { seed: self.seed, phase: self.phase as u32, slot, generation };
        key.fill(0, &mut state.buffer[slot as usize * batch..(slot as usize + 1) * batch]);
        state.produced[slot as usize] += 1;
        self.slots_left -= 1;
        match (self.mode, state.phase.producer) {
            (Mode::Fault, Endpoint::Host) => {
                self.schedule(self.after(self.cal.daemon.publish_ns.value), Event::PublishArrives { slot });
            }
            (Mode::Fault, Endpoint::Gpu(gpu)) => {
                let layout = state.channel.as_ref().expect("fault mode has channels");
                let pat =
                    layout.slots[slot as usize].pat.expect("GPU producer has PAT pages")[(generation % 2) as usize];
                let sm = slot % self.cal.gpu.sms.value;
                if self.access(Agent::Producer(slot), gpu, sm, pat, AccessType::Write) {
                    // A PAT page is write-protected until its fault is served, unless the re-arm
                    // of an earlier generation has not landed yet: the write would go unnoticed.
                    self.stopped =
                        Some(format!("slot {slot}'s producer found its PAT page still mapped{TIMEOUT_HINT}"));
                }
            }
            (Mode::Push, Endpoint::Host) => {
                // One publish (a copy and a ready word in stream order) by the host thread, which
                // publishes one batch at a time, arrives the measured one-way time of a small
                // message after it began, plus the rest of the batch's copy.
                let push = &self.cal.push;
                let start = self.now.max(self.host_publish_free_at);
                self.host_publish_free_at = start.saturating_add(push.host_publish_ns.value);
                let at = start
                    .saturating_add(push.host_one_way_ns.value)
                    .saturating_add(transfer_ns(batch as u64, self.cal.link.pcie_gbps.value));
                self.schedule(at, Event::ReadyArrives { slot });
            }
            (Mode::Push, Endpoint::Gpu(gpu)) => {
                // The producer kernel's stores over the link, one batch after another at the
                // link's bandwidth, then its fence and the ready word.
                let link = &mut self.peer_link_free_at[gpu as usize];
                let start = self.now.max(*link);
                *link = start.saturating_add(transfer_ns(batch as u64, self.cal.link.nvlink_gbps.value));
                let at = link.saturating_add(self.cal.push.peer_one_way_ns.value);
                self.schedule(at, Event::ReadyArrives { slot });
            }
            (Mode::Poll, Endpoint::Host) => {
                // The CPU's flag write faults if the page sits on the GPU (it does after a poll).
                let on_gpu = state.flag_loc[slot as usize] != Loc::Host;
                let cost = if on_gpu {
                    self.cal.fault.cpu_fault_ns.value.saturating_add(self.cal.pcie_ns(batch as u64))
                } else {
                    0
                };
                self.schedule(self.after(cost), Event::FlagVisible { slot });
            }
            (Mode::Poll, Endpoint::Gpu(gpu)) => {
                let sm = slot % self.cal.gpu.sms.value;
                let flag = self.flag_va(slot);
                if self.access(Agent::Producer(slot), gpu, sm, flag, AccessType::AtomicStrong) {
                    self.flag_visible(slot);
                }
            }
        }
        self.maybe_finish_phase();
    }
}
