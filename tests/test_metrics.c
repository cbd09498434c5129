/*
 * test_metrics.c - readiness: every thread ready and, in sharded ordering,
 * every shard covered by some thread of the process; the reason names what
 * is missing.
 */
#include <criterion/criterion.h>
#include <string.h>

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
