// SPDX-License-Identifier: GPL-2.0
/*
 * fakegpu_smoke.c - exercise every ioctl of /dev/wic_fakegpu, bad arguments included.
 *
 * Usage: fakegpu_smoke [DEVICE]
 *
 * Needs wic_fakegpu.ko loaded and the device otherwise idle: the event log is global and this
 * program resets it. wic_shim.ko may be loaded, as long as no session has attached this
 * process's files (faults of spaces it does not know pass).
 *
 * Exit status: 0 when every check passed, 1 when one failed, 77 when the device is missing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wic_fakegpu.h"

_Static_assert(sizeof(struct wic_fakegpu_event) == 40, "event layout");
_Static_assert(sizeof(struct wic_fakegpu_inject) == 32, "inject layout");
_Static_assert(sizeof(struct wic_fakegpu_events) == 32, "events layout");
_Static_assert(sizeof(struct wic_fakegpu_page_state) == 16, "page state layout");

#define VA_A 0x7f0000001000ULL
#define VA_B 0x7f0000002000ULL
/* ADDR_HI 0x810000ab: bit 63 lies above the 57-bit width, bit 56 (set) is the sign. */
#define VA_C 0xff0000ab00345000ULL
/* ADDR_HI 0x80000000: only bits above the width, which are discarded. */
#define VA_D 0x1000ULL
#define GPU 3

static int failures;

#define CHECK(cond, ...)							\
	do {									\
		int saved_errno_ = errno;				\
									\
		if (!(cond)) {							\
			fprintf(stderr, "FAIL %s:%d: ", __func__, __LINE__);	\
			errno = saved_errno_;					\
			fprintf(stderr, __VA_ARGS__);				\
			fputc('\n', stderr);					\
			failures++;						\
		}								\
	} while (0)

/* Check that an ioctl failed with the given errno. */
#define CHECK_ERR(ret, err, what)						\
	CHECK((ret) == -1 && errno == (err), "%s: got %d (%s), want %s", what,	\
	      (ret), (ret) == -1 ? strerror(errno) : "success", strerror(err))

#define CHECK_OK(ret, what)							\
	CHECK((ret) == 0, "%s: %s", what, strerror(errno))

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = v;
	p[1] = v >> 8;
	p[2] = v >> 16;
	p[3] = v >> 24;
}

/* A read fault entry with the given ADDR_LO DWORD (junk in bits [11:0] allowed) and ADDR_HI. */
static void make_entry(uint8_t *e, uint32_t dw2, uint32_t dw3)
{
	memset(e, 0, WIC_FAKEGPU_FAULT_ENTRY_SIZE);
	put_le32(e + 0, 0x00abc000);			/* INST_LO */
	put_le32(e + 8, dw2);
	put_le32(e + 12, dw3);
	put_le32(e + 28, 0x80000080);			/* VALID, REPLAYABLE_FAULT */
}

static void make_entry_va(uint8_t *e, uint64_t va)
{
	make_entry(e, (uint32_t)va, (uint32_t)(va >> 32));
}

static int inject(int fd, uint32_t gpu, const uint8_t *entries, uint32_t count, uint8_t *verdicts,
		  uint64_t *injected_ns)
{
	struct wic_fakegpu_inject in = {
		.gpu_id = gpu,
		.count = count,
		.entries = (uintptr_t)entries,
		.verdicts = (uintptr_t)verdicts,
	};
	int ret = ioctl(fd, WIC_FAKEGPU_IOC_INJECT, &in);

	if (injected_ns)
		*injected_ns = in.injected_ns;
	return ret;
}

static int read_events(int fd, struct wic_fakegpu_event *buf, uint32_t capacity,
		       uint32_t timeout_ms, uint32_t *count, uint64_t *overflow)
{
	struct wic_fakegpu_events ev = {
		.buffer = (uintptr_t)buf,
		.capacity = capacity,
		.timeout_ms = timeout_ms,
	};
	int ret = ioctl(fd, WIC_FAKEGPU_IOC_EVENTS, &ev);

	*count = ev.count;
	if (overflow)
		*overflow = ev.overflow;
	return ret;
}

static int page_flags(int fd, uint32_t gpu, uint64_t va, uint32_t *flags)
{
	struct wic_fakegpu_page_state ps = { .gpu_id = gpu, .flags = 0xdead, .va = va };
	int ret = ioctl(fd, WIC_FAKEGPU_IOC_PAGE_STATE, &ps);

	*flags = ps.flags;
	return ret;
}

