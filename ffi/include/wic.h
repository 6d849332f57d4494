/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wic.h - libwic, the application interface of wicd (warp-level interrupts for GPUs).
 *
 * A channel carries batches of messages from a producer (a host thread or a kernel on another
 * GPU) to the consumer warps of one GPU. Each channel has a number of slots; each slot carries
 * one batch per generation. The process that creates a channel owns it and may grant tokens
 * that let other processes attach to it as producer or consumer.
 *
 * Every function returning int returns WIC_OK (0) or a negative WIC_E* code; wic_strerror()
 * describes it. Client and channel handles may be used from several threads, with one rule per
 * channel: at most one thread at a time publishes or waits on a given slot, and at most one
 * thread at a time consumes a given slot.
 *
 * Timeouts: every call that sends a request to the daemon (wic_connect, wic_attach_space,
 * wic_watch_range, wic_channel_create, wic_channel_create_at, wic_channel_grant,
 * wic_channel_attach, wic_channel_close on an owner's handle, wic_stats) waits for the answer
 * at most WIC_TIMEOUT_MS milliseconds, an environment variable read by wic_connect: 1 to
 * 3600000, 10000 if unset or empty, 0 for no deadline. wic_connect's deadline covers
 * connecting and the greeting; each later call has its own. A call whose deadline passes
 * returns WIC_ETIMED_OUT and closes the session's connection, as if the daemon had hung up:
 * later calls through the session and its channels return WIC_ECONNECT, and the daemon
 * destroys the channels the session owns. A malformed WIC_TIMEOUT_MS makes wic_connect fail
 * with WIC_EINVALID. An empty WIC_SOCKET counts as unset.
 */
#ifndef WIC_H
#define WIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WIC_VERSION_MAJOR 0
#define WIC_VERSION_MINOR 1
#define WIC_VERSION_PATCH 0

#define WIC_OK 0

/* Error codes: -(the protocol's error code); wic_strerror() describes them. */
#define WIC_EINVALID (-1)      /* a malformed request or an argument out of range */
#define WIC_EPERMISSION (-2)   /* not allowed for this caller or handle */
#define WIC_ENOT_FOUND (-3)    /* no such channel, slot, token or GPU */
#define WIC_EEXHAUSTED (-4)    /* page pool, slot table, or a per-client or per-user limit */
#define WIC_EBUSY (-5)         /* the slot's previous data has not been delivered yet */
#define WIC_ETIMED_OUT (-6)    /* the wait exceeded its timeout, or wicd did not answer in time */
#define WIC_ECLOSED (-7)       /* the channel was destroyed */
#define WIC_ESTOPPING (-8)     /* the daemon is stopping */
#define WIC_EPROTOCOL (-9)     /* the daemon and the library do not understand each other */
#define WIC_ECONNECT (-10)     /* the daemon cannot be reached, or hung up */
#define WIC_EUNSUPPORTED (-11) /* the backend or channel cannot do this */
#define WIC_EIO (-12)          /* a system call failed (wic.cuh: a CUDA runtime call) */
#define WIC_ESTALE (-13)       /* the generation was overwritten, or an in-place publish missed it */
#define WIC_ESTREAM (-14)      /* wic.cuh: a stream that waits for the consumer kernel */

/* Bytes of a grant token buffer: 32 hex digits and a NUL. */
#define WIC_TOKEN_LEN 33

/*
 * A consumer whose request cannot be served finds, at the start of each page of its run, the
 * 64-bit word WIC_ERROR_MARKER_MAGIC | code (1: timeout, 2: channel closed, 3: daemon stopping,
 * 4: daemon gone, written by the kernel module) instead of data.
 */
#define WIC_ERROR_MARKER_MAGIC 0x5749434500000000ULL

/**
 * enum wic_producer_kind - who produces a channel's data
 * @WIC_PRODUCER_HOST: a host thread publishes through wic_publish()
 * @WIC_PRODUCER_GPU: a kernel on another GPU publishes by writing the slot's PAT page
 */
enum wic_producer_kind {
	WIC_PRODUCER_HOST = 0,
	WIC_PRODUCER_GPU = 1,
};

/**
 * enum wic_role - the part of a channel a handle holds
 * @WIC_ROLE_OWNER: created the channel: may publish, consume, grant and destroy
 * @WIC_ROLE_PRODUCER: may publish
 * @WIC_ROLE_CONSUMER: may consume
 */
enum wic_role {
	WIC_ROLE_OWNER = 0,
	WIC_ROLE_PRODUCER = 1,
	WIC_ROLE_CONSUMER = 2,
};

/**
 * typedef wic_client - a session with wicd (opaque); thread-safe
 */
typedef struct wic_client wic_client;

/**
 * typedef wic_channel - a channel created or attached to by this process (opaque)
 */
typedef struct wic_channel wic_channel;

/**
 * struct wic_channel_spec - what wic_channel_create() creates
 * @consumer_gpu: GPU whose warps consume the channel
 * @producer_kind: an enum wic_producer_kind value
 * @producer_gpu: the producer's GPU (WIC_PRODUCER_GPU only)
 * @reserved: must be 0
 * @message_bytes: bytes of one warp's message
 * @slots: number of slots
 * @producer_base_va: where the producer GPU's message bytes are (WIC_PRODUCER_GPU only)
 * @timeout_ns: how long a consumer may wait for data; 0 for the daemon's default
 *
 * GPUs are numbered as the daemon's backend numbers them: the emulated backend's GPUs are 0 to
 * its count - 1; on the shim backend a GPU is nvidia-uvm's processor id of it, the id its
 * faults carry (1 + 8 x the GPU's registration index in nvidia-uvm + its MIG sub-index), not
 * CUDA's device index: wic_uvm_gpu_id() translates a CUDA device's UUID.
 */
struct wic_channel_spec {
	uint16_t consumer_gpu;
	uint16_t producer_kind;
	uint16_t producer_gpu;
	uint16_t reserved;
	uint32_t message_bytes;
	uint32_t slots;
	uint64_t producer_base_va;
	uint64_t timeout_ns;
};

/**
 * struct wic_slot_info - one slot as device code addresses it
 * @run_va: first VA of the run read by even (0) and odd (1) generations
 * @pat_va: the slot's PAT pages for a GPU producer; 0 for host producers
 * @tag: the slot's tag
 * @reserved: 0
 */
struct wic_slot_info {
	uint64_t run_va[2];
	uint64_t pat_va[2];
	uint32_t tag;
	uint32_t reserved;
};

/**
 * struct wic_channel_info - a channel as the daemon laid it out
 * @channel_id: the channel's id in the daemon
 * @role: an enum wic_role value: the part of the channel this handle holds
 * @slots: number of slots
 * @message_bytes: bytes of one warp's message
 * @pages_per_run: pages of each of a slot's two runs
 * @warps_per_batch: consumer warps that read one batch
 * @batch_bytes: bytes one slot carries per generation (warps_per_batch * message_bytes)
 */
struct wic_channel_info {
	uint32_t channel_id;
	uint32_t role;
	uint32_t slots;
	uint32_t message_bytes;
	uint32_t pages_per_run;
	uint32_t warps_per_batch;
	uint64_t batch_bytes;
};

/**
 * struct wic_stats - daemon statistics, cumulative since it started unless noted
 * @faults_captured: fault-buffer entries fetched
 * @faults_held: requests that had to wait for their data
 * @faults_completed: requests completed with data
 * @faults_timed_out: requests completed with the timeout marker
 * @faults_cancelled: requests completed with the channel-closed or stopping marker
 * @faults_ignored: entries that were duplicates, stale or not the daemon's
 * @dab_updates: data-availability updates
 * @pat_faults: GPU producer publishes seen as faults on PAT pages
 * @host_publishes: host publishes (doorbell and socket)
 * @fault_buffer_overflows: fault-buffer overflows wicd saw itself (shim: faults the module
 *	could not record; emulated: fault rings found full)
 * @replays: replays issued
 * @wake_latency_count: wake-ups measured (fault to replay)
 * @wake_latency_sum_ns: sum of the measured wake latencies, nanoseconds
 * @wake_latency_max_ns: longest measured wake latency, nanoseconds
 * @pfq_depth: requests waiting now
 * @pool_pages: pages in the page pool
 * @pool_pages_used: pool pages in use now
 * @pool_longest_free_run: longest run of free pool pages now
 * @channels: channels now
 * @clients: connected clients now
 */
struct wic_stats {
	uint64_t faults_captured;
	uint64_t faults_held;
	uint64_t faults_completed;
	uint64_t faults_timed_out;
	uint64_t faults_cancelled;
	uint64_t faults_ignored;
	uint64_t dab_updates;
	uint64_t pat_faults;
	uint64_t host_publishes;
	uint64_t fault_buffer_overflows;
	uint64_t replays;
	uint64_t wake_latency_count;
	uint64_t wake_latency_sum_ns;
	uint64_t wake_latency_max_ns;
	uint32_t pfq_depth;
	uint32_t pool_pages;
	uint32_t pool_pages_used;
	uint32_t pool_longest_free_run;
	uint32_t channels;
	uint32_t clients;
};

/**
 * wic_version() - the library's version
 *
 * Return: a static string "MAJOR.MINOR.PATCH".
 */
const char *wic_version(void);

/**
 * wic_strerror() - describe a return value
 * @err: WIC_OK or a WIC_E* code
 *
 * Return: a static string: "success" for WIC_OK, "unknown error" for values that are not
 * error codes.
 */
const char *wic_strerror(int err);

/**
 * wic_connect() - open a session with wicd
 * @socket_path: the daemon's socket; NULL for $WIC_SOCKET (unless empty), else
 *	/run/wic/wicd.sock
 * @out: receives the client handle (NULL on failure)
 *
 * Reads WIC_TIMEOUT_MS (see Timeouts above); the session keeps that deadline.
 *
 * Return: WIC_OK, WIC_ECONNECT if the daemon cannot be reached, WIC_ETIMED_OUT if it did not
 * accept the connection and answer within WIC_TIMEOUT_MS, WIC_EEXHAUSTED if it serves the most
 * clients it will, WIC_EPROTOCOL if it speaks another protocol version, WIC_EINVALID if @out is
 * NULL or WIC_TIMEOUT_MS is malformed.
 */
int wic_connect(const char *socket_path, wic_client **out);

/**
 * wic_disconnect() - release a client handle
 * @client: the handle, or NULL
 *
 * Channels opened through @client stay usable until they are closed: they share the
 * connection, which ends when the last of them is closed.
 */
void wic_disconnect(wic_client *client);

/**
 * wic_channel_create() - create a channel owned by this session
 * @client: the session
 * @spec: what to create; @spec->reserved must be 0
 * @out: receives the channel handle, role WIC_ROLE_OWNER (NULL on failure)
 *
 * Return: WIC_OK; WIC_EINVALID for a bad spec; WIC_EEXHAUSTED if the daemon has no room.
 */
int wic_channel_create(wic_client *client, const struct wic_channel_spec *spec, wic_channel **out);

/**
 * wic_attach_space() - let wicd place channels in this process's managed memory
 * @client: the session
 * @uvm_fd: the process's open /dev/nvidia-uvm descriptor (the CUDA runtime's)
 * @space: receives the space id; may be NULL
 *
 * Needed on the shim backend before wic_channel_create_at(). On the emulated backend, on a
 * machine with an NVIDIA GPU (the stock driver's /dev/nvidia-uvm-tools), wicd observes the
 * space's GPU faults instead: see wic_watch_range(). One space per session; it is detached
 * when the session ends. CUDA opens /dev/nvidia-uvm more than once: only the file of the
 * address space is accepted, so try each until one is.
 *
 * Return: WIC_OK; WIC_EUNSUPPORTED on the emulated backend without a GPU; WIC_EBUSY if this
 * session or another attached the space already; WIC_EINVALID if @uvm_fd is not the
 * initialized UVM file of an address space.
 */
int wic_attach_space(wic_client *client, int uvm_fd, uint32_t *space);

/**
 * wic_watch_range() - have wicd count and time the GPU faults on some pages
 * @client: the session, with its space attached by wic_attach_space()
 * @base_va: start of the pages
 * @length: bytes
 *
 * For the emulated backend on a GPU with the stock driver: the faults the driver services on
 * these pages, and the time from each to the replay of its batch, show in `wicctl stats`.
 *
 * Return: WIC_OK; WIC_EINVALID without an attached space or for an empty range;
 * WIC_EUNSUPPORTED on the shim backend (it holds its channels' faults itself).
 */
int wic_watch_range(wic_client *client, uint64_t base_va, uint64_t length);

/**
 * wic_placement_bytes() - managed memory a channel of @spec is placed in
 * @client: the session (the size follows from the daemon's configuration)
 * @spec: the channel to be created
 * @bytes: receives the size, a multiple of 4096
 *
 * Return: WIC_OK, or WIC_EINVALID for a bad argument: a spec without a slot or a message
 * byte, or one whose size does not fit in 64 bits.
 */
int wic_placement_bytes(wic_client *client, const struct wic_channel_spec *spec, uint64_t *bytes);

/**
 * wic_channel_create_at() - create a channel in this process's managed memory
 * @client: the session, with its space attached by wic_attach_space()
 * @spec: what to create; @spec->reserved must be 0
 * @base_va: page-aligned start of wic_placement_bytes() bytes of managed memory
 * @out: receives the channel handle, role WIC_ROLE_OWNER (NULL on failure)
 *
 * The slots' run and PAT addresses (wic_channel_slot()) are then inside the placement: they
 * are what the consumer's kernels read.
 *
 * Return: WIC_OK; WIC_EINVALID for a bad spec, no attached space or a placement the module
 * refuses (unaligned, overlapping, not mapped); WIC_EUNSUPPORTED on the emulated backend.
 */
int wic_channel_create_at(wic_client *client, const struct wic_channel_spec *spec, uint64_t base_va,
			  wic_channel **out);

/**
 * wic_channel_grant() - issue a token that lets another process attach
 * @ch: a channel this process owns
 * @role: WIC_ROLE_PRODUCER or WIC_ROLE_CONSUMER
 * @uid: the only user that may attach with the token, or -1 for any user
 * @token: receives the token, NUL-terminated
 *
 * Return: WIC_OK; WIC_EINVALID for another role or an out-of-range uid; WIC_EPERMISSION if
 * @ch is not the owner's handle.
 */
int wic_channel_grant(wic_channel *ch, enum wic_role role, int64_t uid, char token[WIC_TOKEN_LEN]);

/**
 * wic_channel_attach() - attach to a channel with a token
 * @client: the session
 * @token: a token from wic_channel_grant()
 * @out: receives the channel handle, with the token's role (NULL on failure)
 *
 * Return: WIC_OK; WIC_ENOT_FOUND for an unknown token; WIC_EPERMISSION if the token is for
 * another user.
 */
int wic_channel_attach(wic_client *client, const char *token, wic_channel **out);

/**
 * wic_channel_close() - release a channel handle
 * @ch: the handle, or NULL
 *
 * The owner's handle also destroys the channel in the daemon: waiting producers and consumers
 * get WIC_ECLOSED. The handle is freed whatever the result.
 *
 * Return: WIC_OK, or the daemon's error for the destroy request.
 */
int wic_channel_close(wic_channel *ch);

/**
 * wic_channel_info() - describe a channel
 * @ch: the handle
 * @out: receives the description
 *
 * Return: WIC_OK, or WIC_EINVALID for NULL arguments.
 */
int wic_channel_info(const wic_channel *ch, struct wic_channel_info *out);

/**
 * wic_channel_slot() - describe a slot
 * @ch: the handle
 * @slot: the slot
 * @out: receives the description
 *
 * Return: WIC_OK, or WIC_ENOT_FOUND for a slot beyond the channel.
 */
int wic_channel_slot(const wic_channel *ch, uint32_t slot, struct wic_slot_info *out);

/**
 * wic_slot_buffer() - a host producer's buffer for a slot
 * @ch: a handle that may publish to a host-producer channel
 * @slot: the slot
 *
 * The buffer holds batch_bytes bytes. Fill it, then wic_publish(); write it only while the slot
 * is writable (see wic_wait_writable()), since the daemon reads it until delivery.
 *
 * Return: the buffer, or NULL if @ch cannot publish or @slot is out of range.
 */
void *wic_slot_buffer(wic_channel *ch, uint32_t slot);

/**
 * wic_publish() - publish the next generation of a slot from its buffer
 * @ch: a handle that may publish to a host-producer channel
 * @slot: the slot
 *
 * Return: WIC_OK; WIC_EBUSY if the previous generation has not been delivered yet;
 * WIC_ENOT_FOUND for a slot beyond the channel; WIC_EPERMISSION for a consumer handle;
 * WIC_EUNSUPPORTED for a GPU-producer channel; WIC_ECLOSED or WIC_ESTOPPING.
 */
int wic_publish(wic_channel *ch, uint32_t slot);

/**
 * wic_publish_copy() - copy data into a slot's buffer and publish it
 * @ch: a handle that may publish to a host-producer channel
 * @slot: the slot
 * @data: the bytes
 * @len: how many; at most batch_bytes
 *
 * Nothing is written while the slot is busy.
 *
 * Return: as wic_publish(), and WIC_EINVALID if @len exceeds batch_bytes.
 */
int wic_publish_copy(wic_channel *ch, uint32_t slot, const void *data, size_t len);

/**
 * wic_wait_writable() - wait until a slot may be published again
 * @ch: a handle that may publish to a host-producer channel
 * @slot: the slot
 * @timeout_ns: longest wait; 0 checks once
 *
 * Return: WIC_OK once the slot's last generation has been delivered; WIC_ESTALE, once, if it
 * was this handle's in-place publish and missed its generation (see wic_run_publish());
 * WIC_ETIMED_OUT;
 * WIC_ECLOSED or WIC_ESTOPPING; WIC_ECONNECT if the daemon hung up.
 */
int wic_wait_writable(wic_channel *ch, uint32_t slot, uint64_t timeout_ns);

/**
 * struct wic_run - a slot's run, lent to its host producer to write the next batch in place
 * @data: the run: batch_bytes bytes in the consumers' own pages, except the first 8 bytes of
 *	each 4096-byte page, which belong to @heads
 * @heads: one word per page: the batch's bytes [4096 p, 4096 p + 8) go to heads[p], never to
 *	data + 4096 p
 * @batch_bytes: bytes of the batch
 * @pages: pages of the run (and words of @heads)
 * @side: which of the slot's two runs
 * @slot: the slot
 * @reserved: 0
 *
 * The daemon writes the head words at the start of the run's pages when it maps the run, and
 * copies nothing else. Why a producer never writes those 8 bytes itself: a generation can end
 * while its producer is still writing (the channel's timeout, the module's bound, a close),
 * and then an error marker goes there and the run is mapped; stores that come later land in
 * pages the consumers read, but never on the marker, so a consumer reads either its marker or
 * the whole batch. wic_run_write() copies into a run with the head bytes put where they go.
 */
struct wic_run {
	void *data;
	uint64_t *heads;
	uint64_t batch_bytes;
	uint32_t pages;
	uint32_t side;
	uint32_t slot;
	uint32_t reserved;
};

/**
 * wic_run_acquire() - wait until a slot may be published again, and lend its run to write in place
 * @ch: the handle that can reach the consumers' pages: the owner's handle of a channel placed in
 *	this process's managed memory (wic_channel_create_at()), or, on the emulated backend, a
 *	handle that may also consume
 * @slot: the slot
 * @timeout_ns: longest wait; 0 checks once
 * @out: receives the run
 *
 * Instead of filling the slot buffer, which the daemon then copies into the consumers' pages,
 * the producer writes the batch straight into those pages, which no GPU reads until
 * wic_run_publish() has them mapped with its head words (or, if the generation ends first, with
 * an error marker at each page's head, which the producer's stores never reach). Write it with
 * wic_run_write() or by hand, following struct wic_run's rule for the head words, then
 * wic_run_publish(); the run and its head words are valid until then, and never after the
 * handle is closed. One thread per slot.
 *
 * The run's pages should stay in CPU memory (cudaMemAdviseSetPreferredLocation to
 * cudaCpuDeviceId on the placement): a GPU fault on other managed data of their 2 MiB block can
 * otherwise migrate them to GPU memory, where every write from the CPU would move them back.
 *
 * Return: WIC_OK; WIC_ESTALE, once, when the slot's last in-place publish missed its generation
 * (it ended before the run was mapped, and the consumers read an error marker instead): call
 * again and write the batch again into the run it lends; WIC_EUNSUPPORTED for a handle that
 * cannot reach the pages (publish from the slot buffer instead) or a daemon older than in-place
 * publishing; otherwise as wic_wait_writable().
 */
int wic_run_acquire(wic_channel *ch, uint32_t slot, uint64_t timeout_ns, struct wic_run *out);

/**
 * wic_run_write() - copy bytes into a lent run, the head bytes into the head words
 * @run: from wic_run_acquire() of a handle not yet closed, not yet published
 * @offset: where in the batch
 * @src: the bytes
 * @len: how many
 *
 * Return: WIC_OK, or WIC_EINVALID for a NULL @run, a NULL @src with a @len, or bytes beyond the
 * batch.
 */
int wic_run_write(const struct wic_run *run, uint64_t offset, const void *src, size_t len);

/**
 * wic_run_publish() - publish the batch written in place into a lent run
 * @ch: the handle that acquired @run
 * @slot: the slot
 * @run: from wic_run_acquire() of @slot
 *
 * The daemon writes the head words and maps the run, or, if the generation ended before (a
 * timeout, or a run acquired before the generation ended), drops the publish: the next
 * wic_run_acquire() or wic_wait_writable() of the slot says so with WIC_ESTALE.
 *
 * Return: as wic_publish(), and WIC_EINVALID for a NULL @run or one lent for another slot.
 */
int wic_run_publish(wic_channel *ch, uint32_t slot, const struct wic_run *run);

/**
 * wic_consume() - read a slot's next generation as the consumer warps would
 * @ch: a handle that may consume
 * @slot: the slot
 * @dst: receives up to @len bytes of the batch
 * @len: size of @dst; bytes beyond batch_bytes are left untouched
 *
 * Emulated backend only: the calling thread plays the consumer warps of one batch, faulting
 * on the slot's run and sleeping until the daemon maps it. Blocks until the data arrives or
 * the daemon completes the request with an error; an error still uses up the generation. Only
 * one thread at a time may consume a given slot.
 *
 * Return: WIC_OK; WIC_ETIMED_OUT if the producer missed the channel's timeout; WIC_ECLOSED;
 * WIC_ESTOPPING; WIC_ECONNECT if the daemon hung up; WIC_EPERMISSION for a producer handle;
 * WIC_EUNSUPPORTED on the shim backend, whose consumers are GPU kernels.
 */
int wic_consume(wic_channel *ch, uint32_t slot, void *dst, size_t len);

/**
 * wic_uvm_gpu_id() - nvidia-uvm's id of a GPU, from its UUID
 * @uuid: the GPU's 16-byte UUID, as CUDA gives it (cudaDeviceProp::uuid.bytes,
 *	cuDeviceGetUuid()): a MIG device's UUID names that MIG instance (nvidia-uvm's
 *	intent; not yet seen on a MIG GPU)
 * @gpu_id: receives the id, what wic_channel_spec's GPU fields take on the shim backend
 *
 * nvidia-uvm hands out a GPU's id when it first registers the GPU, which CUDA does for every
 * GPU a process can see when it initializes, and takes it back when no process has the GPU
 * registered: the id depends on which GPUs other processes use and on CUDA_VISIBLE_DEVICES, and
 * stays the same only while some process, the caller included, has CUDA initialized. Call it
 * after CUDA is initialized. Reads nvidia-uvm's /proc/driver/nvidia-uvm/gpus; needs no daemon.
 *
 * Return: WIC_OK; WIC_ENOT_FOUND if no GPU of that UUID is registered (CUDA not initialized,
 * or not an NVIDIA GPU's UUID), or if it is the physical UUID of a GPU split into several MIG
 * instances (give the MIG device's UUID); WIC_EUNSUPPORTED where nvidia-uvm is not loaded;
 * WIC_EINVALID for a NULL pointer.
 */
int wic_uvm_gpu_id(const uint8_t uuid[16], uint32_t *gpu_id);

/**
 * wic_stats() - fetch the daemon's statistics
 * @client: the session
 * @out: receives the statistics
 *
 * Return: WIC_OK or an error code.
 */
int wic_stats(wic_client *client, struct wic_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* WIC_H */
