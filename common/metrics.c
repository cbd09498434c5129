/*
 * metrics.c - counters and the optional HTTP endpoint.  The histogram has
 * fixed buckets so that an observation is a handful of relaxed atomic adds.
 */
#include "metrics.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "array.h"
#include "config.h"
#include "log.h"

#if INBOX_HAVE_MALLINFO2
#include <malloc.h>
#endif

#if INBOX_HAVE_METRICS
#include <microhttpd.h>
#include <unistd.h>

#include "addr.h"
#endif

#define METRICS_MAX_THREADS 256
/* The page with every series at METRICS_MAX_THREADS threads fits. */
#define METRICS_PAGE_MAX 65536

static const double metrics_buckets[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                          0.05, 0.1, 0.25, 0.5, 1, 2.5, 5 };
#define METRICS_NBUCKETS (sizeof metrics_buckets / sizeof metrics_buckets[0])

static struct {
	atomic_uint_fast64_t outcomes[METRICS_OUTCOME_COUNT];
	atomic_uint_fast64_t dead_letters[MSG_REASON_COUNT];
	atomic_uint_fast64_t held;
	atomic_uint_fast64_t released;
	atomic_int_fast64_t held_now;
	atomic_int_fast64_t held_oldest_ms;
	atomic_uint_fast64_t db_retries;
	atomic_uint_fast64_t reconnects[METRICS_PEER_COUNT];
	atomic_uint_fast64_t hist[METRICS_NBUCKETS + 1];
	atomic_uint_fast64_t hist_sum_us;
	atomic_int_fast64_t outbox_pending;
	atomic_uint_fast64_t outbox_failed;
	atomic_uint_fast64_t outbox_dispatched;
	atomic_uint_fast64_t confirm_waits;
	atomic_uint_fast64_t splits[METRICS_SPLIT_COUNT], split_deliveries[METRICS_SPLIT_COUNT];
	atomic_int_fast64_t outbox_oldest_ms;
	atomic_int_fast64_t dlq_depth;       /* stored + 1: 0 means never read */
	atomic_uint_fast64_t redelivered;
	atomic_int threads;
	atomic_bool ready[METRICS_MAX_THREADS];
	atomic_int shards;
	atomic_uint_fast64_t shard_mask[METRICS_MAX_THREADS]; /* shards a thread consumes */
	/* The lifecycle this process runs (metrics_set_lifecycle): written
	 * before lifecycle_set is published, read only after it. */
	char lifecycle[3][METRICS_NAME_MAX + 1];
	atomic_bool lifecycle_set;
	/* The event types that run statements of their own
	 * (metrics_set_statement_events: "" for one that runs none), and
	 * what their statements did: [event][0] ran, [event][1] refused. */
	char stmt_event[METRICS_EVENTS_MAX][METRICS_NAME_MAX + 1];
	atomic_bool stmt_events_set;
	atomic_uint_fast64_t statements[METRICS_EVENTS_MAX][2];
	/* HTTP destinations (metrics_set_destinations) and their rows. */
	char dest[METRICS_DESTS_MAX][METRICS_NAME_MAX + 1];
	int ndests;
	atomic_bool dests_set;
	atomic_uint_fast64_t deliveries[METRICS_DESTS_MAX][METRICS_DELIVERY_COUNT];
	atomic_int_fast64_t dest_pending[METRICS_DESTS_MAX];
	atomic_int_fast64_t dest_oldest_ms[METRICS_DESTS_MAX];
} metrics;

static const char *const metrics_outcome_names[] = {
	"applied", "ignored", "compensated", "dead_lettered", "duplicate",
};
_Static_assert(ARRAY_LEN(metrics_outcome_names) == METRICS_OUTCOME_COUNT, "one name per enum metrics_outcome");

void metrics_outcome(enum metrics_outcome o, int n)
{
	if ((unsigned)o < METRICS_OUTCOME_COUNT && n > 0)
		atomic_fetch_add_explicit(&metrics.outcomes[o], (uint_fast64_t)n, memory_order_relaxed);
}

