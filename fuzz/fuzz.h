/*
 * fuzz.h - the fuzz targets' per-input checks, callable without libFuzzer.
 *
 * Each target's body is a plain function so that two programs share it: the
 * libFuzzer binary built by -Dfuzz=true (clang, sanitizers, coverage), and
 * tests/unit/test_fuzz_regress.c, which the ordinary gcc build runs over the seed
 * corpus and every saved finding.  A broken invariant aborts with the check
 * that failed, which both libFuzzer and criterion report as a crash.
 */
#ifndef INBOX_FUZZ_H
#define INBOX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* assert() that survives NDEBUG: a release build must still find bugs. */
#define FUZZ_CHECK(cond)                                                                    \
	do {                                                                                    \
		if (!(cond)) {                                                                      \
			fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
			abort();                                                                        \
		}                                                                                   \
	} while (0)

/* msg_parse on one input (first bytes may carry AMQP properties), then the
 * canonical hash and its invariants. */
void fuzz_msg_one(const uint8_t *data, size_t size);

/* One input decoded as AMQP basic properties, then mq_delivery_props_json
 * and the JSON it returns. */
void fuzz_props_one(const uint8_t *data, size_t size);

/* env_parse on one input (envelope, content type, headers, correlation id
 * carved off the front; see fuzz_envelope.c), then the canonical event
 * and the trace context and their invariants. */
void fuzz_envelope_one(const uint8_t *data, size_t size);

#endif
