/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR MIT */
/*
 * wic_abi.h - the interface between wicd and wic_shim.ko (/dev/wic).
 *
 * The one definition of the kernel <-> daemon ABI: the module includes it, the daemon's Rust
 * view (crate wic-kabi) is checked against it by a test.
 *
 * Session: wicd opens /dev/wic (one open session at a time), negotiates the version with
 * WIC_IOC_VERSION, maps the fault ring (mmap offset 0, WIC_RING_BYTES(entries) bytes), attaches
 * application VA spaces (WIC_IOC_ATTACH with the application's UVM file descriptor, received
 * over the daemon's socket) and registers their PCM and PAT ranges. Faults on registered pages
 * are held and appear in the ring; poll() reports POLLIN while records are unread. Commands go
 * in batches, through WIC_IOC_SUBMIT or an io_uring IORING_OP_URING_CMD whose cmd_op is
 * WIC_IOC_SUBMIT and whose 16-byte command area holds a struct wic_submit. A batch of at most
 * 16 commands runs inline, from the submitting task, unless WIC_MAX_CONCURRENT_BATCHES batches
 * run already or a call or the module's expiry holds the session; a longer one, or one that
 * finds the session held, runs on one of io_uring's workers (the command answers -EAGAIN to
 * the inline issue), so that io_uring_enter() never waits for the session nor for the expiry.
 *
 * Batches submitted from several threads (or io_uring workers) run at once, up to
 * WIC_MAX_CONCURRENT_BATCHES of them; the other calls, and the module's own sweeps of its held
 * faults (expiry, closing, release), run alone. The module orders nothing between two batches
 * that run at once: commands naming the same pages, or a run and the companion it unmaps,
 * must be in one batch or in batches that do not overlap in time. A wicd that submits from
 * one thread is served as before.
 *
 * When the session's file is released (wicd exits or is killed), every held fault is
 * completed with the WIC_MARKER_DAEMON_GONE error marker, mapped and replayed.
 *
 * With the module parameter max_hold_ms set (default 3000; 0: no bound), a fault held longer is
 * completed by the module itself with the WIC_MARKER_TIMEOUT marker, mapped and its GPU
 * replayed. In a PCM range registered with its runs (struct wic_range @run_pages) the whole
 * run is completed as wicd's timeout would, the slot's other run unmapped, and a
 * WIC_RECORD_EXPIRED record tells wicd; elsewhere, and for a run nvidia-uvm refuses to complete
 * whole, only the faulting page, and wicd is not told (see shim/README.md). wicd's channel timeouts should stay well below it. A command wicd runs
 * for that page afterwards acts on a page that is no longer held.
 */
#ifndef _WIC_ABI_H
#define _WIC_ABI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define WIC_ABI_VERSION 6

#define WIC_PAGE_SIZE 4096

/* Module limits, also reported by WIC_IOC_VERSION. */
#define WIC_MAX_SPACES 64
#define WIC_MAX_RANGES 1024
#define WIC_MAX_HELD 4096
#define WIC_MAX_COMMANDS 1024
#define WIC_MAX_RANGE_BYTES (1ULL << 36)
#define WIC_MAX_WRITE_BYTES (1U << 20)

/*
 * Batches of one session that run at once at most: submitted from several threads, they run
 * together, and a further one waits for one of them to end.
 */
#define WIC_MAX_CONCURRENT_BATCHES 4

/*
 * GPU ids are nvidia-uvm's processor ids of GPUs: parent GPU index * 8 + MIG sub-index + 1,
 * so 1 to WIC_MAX_GPU_ID (0 is the CPU's id, never a GPU's).
 */
#define WIC_MAX_GPU_ID 256

/* Error markers: the first 8 bytes of a page completed without data. */
#define WIC_MARKER_MAGIC 0x5749434500000000ULL
#define WIC_MARKER_TIMEOUT (WIC_MARKER_MAGIC | 1)
#define WIC_MARKER_CHANNEL_CLOSED (WIC_MARKER_MAGIC | 2)
#define WIC_MARKER_DAEMON_STOPPING (WIC_MARKER_MAGIC | 3)
#define WIC_MARKER_DAEMON_GONE (WIC_MARKER_MAGIC | 4)