void metrics_dead_letter(enum msg_reason r, int n)
{
	if (n <= 0)
		return;
	/* A reason outside the list still counts as a dead letter, under
	 * "" (rendered as "other"), so the two sums never disagree. */
	if ((unsigned)r >= MSG_REASON_COUNT)
		r = MSG_REASON_NONE;
	atomic_fetch_add_explicit(&metrics.dead_letters[r], (uint_fast64_t)n, memory_order_relaxed);
	metrics_outcome(METRICS_DEAD_LETTERED, n);
}

uint64_t metrics_dead_letter_count(enum msg_reason r)
{
	return (unsigned)r < MSG_REASON_COUNT ? atomic_load_explicit(&metrics.dead_letters[r], memory_order_relaxed)
	                                      : 0;
}

void metrics_held(void)
{
	atomic_fetch_add_explicit(&metrics.held, 1, memory_order_relaxed);
}

void metrics_released(int n)
{
	if (n > 0)
		atomic_fetch_add_explicit(&metrics.released, (uint_fast64_t)n, memory_order_relaxed);
}

uint64_t metrics_held_count(void)
{
	return atomic_load_explicit(&metrics.held, memory_order_relaxed);
}

uint64_t metrics_released_count(void)
{
	return atomic_load_explicit(&metrics.released, memory_order_relaxed);
}

