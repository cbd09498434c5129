/*
 * deadletter.c - see deadletter.h.  The headers are built into one array
 * for both paths: the worker hands it to mq_publish as it is, the outbox
 * stores it as JSON and its relay turns that back into the same array
 * (outbox_headers), so what the broker gets cannot differ by path.
 */
#include "deadletter.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

void deadletter_headers(struct deadletter_headers *out, const char *reason, const char *detail,
                        const char *props_note, int64_t deliveries)
{
	time_t now = time(NULL);
	struct tm tm;
	bool note = props_note != NULL && props_note[0] != '\0';

	snprintf(out->detail, sizeof out->detail, "%s%s%s", detail, note ? "; properties: " : "", note ? props_note : "");
	if (gmtime_r(&now, &tm) == NULL || strftime(out->at, sizeof out->at, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(out->at, sizeof out->at, "unknown");
	out->n = 0;
	out->h[out->n++] = (struct mq_header){ DEADLETTER_REASON, reason };
	out->h[out->n++] = (struct mq_header){ DEADLETTER_DETAIL, out->detail };
	out->h[out->n++] = (struct mq_header){ DEADLETTER_AT, out->at };
	if (deliveries > 0) {
		snprintf(out->deliveries, sizeof out->deliveries, "%lld", (long long)deliveries);
		out->h[out->n++] = (struct mq_header){ DEADLETTER_DELIVERIES, out->deliveries };
	}
}

char *deadletter_headers_json(const struct deadletter_headers *dh)
{
	json_t *o = json_object();
	char *text = NULL;
	int i;

	if (o == NULL)
		return NULL;
	for (i = 0; i < dh->n; i++)
		if (json_object_set_new(o, dh->h[i].key, json_string(dh->h[i].value)) != 0)
			break;
	if (i == dh->n)
		text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return text;
}
