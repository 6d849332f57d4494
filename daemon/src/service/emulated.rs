//! The emulated GPU backend: executes the Activator's commands on the channels' shared regions.
//!
//! Each channel's consumer region stands for the channel's pages in consumer-GPU memory and for
//! the GPU's page table (one state word per page); a replay bumps the replay counter of every
//! channel consuming on that GPU, which is what wakes the warps stalled on it.

use wic_engine::{Command, DataSource, EngineConfig, Fill, GpuId, RunIndex, RunPlace, PAGE_SIZE};
use wic_proto::shm::{ConsumerRegion, ProducerRegion, PAGE_MAPPED, PAGE_UNMAPPED};

use super::gpus::{ChannelMap, Executed, ExecutionLog};

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
                    let Some(place) = self.place(run_va) else { continue };
                    match fill {
                        Fill::Data { len, source } => self.write_data(place, len, source, log),
                        Fill::Marker(marker) => {
                            if let Some(region) = self.consumer(place.channel) {
                                let first = region.layout().run_page(place.slot, place.side);
                                for page in first..first + pages as usize {
                                    region.write_pages(page, &marker.word().to_le_bytes());
                                }
                                log.failed(place.channel, marker);
                            }
                        }
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

    fn write_data(&mut self, place: RunPlace, len: u64, source: DataSource, log: &mut impl ExecutionLog) {
        let DataSource::Host { offset } = source else {
            tracing::error!("emulated backend cannot copy from a GPU producer");
            return;
        };
        let Some(channel) = self.channels.get(&place.channel) else { return };
        let Some(producer) = &channel.producer else { return };
        let capacity = channel.consumer.layout().pages_per_run as u64 * PAGE_SIZE;
        self.scratch.resize(len.min(capacity) as usize, 0);
        producer.read_data(offset, &mut self.scratch);
        channel.consumer.write_pages(channel.consumer.layout().run_page(place.slot, place.side), &self.scratch);
        producer.mark_delivered(place.slot);
        log.delivered(place.channel);
    }
}