/**
 * struct wic_version - version negotiation, the first call of a session
 * @abi_version: in: the daemon's WIC_ABI_VERSION; out: the module's
 * @ring_entries: out: records in the fault ring (a power of two)
 * @max_spaces: out: VA spaces one session may attach
 * @max_ranges: out: ranges one session may register
 * @max_held: out: faults the module holds at once; more stay stalled unrecorded and fault
 *	again after the next replay
 * @max_commands: out: commands in one submission
 *
 * The call fails with EPROTONOSUPPORT, after filling in the module's values, when the versions
 * differ. Every other call fails with EPROTO until the versions agreed.
 */
struct wic_version {
	__u32 abi_version;
	__u32 ring_entries;
	__u32 max_spaces;
	__u32 max_ranges;
	__u32 max_held;
	__u32 max_commands;
};

/**
 * struct wic_attach - attach an application's UVM VA space to the session
 * @uvm_fd: in: the daemon's descriptor of the application's /dev/nvidia-uvm file
 * @space_id: out: the id commands and records use for this space (never 0)
 *
 * Errors: EINVAL when @space_id is not 0 on input; EBADF when @uvm_fd is no descriptor or not
 * an nvidia-uvm VA-space file; ENODEV when that space has no process yet; EOPNOTSUPP when a
 * GPU registered in the space cannot cancel faults per VA (Pascal and older), whose faults wic
 * never holds; EPERM under Confidential Computing, where nvidia-uvm cannot write a held page's
 * data; EEXIST when the space is attached already; ENOSPC past WIC_MAX_SPACES. Commands
 * naming such a GPU fail with EOPNOTSUPP.
 */
struct wic_attach {
	__s32 uvm_fd;
	__u32 space_id;
};

/* Range kinds. */
#define WIC_RANGE_PCM 1	/* consumer pages: read faults are held until data arrives */
#define WIC_RANGE_PAT 2	/* producer pages: write faults signal availability */
#define WIC_RANGE_SOURCE 3	/* a GPU producer's data: read by WIC_CMD_COMPLETE_COPY, never held */

/**
 * struct wic_range - register a range of an attached space
 * @space_id: in: from WIC_IOC_ATTACH
 * @kind: in: WIC_RANGE_PCM, WIC_RANGE_PAT or WIC_RANGE_SOURCE
 * @start: in: page-aligned start
 * @length: in: page-aligned length, 1 page to WIC_MAX_RANGE_BYTES
 * @range_id: out: the id records carry and WIC_IOC_UNREGISTER takes (never 0); 0 on input
 * @run_pages: in: WIC_RANGE_PCM: 0, or the pages of each run when the range is runs of that
 *	size laid end to end, each slot's two runs side by side (the even-indexed run and the
 *	one after it), as wicd places a channel; then the module's own expiry (max_hold_ms)
 *	completes a whole run as wicd's timeout would and reports it (WIC_RECORD_EXPIRED).
 *	Other kinds: 0
 *
 * A @run_pages that is not 0 must divide the range into pairs of runs (@length a multiple of
 * 2 * @run_pages pages), for a PCM range only (EINVAL otherwise). Ranges of one space never
 * overlap. Faults on a WIC_RANGE_SOURCE range are never held: the
 * producer GPU writes there as usual; the range only names the bytes WIC_CMD_COMPLETE_COPY may
 * read, and is checked to be managed memory when it is registered, not at the first copy.
 * Errors, in the order checked: EINVAL for a field above
 * broken, or a range that would end past 2^64 - 1; ENOENT when @space_id names no attached
 * space; ENOSPC when the session holds WIC_MAX_RANGES ranges; EFAULT when the range is not
 * inside mappings of the space's process (touching mappings may share it); EEXIST when it
 * overlaps a range of the space; EMEDIUMTYPE when it is not entirely managed memory of the
 * space (cudaMallocManaged): malloc or mmap memory (HMM for nvidia-uvm) and other allocations
 * are refused, since nvidia-uvm can complete faults on managed memory only; EAGAIN while
 * nvidia-uvm is suspended; ENOMEM when the module cannot allocate the range's table or, for a
 * PCM range, its two bits per page (below). WIC_IOC_UNREGISTER fails with ENOENT for an id no
 * range has.
 *
 * WIC_IOC_UNREGISTER (a range) and WIC_IOC_DETACH (a space and all its ranges) first complete
 * the faults held there with the channel-closed marker: each held PCM page gets the marker and
 * every held page is mapped; faults arriving meanwhile are held and completed too, never
 * recorded. Only then are the pages no longer wic pages and their GPUs replayed. When
 * nvidia-uvm refuses a marker's write or map (EAGAIN while it is suspended, ENOMEM, ENODATA,
 * EBUSY) the call fails with that errno and leaves the range or space registered, its
 * remaining faults held: call again, or closing the session completes them. A page whose
 * process, memory or GPU is gone (ESRCH, EFAULT, ENODEV) is dropped without its marker. A
 * held page nvidia-uvm cannot map on the faulting GPU (EXDEV, see struct wic_command) gets
 * its marker and is released unmapped: once the range is gone its fault comes back and
 * nvidia-uvm services it as any fault, so the warp reads the marker. So does a fault held
 * without a held-table entry (the table full), whose page a PCM range remembers until it is
 * completed: its marker is written, unmapped, before the range goes.
 */
