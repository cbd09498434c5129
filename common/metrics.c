/*
 * metrics.c - counters and the optional HTTP endpoint.  The histogram has
 * fixed buckets so that an observation is a handful of relaxed atomic adds.
 */
#include "metrics.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"

#if INBOX_HAVE_METRICS
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#endif

#define METRICS_MAX_THREADS 256

static const double metrics_buckets[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                          0.05, 0.1, 0.25, 0.5, 1, 2.5, 5 };
#define METRICS_NBUCKETS (sizeof metrics_buckets / sizeof metrics_buckets[0])

static struct {
	atomic_uint_fast64_t outcomes[METRICS_OUTCOME_COUNT];
	atomic_uint_fast64_t db_retries;
	atomic_uint_fast64_t reconnects[METRICS_PEER_COUNT];
	atomic_uint_fast64_t hist[METRICS_NBUCKETS + 1];
	atomic_uint_fast64_t hist_sum_us;
	atomic_int_fast64_t outbox_pending;
	atomic_uint_fast64_t outbox_failed;
	atomic_int_fast64_t outbox_oldest_ms;
	atomic_int_fast64_t dlq_depth;       /* stored + 1: 0 means never read */
	atomic_uint_fast64_t redelivered;
	atomic_int threads;
	atomic_bool ready[METRICS_MAX_THREADS];
	atomic_int shards;
	atomic_uint_fast64_t shard_mask[METRICS_MAX_THREADS]; /* shards a thread consumes */
} metrics;

static const char *const metrics_outcome_names[METRICS_OUTCOME_COUNT] = {
	"applied", "held", "ignored", "compensated", "dead_lettered", "duplicate",
};

const char *metrics_outcome_name(enum metrics_outcome o)
{
	return (unsigned)o < METRICS_OUTCOME_COUNT ? metrics_outcome_names[o] : "unknown";
}

void metrics_outcome(enum metrics_outcome o)
{
	if ((unsigned)o < METRICS_OUTCOME_COUNT)
		atomic_fetch_add_explicit(&metrics.outcomes[o], 1, memory_order_relaxed);
}

uint64_t metrics_outcome_count(enum metrics_outcome o)
{
	return (unsigned)o < METRICS_OUTCOME_COUNT
	           ? atomic_load_explicit(&metrics.outcomes[o], memory_order_relaxed)
	           : 0;
}

void metrics_db_retry(void)
{
	atomic_fetch_add_explicit(&metrics.db_retries, 1, memory_order_relaxed);
}

void metrics_reconnect(enum metrics_peer p)
{
	if ((unsigned)p < METRICS_PEER_COUNT)
		atomic_fetch_add_explicit(&metrics.reconnects[p], 1, memory_order_relaxed);
}

void metrics_processing_seconds(double s)
{
	size_t i = 0;

	while (i < METRICS_NBUCKETS && s > metrics_buckets[i])
		i++;
	atomic_fetch_add_explicit(&metrics.hist[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&metrics.hist_sum_us, (uint64_t)(s * 1e6), memory_order_relaxed);
}

void metrics_outbox_pending(int64_t n)
{
	atomic_store_explicit(&metrics.outbox_pending, n, memory_order_relaxed);
}

void metrics_outbox_failed(int n)
{
	if (n > 0)
		atomic_fetch_add_explicit(&metrics.outbox_failed, (uint_fast64_t)n, memory_order_relaxed);
}

void metrics_dlq_depth(int64_t n)
{
	atomic_store_explicit(&metrics.dlq_depth, n < 0 ? 0 : n + 1, memory_order_relaxed);
}

void metrics_outbox_oldest_pending(double seconds)
{
	atomic_store_explicit(&metrics.outbox_oldest_ms, (int_fast64_t)(seconds * 1000), memory_order_relaxed);
}

void metrics_set_threads(int n)
{
	atomic_store(&metrics.threads, n > METRICS_MAX_THREADS ? METRICS_MAX_THREADS : n);
}

void metrics_thread_ready(int thread, bool ready)
{
	if (thread >= 0 && thread < METRICS_MAX_THREADS)
		atomic_store(&metrics.ready[thread], ready);
}

/* Append to buf; on overflow mark it so the caller returns -1. */
struct metrics_buf {
	char *p;
	size_t cap;
	size_t len;
	bool overflow;
};

__attribute__((format(printf, 2, 3)))
static void metrics_put(struct metrics_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->overflow)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= b->cap - b->len)
		b->overflow = true;
	else
		b->len += (size_t)n;
}

void metrics_redelivered(void)
{
	atomic_fetch_add_explicit(&metrics.redelivered, 1, memory_order_relaxed);
}

uint64_t metrics_redelivered_count(void)
{
	return atomic_load_explicit(&metrics.redelivered, memory_order_relaxed);
}

void metrics_set_shards(int n)
{
	atomic_store(&metrics.shards, n < 0 ? 0 : n > 64 ? 64 : n);
}

void metrics_thread_shards(int thread, uint64_t mask)
{
	if (thread >= 0 && thread < METRICS_MAX_THREADS)
		atomic_store(&metrics.shard_mask[thread], mask);
}

