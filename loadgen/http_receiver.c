/*
 * http_receiver.c - inbox-http-receiver, the other service of the calls
 * through the outbox (common/http_call.c): for the suites, scripts/chaos
 * and dashboard-check, and a stand-in mail service for doc/lifecycle.md.
 * An HTTP server on 127.0.0.1 that writes down every request it gets and
 * can be told to misbehave in the ways a real service does.  Not
 * installed.
 *
 *   inbox-http-receiver --out FILE [--port N] [--fail-ratio R] [--429-ratio R]
 *                 [--retry-after N] [--seed S] [--away-seconds N]
 *
 * - POST and PUT on any path; each request is one JSON line appended to
 *   FILE (flushed before the answer, so a client that saw the answer finds
 *   the line): {"method","path","idempotency_key","traceparent","body",
 *   "body_bytes","status"}.  The key is the header's value as it came (an
 *   sf-string, quotes included); a header absent, or a body that is not
 *   UTF-8, is null.  Refused requests are written down too, with the
 *   status they got.
 * - Each POST or PUT draws one number from a splitmix64 stream seeded by
 *   --seed (default 1): below --fail-ratio it is answered 503, below
 *   --fail-ratio + --429-ratio 429 with Retry-After: --retry-after (default
 *   1), otherwise 200.  The same seed and the same order of requests give
 *   the same answers.  Other methods get 405, bodies over 1 MiB 413.
 * - It keeps the Idempotency-Key promise a real service makes (the IETF
 *   httpapi draft): a key it has answered 200 before is answered 200 again
 *   without a second effect, its line marked "replay": true, when the body
 *   is the same, and 422 when it is not (a key reused for a different
 *   request).  A client killed between our 200 and its own record sends
 *   again; the replay is how such a call is told from a second effect.
 * - SIGUSR1: stop listening (the socket closed, open connections dropped,
 *   so a connect is refused) for --away-seconds (default 5), then listen on
 *   the same port again.  SIGTERM or SIGINT: exit 0.
 * - stdout says "ready PORT" each time it listens (PORT is the one bound,
 *   useful with --port 0) and "away" each time it stops; errors go to
 *   stderr, and exit 1 (2 for a bad command line).
 *
 * One libmicrohttpd polling thread answers; the main thread owns the
 * signals (blocked before the server starts, taken with sigwait), so no
 * handler runs in signal context.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RCV_BODY_MAX (1024 * 1024)
#define RCV_CONN_TIMEOUT_S 30

struct rcv {
	FILE *out;
	int port;
	double fail_ratio, ratio_429;
	char retry_after[24];
	long away_s;
	uint64_t rng;
	pthread_mutex_t mu; /* out and rng, should answers ever come from two threads */
	struct MHD_Daemon *d;
	json_t *accepted; /* key -> the body it was accepted with; under mu */
};

struct rcv_req {
	char *body;
	size_t len, cap;
	bool too_long;
};

static uint64_t rcv_splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

/* A string for JSON, or null: absent, or not UTF-8. */
static json_t *rcv_jstr(const char *s, size_t len)
{
	json_t *v = s != NULL ? json_stringn(s, len) : NULL;

	return v != NULL ? v : json_null();
}

static json_t *rcv_header(struct MHD_Connection *c, const char *name)
{
	const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);

	return rcv_jstr(v, v != NULL ? strlen(v) : 0);
}

/* The request's line, written and flushed; false when it could not be. */
static bool rcv_record(struct rcv *r, struct MHD_Connection *c, const char *method, const char *url,
                       const struct rcv_req *q, unsigned status, bool replay)
{
	json_t *o;
	char *line = NULL;
	bool ok = false;

	/* json_pack's "o" takes the references, on failure too. */
	o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:I, s:i, s:b}",
	              "method", rcv_jstr(method, strlen(method)), "path", rcv_jstr(url, strlen(url)),
	              "idempotency_key", rcv_header(c, "Idempotency-Key"), "traceparent", rcv_header(c, "traceparent"),
	              "body", q->too_long ? json_null() : rcv_jstr(q->body != NULL ? q->body : "", q->len),
	              "body_bytes", (json_int_t)q->len, "status", (int)status, "replay", replay);
	if (o == NULL)
		goto cleanup;
	line = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	if (line == NULL)
		goto cleanup;
	if (fprintf(r->out, "%s\n", line) < 0 || fflush(r->out) != 0) {
		fprintf(stderr, "inbox-http-receiver: cannot write the request's line: %s\n", strerror(errno));
		goto cleanup;
	}
	ok = true;