struct wic_range {
	__u32 space_id;
	__u32 kind;
	__u64 start;
	__u64 length;
	__u32 range_id;
	__u32 run_pages;
};

/*
 * Command opcodes. 1 to 4 are not used: they named the steps of a completion (write data,
 * write a marker, unmap, map) as commands of their own, which no caller needs, since wicd
 * wakes a slot only whole (WIC_CMD_COMPLETE), and which let a session map or unmap any page
 * of its ranges out of turn. The module refuses them with EINVAL.
 */
#define WIC_CMD_SERVICE_PAT 5	/* map a PAT page writable and release its held fault */
#define WIC_CMD_REARM_PAT 6	/* revoke write access to a PAT page */
#define WIC_CMD_REPLAY 7	/* replay the GPU's faults; @space_id, @va, @pages unused */
#define WIC_CMD_COMPLETE 8	/* one wake-up: fill @va, unmap @companion, map @va and release */
#define WIC_CMD_COMPLETE_COPY 9	/* WIC_CMD_COMPLETE, its data copied from a GPU producer */
#define WIC_CMD_COMPLETE_HEADS 10	/* WIC_CMD_COMPLETE of a run its producer wrote in place */

/**
 * struct wic_command - one command of a submission
 * @opcode: WIC_CMD_*
 * @space_id: the space the pages belong to
 * @gpu_id: the GPU the command concerns, 1 to WIC_MAX_GPU_ID (nvidia-uvm's id of the GPU)
 * @pages: pages from @va, 1 to WIC_MAX_RANGE_BYTES / WIC_PAGE_SIZE (1 for the PAT commands)
 * @va: page-aligned, inside one registered range of @space_id (a PAT range for PAT commands)
 * @length: WIC_CMD_COMPLETE with data and WIC_CMD_COMPLETE_COPY: bytes to copy, at least 1,
 *	at most WIC_MAX_WRITE_BYTES and no more than the @pages pages hold;
 *	WIC_CMD_COMPLETE_HEADS: exactly 8 x @pages (so @pages is at most
 *	WIC_MAX_WRITE_BYTES / 8); otherwise 0
 * @arg: WIC_CMD_COMPLETE with @length: the daemon's address of the bytes;
 *	WIC_CMD_COMPLETE_COPY: the application's address of the bytes, @length of them inside
 *	one WIC_RANGE_SOURCE range of @space_id; WIC_CMD_COMPLETE_HEADS: the daemon's address of
 *	@pages 8-byte words, the heads; WIC_CMD_COMPLETE without @length: one of the four
 *	WIC_MARKER_* values; otherwise 0
 * @companion: WIC_CMD_COMPLETE, WIC_CMD_COMPLETE_COPY and WIC_CMD_COMPLETE_HEADS: the other
 *	run of the slot, @pages pages from this page-aligned address, in a PCM range of
 *	@space_id and not overlapping @va's; otherwise 0
 * @result: in: 0; out: 0 or a negative errno
 * @reserved: must be 0
 *
 * WIC_CMD_COMPLETE is one wake-up of a slot: the fill of @va's pages (@length bytes from @arg,
 * or with @length 0 marker @arg at the start of each page), the unmap of @companion's pages
 * from @gpu_id (waiting for the invalidate; the faults held there are late duplicates and are
 * forgotten), then the read-only map of @va's pages on @gpu_id, which releases their held
 * faults. The steps run in that order and the first that fails ends the
 * command with its error, so a run whose fill failed is never mapped. WIC_CMD_COMPLETE_COPY is
 * the same wake-up for a GPU producer: the fill is a copy of @length bytes from @arg in the
 * application's managed memory, read where they are resident: from a GPU's memory, that GPU's
 * copy engine writes them by DMA into system memory (after the work pending on those pages),
 * from where they reach @va's pages. The producer makes its bytes visible before it signals
 * (a system-scope fence before its PAT write), as for any copy engine reading its memory.
 *
 * WIC_CMD_COMPLETE_HEADS is the same wake-up for a host producer that wrote its batch straight
 * into @va's pages (CPU-resident, and unmapped on the GPU while the fault is held), all but the
 * first 8 bytes of each page: those head words are where error markers go, and only
 * completions (wicd's, the module's expiry, the channel's close, the session's release) write
 * them. The producer never does, so that one still writing when a timeout marker lands can
 * never overwrite the marker. The producer hands its heads to the
 * daemon, and the fill writes word i of @arg at the start of page i of @va's run: 8 bytes a
 * page instead of the whole batch. The bytes after each head were written by the application
 * itself; the module never writes them. Then, exactly as WIC_CMD_COMPLETE, the unmap of
 * @companion and the map of @va, which releases their held faults.
 *
 * Errors in @result, in the order checked: EINVAL for @reserved or @result set or an unknown
 * opcode; ENODEV for @gpu_id; EINVAL for @length, @arg or @companion set where the opcode does
 * not use them (WIC_CMD_REPLAY needs nothing more), for @pages or @va broken, or pages that
 * would end past 2^64 - 1, and for a @companion that is not page aligned, would end past
 * 2^64 - 1 or overlaps @va's pages; ENOENT when @space_id names no attached space; ERANGE when
 * the pages (or the companion's) are not inside one range of the kind the opcode needs; EINVAL
 * for the data's @length, the marker's @arg, or a WIC_CMD_COMPLETE_HEADS whose @length is not
 * 8 x @pages (or is above WIC_MAX_WRITE_BYTES); ERANGE when a copy's source bytes are not inside
 * one WIC_RANGE_SOURCE range; ESTALE for a completion of a run the module's expiry
 * completed (max_hold_ms) whose WIC_RECORD_EXPIRED record the daemon has not read yet (or, when
 * the ring had no room for the record, the first completion of that run after the expiry), or
 * the first completion after the expiry of a PCM page it completed alone, with no record (a
 * range registered without runs): it was sent for the generation the expiry ended, whose warps
 * already read the timeout marker, and nothing is written. Running the command may fail too (EFAULT for @arg bytes that cannot
 * be read, or what nvidia-uvm returns).
 *
 * WIC_CMD_SERVICE_PAT and the three completions release held faults only when the map
 * succeeded. It fails with ENODATA when a page is resident nowhere (never written; a
 * PAT page, mapped writable, is made resident, zeroed, instead) and
 * with EXDEV when nvidia-uvm cannot map a page on @gpu_id: it is resident only on a GPU without
 * peer access to @gpu_id, or policy keeps it from a remote mapping (read duplication, a
 * preferred location on @gpu_id, a UVM-Lite GPU), or a writable map was asked of a
 * read-duplicated page. Then the faults stay held (other pages of the command may be mapped
 * already) and the application's warps stay stalled on those pages; nothing faults again in a
 * loop. They are released by a later completion or PAT service whose map succeeds (once the
 * application moved the pages, e.g. prefetched them to the CPU), by WIC_IOC_UNREGISTER or
 * WIC_IOC_DETACH (marker, see struct wic_range), or when the session ends (daemon-gone marker,
 * released unmapped).
 */