/* Shards with no live consumer in this process, as a bit mask. */
static uint64_t metrics_unconsumed(void)
{
	int n = atomic_load(&metrics.threads), shards = atomic_load(&metrics.shards);
	uint64_t all = shards >= 64 ? UINT64_MAX : ((uint64_t)1 << shards) - 1, have = 0;

	for (int i = 0; i < n; i++)
		have |= atomic_load(&metrics.shard_mask[i]);
	return all & ~have;
}

bool metrics_readiness(char *why, size_t cap)
{
	struct metrics_buf b = { .p = why, .cap = cap };
	int n = atomic_load(&metrics.threads);
	uint64_t missing = metrics_unconsumed();
	bool ready = n > 0 && missing == 0;

	if (why != NULL && cap > 0)
		why[0] = '\0';
	if (n <= 0 && why != NULL)
		metrics_put(&b, " no worker thread;");
	for (int i = 0; i < n; i++) {
		if (atomic_load(&metrics.ready[i]))
			continue;
		ready = false;
		if (why != NULL)
			metrics_put(&b, " thread %d has no consumer or no database;", i);
	}
	for (int s = 0; why != NULL && s < 64; s++)
		if (missing & ((uint64_t)1 << s))
			metrics_put(&b, " shard %d has no consumer;", s);
	return ready;
}

bool metrics_ready(void)
{
	return metrics_readiness(NULL, 0);
}

