//! How consumer warps wait for their data, mode by mode: WIC's faults on the run's pages,
//! push's ready words in device memory, the paper's Algorithm 1 polling a managed flag.

use super::*;

impl Sim<'_> {
    pub(super) fn wic_request(&mut self, warp: u32) {
        let slot = self.slot_of(warp);
        let state = &self.phases[self.phase];
        let generation = state.consumed[slot as usize];
        let layout = state.channel.as_ref().expect("fault mode has channels");
        let va = layout.slots[slot as usize].runs[(generation % 2) as usize];
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        if self.access(Agent::Warp(warp), gpu, sm, va, AccessType::Read) {
            self.wic_read(warp, va);
        } else if self.warps[warp as usize].state != WarpState::Waiting {
            self.set_waiting(warp, WarpState::Waiting);
        }
    }

    /// A warp's own message in an exchange under WIC, as wic.cuh sends to another GPU: its
    /// store to its slot's PAT page of the reverse channel, write-protected, so it faults on its
    /// own GPU, shares that GPU's fault buffer and bottom half with the receiving warps' faults,
    /// and stalls until wicd services the PAT page. The other GPU's consumer of the message
    /// waits for it already (the exchange is symmetric): its fault on the reverse channel's run
    /// is raised with the first send of a generation, so that wicd completes the message to it
    /// in the same submissions as the rest. The warps of a block send one message together.
    pub(super) fn wic_send(&mut self, warp: u32) {
        let (cta, sent) = (self.warps[warp as usize].cta, self.warps[warp as usize].sent);
        let phase = &self.current().phase;
        let (slot, warps) = ((cta * phase.requests_per_warp + sent - 1) as usize, u64::from(phase.warps_per_cta));
        let state = &mut self.phases[self.phase];
        let send = Send {
            warp,
            slot,
            generation: state.reverse_sent[slot] / warps,
            first: state.reverse_sent[slot] % warps == 0,
        };
        state.reverse_sent[slot] += 1;
        self.send_write(send);
    }

    /// The store of `send`, once the other GPU has its slot's previous generation: a producer
    /// may not write a generation before the one before it is consumed (wic.cuh's flow control;
    /// the engine would take the write for a stale one). Until then the warp waits, not stalled
    /// on a fault, for the completion that maps that run on the other GPU.
    pub(super) fn send_write(&mut self, send: Send) {
        let Endpoint::Gpu(other) = self.current().phase.producer else { unreachable!("an exchange is between GPUs") };
        let cta = &self.ctas[self.warps[send.warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        let layout = self.phases[self.phase].reverse.as_ref().expect("fault mode opens an exchange's reverse channel");
        let side = (send.generation % 2) as usize;
        let slot = &layout.slots[send.slot];
        let (run, previous, pat) =
            (slot.runs[side], slot.runs[1 - side], slot.pat.expect("a GPU producer's slot")[side]);
        let daemon = self.daemon.as_mut().expect("fault mode");
        if send.generation > 0 && !daemon.mapped.contains(&(other, previous)) {
            daemon.waiting_sends.entry((other, previous)).or_default().push(send);
            return;
        }
        if send.first {
            let other_sm = send.slot as u32 % self.cal.gpu.sms.value;
            if self.access(Agent::Mirror, other, other_sm, run, AccessType::Read) {
                self.stopped = Some(format!("slot {}'s reverse run was still mapped on GPU {other}", send.slot));
                return;
            }
        }
        if self.access(Agent::Sender(send.warp), gpu, sm, pat, AccessType::Write) {
            if send.first {
                // As for a producer: an unnoticed write would never reach wicd.
                self.stopped =
                    Some(format!("slot {}'s sender found its PAT page still mapped{TIMEOUT_HINT}", send.slot));
                return;
            }
            self.schedule(self.now, Event::SendDone { warp: send.warp });
        }
    }

    pub(super) fn wic_read(&mut self, warp: u32, va: u64) {
        let slot = self.slot_of(warp);
        let bytes = self.daemon.as_mut().expect("fault mode").pcm.remove(&va).unwrap_or_default();
        self.receive(warp, &bytes);
        self.daemon.as_mut().expect("fault mode").pcm.insert(va, bytes);
        self.count_reader(slot);
    }

    pub(super) fn count_reader(&mut self, slot: u32) {
        let warps = self.current().phase.warps_per_cta;
        let state = &mut self.phases[self.phase];
        state.readers[slot as usize] += 1;
        if state.readers[slot as usize] == warps {
            state.readers[slot as usize] = 0;
            state.consumed[slot as usize] += 1;
        }
    }

    // ---- ready words (wic.cuh's push and poll on the stock driver; no-wait) -------------------

    /// The warp wants its slot's next generation: there already, or wait for it, as `waiting`:
    /// push's backoff (Waiting: no issue slot) or poll's spin (Polling). Neither faults.
    pub(super) fn ready_word_request(&mut self, warp: u32, waiting: WarpState) {
        let slot = self.slot_of(warp);
        let state = &mut self.phases[self.phase];
        if state.flag_visible[slot as usize] > state.consumed[slot as usize] {
            self.push_read(warp, slot);
            return;
        }
        state.ready_waiters[slot as usize].push(warp);
        self.set_waiting(warp, waiting);
    }

    pub(super) fn push_read(&mut self, warp: u32, slot: u32) {
        let state = &self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let bytes = state.buffer[slot as usize * batch..(slot as usize + 1) * batch].to_vec();
        self.receive(warp, &bytes);
        self.count_reader(slot);
    }

    pub(super) fn ready_arrives(&mut self, slot: u32) {
        let state = &mut self.phases[self.phase];
        state.flag_visible[slot as usize] += 1;
        let waiters = std::mem::take(&mut state.ready_waiters[slot as usize]);
        for warp in waiters {
            let cta = &self.ctas[self.warps[warp as usize].cta as usize];
            let (gpu, sm) = (cta.gpu, cta.sm);
            self.advance(gpu, sm);
            self.set_waiting(warp, WarpState::Computing);
            self.push_read(warp, slot);
            self.reschedule(gpu, sm);
        }
    }

    // ---- poll mode (Algorithm 1) ----------------------------------------------------------------

    pub(super) fn arrive_at_barrier(&mut self, warp: u32) {
        self.set_waiting(warp, WarpState::Waiting);
        let cta = self.warps[warp as usize].cta;
        let warps = self.current().phase.warps_per_cta;
        let c = &mut self.ctas[cta as usize];
        c.arrived += 1;
        if c.arrived == warps {
            c.arrived = 0;
            c.poll = PollStage::Flag;
            self.poll_step(cta);
        }
    }

    pub(super) fn flag_va(&self, slot: u32) -> u64 {
        FLAG_BASE + self.phase as u64 * PHASE_SPAN + u64::from(slot) * PAGE_SIZE
    }

    pub(super) fn data_va(&self, slot: u32) -> u64 {
        DATA_BASE + self.phase as u64 * PHASE_SPAN + u64::from(slot) * data_stride(&self.current().phase) * PAGE_SIZE
    }

    /// Thread 0 of the CTA: read the flag until it is set, then read the data.
    pub(super) fn poll_step(&mut self, cta: u32) {
        let c = &self.ctas[cta as usize];
        let (gpu, sm, poller) = (c.gpu, c.sm, c.first_warp);
        let slot = self.slot_of(poller);
        if c.poll == PollStage::Flag {
            if !self.access(Agent::Warp(poller), gpu, sm, self.flag_va(slot), AccessType::AtomicStrong) {
                return;
            }
            let state = &self.phases[self.phase];
            if state.flag_visible[slot as usize] <= state.consumed[slot as usize] {
                self.ctas[cta as usize].poll = PollStage::Spinning;
                self.phases[self.phase].spinning_cta[slot as usize] = Some(cta);
                self.advance(gpu, sm);
                self.set_waiting(poller, WarpState::Polling);
                self.reschedule(gpu, sm);
                return;
            }
            self.ctas[cta as usize].poll = PollStage::Data;
        }
        if !self.access(Agent::Warp(poller), gpu, sm, self.data_va(slot), AccessType::Read) {
            return;
        }
        let state = &self.phases[self.phase];
        let batch = state.phase.warps_per_cta as usize * state.phase.message_bytes as usize;
        let bytes = state.buffer[slot as usize * batch..(slot as usize + 1) * batch].to_vec();
        self.advance(gpu, sm);
        let first = self.ctas[cta as usize].first_warp;
        for warp in first..first + self.current().phase.warps_per_cta {
            self.set_waiting(warp, WarpState::Computing);
            self.receive(warp, &bytes);
        }
        let state = &mut self.phases[self.phase];
        state.consumed[slot as usize] += 1;
        self.reschedule(gpu, sm);
    }

    pub(super) fn flag_visible(&mut self, slot: u32) {
        let producer = self.current().phase.producer;
        let state = &mut self.phases[self.phase];
        state.flag_visible[slot as usize] = state.produced[slot as usize];
        state.flag_loc[slot as usize] = producer.into();
        state.data_loc[slot as usize] = producer.into();
        if let Some(cta) = state.spinning_cta[slot as usize].take() {
            let c = &self.ctas[cta as usize];
            let (gpu, sm, poller) = (c.gpu, c.sm, c.first_warp);
            self.advance(gpu, sm);
            self.set_waiting(poller, WarpState::Waiting);
            self.reschedule(gpu, sm);
            self.ctas[cta as usize].poll = PollStage::Flag;
            self.poll_step(cta);
        }
    }
}