void metrics_held_now(int64_t n, double oldest_s)
{
	atomic_store_explicit(&metrics.held_now, n, memory_order_relaxed);
	atomic_store_explicit(&metrics.held_oldest_ms, (int_fast64_t)(oldest_s * 1000), memory_order_relaxed);
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

void metrics_outbox_dispatched(int n)
{
	if (n > 0)
		atomic_fetch_add_explicit(&metrics.outbox_dispatched, (uint_fast64_t)n, memory_order_relaxed);
}

void metrics_confirm_wait(void)
{
	atomic_fetch_add_explicit(&metrics.confirm_waits, 1, memory_order_relaxed);
}

void metrics_batch_split(enum metrics_split why, int n)
{
	if ((unsigned)why >= METRICS_SPLIT_COUNT || n <= 0)
		return;
	atomic_fetch_add_explicit(&metrics.splits[why], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&metrics.split_deliveries[why], (uint_fast64_t)n, memory_order_relaxed);
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

/* The process's start in seconds since the epoch: the boot time
 * (/proc/stat btime) plus the start in clock ticks after boot (field 22 of
 * /proc/self/stat), as the Prometheus clients compute it; read once, it
 * does not change.  0 when /proc cannot say. */
static double metrics_start_time(long ticks)
{
	static _Atomic double cached;
	double t = atomic_load(&cached);
	char line[1024], *p;
	unsigned long long start = 0, btime = 0;
	FILE *f;
	size_t n;

	if (t > 0 || ticks <= 0)
		return t;
	f = fopen("/proc/self/stat", "r");
	if (f == NULL)
		return 0;
	n = fread(line, 1, sizeof line - 1, f);
	fclose(f);
	line[n] = '\0';
	p = strrchr(line, ')'); /* the command name may hold spaces */
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
	                         &start) != 1)
		return 0;
	f = fopen("/proc/stat", "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof line, f) != NULL)
		if (sscanf(line, "btime %llu", &btime) == 1)
			break;
	fclose(f);
	if (btime == 0)
		return 0;
	t = (double)btime + (double)start / (double)ticks;
	atomic_store(&cached, t);
	return t;
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

/*
 * The malloc heap as glibc counts it (every arena): the bytes in use by
 * live allocations, and the bytes the heap holds from the system.  RSS
 * alone cannot tell a leak from a heap that holds freed memory: a leak
 * grows the first, fragmentation or arenas still warming up only the
 * second (bench/soak samples both).  mallinfo2 walks every arena under
 * its lock; a scrape every few seconds does not notice.
 */
static void metrics_heap(struct metrics_buf *b)
{
	/* Under AddressSanitizer malloc is not glibc's: its arenas would say
	 * nothing about our allocations. */
#if INBOX_HAVE_MALLINFO2 && !defined(__SANITIZE_ADDRESS__)
	struct mallinfo2 mi = mallinfo2();

	metrics_put(b, "# HELP inbox_heap_in_use_bytes Bytes of the malloc heap in live allocations.\n"
	               "# TYPE inbox_heap_in_use_bytes gauge\n"
	               "inbox_heap_in_use_bytes %zu\n"
	               "# HELP inbox_heap_held_bytes Bytes the malloc heap holds from the system, in use or free.\n"
	               "# TYPE inbox_heap_held_bytes gauge\n"
	               "inbox_heap_held_bytes %zu\n",
	            mi.uordblks + mi.hblkhd, mi.arena + mi.hblkhd);
#else
	(void)b;
#endif
}

/* The process_* series of the Prometheus client libraries, from /proc
 * (Linux); one that cannot be read is left out rather than made up. */
static void metrics_process(struct metrics_buf *b)
{
	struct rusage ru;
	long page = sysconf(_SC_PAGESIZE), ticks = sysconf(_SC_CLK_TCK);
	FILE *f;
	DIR *d;

	if (getrusage(RUSAGE_SELF, &ru) == 0)
		metrics_put(b, "# HELP process_cpu_seconds_total User and system CPU time spent, in seconds.\n"
		               "# TYPE process_cpu_seconds_total counter\n"
		               "process_cpu_seconds_total %.3f\n",
		            (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
		                (double)ru.ru_stime.tv_usec / 1e6);
	f = fopen("/proc/self/statm", "r");
	if (f != NULL) {
		unsigned long size, resident;
		if (fscanf(f, "%lu %lu", &size, &resident) == 2 && page > 0)
			metrics_put(b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
			               "# TYPE process_resident_memory_bytes gauge\n"
			               "process_resident_memory_bytes %llu\n",
			            (unsigned long long)resident * (unsigned long long)page);
		fclose(f);
	}
	d = opendir("/proc/self/fd");
	if (d != NULL) {
		long n = 0;
		struct dirent *e;
		while ((e = readdir(d)) != NULL)
			if (e->d_name[0] != '.')
				n++;
		closedir(d);
		metrics_put(b, "# HELP process_open_fds Number of open file descriptors.\n"
		               "# TYPE process_open_fds gauge\n"
		               "process_open_fds %ld\n",
		            n - 1); /* less the one opendir itself held */
	}
	metrics_heap(b);
	if (metrics_start_time(ticks) > 0)
		metrics_put(b, "# HELP process_start_time_seconds Start time of the process since the epoch, in seconds.\n"
		               "# TYPE process_start_time_seconds gauge\n"
		               "process_start_time_seconds %.2f\n",
		            metrics_start_time(ticks));
}

/* Every delivery's decision, and the dead letters by reason. */
static void metrics_outcomes(struct metrics_buf *b)
{
	metrics_put(b, "# HELP inbox_messages_total Deliveries by final decision; a held event is counted when"
	               " it is settled (released or expired).\n"
	               "# TYPE inbox_messages_total counter\n");
	for (int i = 0; i < METRICS_OUTCOME_COUNT; i++)
		metrics_put(b, "inbox_messages_total{outcome=\"%s\"} %llu\n", metrics_outcome_names[i],
		            (unsigned long long)metrics_outcome_count((enum metrics_outcome)i));
	/* The same count as outcome="duplicate", under the name SPEC.md
	 * promises to the dashboards built against it. */
	metrics_put(b, "# HELP inbox_duplicates_total Deliveries recognised as duplicates (the same count as"
	               " inbox_messages_total{outcome=\"duplicate\"}).\n"
	               "# TYPE inbox_duplicates_total counter\n"
	               "inbox_duplicates_total %llu\n",
	            (unsigned long long)metrics_outcome_count(METRICS_DUPLICATE));
	metrics_put(b, "# HELP inbox_dead_letters_total Dead letters the worker sent, by x-inbox-reason"
	               " (their sum is outcome=\"dead_lettered\").\n"
	               "# TYPE inbox_dead_letters_total counter\n");
	for (int r = 1; r <= MSG_REASON_COUNT; r++) {
		enum msg_reason why = r < MSG_REASON_COUNT ? (enum msg_reason)r : MSG_REASON_NONE;
		uint64_t n = metrics_dead_letter_count(why);
		if (why == MSG_REASON_NONE && n == 0)
			continue; /* "other" only when something unexpected happened */
		metrics_put(b, "inbox_dead_letters_total{reason=\"%s\"} %llu\n",
		            why == MSG_REASON_NONE ? "other" : msg_reason_name(why), (unsigned long long)n);
	}
}

/* inbox_processing_seconds, cumulative as Prometheus wants it. */
static void metrics_histogram(struct metrics_buf *b)
{
	uint64_t cum = 0;

	metrics_put(b, "# HELP inbox_processing_seconds Time from delivery to settlement (commit, or dead-letter confirm).\n"
	               "# TYPE inbox_processing_seconds histogram\n");
	for (size_t i = 0; i <= METRICS_NBUCKETS; i++) {
		cum += atomic_load(&metrics.hist[i]);
		if (i < METRICS_NBUCKETS)
			metrics_put(b, "inbox_processing_seconds_bucket{le=\"%g\"} %llu\n", metrics_buckets[i],
			            (unsigned long long)cum);
		else
			metrics_put(b, "inbox_processing_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
	}
	metrics_put(b, "inbox_processing_seconds_sum %.6f\ninbox_processing_seconds_count %llu\n",
	            (double)atomic_load(&metrics.hist_sum_us) / 1e6, (unsigned long long)cum);
}

/* A lifecycle name as a label value: [a-z0-9_] only (lc_load allows no
 * more), so it needs no escaping. */
static bool metrics_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > METRICS_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

int metrics_set_lifecycle(const char *aggregate, const char *table, const char *key)
{
	const char *v[3] = { aggregate, table, key };

	if (atomic_load(&metrics.lifecycle_set))
		return -1;
	for (int i = 0; i < 3; i++)
		if (v[i] == NULL || !metrics_name_ok(v[i]))
			return -1;
	for (int i = 0; i < 3; i++)
		snprintf(metrics.lifecycle[i], sizeof metrics.lifecycle[i], "%s", v[i]);
	atomic_store_explicit(&metrics.lifecycle_set, true, memory_order_release);
	return 0;
}

int metrics_set_statement_events(const char *const *names, int n)
{
	if (atomic_load(&metrics.stmt_events_set) || n < 0 || n > METRICS_EVENTS_MAX)
		return -1;
	for (int e = 0; e < n; e++) {
		if (names[e] == NULL)
			continue;
		if (strlen(names[e]) == 0 || strlen(names[e]) > METRICS_NAME_MAX)
			return -1;
		/* lc_load's names: a letter, then letters, digits or _ */
		for (const char *c = names[e]; *c != '\0'; c++)
			if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_'))
				return -1;
	}
	for (int e = 0; e < n; e++)
		snprintf(metrics.stmt_event[e], sizeof metrics.stmt_event[e], "%s", names[e] != NULL ? names[e] : "");
	atomic_store_explicit(&metrics.stmt_events_set, true, memory_order_release);
	return 0;
}

void metrics_statements(int event, int ran, int refused)
{
	if ((unsigned)event >= METRICS_EVENTS_MAX)
		return;
	if (ran > 0)
		atomic_fetch_add_explicit(&metrics.statements[event][0], (uint_fast64_t)ran, memory_order_relaxed);
	if (refused > 0)
		atomic_fetch_add_explicit(&metrics.statements[event][1], (uint_fast64_t)refused, memory_order_relaxed);
}

uint64_t metrics_statements_count(int event, bool refused)
{
	return (unsigned)event < METRICS_EVENTS_MAX
	           ? atomic_load_explicit(&metrics.statements[event][refused ? 1 : 0], memory_order_relaxed)
	           : 0;
}

int metrics_set_destinations(const char *const *names, int n)
{
	if (atomic_load(&metrics.dests_set) || n < 0 || n > METRICS_DESTS_MAX)
		return -1;
	for (int d = 0; d < n; d++) {
		if (names[d] == NULL || names[d][0] == '\0' || strlen(names[d]) > METRICS_NAME_MAX)
			return -1;
		/* lifecycle_dest.c's names: [a-z][a-z0-9_-]* */
		for (const char *c = names[d]; *c != '\0'; c++)
			if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-'))
				return -1;
	}
	for (int d = 0; d < n; d++)
		snprintf(metrics.dest[d], sizeof metrics.dest[d], "%s", names[d]);
	metrics.ndests = n;
	atomic_store_explicit(&metrics.dests_set, true, memory_order_release);
	return 0;
}

void metrics_delivery(int dest, enum metrics_delivery result, int n)
{
	if ((unsigned)dest < METRICS_DESTS_MAX && (unsigned)result < METRICS_DELIVERY_COUNT && n > 0)
		atomic_fetch_add_explicit(&metrics.deliveries[dest][result], (uint_fast64_t)n, memory_order_relaxed);
}

uint64_t metrics_delivery_count(int dest, enum metrics_delivery result)
{
	return (unsigned)dest < METRICS_DESTS_MAX && (unsigned)result < METRICS_DELIVERY_COUNT
	           ? atomic_load_explicit(&metrics.deliveries[dest][result], memory_order_relaxed)
	           : 0;
}

void metrics_destination_backlog(int dest, int64_t pending, double oldest_s)
{
	if ((unsigned)dest >= METRICS_DESTS_MAX)
		return;
	atomic_store_explicit(&metrics.dest_pending[dest], pending, memory_order_relaxed);
	atomic_store_explicit(&metrics.dest_oldest_ms[dest], (int_fast64_t)(oldest_s * 1000), memory_order_relaxed);
}

/* The series of the HTTP destinations, when the lifecycle has any. */
static void metrics_put_destinations(struct metrics_buf *b)
{
	static const char *const results[] = { "delivered", "retried", "dead_lettered" };

	if (!atomic_load_explicit(&metrics.dests_set, memory_order_acquire) || metrics.ndests == 0)
		return;
	metrics_put(b, "# HELP inbox_http_deliveries_total Calls to the lifecycle's HTTP destinations by result:"
	               " delivered (2xx), retried (to be called again), dead_lettered (delivery-failed).\n"
	               "# TYPE inbox_http_deliveries_total counter\n");
	for (int d = 0; d < metrics.ndests; d++)
		for (int r = 0; r < METRICS_DELIVERY_COUNT; r++)
			metrics_put(b, "inbox_http_deliveries_total{destination=\"%s\",result=\"%s\"} %llu\n",
			            metrics.dest[d], results[r], (unsigned long long)metrics_delivery_count(d, r));
	metrics_put(b, "# HELP inbox_http_undelivered Outbox rows for an HTTP destination not delivered yet.\n"
	               "# TYPE inbox_http_undelivered gauge\n");
	for (int d = 0; d < metrics.ndests; d++)
		metrics_put(b, "inbox_http_undelivered{destination=\"%s\"} %lld\n", metrics.dest[d],
		            (long long)atomic_load_explicit(&metrics.dest_pending[d], memory_order_relaxed));
	metrics_put(b, "# HELP inbox_http_oldest_undelivered_seconds Age of the oldest row an HTTP destination"
	               " has not taken yet (0 when none).\n"
	               "# TYPE inbox_http_oldest_undelivered_seconds gauge\n");
	for (int d = 0; d < metrics.ndests; d++)
		metrics_put(b, "inbox_http_oldest_undelivered_seconds{destination=\"%s\"} %.3f\n", metrics.dest[d],
		            (double)atomic_load_explicit(&metrics.dest_oldest_ms[d], memory_order_relaxed) / 1000.0);
}

/* inbox_statements_total, when the lifecycle has statements of its own. */
static void metrics_put_statements(struct metrics_buf *b)
{
	if (!atomic_load_explicit(&metrics.stmt_events_set, memory_order_acquire))
		return;
	metrics_put(b, "# HELP inbox_statements_total The lifecycle's own statements by event type: ran (committed"
	               " with their batch) or refused (by the message's own data: the message is dead-lettered as"
	               " effect-failed).\n"
	               "# TYPE inbox_statements_total counter\n");
	for (int e = 0; e < METRICS_EVENTS_MAX; e++) {
		if (metrics.stmt_event[e][0] == '\0')
			continue;
		metrics_put(b, "inbox_statements_total{event=\"%s\",result=\"ran\"} %llu\n"
		               "inbox_statements_total{event=\"%s\",result=\"refused\"} %llu\n",
		            metrics.stmt_event[e], (unsigned long long)metrics_statements_count(e, false),
		            metrics.stmt_event[e], (unsigned long long)metrics_statements_count(e, true));
	}
}

/* A counter labelled by="database"/"thread" (enum metrics_split). */
static void metrics_put_splits(struct metrics_buf *b, const char *name, const char *help,
                               const atomic_uint_fast64_t v[METRICS_SPLIT_COUNT])
{
	metrics_put(b,
	            "# HELP %s %s\n# TYPE %s counter\n%s{by=\"database\"} %llu\n%s{by=\"thread\"} %llu\n",
	            name, help, name, name, (unsigned long long)atomic_load(&v[METRICS_SPLIT_DATABASE]), name,
	            (unsigned long long)atomic_load(&v[METRICS_SPLIT_THREAD]));
}

int metrics_render(char *buf, size_t cap)
{
	struct metrics_buf b = { .p = buf, .cap = cap };

	metrics_put(&b, "# HELP inbox_build_info The worker's version.\n"
	                "# TYPE inbox_build_info gauge\n"
	                "inbox_build_info{version=\"%s\"} 1\n",
	            INBOX_VERSION);
	if (atomic_load_explicit(&metrics.lifecycle_set, memory_order_acquire))
		metrics_put(&b, "# HELP inbox_lifecycle_info The lifecycle this process runs (INBOX_LIFECYCLE): its"
		                " aggregate, table and key field; every other series of the process is of it.\n"
		                "# TYPE inbox_lifecycle_info gauge\n"
		                "inbox_lifecycle_info{aggregate=\"%s\",table=\"%s\",key=\"%s\"} 1\n",
		            metrics.lifecycle[0], metrics.lifecycle[1], metrics.lifecycle[2]);
	metrics_outcomes(&b);
	metrics_put_statements(&b);
	metrics_put_destinations(&b);
	metrics_put(&b, "# HELP inbox_held_total Events held on arrival to wait for their prerequisite (each is"
	                " counted again in inbox_messages_total once settled).\n"
	                "# TYPE inbox_held_total counter\n"
	                "inbox_held_total %llu\n"
	                "# HELP inbox_released_total Held events settled by this process when their order changed.\n"
	                "# TYPE inbox_released_total counter\n"
	                "inbox_released_total %llu\n",
	            (unsigned long long)metrics_held_count(), (unsigned long long)metrics_released_count());
	metrics_put(&b, "# HELP inbox_held_events Events held now, waiting for their prerequisite (the database's"
	                " count for this consumer, all processes).\n"
	                "# TYPE inbox_held_events gauge\n"
	                "inbox_held_events %lld\n"
	                "# HELP inbox_held_oldest_seconds Age of the oldest held event (0: none).\n"
	                "# TYPE inbox_held_oldest_seconds gauge\n"
	                "inbox_held_oldest_seconds %.3f\n",
	            (long long)atomic_load(&metrics.held_now), (double)atomic_load(&metrics.held_oldest_ms) / 1000.0);
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
	metrics_histogram(&b);
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
	metrics_put(&b, "# HELP inbox_outbox_dispatched_total Outbox rows published and confirmed by the thread that"
	                " committed them, right after its commit (the relay sweeps the others).\n"
	                "# TYPE inbox_outbox_dispatched_total counter\n"
	                "inbox_outbox_dispatched_total %llu\n",
	            (unsigned long long)atomic_load(&metrics.outbox_dispatched));
	metrics_put(&b, "# HELP inbox_outbox_confirm_waits_total Times a worker thread stopped to wait for the"
	                " confirms of the outbox rows it published (a dead-letter publish, a full window, stop).\n"
	                "# TYPE inbox_outbox_confirm_waits_total counter\n"
	                "inbox_outbox_confirm_waits_total %llu\n",
	            (unsigned long long)atomic_load(&metrics.confirm_waits));
	metrics_put_splits(&b, "inbox_batch_splits_total",
	                   "Batches cut in two because another transaction (by=database, any process) or another"
	                   " thread of this process (by=thread) had one of their orders.",
	                   metrics.splits);
	metrics_put_splits(&b, "inbox_batch_split_deliveries_total",
	                   "Deliveries those splits moved to a second transaction, settled right after the first.",
	                   metrics.split_deliveries);
	metrics_put(&b, "# HELP inbox_outbox_oldest_pending_seconds Age of the oldest outbox row not yet sent (0: none).\n"
	                "# TYPE inbox_outbox_oldest_pending_seconds gauge\n"
	                "inbox_outbox_oldest_pending_seconds %.3f\n",
	            (double)atomic_load(&metrics.outbox_oldest_ms) / 1000.0);
	metrics_put(&b, "# HELP inbox_thread_ready 1 while the worker thread has its broker and database"
	                " connections and its consumers.\n"
	                "# TYPE inbox_thread_ready gauge\n");
	for (int i = 0, n = atomic_load(&metrics.threads); i < n; i++)
		metrics_put(&b, "inbox_thread_ready{thread=\"%d\"} %d\n", i, atomic_load(&metrics.ready[i]) ? 1 : 0);
	metrics_process(&b);
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
	char *body = malloc(METRICS_PAGE_MAX); /* freed below: the response keeps a copy */
	const char *text;
	unsigned status = MHD_HTTP_OK;
	struct MHD_Response *resp;
	enum MHD_Result ret;
	int n;

	(void)cls; (void)version; (void)upload; (void)upload_size; (void)req_cls;
	if (body == NULL)
		return MHD_NO;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		text = "method not allowed\n";
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics") == 0) {
		n = metrics_render(body, METRICS_PAGE_MAX);
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
			snprintf(body, METRICS_PAGE_MAX, "not ready:%s\n", why);
			text = body;
		}
		status = ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
	} else {
		text = "not found\n";
		status = MHD_HTTP_NOT_FOUND;
	}
	resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
	free(body);
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
	struct addr_hostport a;
	char err[400];
	bool v6 = false;
	int fd;

	if (addr == NULL || addr[0] == '\0')
		return 0;
	/* The parser the configuration check used: what it accepted binds. */
	if (addr_hostport_parse(addr, &a, err, sizeof err) != 0) {
		LOG(LOG_LEVEL_ERROR, "cannot serve metrics", LOG_S("addr", addr), LOG_S("error", err));
		return -1;
	}
	/* Our own socket, so that a failed bind says why (a port in use,
	 * one that needs privileges) and what to do about it. */
	fd = addr_listen(&a, "INBOX_METRICS_ADDR", &v6, err, sizeof err);
	if (fd < 0) {
		LOG(LOG_LEVEL_ERROR, "cannot serve metrics", LOG_S("addr", addr), LOG_S("error", err));
		return -1;
	}
	/* Health checks must not queue behind clients that connect and say
	 * nothing (or trickle): an idle connection is closed after
	 * METRICS_CONN_TIMEOUT_S, one address holds at most
	 * METRICS_PER_IP_LIMIT of the METRICS_CONN_LIMIT slots, so one
	 * misbehaving peer leaves room for the prober and the scraper, and a
	 * local one starves them for one time-out at most.  MHD_USE_AUTO
	 * picks epoll: select() breaks on descriptors above FD_SETSIZE. */
	metrics_daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | (v6 ? MHD_USE_IPv6 : 0),
	                                  (uint16_t)a.port, NULL, NULL, metrics_answer, NULL,
	                                  MHD_OPTION_LISTEN_SOCKET, fd,
	                                  MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_CONN_LIMIT,
	                                  MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)METRICS_PER_IP_LIMIT,
	                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_CONN_TIMEOUT_S,
	                                  MHD_OPTION_END);
	if (metrics_daemon == NULL) {
		close(fd);
		LOG(LOG_LEVEL_ERROR, "cannot serve metrics", LOG_S("addr", addr), LOG_S("error", "the HTTP server did not start"));
		return -1;
	}
	LOG(LOG_LEVEL_INFO, "serving /metrics /healthz /readyz", LOG_S("addr", addr));
	return 0;
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
		LOG(LOG_LEVEL_WARN, "built without libmicrohttpd: metrics endpoint off", LOG_S("addr", addr));
	return 0;
}

void metrics_stop(void)
{
}
#endif