cleanup:
	free(line);
	json_decref(o);
	return ok;
}

static enum MHD_Result rcv_reply(struct MHD_Connection *c, unsigned status, const char *text, const char *retry_after)
{
	struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (resp == NULL)
		return MHD_NO;
	if (retry_after != NULL && MHD_add_response_header(resp, "Retry-After", retry_after) != MHD_YES) {
		MHD_destroy_response(resp);
		return MHD_NO;
	}
	ret = MHD_queue_response(c, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* Keep up to RCV_BODY_MAX bytes; beyond that the request is 413. */
static bool rcv_append(struct rcv_req *q, const char *data, size_t n)
{
	if (q->too_long || n > RCV_BODY_MAX - q->len) {
		q->too_long = true;
		return true;
	}
	if (q->len + n > q->cap) {
		size_t cap = q->cap == 0 ? 4096 : q->cap;
		char *b;

		while (cap < q->len + n)
			cap *= 2;
		b = realloc(q->body, cap);
		if (b == NULL)
			return false;
		q->body = b;
		q->cap = cap;
	}
	memcpy(q->body + q->len, data, n);
	q->len += n;
	return true;
}

static enum MHD_Result rcv_answer(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *data_size, void **req_cls)
{
	struct rcv *r = cls;
	struct rcv_req *q = *req_cls;
	unsigned status = 200;
	const char *text = "ok\n", *retry_after = NULL, *key;
	bool recorded, replay = false;

	(void)version;
	if (q == NULL) {
		q = calloc(1, sizeof *q);
		if (q == NULL)
			return MHD_NO;
		*req_cls = q;
		return MHD_YES;
	}
	if (*data_size > 0) {
		if (!rcv_append(q, data, *data_size))
			return MHD_NO;
		*data_size = 0;
		return MHD_YES;
	}
	if (pthread_mutex_lock(&r->mu) != 0)
		return MHD_NO;
	if (strcmp(method, "POST") != 0 && strcmp(method, "PUT") != 0) {
		status = 405;
		text = "POST or PUT\n";
	} else if (q->too_long) {
		status = 413;
		text = "body too long\n";
	} else {
		/* 53 bits of the stream as a double in [0, 1). */
		double u = (double)(rcv_splitmix64(&r->rng) >> 11) / 9007199254740992.0;

		if (u < r->fail_ratio) {
			status = 503;
			text = "unavailable (--fail-ratio)\n";
		} else if (u < r->fail_ratio + r->ratio_429) {
			status = 429;
			text = "slow down (--429-ratio)\n";
			retry_after = r->retry_after;
		}
	}
	key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
	if (status == 200 && key != NULL) {
		json_t *seen = json_object_get(r->accepted, key);
		json_t *body = json_stringn(q->body != NULL ? q->body : "", q->len);

		if (body == NULL) {
			/* not UTF-8: nothing to compare later, so nothing kept */
		} else if (seen == NULL) {
			if (json_object_set(r->accepted, key, body) != 0)
				status = 500, text = "cannot keep the key\n";
		} else if (json_equal(seen, body)) {
			replay = true;
		} else {
			status = 422;
			text = "Idempotency-Key reused with a different body\n";
		}
		json_decref(body);
	}
	recorded = rcv_record(r, c, method, url, q, status, replay);
	if (pthread_mutex_unlock(&r->mu) != 0)
		return MHD_NO;
	if (!recorded)
		return rcv_reply(c, 500, "cannot record the request\n", NULL);
	return rcv_reply(c, status, text, retry_after);
}

static void rcv_done(void *cls, struct MHD_Connection *c, void **req_cls, enum MHD_RequestTerminationCode why)
{
	struct rcv_req *q = *req_cls;

	(void)cls; (void)c; (void)why;
	if (q != NULL)
		free(q->body);
	free(q);
	*req_cls = NULL;
}

/* Listen on 127.0.0.1:r->port (0: any; r->port becomes the one bound). */
static bool rcv_listen(struct rcv *r)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)r->port) };
	socklen_t sl = sizeof sa;
	int fd, one = 1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		fprintf(stderr, "inbox-http-receiver: socket: %s\n", strerror(errno));
		return false;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 64) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
		fprintf(stderr, "inbox-http-receiver: cannot listen on 127.0.0.1:%d: %s\n", r->port, strerror(errno));
		close(fd);
		return false;
	}
	r->port = ntohs(sa.sin_port);
	r->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, rcv_answer, r,
	                        MHD_OPTION_LISTEN_SOCKET, fd,
	                        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)RCV_CONN_TIMEOUT_S,
	                        MHD_OPTION_NOTIFY_COMPLETED, rcv_done, NULL, MHD_OPTION_END);
	if (r->d == NULL) {
		fprintf(stderr, "inbox-http-receiver: the HTTP server did not start\n");
		close(fd);
		return false;
	}
	if (printf("ready %d\n", r->port) < 0 || fflush(stdout) != 0) {
		fprintf(stderr, "inbox-http-receiver: cannot write to stdout\n");
		return false;
	}
	return true;
}

