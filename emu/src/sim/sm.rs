//! SMs: issue shared among the resident warps, and what a fault-stalled warp costs the others;
//! a warp's compute segments, its requests, and the messages it receives.

use super::*;

/// Instructions per cycle of each of `computing` warps of an SM beside `polling` spinning ones:
/// processor sharing of the SM's issue slots.
fn issue_ipc(cal: &Calibration, computing: f64, polling: f64) -> f64 {
    let g = &cal.gpu;
    let demand = computing + cal.poll.issue_weight.value * polling;
    if demand > 0.0 {
        g.warp_ipc.value.min(f64::from(g.schedulers_per_sm.value) / demand)
    } else {
        0.0
    }
}

/// Speed, relative to alone, of work that spends `memory_share` of its time alone on memory
/// accesses leaving the SM, on an SM where a warp is stalled on a fault or warps spin on host
/// memory: the same rule for the SM's own warps and for another kernel's beside them.
fn progress_beside(cal: &Calibration, fault_stalled: bool, host_spinners: bool, memory_share: f64) -> f64 {
    if fault_stalled {
        return cal.stall.progress(memory_share);
    }
    if host_spinners {
        return cal.poll.progress_beside_host_spinners(memory_share);
    }
    1.0
}

/// Another kernel's warps on every SM beside the run's (`try_run_beside`): how many (at least
/// one counts), and the share of their time alone spent on memory accesses that leave the SM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbour {
    pub warps: u32,
    pub memory_share: f64,
}

