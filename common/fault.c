/*
 * fault.c - see fault.h.  The environment is read once; the counter is an
 * atomic so that exactly INBOX_FAULT_COUNT hits fire across all threads.
 */
#include "fault.h"

#if INBOX_FAULT_HOOKS
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static pthread_once_t fault_once = PTHREAD_ONCE_INIT;
static const char *fault_point;
static atomic_long fault_left;
static atomic_long fault_skip;

static void fault_load(void)
{
	const char *n = getenv("INBOX_FAULT_COUNT");
	char *end;
	long v = 1;

	fault_point = getenv("INBOX_FAULT");
	if (n != NULL) {
		v = strtol(n, &end, 10);
		if (*end != '\0' || v < 0)
			v = 1;
	}
	atomic_store(&fault_left, v);
	n = getenv("INBOX_FAULT_SKIP");
	v = 0;
	if (n != NULL) {
		v = strtol(n, &end, 10);
		if (*end != '\0' || v < 0)
			v = 0;
	}
	atomic_store(&fault_skip, v);
}

bool fault_armed(const char *point)
{
	return pthread_once(&fault_once, fault_load) == 0 && fault_point != NULL && strcmp(fault_point, point) == 0;
}

bool fault_hit(const char *point)
{
	if (pthread_once(&fault_once, fault_load) != 0 || fault_point == NULL ||
	    strcmp(fault_point, point) != 0)
		return false;
	if (atomic_fetch_sub(&fault_skip, 1) > 0)
		return false;
	if (atomic_fetch_sub(&fault_left, 1) <= 0)
		return false;
	LOG(LOG_LEVEL_WARN, "fault injected", LOG_S("point", point));
	return true;
}
#endif