/* Stop listening: MHD_stop_daemon closes the listening socket and every
 * connection. */
static void rcv_unlisten(struct rcv *r)
{
	if (r->d != NULL)
		MHD_stop_daemon(r->d);
	r->d = NULL;
}

static bool rcv_num(const char *flag, const char *s, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
		fprintf(stderr, "inbox-http-receiver: %s wants a number in [%g, %g], not \"%s\"\n", flag, lo, hi, s);
		return false;
	}
	*out = v;
	return true;
}

static bool rcv_int(const char *flag, const char *s, long long lo, long long hi, long long *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "inbox-http-receiver: %s wants an integer in [%lld, %lld], not \"%s\"\n", flag, lo, hi, s);
		return false;
	}
	*out = v;
	return true;
}

static void rcv_usage(FILE *f)
{
	fputs("usage: inbox-http-receiver --out FILE [--port N] [--fail-ratio R] [--429-ratio R]\n"
	      "                           [--retry-after N] [--seed S] [--away-seconds N]\n", f);
}

static int rcv_args(int argc, char **argv, struct rcv *r, const char **out_path)
{
	long long v;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
		bool ok;

		if (strcmp(a, "--help") == 0) {
			rcv_usage(stdout);
			exit(0);
		}
		if (val == NULL) {
			fprintf(stderr, "inbox-http-receiver: %s wants a value\n", a);
			return -1;
		}
		i++;
		if (strcmp(a, "--out") == 0) {
			*out_path = val;
			ok = true;
		} else if (strcmp(a, "--port") == 0) {
			ok = rcv_int(a, val, 0, 65535, &v);
			r->port = (int)v;
		} else if (strcmp(a, "--fail-ratio") == 0) {
			ok = rcv_num(a, val, 0, 1, &r->fail_ratio);
		} else if (strcmp(a, "--429-ratio") == 0) {
			ok = rcv_num(a, val, 0, 1, &r->ratio_429);
		} else if (strcmp(a, "--retry-after") == 0) {
			ok = rcv_int(a, val, 0, 86400, &v);
			snprintf(r->retry_after, sizeof r->retry_after, "%lld", v);
		} else if (strcmp(a, "--seed") == 0) {
			ok = rcv_int(a, val, 0, INT64_MAX, &v);
			r->rng = (uint64_t)v;
		} else if (strcmp(a, "--away-seconds") == 0) {
			ok = rcv_int(a, val, 0, 3600, &v);
			r->away_s = (long)v;
		} else {
			fprintf(stderr, "inbox-http-receiver: unknown option %s\n", a);
			ok = false;
		}
		if (!ok)
			return -1;
	}
	if (*out_path == NULL) {
		fprintf(stderr, "inbox-http-receiver: --out FILE is needed\n");
		return -1;
	}
	if (r->fail_ratio + r->ratio_429 > 1) {
		fprintf(stderr, "inbox-http-receiver: --fail-ratio and --429-ratio add up to more than 1\n");
		return -1;
	}
	return 0;
}

