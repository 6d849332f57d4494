/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic.cuh - the device side of wic: how consumer warps wait for a channel's data.
 *
 * A channel carries, per slot and generation, one batch of warps_per_batch messages of
 * message_bytes each; warp w of the batch reads bytes [w * message_bytes, (w + 1) *
 * message_bytes). Generation g of slot s is published once; its consumers call wic::recv().
 *
 * Six transports, chosen per channel:
 *  - fault: the batch's run is an unmapped managed page; reading it stalls the warp in hardware
 *    until wicd (shim backend, patched nvidia-uvm) writes the data, maps the run and replays.
 *    Needs the patched driver. The channel comes from libwic (wic_channel_create_at). A GPU
 *    producer of such a channel (WIC_PRODUCER_GPU) publishes by writing the slot's PAT page
 *    (wic_slot_info::pat_va[generation % 2]), which wicd also sees as a fault: the patched
 *    driver again. wic::publish() is not for fault channels.
 *  - push: the producer's data goes into the consumer GPU's memory, then a ready word there
 *    tells the slot's generation; warps wait on that word with __nanosleep backoff, never
 *    across a link. A host producer copies and sets the word in stream order (host_channel); a
 *    kernel on another GPU writes both over the peer link (peer_channel, wic::publish()). Runs
 *    on the stock driver.
 *  - poll: spinning: the data is in the consumer GPU's memory, the ready word in the
 *    producer's (pinned host memory, or the producer GPU's memory), and warps spin on it without
 *    backoff across PCIe or the peer link.
 *  - alg1: the WIC paper's Algorithm 1 made correct on a GPU without host-native atomics: data
 *    and ready words in managed memory, where nvidia-uvm moves the pages on demand. A host
 *    producer (host_channel) writes both with plain stores; a producer kernel on another GPU
 *    (peer_channel, wic::publish()) writes the data and stores the word with release semantics
 *    at system scope where the paper's producer has atomicAdd(&flag, 1). The waiter spins on
 *    its slot's word without backoff, with an acquire load at system scope where the paper has
 *    a device-scope atomicAdd(&flag, 0), which on an H100 stops seeing the host once
 *    nvidia-uvm pins the page in host memory (device/bench/README.md, "Algorithm 1 on an
 *    H100"). recv_block() waits as the paper's consumer does: thread 0 alone, then the block's
 *    barrier.
 *  - mapped: for small messages from a host producer (host_channel): data and ready words in
 *    pinned host memory mapped into the GPU. The host writes both with plain stores, no copy
 *    engine and no driver call; the waiter spins on the word across the link and the consumer
 *    then reads the message there, once per access.
 *  - tagged: for small messages: no ready word; every 4 bytes of data cross the link next to
 *    the generation's tag, in 16-byte lines of two 64-bit words (NCCL's LL protocol). From a
 *    kernel on another GPU (peer_channel): a 64-bit store is single-copy atomic, so a consumer
 *    that reads a word carrying the tag reads the data beside it, and the producer needs no
 *    fence before a flag: push's __threadfence_system() waits for its data's stores to be
 *    acknowledged across the link before the ready word may follow. From a host producer
 *    (host_channel): the host formats the lines in pinned memory and queues one copy of them
 *    into the consumer GPU's memory, half of push's calls, with no ready word written
 *    after the copy; this relies on the copy engine writing each aligned 64-bit word whole,
 *    which the transport test checks byte by byte but NVIDIA does not document. The price:
 *    twice the bytes on the link, the consumers unpack the lines into the consumer GPU's
 *    memory, and a host producer formats every byte on its own thread.
 *
 * A producer learns that the consumers are done with a generation, so that it may write the
 * slot again, through a word per slot that one consumer thread sets (wic::consumed()): in the
 * producer GPU's memory for a GPU producer (wic::wait_consumed()), in pinned host memory for a
 * host producer (host_channel::wait_free()).
 *
 * This header includes every part; each part also stands alone:
 *  - wic/status.cuh: error_name(), outcome (what host calls return), forever (timeouts);
 *  - wic/channel.cuh: the transports and wic::channel, what kernels take;
 *  - wic/wait.cuh: each transport's wait, in one place;
 *  - wic/recv.cuh: the consumer's recv(), recv_block() (typed: recv<K>(), recv_block<K>()) and
 *    consumed();
 *  - wic/host_producer.cuh: wic::host_channel, a host thread's push, poll, alg1, mapped and
 *    tagged channels, and pick_host_transport();
 *  - wic/gpu_producer.cuh: wic::peer_channel and the producer kernel's calls, and
 *    pick_peer_transport();
 *  - wic/results.cuh: the results direction, GPU to host, with its flow control;
 *  - wic/fault.cuh: a libwic channel's device view, nvidia-uvm's GPU ids;
 *  - wic/launch.cuh: co_resident(), whether a grid's blocks all run at once.
 */
#ifndef WIC_WIC_CUH
#define WIC_WIC_CUH

#include <wic/status.cuh>
#include <wic/channel.cuh>
#include <wic/wait.cuh>
#include <wic/recv.cuh>
#include <wic/host_producer.cuh>
#include <wic/gpu_producer.cuh>
#include <wic/results.cuh>
#include <wic/fault.cuh>
#include <wic/launch.cuh>

#endif /* WIC_WIC_CUH */