struct wic_command {
	__u32 opcode;
	__u32 space_id;
	__u32 gpu_id;
	__u32 pages;
	__u64 va;
	__u64 length;
	__u64 arg;
	__u64 companion;
	__s32 result;
	__u32 reserved;
};

/**
 * struct wic_submit - a batch of commands
 * @commands: the daemon's address of @count struct wic_command
 * @count: 1 to WIC_MAX_COMMANDS
 * @flags: must be 0
 *
 * Commands run in order; each gets its own result. The call returns the number of commands
 * that succeeded, or a negative errno when the batch itself is refused (EINVAL for @count or
 * @flags) or its first command cannot be read or answered (EFAULT). A command that cannot
 * be read ends the batch: it and the ones after it do not run and keep their result fields,
 * so a count below the number of zero results says where the batch stopped. So does a result
 * that cannot be stored: the commands after it do not run, and the count includes every
 * command that succeeded, that one too (EFAULT when it is the first command's).
 */
struct wic_submit {
	__u64 commands;
	__u32 count;
	__u32 flags;
};

/**
 * struct wic_ring_header - the first page of the mapped fault ring
 * @magic: WIC_RING_MAGIC
 * @abi_version: WIC_ABI_VERSION
 * @entries: records in the ring, a power of two
 * @record_size: sizeof(struct wic_fault_record)
 * @head: written by the module: sequence number of the next record it will write; record
 *	@seq lives at index @seq & (@entries - 1)
 * @dropped: written by the module: each time a fault is held but not recorded because the
 *	ring or the held table was full (a fault the ring had no room for keeps its held-table
 *	entry and is recorded when it faults again with room; one past a full table is held
 *	without an entry and faults again at its GPU's next replay; either is bounded by
 *	max_hold_ms)
 * @tail: written by the daemon: sequence number of the next record it will read; the module
 *	never overwrites an unread record
 *
 * @head and @tail live on different cache lines; records start at WIC_RING_RECORDS_OFFSET.
 */
