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
        state.produced_at[slot as usize] = self.now;
        self.slots_left -= 1;
        match (self.mode, state.phase.producer) {
            (Mode::Fault, Endpoint::Host) => {
                let side = (generation % 2) as u8;
                self.write_in_place(slot, side);
                let at = self.after(self.cal.daemon.publish_ns.value);
                self.schedule(at, Event::PublishArrives { slot, in_place: Some(side) });
            }
            (Mode::FaultCopy | Mode::FaultCopyEngine, Endpoint::Host) => {
                let at = self.after(self.cal.daemon.publish_ns.value);
                self.schedule(at, Event::PublishArrives { slot, in_place: None });
            }
            (Mode::Fault | Mode::FaultCopy | Mode::FaultCopyEngine, Endpoint::Gpu(gpu)) => {
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
            (Mode::Push | Mode::Poll, Endpoint::Host) => self.host_publish(slot, batch as u64),
            (Mode::Push | Mode::Poll, Endpoint::Gpu(gpu)) => {
                // The producer kernel's stores over the link, one batch after another at the
                // link's bandwidth, then (push) its fence and the ready word, or (poll) the
                // waiting warp's next read of the ready word across the link.
                let one_way = match self.mode {
                    Mode::Push => self.cal.push.peer_one_way_ns.value,
                    _ => self.cal.poll.peer_one_way_ns.value,
                };
                let link = &mut self.peer_link_free_at[gpu as usize];
                let start = self.now.max(*link);
                *link = start.saturating_add(transfer_ns(batch as u64, self.cal.link.nvlink_gbps.value));
                let at = link.saturating_add(one_way);
                self.schedule(at, Event::ReadyArrives { slot });
            }
            (Mode::NoWait, _) => self.ready_arrives(slot),
            (Mode::Alg1, Endpoint::Host) => {
                // The CPU's flag write faults if the page sits on the GPU (it does after a poll).
                let on_gpu = state.flag_loc[slot as usize] != Loc::Host;
                let cost = if on_gpu {
                    self.cal.fault.cpu_fault_ns.value.saturating_add(self.cal.pcie_ns(batch as u64))
                } else {
                    0
                };
                self.schedule(self.after(cost), Event::FlagVisible { slot });
            }
            (Mode::Alg1, Endpoint::Gpu(gpu)) => {
                let sm = slot % self.cal.gpu.sms.value;
                let flag = self.flag_va(slot);
                if self.access(Agent::Producer(slot), gpu, sm, flag, AccessType::AtomicStrong) {
                    self.flag_visible(slot);
                }
            }
        }
        self.maybe_finish_phase();
    }

    /// A host producer's in-place write of `slot`'s batch into its run `side`, the one the
    /// slot's generation reads (unmapped on the consumer GPU since the completion before):
    /// every byte but the first 8 of each page, which stay as they were until wicd's
    /// completion writes the head words from the producer's buffer ([`Sim::submit`]). These
    /// are the application's own stores, made while it makes the batch: the model charges the
    /// producer nothing for them, as it charges nothing for writing its buffer on the other
    /// paths (a producer's time is its workload's `produce_ns`).
    fn write_in_place(&mut self, slot: u32, side: u8) {
        let state = &self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let va = state.channel.as_ref().expect("fault mode has channels").slots[slot as usize].runs[side as usize];
        let bytes = &state.buffer[slot as usize * batch..(slot as usize + 1) * batch];
        let run = self.daemon.as_mut().expect("fault mode").pcm.entry(va).or_default();
        // A phase of smaller CTAs fills only the first part of the run, as a copy does.
        run.resize(batch, 0);
        for (run, bytes) in run.chunks_mut(PAGE_SIZE as usize).zip(bytes.chunks(PAGE_SIZE as usize)) {
            let head = HEAD_BYTES.min(bytes.len());
            run[head..].copy_from_slice(&bytes[head..]);
        }
    }

    /// A host producer's slot handed over: by the host thread, which publishes one call at a
    /// time, each call carrying the phase's `publish_slots` slots once the last of them is made
    /// (one copy over PCIe, which carries one copy at a time, then their ready words). Push: the
    /// words follow the copy in stream order, arriving the measured one way after the call
    /// began. Poll: the thread waits for the copy and writes the words in host memory, which the
    /// spinning warps read; both take longer the more warps spin on host memory.
    fn host_publish(&mut self, slot: u32, batch: u64) {
        let state = &mut self.phases[self.phase];
        if state.publish_group.is_empty() {
            // This slot and those still to come, up to a publish's worth (slots_left counts
            // this one out already).
            state.publish_size = state.phase.publish_slots.min(self.slots_left + 1);
        }
        state.publish_group.push(slot);
        if state.publish_group.len() < state.publish_size as usize {
            return;
        }
        let group = std::mem::take(&mut state.publish_group);
        let (one_way, publish) = match self.mode {
            Mode::Push => (self.cal.push.host_one_way_ns.value, self.cal.push.host_publish_ns.value),
            _ => {
                let poll = &self.cal.poll;
                let spinners = self.spinning_warps().saturating_sub(1);
                (
                    poll.host_one_way_ns.value.saturating_add(poll.host_one_way_per_spinner_ns.value * spinners),
                    poll.host_publish_ns.value.saturating_add(poll.host_publish_per_spinner_ns.value * spinners),
                )
            }
        };
        let start = self.now.max(self.host_publish_free_at);
        let copy_start = start.max(self.host_link_free_at);
        self.host_link_free_at =
            copy_start.saturating_add(transfer_ns(batch * group.len() as u64, self.cal.link.pcie_gbps.value));
        self.host_publish_free_at = match self.mode {
            Mode::Push => start.saturating_add(publish),
            _ => start.saturating_add(publish).max(self.host_link_free_at),
        };
        let arrives = self.host_link_free_at.saturating_add(one_way);
        for slot in group {
            self.schedule(arrives, Event::ReadyArrives { slot });
        }
    }

    /// Warps spinning on a ready word, on every GPU.
    fn spinning_warps(&self) -> u64 {
        self.gpus.iter().flat_map(|g| &g.sms).map(|s| u64::from(s.polling)).sum()
    }
}