static void test_events_args(int fd)
{
	struct wic_fakegpu_event buf[4];
	struct wic_fakegpu_events ev;
	uint64_t overflow, t0;
	uint32_t count;
	int ret;

	ret = read_events(fd, buf, 4, 0, &count, &overflow);
	CHECK_OK(ret, "EVENTS on an empty log");
	CHECK(count == 0 && overflow == 0, "empty log: count %u overflow %" PRIu64, count,
	      overflow);

	t0 = now_ns();
	ret = read_events(fd, buf, 4, 100, &count, NULL);
	CHECK_OK(ret, "EVENTS with a timeout");
	CHECK(count == 0, "timed-out read returned %u events", count);
	CHECK(now_ns() - t0 >= 90000000ULL, "timeout of 100 ms returned after %" PRIu64 " ns",
	      now_ns() - t0);

	memset(&ev, 0, sizeof(ev));
	ev.buffer = (uintptr_t)buf;
	ev.capacity = 0;
	ret = ioctl(fd, WIC_FAKEGPU_IOC_EVENTS, &ev);
	CHECK_ERR(ret, EINVAL, "EVENTS capacity 0");

	ev.capacity = 4;
	ev.reserved = 1;
	ret = ioctl(fd, WIC_FAKEGPU_IOC_EVENTS, &ev);
	CHECK_ERR(ret, EINVAL, "EVENTS reserved 1");

	ret = ioctl(fd, WIC_FAKEGPU_IOC_EVENTS, NULL);
	CHECK_ERR(ret, EFAULT, "EVENTS NULL argument");
}

static void test_page_state_args(int fd)
{
	struct wic_fakegpu_page_state ps = { .gpu_id = 1, .va = VA_A };
	uint32_t flags;
	int ret;

	ret = page_flags(fd, 1, VA_A, &flags);
	CHECK_ERR(ret, ENODEV, "PAGE_STATE gpu 0 (the CPU)");
	ret = page_flags(fd, WIC_FAKEGPU_NR_GPUS + 1, VA_A, &flags);
	CHECK_ERR(ret, ENODEV, "PAGE_STATE gpu 257");
	ret = page_flags(fd, 0xffffffffU, VA_A, &flags);
	CHECK_ERR(ret, ENODEV, "PAGE_STATE gpu ~0");
	ret = page_flags(fd, 1, VA_A + 1, &flags);
	CHECK_ERR(ret, EINVAL, "PAGE_STATE unaligned va");
	ret = ioctl(fd, WIC_FAKEGPU_IOC_PAGE_STATE, NULL);
	CHECK_ERR(ret, EFAULT, "PAGE_STATE NULL argument");
	ret = ioctl(fd, WIC_FAKEGPU_IOC_PAGE_STATE, &ps);
	CHECK_OK(ret, "PAGE_STATE");
	CHECK(ps.flags == 0, "unmapped page has flags %#x", ps.flags);
}

static void test_inject_args(int fd)
{
	static uint8_t entries[(WIC_FAKEGPU_MAX_INJECT + 1) * WIC_FAKEGPU_FAULT_ENTRY_SIZE];
	static uint8_t verdicts[WIC_FAKEGPU_MAX_INJECT + 1];
	struct wic_fakegpu_event buf[4];
	uint32_t count, flags;
	int ret;

	make_entry_va(entries, VA_A);
	ret = ioctl(fd, WIC_FAKEGPU_IOC_INJECT, NULL);
	CHECK_ERR(ret, EFAULT, "INJECT NULL argument");
	ret = inject(fd, 1, entries, 0, verdicts, NULL);
	CHECK_ERR(ret, EINVAL, "INJECT count 0");
	ret = inject(fd, 1, entries, WIC_FAKEGPU_MAX_INJECT + 1, verdicts, NULL);
	CHECK_ERR(ret, EINVAL, "INJECT count 4097");
	ret = inject(fd, 1, entries, 1, verdicts, NULL);
	CHECK_ERR(ret, ENODEV, "INJECT gpu 0 (the CPU)");
	ret = inject(fd, WIC_FAKEGPU_NR_GPUS + 1, entries, 1, verdicts, NULL);
	CHECK_ERR(ret, ENODEV, "INJECT gpu 257");
	ret = inject(fd, 0xffffffffU, entries, 1, verdicts, NULL);
	CHECK_ERR(ret, ENODEV, "INJECT gpu ~0");
	ret = inject(fd, 1, NULL, 1, verdicts, NULL);
	CHECK_ERR(ret, EFAULT, "INJECT NULL entries");
	ret = inject(fd, 1, (const uint8_t *)8, 1, verdicts, NULL);
	CHECK_ERR(ret, EFAULT, "INJECT bad entries");

	/* Nothing above reached the classify step. */
	ret = read_events(fd, buf, 4, 0, &count, NULL);
	CHECK(ret == 0 && count == 0, "rejected injections logged %u events", count);
	ret = page_flags(fd, 1, VA_A, &flags);
	CHECK(ret == 0 && flags == 0, "rejected injection mapped the page (%#x)", flags);

	/* A bad verdicts pointer is found after classifying: the fault was serviced. */
	ret = inject(fd, 1, entries, 1, (uint8_t *)8, NULL);
	CHECK_ERR(ret, EFAULT, "INJECT bad verdicts");
	ret = page_flags(fd, 1, VA_A, &flags);
	CHECK(ret == 0 && flags == WIC_FAKEGPU_PAGE_MAPPED,
	      "fault with bad verdicts pointer not serviced (%#x)", flags);

	ret = ioctl(fd, WIC_FAKEGPU_IOC_RESET, 1);
	CHECK_ERR(ret, EINVAL, "RESET with an argument");
	ret = ioctl(fd, WIC_FAKEGPU_IOC_RESET, 0);
	CHECK_OK(ret, "RESET");
	ret = page_flags(fd, 1, VA_A, &flags);
	CHECK(ret == 0 && flags == 0, "RESET left the page mapped (%#x)", flags);
	ret = read_events(fd, buf, 4, 0, &count, NULL);
	CHECK(ret == 0 && count == 0, "RESET left %u events", count);
}

