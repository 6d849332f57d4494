//! The emulated GPU backend: executes the Activator's commands on the channels' shared regions.
//!
//! Each channel's consumer region stands for the channel's pages in consumer-GPU memory and for
//! the GPU's page table (one state word per page); a replay bumps the replay counter of every
//! channel consuming on that GPU, which is what wakes the warps stalled on it.

use wic_engine::{Command, DataSource, EngineConfig, Fill, GpuId, PAGE_SIZE};
use wic_proto::shm::{ConsumerRegion, ProducerRegion, PAGE_MAPPED, PAGE_UNMAPPED};

use super::gpus::{ChannelMap, Executed, ExecutionLog};
use super::runs::{RunIndex, RunPlace};

/// A channel's regions as the backend sees them.
pub struct EmulatedChannel {
    pub consumer_gpu: GpuId,
    pub consumer: ConsumerRegion,
    pub producer: Option<ProducerRegion>,
}

/// The emulated GPUs: the channels' regions and an index from run VA to channel slot.
pub struct EmulatedGpus {
    channels: ChannelMap<EmulatedChannel>,
    runs: RunIndex,
    scratch: Vec<u8>,
}

impl EmulatedGpus {
    /// No channels yet, for an engine configured as `config`.
    pub fn new(config: &EngineConfig) -> Self {
        Self { channels: ChannelMap::default(), runs: RunIndex::new(config), scratch: Vec::new() }
    }

    /// Adds a channel whose runs start at `runs[slot][side]`.
    pub fn add(&mut self, channel: u32, regions: EmulatedChannel, runs: impl IntoIterator<Item = [u64; 2]>) {
        self.runs.add(channel, regions.consumer.layout().pages_per_run, runs);
        self.channels.insert(channel, regions);
    }

    /// Removes a channel after its final commands ran, returning its regions.
    pub fn remove(&mut self, channel: u32) -> Option<EmulatedChannel> {
        self.runs.remove(channel);
        self.channels.remove(&channel)
    }

    /// A channel's regions.
    pub fn channel(&self, channel: u32) -> Option<&EmulatedChannel> {
        self.channels.get(&channel)
    }

    /// Every channel.
    pub fn channels(&self) -> impl Iterator<Item = (&u32, &EmulatedChannel)> {
        self.channels.iter()
    }

    /// The run that holds the page at `va`.
    pub fn place(&self, va: u64) -> Option<RunPlace> {
        self.runs.place(va)
    }

    /// Runs `commands` in order.
    pub fn execute(&mut self, commands: &[Command], log: &mut impl ExecutionLog) -> Executed {
        let mut done = Executed::default();
        for command in commands {
            match *command {
                Command::Complete { run_va, pages, fill, .. } => {
                    // One lookup serves the whole completion: the companion is the slot's
                    // other run.
                    let Some(place) = self.place(run_va) else {
                        tracing::error!("emulated backend got {command:?} for a run of no channel");
                        done.failed += 1;
                        continue;
                    };
                    let filled = match fill {
                        Fill::Data { len, source } => self.write_data(place, len, source, log),
                        Fill::Marker(marker) => {
                            if let Some(region) = self.consumer(place.channel) {
                                let first = region.layout().run_page(place.slot, place.side);
                                for page in first..first + pages as usize {
                                    region.write_pages(page, &marker.word().to_le_bytes());
                                }
                                log.failed(place.channel, marker);
                            }
                            true
                        }
                    };
                    // As in the module: a run whose fill failed is not mapped.
                    if !filled {
                        done.failed += 1;
                        log.unfilled(*command);
                        continue;
                    }
                    if let Some(region) = self.consumer(place.channel) {
                        let layout = region.layout();
                        region.set_pages(layout.run_page(place.slot, 1 - place.side), pages as usize, PAGE_UNMAPPED);
                        region.set_pages(layout.run_page(place.slot, place.side), pages as usize, PAGE_MAPPED);
                    }
                }
                Command::ServicePat { .. } | Command::RearmPat { .. } => {
                    // Channels with GPU producers are refused at creation by this backend.
                    tracing::error!("emulated backend got {command:?} without a GPU producer");
                    done.failed += 1;
                }
                Command::Replay { gpu } => {
                    for channel in self.channels.values().filter(|c| c.consumer_gpu == gpu) {
                        channel.consumer.replay();
                    }
                    done.replays += 1;
                }
            }
        }
        done
    }