int metrics_render(char *buf, size_t cap)
{
	struct metrics_buf b = { .p = buf, .cap = cap };
	uint64_t cum = 0;

	metrics_put(&b, "# HELP inbox_messages_total Deliveries by final decision.\n"
	                "# TYPE inbox_messages_total counter\n");
	for (int i = 0; i < METRICS_OUTCOME_COUNT; i++)
		metrics_put(&b, "inbox_messages_total{outcome=\"%s\"} %llu\n", metrics_outcome_names[i],
		            (unsigned long long)metrics_outcome_count((enum metrics_outcome)i));
	metrics_put(&b, "# HELP inbox_duplicates_total Deliveries recognised as duplicates.\n"
	                "# TYPE inbox_duplicates_total counter\n"
	                "inbox_duplicates_total %llu\n",
	            (unsigned long long)metrics_outcome_count(METRICS_DUPLICATE));
	metrics_put(&b, "# HELP inbox_db_retries_total Transactions retried after deadlock or lock wait timeout.\n"
	                "# TYPE inbox_db_retries_total counter\n"
	                "inbox_db_retries_total %llu\n",
	            (unsigned long long)atomic_load(&metrics.db_retries));
	metrics_put(&b, "# HELP inbox_reconnects_total Reconnections by peer.\n"
	                "# TYPE inbox_reconnects_total counter\n"
	                "inbox_reconnects_total{peer=\"amqp\"} %llu\n"
	                "inbox_reconnects_total{peer=\"db\"} %llu\n",
	            (unsigned long long)atomic_load(&metrics.reconnects[METRICS_PEER_AMQP]),
	            (unsigned long long)atomic_load(&metrics.reconnects[METRICS_PEER_DB]));
	metrics_put(&b, "# HELP inbox_processing_seconds Time from delivery to settlement (commit, or dead-letter confirm).\n"
	                "# TYPE inbox_processing_seconds histogram\n");
	for (size_t i = 0; i <= METRICS_NBUCKETS; i++) {
		cum += atomic_load(&metrics.hist[i]);
		if (i < METRICS_NBUCKETS)
			metrics_put(&b, "inbox_processing_seconds_bucket{le=\"%g\"} %llu\n", metrics_buckets[i],
			            (unsigned long long)cum);
		else
			metrics_put(&b, "inbox_processing_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
	}
	metrics_put(&b, "inbox_processing_seconds_sum %.6f\ninbox_processing_seconds_count %llu\n",
	            (double)atomic_load(&metrics.hist_sum_us) / 1e6, (unsigned long long)cum);
	metrics_put(&b, "# HELP inbox_redelivered_total Deliveries the broker marked as redelivered.\n"
	                "# TYPE inbox_redelivered_total counter\n"
	                "inbox_redelivered_total %llu\n",
	            (unsigned long long)metrics_redelivered_count());
	metrics_put(&b, "# HELP inbox_shards_without_consumer Shard queues no thread of this process consumes (sharded ordering).\n"
	                "# TYPE inbox_shards_without_consumer gauge\n"
	                "inbox_shards_without_consumer %d\n",
	            __builtin_popcountll(metrics_unconsumed()));
	metrics_put(&b, "# HELP inbox_outbox_pending Outbox rows not yet confirmed by the broker.\n"
	                "# TYPE inbox_outbox_pending gauge\n"
	                "inbox_outbox_pending %lld\n",
	            (long long)atomic_load(&metrics.outbox_pending));
	metrics_put(&b, "# HELP inbox_outbox_failed_total Outbox publishes that failed for their own row"
	                " (returned unroutable, nacked, unpublishable); each is retried with a backoff.\n"
	                "# TYPE inbox_outbox_failed_total counter\n"
	                "inbox_outbox_failed_total %llu\n",
	            (unsigned long long)atomic_load(&metrics.outbox_failed));
	metrics_put(&b, "# HELP inbox_outbox_oldest_pending_seconds Age of the oldest outbox row not yet sent (0: none).\n"
	                "# TYPE inbox_outbox_oldest_pending_seconds gauge\n"
	                "inbox_outbox_oldest_pending_seconds %.3f\n",
	            (double)atomic_load(&metrics.outbox_oldest_ms) / 1000.0);
	/* Absent until the janitor read it: a 0 would claim an empty DLQ. */
	if (atomic_load(&metrics.dlq_depth) > 0)
		metrics_put(&b, "# HELP inbox_dlq_messages Messages ready in the dead-letter queue, as this process last read it.\n"
		                "# TYPE inbox_dlq_messages gauge\n"
		                "inbox_dlq_messages %lld\n",
		            (long long)atomic_load(&metrics.dlq_depth) - 1);
	return b.overflow ? -1 : (int)b.len;
}

#if INBOX_HAVE_METRICS
/* A scrape or a probe sends its request at once and needs well under a
 * second; a connection silent for this long is idle or hostile. */
#define METRICS_CONN_TIMEOUT_S 5
#define METRICS_CONN_LIMIT 128
#define METRICS_PER_IP_LIMIT 16

static struct MHD_Daemon *metrics_daemon;

static enum MHD_Result metrics_answer(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version, const char *upload,
                                      size_t *upload_size, void **req_cls)
{
	char body[8192];
	const char *text;
	unsigned status = MHD_HTTP_OK;
	struct MHD_Response *resp;
	enum MHD_Result ret;
	int n;

	(void)cls; (void)version; (void)upload; (void)upload_size; (void)req_cls;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		text = "method not allowed\n";
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics") == 0) {
		n = metrics_render(body, sizeof body);
		text = n < 0 ? "metrics buffer too small\n" : body;
		status = n < 0 ? MHD_HTTP_INTERNAL_SERVER_ERROR : MHD_HTTP_OK;
	} else if (strcmp(url, "/healthz") == 0) {
		text = "ok\n";
	} else if (strcmp(url, "/readyz") == 0) {
		char why[2048];
		bool ready = metrics_readiness(why, sizeof why);
		if (ready) {
			text = "ready\n";
		} else {
			/* Say which thread or shard is missing, so that the
			 * operator need not read the logs to find out. */
			snprintf(body, sizeof body, "not ready:%s\n", why);
			text = body;
		}
		status = ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
	} else {
		text = "not found\n";
		status = MHD_HTTP_NOT_FOUND;
	}
	resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
	if (resp == NULL)
		return MHD_NO;
	if (MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4") != MHD_YES) {
		MHD_destroy_response(resp);
		return MHD_NO;
	}
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

int metrics_start(const char *addr)
{
	struct sockaddr_in sa;
	char host[64];
	const char *colon;
	long port;
	char *end;

	if (addr == NULL || addr[0] == '\0')
		return 0;
	colon = strrchr(addr, ':');
	if (colon == NULL || (size_t)(colon - addr) >= sizeof host)
		goto bad;
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = '\0';
	port = strtol(colon + 1, &end, 10);
	if (*end != '\0' || port < 0 || port > 65535)
		goto bad;
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, host[0] ? host : "0.0.0.0", &sa.sin_addr) != 1)
		goto bad;
	/* Health checks must not queue behind clients that connect and say
	 * nothing (or trickle): an idle connection is closed after
	 * METRICS_CONN_TIMEOUT_S, one address holds at most
	 * METRICS_PER_IP_LIMIT of the METRICS_CONN_LIMIT slots, so one
	 * misbehaving peer leaves room for the prober and the scraper, and a
	 * local one starves them for one time-out at most.  MHD_USE_AUTO
	 * picks epoll: select() breaks on descriptors above FD_SETSIZE. */
	metrics_daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, (uint16_t)port, NULL,
	                                  NULL, metrics_answer, NULL, MHD_OPTION_SOCK_ADDR, &sa,
	                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_CONN_LIMIT,
	                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)METRICS_PER_IP_LIMIT,
	                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_CONN_TIMEOUT_S,
	                                  MHD_OPTION_END);
	if (metrics_daemon == NULL) {
		LOG(LOG_ERROR, "cannot serve metrics", LOG_S("addr", addr));
		return -1;
	}
	LOG(LOG_INFO, "serving /metrics /healthz /readyz", LOG_S("addr", addr));
	return 0;
bad:
	LOG(LOG_ERROR, "bad metrics address (want IPv4 host:port)", LOG_S("addr", addr));
	return -1;
}

void metrics_stop(void)
{
	if (metrics_daemon != NULL)
		MHD_stop_daemon(metrics_daemon);
	metrics_daemon = NULL;
}
#else
int metrics_start(const char *addr)
{
	if (addr != NULL && addr[0] != '\0')
		LOG(LOG_WARN, "built without libmicrohttpd: metrics endpoint off", LOG_S("addr", addr));
	return 0;
}

void metrics_stop(void)
{
}
#endif