static void test_inject(int fd, int fd2)
{
	static const uint64_t vas[] = { VA_A, VA_B, VA_C, VA_D };
	uint8_t entries[4 * WIC_FAKEGPU_FAULT_ENTRY_SIZE];
	struct wic_fakegpu_event buf[16];
	uint8_t verdicts[4] = { 0xff, 0xff, 0xff, 0xff };
	uint64_t injected_ns, t0, overflow;
	uint32_t count, flags, i;
	int ret;

	make_entry_va(entries, VA_A);
	make_entry(entries + 32, (uint32_t)VA_B | 0x3, (uint32_t)(VA_B >> 32));
	make_entry(entries + 64, 0x00345003, 0x810000ab);
	make_entry(entries + 96, 0x00001000, 0x80000000);

	t0 = now_ns();
	ret = inject(fd, GPU, entries, 4, verdicts, &injected_ns);
	CHECK_OK(ret, "INJECT");
	CHECK(injected_ns >= t0 && injected_ns <= now_ns(), "injected_ns %" PRIu64
	      " outside the call", injected_ns);
	for (i = 0; i < 4; i++)
		CHECK(verdicts[i] == WIC_FAKEGPU_VERDICT_PASS, "entry %u: verdict %u", i,
		      verdicts[i]);

	for (i = 0; i < 4; i++) {
		ret = page_flags(fd, GPU, vas[i], &flags);
		CHECK(ret == 0 && flags == WIC_FAKEGPU_PAGE_MAPPED,
		      "%#" PRIx64 " on gpu %d: flags %#x", vas[i], GPU, flags);
		ret = page_flags(fd, GPU - 1, vas[i], &flags);
		CHECK(ret == 0 && flags == 0, "%#" PRIx64 " on gpu %d: flags %#x", vas[i], GPU - 1,
		      flags);
		ret = page_flags(fd2, GPU, vas[i], &flags);
		CHECK(ret == 0 && flags == 0, "%#" PRIx64 " in another space: flags %#x", vas[i],
		      flags);
	}

	/* One event at a time, then a bad buffer (nothing consumed), then the rest. */
	ret = read_events(fd, buf, 1, 0, &count, &overflow);
	CHECK(ret == 0 && count == 1 && overflow == 0, "first read: ret %d count %u overflow %"
	      PRIu64, ret, count, overflow);
	ret = read_events(fd, (struct wic_fakegpu_event *)8, 16, 0, &count, NULL);
	CHECK_ERR(ret, EFAULT, "EVENTS bad buffer");
	ret = read_events(fd, buf + 1, 15, 0, &count, NULL);
	CHECK(ret == 0 && count == 3, "second read: ret %d count %u", ret, count);
	for (i = 0; i < 4 && i < count + 1; i++) {
		const struct wic_fakegpu_event *e = &buf[i];

		CHECK(e->kind == WIC_FAKEGPU_EVENT_SERVICED && e->gpu_id == GPU &&
		      e->va == vas[i] && e->length == WIC_FAKEGPU_PAGE_SIZE && e->data0 == 0,
		      "event %u: kind %u gpu %u va %#" PRIx64 " length %" PRIu64 " data0 %#"
		      PRIx64, i, e->kind, e->gpu_id, (uint64_t)e->va, (uint64_t)e->length,
		      (uint64_t)e->data0);
		CHECK(e->ns >= injected_ns && (i == 0 || e->ns >= buf[i - 1].ns),
		      "event %u: ns %" PRIu64 " out of order", i, (uint64_t)e->ns);
	}
}

