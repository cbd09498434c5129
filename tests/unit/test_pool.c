/*
 * test_pool.c - pool_main (worker/pool.c) leaves nothing behind on any way
 * out.  Its first steps cannot fail on demand, so the pthread calls it
 * makes are wrapped at link time (-Wl,--wrap, tests/unit/meson.build): armed,
 * a wrapper fails; always, it counts what was initialised and destroyed.
 * pool_main used to return straight out of its first failures, skipping
 * the cleanup at its end: the condition attribute was never destroyed when
 * the clock could not be set, nor the condition variable when the mutex
 * could not be made.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "cfg.h"
#include "pool.h"

int __real_pthread_condattr_init(pthread_condattr_t *a);
int __real_pthread_condattr_destroy(pthread_condattr_t *a);
int __real_pthread_condattr_setclock(pthread_condattr_t *a, clockid_t c);
int __real_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
int __real_pthread_cond_destroy(pthread_cond_t *c);
int __real_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a);
int __wrap_pthread_condattr_init(pthread_condattr_t *a);
int __wrap_pthread_condattr_destroy(pthread_condattr_t *a);
int __wrap_pthread_condattr_setclock(pthread_condattr_t *a, clockid_t c);
int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a);
int __wrap_pthread_cond_destroy(pthread_cond_t *c);
int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a);

static bool fail_setclock, fail_mutex;
static int attrs, conds; /* initialised and not destroyed */

int __wrap_pthread_condattr_init(pthread_condattr_t *a)
{
	int rc = __real_pthread_condattr_init(a);
	attrs += rc == 0;
	return rc;
}

int __wrap_pthread_condattr_destroy(pthread_condattr_t *a)
{
	attrs--;
	return __real_pthread_condattr_destroy(a);
}

int __wrap_pthread_condattr_setclock(pthread_condattr_t *a, clockid_t c)
{
	return fail_setclock ? EINVAL : __real_pthread_condattr_setclock(a, c);
}

int __wrap_pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *a)
{
	int rc = __real_pthread_cond_init(c, a);
	conds += rc == 0;
	return rc;
}

int __wrap_pthread_cond_destroy(pthread_cond_t *c)
{
	conds--;
	return __real_pthread_cond_destroy(c);
}

int __wrap_pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *a)
{
	return fail_mutex ? EAGAIN : __real_pthread_mutex_init(m, a);
}

/* Nothing past the failures below reads more of the configuration. */
static struct cfg conf = { .threads = 2 };

/* pool_main with *fail set: it must give up (1) and leave nothing of the
 * janitor's condition variable behind. */
static void expect_nothing_left(bool *fail)
{
	*fail = true;
	cr_assert_eq(pool_main(&conf), 1);
	*fail = false;
	cr_expect_eq(attrs, 0, "%d condition attribute(s) initialised and never destroyed", attrs);
	cr_expect_eq(conds, 0, "%d condition variable(s) initialised and never destroyed", conds);
}

Test(pool, a_clock_that_cannot_be_set_leaves_no_condition_attribute)
{
	expect_nothing_left(&fail_setclock);
}

Test(pool, a_mutex_that_cannot_be_made_leaves_no_condition_variable)
{
	expect_nothing_left(&fail_mutex);
}