    fn consumer(&self, channel: u32) -> Option<&ConsumerRegion> {
        Some(&self.channels.get(&channel)?.consumer)
    }

    /// Copies the producer's bytes into the run; false if there are none this backend can copy.
    fn write_data(&mut self, place: RunPlace, len: u64, source: DataSource, log: &mut impl ExecutionLog) -> bool {
        let DataSource::Host { offset } = source else {
            tracing::error!("emulated backend cannot copy from a GPU producer");
            return false;
        };
        let Some(channel) = self.channels.get(&place.channel) else { return false };
        let Some(producer) = &channel.producer else {
            tracing::error!("channel {}: data for a channel without a host producer region", place.channel);
            return false;
        };
        let capacity = channel.consumer.layout().pages_per_run as u64 * PAGE_SIZE;
        self.scratch.resize(len.min(capacity) as usize, 0);
        producer.read_data(offset, &mut self.scratch);
        channel.consumer.write_pages(channel.consumer.layout().run_page(place.slot, place.side), &self.scratch);
        producer.mark_delivered(place.slot);
        log.delivered(place.channel);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wic_engine::{ChannelSpec, Engine, ErrorMarker, Producer};
    use wic_proto::shm::ConsumerLayout;

    #[derive(Default)]
    struct Log {
        delivered: u32,
        failed: u32,
        unfilled: Vec<Command>,
    }

    impl ExecutionLog for Log {
        fn delivered(&mut self, _: u32) {
            self.delivered += 1;
        }

        fn failed(&mut self, _: u32, _: ErrorMarker) {
            self.failed += 1;
        }

        fn unfilled(&mut self, complete: Command) {
            self.unfilled.push(complete);
        }
    }

    #[test]
    fn a_completion_that_cannot_be_filled_is_counted_failed_and_leaves_its_run_unmapped() {
        let mut engine = Engine::new(EngineConfig::default()).unwrap();
        let spec =
            ChannelSpec { consumer_gpu: 0, producer: Producer::Host, message_bytes: 64, slots: 1, timeout: 1_000 };
        let layout = engine.open_channel(spec).unwrap();
        let (consumer, _fd) =
            ConsumerRegion::create(ConsumerLayout { slots: 1, pages_per_run: layout.pages_per_run }).unwrap();
        let mut gpus = EmulatedGpus::new(engine.config());
        // No producer region: there are no bytes to copy.
        gpus.add(
            layout.id.0,
            EmulatedChannel { consumer_gpu: 0, consumer, producer: None },
            layout.slots.iter().map(|s| s.runs),
        );
        let [run, companion] = layout.slots[0].runs;
        let complete = |run_va, fill| Command::Complete {
            gpu: 0,
            channel: layout.id,
            slot: 0,
            run_va,
            companion_va: companion,
            pages: 1,
            fill,
        };
        let data = Fill::Data { len: 64, source: DataSource::Host { offset: 0 } };
        let mapped = |gpus: &EmulatedGpus| {
            gpus.consumer(layout.id.0).unwrap().page_state(0).load(std::sync::atomic::Ordering::Acquire) == PAGE_MAPPED
        };
        let mut log = Log::default();

        let done = gpus.execute(&[complete(run, data), complete(run + 64 * PAGE_SIZE, data)], &mut log);
        assert_eq!((done.failed, log.delivered), (2, 0), "no producer bytes, then a run of no channel");
        assert_eq!(log.unfilled, [complete(run, data)], "only the channel's run can be completed again");
        assert!(!mapped(&gpus), "a run whose fill failed is not mapped");

        let done = gpus.execute(&[complete(run, Fill::Marker(ErrorMarker::Timeout))], &mut log);
        assert_eq!((done.failed, log.failed), (0, 1));
        assert!(mapped(&gpus), "a marker needs no producer bytes");
    }
}