/* A waiting reader wakes up when another process injects. */
static void test_wakeup(int fd)
{
	struct wic_fakegpu_event buf[4];
	uint8_t entry[WIC_FAKEGPU_FAULT_ENTRY_SIZE];
	uint64_t t0, elapsed;
	uint32_t count;
	int ret, status;
	pid_t pid;

	make_entry_va(entry, VA_B);
	pid = fork();
	if (pid == 0) {
		uint8_t verdict;

		usleep(200000);
		_exit(inject(fd, 1, entry, 1, &verdict, NULL) ? 1 : 0);
	}
	CHECK(pid > 0, "fork: %s", strerror(errno));
	if (pid < 0)
		return;
	t0 = now_ns();
	ret = read_events(fd, buf, 4, 5000, &count, NULL);
	elapsed = now_ns() - t0;
	CHECK(ret == 0 && count == 1 && buf[0].gpu_id == 1, "woken read: ret %d count %u", ret,
	      count);
	CHECK(elapsed < 4000000000ULL, "woken after %" PRIu64 " ns", elapsed);
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "injecting child failed");
}

/* More events than the log holds: the excess is counted, never blocks. */
static void test_overflow(int fd)
{
	static uint8_t entries[WIC_FAKEGPU_MAX_INJECT * WIC_FAKEGPU_FAULT_ENTRY_SIZE];
	static uint8_t verdicts[WIC_FAKEGPU_MAX_INJECT];
	static struct wic_fakegpu_event buf[8192];
	const uint32_t batches = WIC_FAKEGPU_LOG_EVENTS / WIC_FAKEGPU_MAX_INJECT + 1;
	uint64_t total = 0, overflow = 0, ov;
	uint32_t i, count;
	int ret;

	ret = ioctl(fd, WIC_FAKEGPU_IOC_RESET, 0);
	CHECK_OK(ret, "RESET");
	for (i = 0; i < WIC_FAKEGPU_MAX_INJECT; i++)
		make_entry_va(entries + i * WIC_FAKEGPU_FAULT_ENTRY_SIZE, VA_A);
	for (i = 0; i < batches; i++) {
		ret = inject(fd, 1, entries, WIC_FAKEGPU_MAX_INJECT, verdicts, NULL);
		CHECK_OK(ret, "INJECT of a full batch");
	}
	do {
		ret = read_events(fd, buf, 8192, 0, &count, &ov);
		CHECK_OK(ret, "EVENTS");
		if (ret)
			break;
		total += count;
		overflow += ov;
	} while (count);
	CHECK(total == WIC_FAKEGPU_LOG_EVENTS, "read %" PRIu64 " events", total);
	CHECK(overflow == (uint64_t)batches * WIC_FAKEGPU_MAX_INJECT - WIC_FAKEGPU_LOG_EVENTS,
	      "overflow %" PRIu64, overflow);
	ret = read_events(fd, buf, 1, 0, &count, &ov);
	CHECK(ret == 0 && count == 0 && ov == 0, "overflow not cleared: %" PRIu64, ov);
}

static void test_unknown(int fd)
{
	int ret;

	ret = ioctl(fd, _IO(WIC_FAKEGPU_IOC_MAGIC, 99), 0);
	CHECK_ERR(ret, ENOTTY, "unknown number");
	ret = ioctl(fd, _IOWR(WIC_FAKEGPU_IOC_MAGIC, 1, uint64_t), 0);
	CHECK_ERR(ret, ENOTTY, "INJECT number with the wrong size");
	ret = ioctl(fd, _IO('G', 4), 0);
	CHECK_ERR(ret, ENOTTY, "wrong magic");
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : WIC_FAKEGPU_DEVICE;
	int fd, fd2;

	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "SKIP: %s: %s\n", path, strerror(errno));
		return errno == ENOENT || errno == ENODEV || errno == ENXIO ? 77 : 1;
	}
	fd2 = open(path, O_RDWR | O_CLOEXEC);
	if (fd2 < 0) {
		fprintf(stderr, "FAIL: second open of %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (ioctl(fd, WIC_FAKEGPU_IOC_RESET, 0)) {
		fprintf(stderr, "FAIL: RESET: %s\n", strerror(errno));
		return 1;
	}

	test_events_args(fd);
	test_page_state_args(fd);
	test_inject_args(fd);
	test_inject(fd, fd2);
	test_wakeup(fd);
	test_overflow(fd);
	test_unknown(fd);

	ioctl(fd, WIC_FAKEGPU_IOC_RESET, 0);
	close(fd2);
	close(fd);
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("fakegpu_smoke: all checks passed\n");
	return 0;
}
