// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * consumer - create a host-producer channel, grant a producer token and consume every slot.
 *
 * Usage: consumer [MESSAGE_BYTES [SLOTS [GENERATIONS]]]   (defaults: 256 4 100)
 *
 * Prints "token <hex>" once the channel exists (give it to ./producer), then consumes
 * GENERATIONS generations of every slot, round robin, checks each batch against the pattern
 * the producer writes, and prints "consumed <count> batches, <errors> mismatches". Exits 0
 * only if every batch matched. The daemon's socket is $WIC_SOCKET, else the default.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <wic.h>

/* Byte i of slot s, generation g: what producer.c writes. */
static uint8_t pattern(size_t i, uint32_t s, uint32_t g)
{
	return (uint8_t)(i * 31u + s * 7u + g * 13u);
}

static int parse_u32(const char *arg, const char *what, uint32_t min, uint32_t *out)
{
	char *end;
	unsigned long value;

	errno = 0;
	value = strtoul(arg, &end, 0);
	if (errno || *arg == '\0' || *end != '\0' || value < min || value > UINT32_MAX) {
		fprintf(stderr, "consumer: bad %s '%s'\n", what, arg);
		return -1;
	}
	*out = (uint32_t)value;
	return 0;
}

static void fail(const char *what, int err)
{
	fprintf(stderr, "consumer: %s: %s (%d)\n", what, wic_strerror(err), err);
}

int main(int argc, char **argv)
{
	struct wic_channel_spec spec = {
		.consumer_gpu = 0,
		.producer_kind = WIC_PRODUCER_HOST,
		.message_bytes = 256,
		.slots = 4,
		.timeout_ns = 0,
	};
	uint32_t generations = 100;
	struct wic_channel_info info;
	char token[WIC_TOKEN_LEN];
	wic_client *client = NULL;
	wic_channel *ch = NULL;
	unsigned long long consumed = 0, mismatches = 0;
	uint8_t *buf = NULL;
	int status = 1;
	int err;

	if (argc > 4) {
		fprintf(stderr, "usage: %s [MESSAGE_BYTES [SLOTS [GENERATIONS]]]\n", argv[0]);
		return 1;
	}
	if ((argc > 1 && parse_u32(argv[1], "message size", 1, &spec.message_bytes)) ||
	    (argc > 2 && parse_u32(argv[2], "slot count", 1, &spec.slots)) ||
	    (argc > 3 && parse_u32(argv[3], "generation count", 0, &generations)))
		return 1;

	err = wic_connect(NULL, &client);
	if (err) {
		fail("connect", err);
		return 1;
	}
	err = wic_channel_create(client, &spec, &ch);
	if (err) {
		fail("create channel", err);
		goto out;
	}
	err = wic_channel_info(ch, &info);
	if (err) {
		fail("channel info", err);
		goto out;
	}
	err = wic_channel_grant(ch, WIC_ROLE_PRODUCER, -1, token);
	if (err) {
		fail("grant", err);
		goto out;
	}
	printf("token %s\n", token);
	fflush(stdout);

	buf = malloc(info.batch_bytes ? info.batch_bytes : 1);
	if (!buf) {
		fprintf(stderr, "consumer: out of memory for a batch of %llu bytes\n",
			(unsigned long long)info.batch_bytes);
		goto out;
	}

	for (uint32_t g = 0; g < generations; g++) {
		for (uint32_t s = 0; s < info.slots; s++) {
			err = wic_consume(ch, s, buf, info.batch_bytes);
			if (err) {
				fprintf(stderr, "consumer: slot %u generation %u: ", s, g);
				fail("consume", err);
				goto out;
			}
			consumed++;
			for (size_t i = 0; i < info.batch_bytes; i++) {
				if (buf[i] != pattern(i, s, g)) {
					fprintf(stderr,
						"consumer: slot %u generation %u: byte %zu is %u, expected %u\n",
						s, g, i, buf[i], pattern(i, s, g));
					mismatches++;
					break;
				}
			}
		}
	}
	printf("consumed %llu batches, %llu mismatches\n", consumed, mismatches);
	status = mismatches ? 1 : 0;

out:
	free(buf);
	err = wic_channel_close(ch);
	if (err) {
		fail("close channel", err);
		status = 1;
	}
	wic_disconnect(client);
	return status;
}
