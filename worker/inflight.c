/*
 * inflight.c - see inflight.h.  Each thread's orders are a sorted array of
 * hashes; a take looks each id up in every other thread's array under one
 * mutex, held for a batch's worth of binary searches (threads x batch
 * log batch comparisons at most), never across a transaction.
 */
#include "inflight.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

struct inflight_thread {
	uint64_t *h; /* sorted */
	int n;
};

struct inflight {
	pthread_mutex_t mu;
	int threads;
	int batch;
	struct inflight_thread *t;
};

/* FNV-1a: order ids are short; a collision only makes a free order look busy. */
static uint64_t inflight_hash(const char *s)
{
	uint64_t h = UINT64_C(14695981039346656037);

	for (; *s != '\0'; s++) {
		h ^= (unsigned char)*s;
		h *= UINT64_C(1099511628211);
	}
	return h;
}

static int inflight_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int inflight_open(struct inflight **out, int threads, int batch)
{
	struct inflight *f = calloc(1, sizeof *f);

	*out = NULL;
	if (f == NULL)
		return ST_ERR_NOMEM;
	f->threads = threads;
	f->batch = batch;
	f->t = calloc((size_t)threads, sizeof *f->t);
	if (f->t == NULL || pthread_mutex_init(&f->mu, NULL) != 0) {
		free(f->t);
		free(f);
		return ST_ERR_NOMEM;
	}
	for (int i = 0; i < threads; i++) {
		f->t[i].h = malloc((size_t)batch * sizeof *f->t[i].h);
		if (f->t[i].h == NULL) {
			inflight_close(&f);
			return ST_ERR_NOMEM;
		}
	}
	*out = f;
	return ST_OK;
}

void inflight_close(struct inflight **fp)
{
	struct inflight *f = fp != NULL ? *fp : NULL;

	if (f == NULL)
		return;
	for (int i = 0; i < f->threads; i++)
		free(f->t[i].h);
	free(f->t);
	pthread_mutex_destroy(&f->mu);
	free(f);
	*fp = NULL;
}

int inflight_take(struct inflight *f, int t, const char *const *ids, int n, bool *busy)
{
	struct inflight_thread *me = &f->t[t];
	int nfree = 0;

	for (int i = 0; i < n; i++)
		busy[i] = false;
	/* A mutex that cannot be taken leaves every order free: the
	 * database decides, as without this set. */
	if (pthread_mutex_lock(&f->mu) != 0)
		return n;
	me->n = 0;
	for (int i = 0; i < n; i++) {
		uint64_t h = inflight_hash(ids[i]);

		for (int o = 0; o < f->threads && !busy[i]; o++)
			busy[i] = o != t && f->t[o].n > 0 &&
			          bsearch(&h, f->t[o].h, (size_t)f->t[o].n, sizeof h, inflight_cmp) != NULL;
		nfree += busy[i] ? 0 : 1;
		/* Busy or not, it is this thread's now: its transaction holds
		 * it, or, after a split, the one right after.  Past the set's
		 * room an order is answered but not recorded: the others then
		 * only wait for it in the database. */
		if (me->n < f->batch)
			me->h[me->n++] = h;
	}
	qsort(me->h, (size_t)me->n, sizeof *me->h, inflight_cmp);
	pthread_mutex_unlock(&f->mu);
	return nfree;
}

void inflight_drop(struct inflight *f, int t)
{
	if (pthread_mutex_lock(&f->mu) != 0)
		return; /* left marked: the other threads only wait in the database */
	f->t[t].n = 0;
	pthread_mutex_unlock(&f->mu);
}

/* Whether a and b name one order or one message key. */
static bool inflight_related(const struct inflight_key *a, const struct inflight_key *b)
{
	return strcmp(a->order_id, b->order_id) == 0 ||
	       (strcmp(a->message_id, b->message_id) == 0 && strcmp(a->source, b->source) == 0);
}

/*
 * Why keys as well as orders: two copies of one key may name different
 * orders (a conflict).  Split by order alone, the later copy, its order
 * free, was settled first and took effect, and the first one, behind a
 * busy order, was dead-lettered as the conflict: the first one must stand
 * (SPEC).  Quadratic in the batch, and only for a batch that splits.
 */
int inflight_split(const struct inflight_key *k, int n, bool *second)
{
	int nfirst = 0;

	for (int i = 0; i < n; i++) {
		for (int j = 0; j < i && !second[i]; j++)
			second[i] = second[j] && inflight_related(&k[i], &k[j]);
		nfirst += second[i] ? 0 : 1;
	}
	return nfirst;
}