impl Sim<'_> {
    pub(super) fn rate(&self, sm: &Sm) -> f64 {
        let ipc = issue_ipc(self.cal, f64::from(sm.computing), f64::from(sm.polling));
        ipc * self.cal.gpu.clock_ghz.value * self.stall_progress(sm)
    }

    /// Whether the SM's polling warps spin on a ready word in host memory (poll with a host
    /// producer).
    fn host_spinners(&self, sm: &Sm) -> bool {
        sm.polling > 0 && self.mode == Mode::Poll && self.current().phase.producer == Endpoint::Host
    }

    /// The computing warps' speed relative to alone: below 1 while a warp of the SM is stalled
    /// on a fault, or spins on a ready word in host memory (poll with a host producer).
    pub(super) fn stall_progress(&self, sm: &Sm) -> f64 {
        progress_beside(self.cal, sm.fault_stalled > 0, self.host_spinners(sm), self.current().phase.memory_share)
    }

    /// A neighbour's speed on the SM relative to alone: its warps share issue with the SM's
    /// computing and polling warps, and make the progress beside their stalls and spinning that
    /// the SM's own work makes.
    pub(super) fn neighbour_speed(&self, sm: &Sm, n: &Neighbour) -> f64 {
        let own = f64::from(n.warps.max(1));
        let alone = issue_ipc(self.cal, own, 0.0);
        let beside = issue_ipc(self.cal, own + f64::from(sm.computing), f64::from(sm.polling));
        beside / alone * progress_beside(self.cal, sm.fault_stalled > 0, self.host_spinners(sm), n.memory_share)
    }

    pub(super) fn advance(&mut self, gpu: u16, sm: u32) {
        let rate = self.rate(&self.gpus[gpu as usize].sms[sm as usize]);
        let progress = self.stall_progress(&self.gpus[gpu as usize].sms[sm as usize]);
        let weight = self.cal.poll.issue_weight.value;
        let speeds: Vec<f64> = self
            .neighbours
            .iter()
            .map(|n| self.neighbour_speed(&self.gpus[gpu as usize].sms[sm as usize], n))
            .collect();
        let now = self.now;
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        let dt = (now - s.last) as f64;
        s.last = now;
        s.neighbour_work.resize(speeds.len(), 0.0);
        for (work, speed) in s.neighbour_work.iter_mut().zip(speeds) {
            *work += dt * speed;
        }
        if s.computing > 0 {
            s.vtime += rate * dt;
        }
        if s.resident_ctas > 0 {
            s.occupied_ns += dt;
        }
        if s.waiting + s.polling > 0 {
            s.wait_ns += dt;
            if s.computing > 0 {
                // Useful work: the computing warps' share of issue, at their speed beside stalls.
                let c = f64::from(s.computing);
                s.overlap_ns += dt * progress * c / (c + weight * f64::from(s.polling));
            }
        }
    }

    pub(super) fn reschedule(&mut self, gpu: u16, sm: u32) {
        let rate = self.rate(&self.gpus[gpu as usize].sms[sm as usize]);
        let now = self.now;
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        s.version += 1;
        let version = s.version;
        if let Some(Reverse((finish, _))) = s.heap.peek() {
            let left = (f64::from_bits(*finish) - s.vtime).max(0.0);
            let at = now.saturating_add((left / rate).ceil() as u64);
            self.schedule(at, Event::SmDone { gpu, sm, version });
        }
    }

    pub(super) fn start_compute(&mut self, warp: u32, instr: u64) {
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        let w = &mut self.warps[warp as usize];
        w.state = WarpState::Computing;
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        let finish = s.vtime + instr as f64 * w.scale;
        s.heap.push(Reverse((finish.to_bits(), warp)));
        s.computing += 1;
    }

    pub(super) fn sm_done(&mut self, gpu: u16, sm: u32, version: u64) {
        if self.gpus[gpu as usize].sms[sm as usize].version != version {
            return;
        }
        self.advance(gpu, sm);
        let mut done = Vec::new();
        let s = &mut self.gpus[gpu as usize].sms[sm as usize];
        while let Some(Reverse((finish, warp))) = s.heap.peek().copied() {
            if f64::from_bits(finish) > s.vtime + 1e-3 {
                break;
            }
            s.heap.pop();
            s.computing -= 1;
            done.push(warp);
        }
        for warp in done {
            self.segment_done(warp);
        }
        self.reschedule(gpu, sm);
    }

    pub(super) fn set_waiting(&mut self, warp: u32, state: WarpState) {
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let s = &mut self.gpus[cta.gpu as usize].sms[cta.sm as usize];
        match self.warps[warp as usize].state {
            WarpState::Waiting => s.waiting -= 1,
            WarpState::Polling => s.polling -= 1,
            WarpState::Computing | WarpState::Done => {}
        }
        match state {
            WarpState::Waiting => s.waiting += 1,
            WarpState::Polling => s.polling += 1,
            WarpState::Computing | WarpState::Done => {}
        }
        self.warps[warp as usize].state = state;
    }

    /// A warp finished a compute segment: send its own message back (exchanges), request, or
    /// exit.
    pub(super) fn segment_done(&mut self, warp: u32) {
        self.progress_at = self.steps;
        let w = &self.warps[warp as usize];
        let communicates = self.ctas[w.cta as usize].communicates;
        if self.current().phase.sends_back && communicates && w.requests > w.sent && self.mode != Mode::NoWait {
            self.warps[warp as usize].sent += 1;
            self.stats.sends += 1;
            self.set_waiting(warp, WarpState::Waiting);
            match self.mode {
                Mode::Fault | Mode::FaultCopy | Mode::FaultCopyEngine => self.wic_send(warp),
                _ => self.schedule(self.after(self.send_ns()), Event::SendDone { warp }),
            }
            return;
        }
        let (cta, requests) = (self.warps[warp as usize].cta, self.warps[warp as usize].requests);
        let phase = &self.current().phase;
        let (per_warp, c2, warps_per_cta) = (phase.requests_per_warp, phase.c2_instr, phase.warps_per_cta);
        if requests < per_warp {
            if !self.ctas[cta as usize].communicates {
                // Warps of a CTA that does not communicate run their dependent work unblocked.
                self.warps[warp as usize].requests = per_warp;
                self.start_compute(warp, c2 * u64::from(per_warp));
                return;
            }
            match self.mode {
                Mode::Fault | Mode::FaultCopy | Mode::FaultCopyEngine => self.wic_request(warp),
                Mode::Alg1 => self.arrive_at_barrier(warp),
                Mode::Push | Mode::NoWait => self.ready_word_request(warp, WarpState::Waiting),
                Mode::Poll => self.ready_word_request(warp, WarpState::Polling),
            }
            return;
        }
        self.set_waiting(warp, WarpState::Done);
        let c = &mut self.ctas[cta as usize];
        c.finished += 1;
        if c.finished == warps_per_cta {
            let (gpu, sm) = (c.gpu, c.sm);
            self.ctas_left -= 1;
            self.gpus[gpu as usize].sms[sm as usize].resident_ctas -= 1;
            self.dispatch_cta(gpu, sm);
            self.maybe_finish_phase();
        }
    }

    pub(super) fn slot_of(&self, warp: u32) -> u32 {
        let w = &self.warps[warp as usize];
        w.cta * self.current().phase.requests_per_warp + w.requests
    }

    pub(super) fn message_key(&self, slot: u32, generation: u64) -> MessageKey {
        MessageKey { seed: self.seed, phase: self.phase as u32, slot, generation }
    }

    /// The warp has its data (or an error marker) at hand: check it and run C2.
    pub(super) fn receive(&mut self, warp: u32, bytes: &[u8]) {
        self.progress_at = self.steps;
        let slot = self.slot_of(warp);
        let state = &self.phases[self.phase];
        let generation = state.consumed[slot as usize];
        let key = self.message_key(slot, generation);
        let msg = state.phase.message_bytes as usize;
        let offset = self.warps[warp as usize].lane as usize * msg;
        let marker = bytes.get(..8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        if marker.and_then(ErrorMarker::from_word).is_some() {
            self.stats.markers += 1;
        } else if !bytes.get(offset..offset + msg).is_some_and(|got| key.matches(offset as u64, got)) {
            self.stats.corrupt += 1;
        }
        self.stats.messages += 1;
        self.stats.bytes += msg as u64;
        self.stats.delivery_ns += self.now.saturating_sub(state.produced_at[slot as usize]) as f64;
        let c2 = self.current().phase.c2_instr;
        self.warps[warp as usize].requests += 1;
        self.start_compute(warp, c2);
    }

    /// The warp's own message is out: on with what follows its work.
    pub(super) fn send_done(&mut self, warp: u32) {
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        self.advance(gpu, sm);
        self.set_waiting(warp, WarpState::Computing);
        self.segment_done(warp);
        self.reschedule(gpu, sm);
    }

    /// How long a warp's send to another GPU keeps it, except under WIC, where it is a PAT fault
    /// of its own (`Sim::wic_send`): its message across the link, then its transport's measured one way (the
    /// fence before the ready word waits for the stores: G_STN_TRACE measured a send of about the
    /// one way on 2 x H100 and 2 x H200); alg1's release store waits as push's fence does.
    pub(super) fn send_ns(&self) -> Nanos {
        let link = transfer_ns(u64::from(self.current().phase.message_bytes), self.cal.link.nvlink_gbps.value);
        match self.mode {
            Mode::Push | Mode::Alg1 => link.saturating_add(self.cal.push.peer_one_way_ns.value),
            Mode::Poll => link.saturating_add(self.cal.poll.peer_one_way_ns.value),
            Mode::NoWait => 0,
            Mode::Fault | Mode::FaultCopy | Mode::FaultCopyEngine => {
                unreachable!("under WIC a send is a PAT fault of its own (Sim::wic_send)")
            }
        }
    }
}
