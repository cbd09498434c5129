/*
 * test_inflight.c - the set of orders each thread of a process has in a
 * transaction (worker/inflight.h): what another thread holds is busy, a
 * thread's own orders never are, a drop frees them, and a take replaces
 * what the thread held before.
 */
#include <criterion/criterion.h>
#include <stdbool.h>

#include "inflight.h"
#include "status.h"

static struct inflight *f;

static void setup(void)
{
	cr_assert_eq(inflight_open(&f, 3, 4), ST_OK);
}

static void teardown(void)
{
	inflight_close(&f);
	cr_assert_null(f, "close clears the caller's pointer");
}

TestSuite(inflight, .init = setup, .fini = teardown);

Test(inflight, an_order_another_thread_holds_is_busy_and_the_rest_free)
{
	const char *a[] = { "order-1", "order-2" };
	const char *b[] = { "order-3", "order-2", "order-4" };
	bool busy[3];

	cr_assert_eq(inflight_take(f, 0, a, 2, busy), 2, "nothing is held yet");
	cr_assert_not(busy[0]);
	cr_assert_not(busy[1]);
	cr_assert_eq(inflight_take(f, 1, b, 3, busy), 2);
	cr_assert_not(busy[0]);
	cr_assert(busy[1], "order-2 is in thread 0's transaction");
	cr_assert_not(busy[2]);
}

Test(inflight, a_threads_own_orders_are_never_busy_to_it)
{
	const char *a[] = { "order-1", "order-1", "order-2" };
	bool busy[3];

	cr_assert_eq(inflight_take(f, 0, a, 3, busy), 3);
	cr_assert_eq(inflight_take(f, 0, a, 3, busy), 3, "a second take by the same thread");
	for (int i = 0; i < 3; i++)
		cr_assert_not(busy[i], "%d", i);
}

Test(inflight, a_drop_frees_the_threads_orders)
{
	const char *a[] = { "order-1" };
	bool busy[1];

	(void)inflight_take(f, 0, a, 1, busy);
	cr_assert_eq(inflight_take(f, 2, a, 1, busy), 0);
	cr_assert(busy[0]);
	inflight_drop(f, 0);
	cr_assert_eq(inflight_take(f, 2, a, 1, busy), 1, "thread 0's transaction ended");
	cr_assert_not(busy[0]);
}

Test(inflight, a_take_replaces_what_the_thread_held)
{
	const char *first[] = { "order-1" };
	const char *second[] = { "order-2" };
	bool busy[1];

	(void)inflight_take(f, 0, first, 1, busy);
	(void)inflight_take(f, 0, second, 1, busy);
	cr_assert_eq(inflight_take(f, 1, first, 1, busy), 1, "thread 0 moved on to order-2");
	cr_assert_not(busy[0]);
	cr_assert_eq(inflight_take(f, 2, second, 1, busy), 0);
	cr_assert(busy[0]);
}

Test(inflight, more_orders_than_a_batch_are_all_answered)
{
	const char *held[] = { "order-9" };
	const char *ids[] = { "order-1", "order-2", "order-3", "order-4", "order-5", "order-9" };
	bool busy[6] = { true, true, true, true, true, false };

	(void)inflight_take(f, 0, held, 1, busy);
	/* Six ids on a set made for batches of four: every flag is set, and
	 * the last one, past the batch, still sees thread 0's order. */
	cr_assert_eq(inflight_take(f, 1, ids, 6, busy), 5);
	for (int i = 0; i < 5; i++)
		cr_assert_not(busy[i], "%d", i);
	cr_assert(busy[5]);
}

/* Issue 22, item 6: K (order a, busy) before K' (order b, free) with one
 * key: K' must not go first, or it takes effect and the first copy is the
 * conflict.  What follows K' on its order goes second too; an order's
 * events before the first that goes second stay first. */
Test(inflight, a_split_keeps_two_copies_of_one_key_in_delivery_order)
{
	const struct inflight_key k[] = {
		{ "b", "s", "m-0" }, /* free, before anything goes second: first */
		{ "a", "s", "K" },   /* busy */
		{ "b", "s", "K" },   /* K': shares the key with K */
		{ "c", "s", "m-1" }, /* unrelated: first */
		{ "b", "s", "m-2" }, /* order b after K': second */
		{ "c", "t", "K" },   /* another source: another key */
	};
	bool second[6] = { false, true, false, false, false, false };

	cr_assert_eq(inflight_split(k, 6, second), 3);
	cr_assert_not(second[0]);
	cr_assert(second[1]);
	cr_assert(second[2], "K' follows K");
	cr_assert_not(second[3]);
	cr_assert(second[4], "order b's later event follows K'");
	cr_assert_not(second[5], "a key is (source, message_id)");
}

Test(inflight, a_split_without_shared_keys_is_by_busy_order_alone)
{
	const struct inflight_key k[] = { { "x", "s", "1" }, { "z", "s", "2" }, { "x", "s", "3" } };
	bool second[3] = { true, false, true };

	cr_assert_eq(inflight_split(k, 3, second), 1);
	cr_assert(second[0]);
	cr_assert_not(second[1]);
	cr_assert(second[2]);
}
