// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * producer - attach to a channel with a producer token and publish into every slot.
 *
 * Usage: producer TOKEN [GENERATIONS]   (default: 100)
 *
 * For each generation and slot, round robin: waits until the slot is writable (at most 5 s),
 * fills its buffer with the pattern consumer.c checks and publishes it. Prints
 * "published <count> batches". The daemon's socket is $WIC_SOCKET, else the default.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <wic.h>

#define WRITABLE_TIMEOUT_NS (5ull * 1000 * 1000 * 1000)

/* Byte i of slot s, generation g: what consumer.c expects. */
static uint8_t pattern(size_t i, uint32_t s, uint32_t g)
{
	return (uint8_t)(i * 31u + s * 7u + g * 13u);
}

static void fail(const char *what, int err)
{
	fprintf(stderr, "producer: %s: %s (%d)\n", what, wic_strerror(err), err);
}

int main(int argc, char **argv)
{
	uint32_t generations = 100;
	struct wic_channel_info info;
	wic_client *client = NULL;
	wic_channel *ch = NULL;
	unsigned long long published = 0;
	int status = 1;
	int err;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s TOKEN [GENERATIONS]\n", argv[0]);
		return 1;
	}
	if (argc > 2) {
		char *end;
		unsigned long value;

		errno = 0;
		value = strtoul(argv[2], &end, 0);
		if (errno || *argv[2] == '\0' || *end != '\0' || value > UINT32_MAX) {
			fprintf(stderr, "producer: bad generation count '%s'\n", argv[2]);
			return 1;
		}
		generations = (uint32_t)value;
	}

	err = wic_connect(NULL, &client);
	if (err) {
		fail("connect", err);
		return 1;
	}
	err = wic_channel_attach(client, argv[1], &ch);
	if (err) {
		fail("attach", err);
		goto out;
	}
	err = wic_channel_info(ch, &info);
	if (err) {
		fail("channel info", err);
		goto out;
	}

	for (uint32_t g = 0; g < generations; g++) {
		for (uint32_t s = 0; s < info.slots; s++) {
			uint8_t *buf;

			err = wic_wait_writable(ch, s, WRITABLE_TIMEOUT_NS);
			if (err) {
				fprintf(stderr, "producer: slot %u generation %u: ", s, g);
				fail("wait writable", err);
				goto out;
			}
			buf = wic_slot_buffer(ch, s);
			if (!buf) {
				fprintf(stderr, "producer: slot %u has no buffer\n", s);
				goto out;
			}
			for (size_t i = 0; i < info.batch_bytes; i++)
				buf[i] = pattern(i, s, g);
			err = wic_publish(ch, s);
			if (err) {
				fprintf(stderr, "producer: slot %u generation %u: ", s, g);
				fail("publish", err);
				goto out;
			}
			published++;
		}
	}
	printf("published %llu batches\n", published);
	status = 0;

out:
	err = wic_channel_close(ch);
	if (err) {
		fail("close channel", err);
		status = 1;
	}
	wic_disconnect(client);
	return status;
}
