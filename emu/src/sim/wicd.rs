//! wicd: faults and publishes into the real engine, its commands landing on the emulated GPUs.

use super::*;

impl Sim<'_> {
    pub(super) fn daemon_input(&mut self, input: DaemonInput) {
        let daemon = self.daemon.as_mut().expect("fault mode");
        daemon.inbox.push_back(input);
        if !daemon.awake {
            daemon.awake = true;
            self.schedule(self.after(self.cal.daemon.wakeup_ns.value), Event::DaemonRun);
        }
    }

    /// wicd drains its inbox through the engine and executes the commands one after another.
    pub(super) fn daemon_run(&mut self) {
        let cal = self.cal;
        let mut t = self.now;
        let phase = self.phase;
        let daemon = self.daemon.as_mut().expect("fault mode");
        let mut out = std::mem::take(&mut daemon.commands);
        while let Some(input) = daemon.inbox.pop_front() {
            match input {
                DaemonInput::Faults(gpu, entries) => {
                    t = t.saturating_add(cal.daemon.engine_per_entry_ns.value.saturating_mul(entries.len() as u64));
                    daemon.engine.handle_faults(t, gpu, &entries, &mut out);
                }
                DaemonInput::Publish(slot) => {
                    t = t.saturating_add(cal.daemon.engine_per_entry_ns.value);
                    let id = self.phases[phase].channel.as_ref().expect("fault mode").id;
                    if let Err(e) = daemon.engine.publish(t, id, slot, &mut out) {
                        self.stopped = Some(format!("publish: {e}{TIMEOUT_HINT}"));
                    }
                }
                DaemonInput::PublishInPlace(slot, side) => {
                    t = t.saturating_add(cal.daemon.engine_per_entry_ns.value);
                    let id = self.phases[phase].channel.as_ref().expect("fault mode").id;
                    if let Err(e) = daemon.engine.publish_in_place(t, id, slot, side, &mut out) {
                        self.stopped = Some(format!("publish in place: {e}{TIMEOUT_HINT}"));
                    }
                }
            }
        }
        daemon.engine.expire(t, &mut out);
        if !out.is_empty() {
            t = self.submit(&mut out, t);
        }
        let daemon = self.daemon.as_mut().expect("fault mode");
        daemon.commands = out;
        daemon.busy_ns += t - self.now;
        self.schedule(t, Event::DaemonIdle);
    }

    pub(super) fn daemon_idle(&mut self) {
        let daemon = self.daemon.as_mut().expect("fault mode");
        if daemon.inbox.is_empty() {
            daemon.awake = false;
        } else {
            self.schedule(self.now, Event::DaemonRun);
        }
    }

    /// Executes one engine step's commands as one batched submission starting at `at`; returns
    /// when wicd's thread is done with it. Copies over one link pipeline (one latency per link
    /// per submission); mapping changes land in order when the submission completes, replays
    /// after that. wicd's thread copies a host producer's batch itself ([`Mode::FaultCopy`]),
    /// or only the head words of an in-place batch, 8 bytes a page ([`Mode::Fault`]); with
    /// the copy engine ([`Mode::FaultCopyEngine`]) the batch is a DMA over PCIe that starts
    /// once the submission reached the module and leaves wicd's thread free, and the mapping
    /// changes land when both it and the thread's part are done.
    pub(super) fn submit(&mut self, commands: &mut Vec<Command>, at: Nanos) -> Nanos {
        let cal = self.cal;
        let copy_engine = self.mode == Mode::FaultCopyEngine;
        let state = &self.phases[self.phase];
        // The engine lays a channel's slots out by its batch, the workload's largest CTA's; a
        // phase of smaller CTAs fills the first part of each.
        let batch = u64::from(state.phase.warps_per_cta) * u64::from(state.phase.message_bytes);
        let (forward, engine_batch) = state.channel.as_ref().map_or((None, batch), |c| (Some(c.id), c.batch_bytes));
        let daemon = self.daemon.as_mut().expect("fault mode");
        let (mut host_copy, mut dma, mut pcie, mut nvlink, mut pages) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut landing = Vec::new();
        for command in commands.drain(..) {
            match command {
                Command::Complete { gpu, channel, slot, run_va: va, companion_va, pages: n, fill } => {
                    let run = daemon.pcm.entry(va).or_default();
                    match fill {
                        // Another channel's data (an exchange's reverse channel, whose bytes the
                        // model does not keep, or an earlier phase's): only its copy counts.
                        Fill::Data { len, source } if Some(channel) != forward => {
                            run.clear();
                            match source {
                                DataSource::Host { .. } if copy_engine => dma += len,
                                DataSource::Host { .. } => host_copy += len,
                                DataSource::Gpu { .. } => nvlink += len,
                            }
                        }
                        Fill::Data { len, source } => {
                            run.clear();
                            let (from, on_host) = match source {
                                DataSource::Host { offset } => (offset, true),
                                DataSource::Gpu { va: src, .. } => (src % PHASE_SPAN, false),
                            };
                            let (start, len) = (from / engine_batch * batch, len.min(batch));
                            run.extend_from_slice(&state.buffer[start as usize..(start + len) as usize]);
                            if on_host && !copy_engine {
                                host_copy += len;
                                daemon.host_resident_runs.insert(va);
                            } else {
                                // Into GPU-resident pages, by a copy engine: a producer GPU's
                                // over its link, the host's over PCIe.
                                if on_host {
                                    dma += len;
                                } else {
                                    nvlink += len;
                                }
                                daemon.host_resident_runs.remove(&va);
                            }
                        }
                        // The producer wrote the rest of the run in place (`Sim::write_in_place`);
                        // the head words come from its buffer, which stands for wicd's shared one.
                        Fill::Heads => {
                            host_copy += HEAD_BYTES as u64 * u64::from(n);
                            if Some(channel) == forward {
                                let start = u64::from(slot) * batch;
                                let heads = &state.buffer[start as usize..(start + batch) as usize];
                                for (run, heads) in
                                    run.chunks_mut(PAGE_SIZE as usize).zip(heads.chunks(PAGE_SIZE as usize))
                                {
                                    let head = HEAD_BYTES.min(run.len());
                                    run[..head].copy_from_slice(&heads[..head]);
                                }
                            }
                            daemon.host_resident_runs.insert(va);
                        }
                        Fill::Marker(marker) => {
                            run.clear();
                            run.resize((u64::from(n) * PAGE_SIZE) as usize, 0);
                            run[..8].copy_from_slice(&marker.word().to_le_bytes());
                            daemon.host_resident_runs.insert(va);
                        }
                    }
                    // What crosses PCIe to a GPU reading a host-resident run: its pages that
                    // hold the message (a phase of smaller CTAs fills only the first ones).
                    let filled_pages = (run.len() as u64).div_ceil(PAGE_SIZE);
                    // The companion's unmap, then the run's map: two page-table updates.
                    pages += 2 * u64::from(n);
                    landing.push(Event::Unmap { gpu, va: companion_va, pages: n });
                    if daemon.host_resident_runs.contains(&va) {
                        pcie += filled_pages * PAGE_SIZE;
                    }
                    landing.push(Event::Map { gpu, va, pages: n });
                }
                Command::ServicePat { gpu, va } => {
                    pages += 1;
                    landing.push(Event::Map { gpu, va, pages: 1 });
                }
                Command::RearmPat { gpu, va } => {
                    pages += 1;
                    landing.push(Event::Unmap { gpu, va, pages: 1 });
                }
                Command::Replay { gpu } => landing.push(Event::Replay { gpu, resume_bh: false }),
                // An in-place batch for a generation that had ended: only a timed-out wait
                // ends one before its data (the model has no backend bound), where the model
                // does not follow.
                Command::MissedPublish { slot, .. } => {
                    self.stopped = Some(format!("slot {slot}'s in-place publish missed its generation{TIMEOUT_HINT}"));
                }
                Command::Expired { slot, .. } => {
                    self.stopped =
                        Some(format!("slot {slot}'s generation expired in a backend the model does not have"));
                }
            }
        }
        let link = |bytes: u64, f: fn(&Calibration, u64) -> u64| if bytes > 0 { f(cal, bytes) } else { 0 };
        // wicd's thread: the submission, the page-table work, its own copies, and a producer
        // GPU's copy, which nvidia-uvm waits for inside the call.
        let done = [
            cal.daemon.submission_ns.value,
            cal.daemon.per_page_ns.value.saturating_mul(pages),
            cal.memcpy_ns(host_copy),
            link(nvlink, Calibration::nvlink_ns),
        ]
        .into_iter()
        .fold(at, u64::saturating_add);
        // The consumers' read of a host-resident run crosses PCIe once it is mapped, on their
        // time, not wicd's: it delays when they have their data (counted here, before the map
        // lands), while wicd goes on to its next step.
        let landed = done
            .saturating_add(link(pcie, Calibration::pcie_ns))
            .max(at.saturating_add(cal.daemon.submission_ns.value).saturating_add(link(dma, Calibration::pcie_ns)));
        for event in landing {
            let when = if matches!(event, Event::Replay { .. }) {
                landed.saturating_add(cal.fault.replay_ns.value)
            } else {
                landed
            };
            self.schedule(when, event);
        }
        done
    }
}