/* Away for r->away_s seconds; false when SIGTERM or SIGINT came meanwhile
 * (another SIGUSR1 is taken and ignored). */
static bool rcv_away(const struct rcv *r, const sigset_t *set)
{
	struct timespec now, end;

	if (clock_gettime(CLOCK_MONOTONIC, &end) != 0)
		return false;
	end.tv_sec += r->away_s;
	for (;;) {
		struct timespec left;
		int sig;

		if (clock_gettime(CLOCK_MONOTONIC, &now) != 0)
			return false;
		left.tv_sec = end.tv_sec - now.tv_sec;
		left.tv_nsec = end.tv_nsec - now.tv_nsec;
		if (left.tv_nsec < 0) {
			left.tv_sec--;
			left.tv_nsec += 1000000000L;
		}
		if (left.tv_sec < 0)
			return true;
		sig = sigtimedwait(set, NULL, &left);
		if (sig < 0 && errno == EAGAIN)
			return true;
		if (sig < 0 && errno != EINTR) {
			fprintf(stderr, "inbox-http-receiver: sigtimedwait: %s\n", strerror(errno));
			return false;
		}
		if (sig == SIGTERM || sig == SIGINT)
			return false;
	}
}

int main(int argc, char **argv)
{
	struct rcv r = { .rng = 1, .away_s = 5, .retry_after = "1" };
	const char *out_path = NULL;
	sigset_t set;
	int rc = 1, err;

	if (rcv_args(argc, argv, &r, &out_path) != 0) {
		rcv_usage(stderr);
		return 2;
	}
	err = pthread_mutex_init(&r.mu, NULL);
	if (err != 0) {
		fprintf(stderr, "inbox-http-receiver: pthread_mutex_init: %s\n", strerror(err));
		return 1;
	}
	r.accepted = json_object();
	if (r.accepted == NULL) {
		fprintf(stderr, "inbox-http-receiver: out of memory\n");
		goto cleanup;
	}
	/* Blocked before the server's thread starts, so that it inherits the
	 * mask and only sigwait below takes them. */
	if (sigemptyset(&set) != 0 || sigaddset(&set, SIGUSR1) != 0 || sigaddset(&set, SIGTERM) != 0 ||
	    sigaddset(&set, SIGINT) != 0) {
		fprintf(stderr, "inbox-http-receiver: sigaddset: %s\n", strerror(errno));
		goto cleanup;
	}
	err = pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (err != 0) {
		fprintf(stderr, "inbox-http-receiver: pthread_sigmask: %s\n", strerror(err));
		goto cleanup;
	}
	r.out = fopen(out_path, "a");
	if (r.out == NULL) {
		fprintf(stderr, "inbox-http-receiver: %s: %s\n", out_path, strerror(errno));
		goto cleanup;
	}
	if (!rcv_listen(&r))
		goto cleanup;
	for (;;) {
		int sig;

		err = sigwait(&set, &sig);
		if (err != 0) {
			fprintf(stderr, "inbox-http-receiver: sigwait: %s\n", strerror(err));
			goto cleanup;
		}
		if (sig != SIGUSR1)
			break;
		rcv_unlisten(&r);
		if (printf("away\n") < 0 || fflush(stdout) != 0) {
			fprintf(stderr, "inbox-http-receiver: cannot write to stdout\n");
			goto cleanup;
		}
		if (!rcv_away(&r, &set))
			break;
		if (!rcv_listen(&r))
			goto cleanup;
	}
	rc = 0;
cleanup:
	rcv_unlisten(&r);
	if (r.out != NULL && fclose(r.out) != 0) {
		fprintf(stderr, "inbox-http-receiver: %s: %s\n", out_path, strerror(errno));
		rc = 1;
	}
	json_decref(r.accepted);
	if (pthread_mutex_destroy(&r.mu) != 0)
		rc = 1;
	return rc;
}
