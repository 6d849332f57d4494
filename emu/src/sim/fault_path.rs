//! The UVM replayable-fault path: the fault buffer, the bottom half in batches, the global replay,
//! and managed pages that migrate on faults.

use super::*;

impl Sim<'_> {
    /// Whether `gpu` can access `va` now; if not, the agent stalls and a fault packet is raised
    /// unless its SM already has one outstanding for that page.
    pub(super) fn access(&mut self, agent: Agent, gpu: u16, sm: u32, va: u64, access: AccessType) -> bool {
        if self.accessible(gpu, va) {
            return true;
        }
        if let Agent::Warp(_) | Agent::Sender(_) = agent {
            self.advance(gpu, sm);
            self.gpus[gpu as usize].sms[sm as usize].fault_stalled += 1;
            self.reschedule(gpu, sm);
        }
        self.gpus[gpu as usize].faults.stalled.entry(va).or_default().push((agent, sm));
        self.raise(gpu, sm, va, access);
        false
    }

    pub(super) fn accessible(&self, gpu: u16, va: u64) -> bool {
        if let Some(daemon) = &self.daemon {
            if daemon.engine.owns(va) {
                return daemon.mapped.contains(&(gpu, va));
            }
        }
        *self.managed_loc(va) == Loc::Gpu(gpu)
    }

    pub(super) fn managed_loc(&self, va: u64) -> &Loc {
        let state = &self.phases[self.phase];
        match managed_page(&state.phase, va) {
            (slot, true) => &state.data_loc[slot],
            (slot, false) => &state.flag_loc[slot],
        }
    }

    pub(super) fn set_managed_loc(&mut self, va: u64, loc: Loc) {
        let state = &mut self.phases[self.phase];
        match managed_page(&state.phase, va) {
            (slot, true) => state.data_loc[slot] = loc,
            (slot, false) => state.flag_loc[slot] = loc,
        }
    }

    pub(super) fn raise(&mut self, gpu: u16, sm: u32, va: u64, access: AccessType) {
        self.steps += 1;
        let path = &mut self.gpus[gpu as usize].faults;
        if !path.outstanding.insert((sm, va)) {
            return;
        }
        if path.buffer.len() >= self.cal.fault.buffer_entries.value as usize {
            // The uTLB keeps the request; it is raised again at the next replay.
            path.outstanding.remove(&(sm, va));
            self.stats.overflows += 1;
            return;
        }
        let sms = self.cal.gpu.sms.value;
        let entry = FaultEntry::replayable_gpc(
            va,
            access,
            self.now,
            0x10_0000 * (u64::from(gpu) + 1),
            (sm * 8 / sms) as u8,
            (sm % 19) as u8,
        );
        path.buffer.push_back((entry.encode(), va));
        self.stats.gpu_faults += 1;
        if !path.bh_active {
            path.bh_active = true;
            self.schedule(self.after(self.cal.fault.interrupt_to_bh_ns.value), Event::BhRun { gpu });
        }
    }

    pub(super) fn bh_run(&mut self, gpu: u16) {
        let max = self.cal.fault.batch_max.value as usize;
        let path = &mut self.gpus[gpu as usize].faults;
        let n = path.buffer.len().min(max);
        path.batch = path.buffer.drain(..n).collect();
        let f = &self.cal.fault;
        let mut cost = f.batch_fixed_ns.value.saturating_add(f.per_fault_ns.value.saturating_mul(n as u64));
        let mut migrated = HashSet::new();
        for (_, va) in &self.gpus[gpu as usize].faults.batch {
            if !self.wic_owned(*va) && migrated.insert(*va) {
                cost = cost.saturating_add(self.migration_ns(gpu, *va));
            }
        }
        self.stats.batches += 1;
        self.schedule(self.after(cost), Event::BatchDone { gpu });
    }

    pub(super) fn wic_owned(&self, va: u64) -> bool {
        self.daemon.as_ref().is_some_and(|d| d.engine.owns(va))
    }

    /// Time to migrate a managed page (a flag page, or a whole data region) to `gpu`.
    pub(super) fn migration_ns(&self, gpu: u16, va: u64) -> u64 {
        let phase = &self.current().phase;
        let bytes = match managed_page(phase, va) {
            (_, true) => u64::from(phase.warps_per_cta) * u64::from(phase.message_bytes),
            (_, false) => PAGE_SIZE,
        };
        match *self.managed_loc(va) {
            Loc::Host => self.cal.pcie_ns(bytes),
            Loc::Gpu(g) if g == gpu => 0,
            Loc::Gpu(_) => self.cal.nvlink_ns(bytes),
        }
    }

    pub(super) fn batch_done(&mut self, gpu: u16) {
        let batch = std::mem::take(&mut self.gpus[gpu as usize].faults.batch);
        let mut held = Vec::new();
        let mut serviced = false;
        for (raw, va) in &batch {
            if self.wic_owned(*va) {
                held.push(*raw);
            } else {
                serviced = true;
                self.set_managed_loc(*va, Loc::Gpu(gpu));
            }
        }
        if !held.is_empty() {
            self.daemon_input(DaemonInput::Faults(gpu, held));
        }
        // The hook skips the replay of a batch that holds only WIC faults (no refault storm).
        if serviced {
            self.schedule(self.after(self.cal.fault.replay_ns.value), Event::Replay { gpu, resume_bh: true });
        } else {
            self.continue_bh(gpu);
        }
    }

    pub(super) fn continue_bh(&mut self, gpu: u16) {
        let path = &mut self.gpus[gpu as usize].faults;
        if path.buffer.is_empty() {
            path.bh_active = false;
        } else {
            self.schedule(self.now, Event::BhRun { gpu });
        }
    }

    /// A replay is global: every stalled request retries; those still unmapped fault again.
    /// The driver's default policy (BATCH_FLUSH) first discards what the buffer holds, since
    /// every unserved request raises a fresh entry after the replay anyway.
    pub(super) fn replay(&mut self, gpu: u16, resume_bh: bool) {
        self.stats.replays += 1;
        let path = &mut self.gpus[gpu as usize].faults;
        self.stats.flushed += path.buffer.len() as u64;
        path.buffer.clear();
        path.outstanding.clear();
        let stalled = std::mem::take(&mut path.stalled);
        let mut pages: Vec<_> = stalled.into_iter().collect();
        pages.sort_unstable_by_key(|(va, _)| *va);
        for (va, agents) in pages {
            if !self.accessible(gpu, va) {
                for (_, sm) in &agents {
                    self.raise(gpu, *sm, va, AccessType::Read);
                }
                // Merged: an agent resumed earlier in this loop may have stalled here already.
                self.gpus[gpu as usize].faults.stalled.entry(va).or_default().extend(agents);
                continue;
            }
            for (agent, _) in agents {
                self.resume(agent, va);
            }
        }
        if resume_bh {
            self.continue_bh(gpu);
        }
    }

    /// A fault-stalled warp's page is there: its SM has one stalled warp less from now.
    /// Returns the SM, to reschedule once the warp has gone on.
    fn unstall(&mut self, warp: u32) -> (u16, u32) {
        let cta = &self.ctas[self.warps[warp as usize].cta as usize];
        let (gpu, sm) = (cta.gpu, cta.sm);
        self.advance(gpu, sm);
        self.gpus[gpu as usize].sms[sm as usize].fault_stalled -= 1;
        (gpu, sm)
    }

    pub(super) fn resume(&mut self, agent: Agent, va: u64) {
        match agent {
            Agent::Producer(slot) => {
                if self.mode == Mode::Alg1 {
                    self.flag_visible(slot);
                }
            }
            Agent::Mirror => {}
            Agent::Sender(warp) => {
                let (gpu, sm) = self.unstall(warp);
                self.reschedule(gpu, sm);
                self.send_done(warp);
            }
            Agent::Warp(warp) => {
                let id = self.warps[warp as usize].cta;
                let (gpu, sm) = self.unstall(warp);
                match self.mode {
                    Mode::Fault | Mode::FaultCopy | Mode::FaultCopyEngine => {
                        self.set_waiting(warp, WarpState::Computing);
                        self.wic_read(warp, va);
                    }
                    Mode::Alg1 => self.poll_step(id),
                    Mode::Push | Mode::Poll | Mode::NoWait => unreachable!("ready-word waiters never fault"),
                }
                self.reschedule(gpu, sm);
            }
        }
    }
}