struct wic_ring_header {
	__u32 magic;
	__u32 abi_version;
	__u32 entries;
	__u32 record_size;
	__u8 pad0[48];
	__u64 head;
	__u64 dropped;
	__u8 pad1[48];
	__u64 tail;
	__u8 pad2[56];
};

#define WIC_RING_MAGIC 0x57494352U /* "WICR" */
#define WIC_RING_RECORDS_OFFSET WIC_PAGE_SIZE
#define WIC_RING_BYTES(entries) \
	(WIC_RING_RECORDS_OFFSET + (__u64)(entries) * sizeof(struct wic_fault_record))

/* Record flags. */
#define WIC_RECORD_PAT 1	/* the fault hit a PAT range */
/*
 * Not a new fault: the module ended this held fault's hold itself (max_hold_ms), in a PCM
 * range registered with run_pages, as wicd's timeout would have: WIC_MARKER_TIMEOUT at the
 * start of each page of the fault's run, the slot's other run unmapped from the GPU, the run
 * mapped, the GPU replayed. The entry is the fault's; wicd moves the slot on.
 */
#define WIC_RECORD_EXPIRED 2
/*
 * Not a held fault: a page of the range faulted on a GPU wic cannot hold faults of (pre-Volta,
 * or a MIG partition of a driver before 560), registered in the space after it was attached
 * (WIC_IOC_ATTACH refuses a space using one, EOPNOTSUPP). nvidia-uvm serviced the fault: its
 * warp read the page without its data. Posted once per space and GPU; wicd fails the channel.
 */
#define WIC_RECORD_UNSUPPORTED_GPU 4

/**
 * struct wic_fault_record - one held fault
 * @seq: the record's sequence number; written last, so a record whose @seq is not the one
 *	expected is torn or stale
 * @space_id: the space the fault belongs to
 * @gpu_id: the faulting GPU, 1 to WIC_MAX_GPU_ID
 * @range_id: the registered range the page is in
 * @flags: WIC_RECORD_*
 * @held_ns: CLOCK_MONOTONIC time the module held the fault
 * @entry: the raw 32-byte hardware fault-buffer entry
 */
struct wic_fault_record {
	__u64 seq;
	__u32 space_id;
	__u32 gpu_id;
	__u32 range_id;
	__u32 flags;
	__u64 held_ns;
	__u8 entry[32];
};

#define WIC_IOC_MAGIC 'W'
#define WIC_IOC_VERSION _IOWR(WIC_IOC_MAGIC, 0x00, struct wic_version)
#define WIC_IOC_ATTACH _IOWR(WIC_IOC_MAGIC, 0x01, struct wic_attach)
#define WIC_IOC_DETACH _IOW(WIC_IOC_MAGIC, 0x02, __u32)
#define WIC_IOC_REGISTER _IOWR(WIC_IOC_MAGIC, 0x03, struct wic_range)
#define WIC_IOC_UNREGISTER _IOW(WIC_IOC_MAGIC, 0x04, __u32)
#define WIC_IOC_SUBMIT _IOWR(WIC_IOC_MAGIC, 0x05, struct wic_submit)

#endif /* _WIC_ABI_H */
