/*
 * test_metrics.c - readiness: every thread ready and, in sharded ordering,
 * every shard covered by some thread of the process; the reason names what
 * is missing.  The rendered page: dead letters by reason adding up to the
 * dead_lettered outcome, holds as a counter and a gauge, build info, per
 * thread readiness and the process series.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "metrics.h"

Test(metrics, readiness_names_threads_and_shards_without_a_consumer)
{
	char why[512], page[16384];

	metrics_set_threads(2);
	metrics_set_shards(4);
	metrics_thread_ready(0, true);
	metrics_thread_shards(0, 0x5); /* shards 0 and 2 */
	metrics_thread_ready(1, true);
	metrics_thread_shards(1, 0x2); /* shard 1 only: shard 3 uncovered */
	cr_assert_not(metrics_readiness(why, sizeof why));
	cr_assert_not_null(strstr(why, "shard 3 has no consumer"), "%s", why);
	cr_assert_null(strstr(why, "shard 1 "), "%s", why);
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_not_null(strstr(page, "\ninbox_shards_without_consumer 1\n"), "%s", page);

	metrics_thread_shards(1, 0xa); /* shards 1 and 3 */
	cr_assert(metrics_readiness(why, sizeof why));
	cr_assert(metrics_ready());
	cr_assert_eq(why[0], '\0');

	metrics_thread_ready(1, false);
	metrics_thread_shards(1, 0);
	cr_assert_not(metrics_readiness(why, sizeof why));
	cr_assert_not_null(strstr(why, "thread 1 has no consumer"), "%s", why);
	cr_assert_not_null(strstr(why, "shard 1 has no consumer"), "%s", why);
	cr_assert_not_null(strstr(why, "shard 3 has no consumer"), "%s", why);
	cr_assert_not(metrics_readiness(NULL, 0), "no buffer is fine");
}

Test(metrics, shared_ordering_needs_only_ready_threads)
{
	metrics_set_threads(1);
	metrics_set_shards(0);
	metrics_thread_ready(0, false);
	cr_assert_not(metrics_ready());
	metrics_thread_ready(0, true);
	metrics_thread_shards(0, 0x1);
	cr_assert(metrics_ready());
}

Test(metrics, redeliveries_are_counted_and_rendered)
{
	char page[16384];

	metrics_redelivered();
	metrics_redelivered();
	cr_assert_eq(metrics_redelivered_count(), 2);
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_not_null(strstr(page, "\ninbox_redelivered_total 2\n"), "%s", page);
}

/* Dead letters by reason add up to the dead_lettered outcome; a held event
 * is counted as held and, once settled, in its outcome (issue 12). */
Test(metrics, dead_letters_by_reason_add_up_and_holds_are_not_an_outcome)
{
	char page[65536];

	metrics_dead_letter(MSG_REASON_TOO_LARGE, 2);
	metrics_dead_letter(MSG_REASON_HOLD_EXPIRED, 1);
	metrics_dead_letter(MSG_REASON_HOLD_EXPIRED, 0);
	metrics_held();
	metrics_released(1);
	metrics_outcome(METRICS_APPLIED, 1);
	metrics_held_now(3, 1.5);
	cr_assert_eq(metrics_outcome_count(METRICS_DEAD_LETTERED), 3);
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_not_null(strstr(page, "\ninbox_dead_letters_total{reason=\"too-large\"} 2\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_dead_letters_total{reason=\"hold-expired\"} 1\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_dead_letters_total{reason=\"invalid-transition\"} 0\n"), "%s", page);
	cr_assert_null(strstr(page, "reason=\"other\""), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_messages_total{outcome=\"dead_lettered\"} 3\n"), "%s", page);
	cr_assert_null(strstr(page, "outcome=\"held\""), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_duplicates_total 0\n"), "SPEC.md's name for outcome=duplicate: %s", page);
	cr_assert_not_null(strstr(page, "\ninbox_held_total 1\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_released_total 1\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_held_events 3\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_held_oldest_seconds 1.500\n"), "%s", page);
}

Test(metrics, build_info_threads_and_process_series)
{
	char page[65536];

	metrics_set_threads(3);
	metrics_thread_ready(0, true);
	metrics_thread_ready(1, false);
	metrics_thread_ready(2, true);
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_not_null(strstr(page, "\ninbox_build_info{version=\"" INBOX_VERSION "\"} 1\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_thread_ready{thread=\"0\"} 1\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_thread_ready{thread=\"1\"} 0\n"), "%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_thread_ready{thread=\"2\"} 1\n"), "%s", page);
	cr_assert_null(strstr(page, "thread=\"3\""), "%s", page);
	cr_assert_not_null(strstr(page, "\nprocess_cpu_seconds_total "), "%s", page);
	cr_assert_not_null(strstr(page, "\nprocess_resident_memory_bytes "), "%s", page);
	cr_assert_not_null(strstr(page, "\nprocess_open_fds "), "%s", page);
	cr_assert_not_null(strstr(page, "\nprocess_start_time_seconds "), "%s", page);
	{
		double start = strtod(strstr(page, "\nprocess_start_time_seconds ") + 28, NULL);
		double now = (double)time(NULL);
		cr_assert(start > now - 3600 && start <= now + 1, "start %f now %f", start, now);
	}
}

#if INBOX_HAVE_MALLINFO2 && !defined(__SANITIZE_ADDRESS__)
static double heap_metric(const char *name)
{
	static char page[65536];
	const char *at;

	cr_assert_gt(metrics_render(page, sizeof page), 0);
	at = strstr(page, name);
	cr_assert_not_null(at, "%s not in %s", name, page);
	return strtod(at + strlen(name), NULL);
}
#endif

/* The heap series follow the allocations: a live 8 MiB block is in use
 * (and held), and gone from "in use" once freed. */
Test(metrics, heap_in_use_follows_live_allocations)
{
#if INBOX_HAVE_MALLINFO2 && !defined(__SANITIZE_ADDRESS__)
	enum { SIZE = 8 << 20 };
	double before = heap_metric("\ninbox_heap_in_use_bytes "), during, after, held;
	char *p = malloc(SIZE);

	cr_assert_not_null(p);
	memset(p, 1, SIZE);
	during = heap_metric("\ninbox_heap_in_use_bytes ");
	held = heap_metric("\ninbox_heap_held_bytes ");
	free(p);
	after = heap_metric("\ninbox_heap_in_use_bytes ");
	cr_assert_geq(during - before, SIZE, "in use %.0f -> %.0f", before, during);
	cr_assert_geq(held, during, "the heap holds at least what is in use");
	cr_assert_lt(after, before + SIZE / 2, "freed: %.0f -> %.0f", during, after);
#else
	static char page[65536];

	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_null(strstr(page, "inbox_heap_in_use_bytes"), "no heap series without glibc's own malloc");
#endif
}

Test(metrics, every_series_fits_the_page_at_the_thread_limit)
{
	static char page[65536];

	metrics_set_threads(256);
	metrics_set_shards(64);
	cr_assert_gt(metrics_render(page, sizeof page), 0, "the HTTP handler's page is 64 KiB");
}

/* The lifecycle a worker runs, as an info series (one per process: every
 * series of one process is of one aggregate).  Absent until the worker has
 * bound its definition; the existing series keep their labels. */
Test(metrics, lifecycle_info_names_the_aggregate)
{
	char page[65536];

	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_null(strstr(page, "inbox_lifecycle_info"), "%s", page);
	metrics_set_lifecycle("shipment", "shipments", "shipment_id");
	cr_assert_gt(metrics_render(page, sizeof page), 0);
	cr_assert_not_null(strstr(page, "\n# TYPE inbox_lifecycle_info gauge\n"), "%s", page);
	cr_assert_not_null(
		strstr(page, "\ninbox_lifecycle_info{aggregate=\"shipment\",table=\"shipments\",key=\"shipment_id\"} 1\n"),
		"%s", page);
	cr_assert_not_null(strstr(page, "\ninbox_messages_total{outcome=\"applied\"} "), "%s", page);
	cr_assert_null(strstr(page, "inbox_messages_total{aggregate"), "%s", page);
}
