/*
 * lifecycle.h - an aggregate's lifecycle read from a definition (JSON, see
 * doc/lifecycle.md): its states, its event types and what each does in each
 * state, compiled into a decision table, and the check that the table is
 * arrival-order independent.
 *
 * No I/O but reading the file; no database.  The worker's order engine
 * (aggregate.h) is this table read from lifecycles/order.json, which is also
 * compiled in (lc_builtin_order) so that a worker without INBOX_LIFECYCLE
 * reads the same definition the same way.
 *
 * State index 0 is "the aggregate does not exist yet" (no name); declared
 * states are 1..nstates-1 in the order the file lists them.  Event indexes
 * follow the file's order.  A verdict's marks are the events that took
 * effect and are remembered (bit i = def->marks[i]); its emits are bits
 * into def->emits, the event types written to the outbox.
 */
#ifndef INBOX_LIFECYCLE_H
#define INBOX_LIFECYCLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "lifecycle_fx.h"

#define LC_NAME_MAX 64
#define LC_MAX_STATES 32
#define LC_MAX_EVENTS 16
#define LC_MAX_ALIASES 8
#define LC_MAX_EMITS 32
#define LC_MAX_SETS 16 /* an event's sets and fields together */
#define LC_MAX_STMTS 32 /* a definition's own statements, all events together */
#define LC_MAX_EVENT_STMTS 8 /* in one list (an event applied, or compensated after a state) */
#define LC_MAX_ERRORS 16
#define LC_CHECK_MAX_EVENTS 8 /* the exhaustive check grows as n! */
#define LC_MAX_DESTS 8 /* HTTP destinations (lifecycle_dest.h) */
#define LC_DEST_MAX_HEADERS 16
#define LC_VALUE_MAX 1024 /* a destination's value as written: text, a variable's name, a path */
#define LC_VERSION_MAX 64 /* a definition's version: held_events and the aggregate's rows keep it */
#define LC_VERSION_HASH 12 /* hex digits of the content hash that stands for an undeclared version */
/* The built-in order definition's version: lifecycles/order.json declares
 * none, and a fixed name reads better in a log than a hash.  Editing the
 * file means bumping it (test_lifecycle holds the file's hash to it). */
#define LC_BUILTIN_ORDER_VERSION "builtin-1"

enum lc_decision {
	LC_APPLY = 0,  /* transition: version + 1, one ledger row, emits */
	LC_HOLD,       /* prerequisite missing: keep it, re-evaluate later */
	LC_IGNORE,     /* stale: no effect */
	LC_COMPENSATE, /* after a terminal state: version + 1, ledger row, emits */
	LC_INVALID,    /* dead-letter as invalid-transition */
};

/* Where a column's value comes from when the event takes effect. */
enum lc_source { LC_SRC_APPLIED_AT = 0, LC_SRC_OCCURRED_AT, LC_SRC_MESSAGE_ID, LC_SRC_DATA };
enum lc_type { LC_TYPE_DATETIME = 0, LC_TYPE_INTEGER, LC_TYPE_STRING };

/* A value an event carries into the aggregate's row (a set: column names
 * its column) or only to its statements (a field, or the occurred_at a
 * statement reads: column ""). */
struct lc_set {
	char column[LC_NAME_MAX + 1];
	enum lc_source src;
	char field[LC_NAME_MAX + 1]; /* data.<field> for LC_SRC_DATA */
	enum lc_type type;
	bool required;               /* a data field the event must carry */
	int64_t min, max;            /* LC_TYPE_INTEGER bounds */
	int64_t max_length;          /* LC_TYPE_STRING bound */
};

/* One event type arriving after a terminal state. */
enum lc_after { LC_AFTER_AUTO = 0, LC_AFTER_IGNORE, LC_AFTER_INVALID, LC_AFTER_COMPENSATE };

struct lc_event {
	char type[LC_NAME_MAX + 1];
	char aliases[LC_MAX_ALIASES][LC_NAME_MAX + 1];
	int naliases;
	int creates;      /* state it creates the aggregate in, or 0 */
	uint32_t from;    /* bit s: applies in state s */
	int to;           /* state it moves to (== creates for a creation) */
	uint32_t emits;   /* emitted when applied */
	int mark;         /* bit in marks when remembered, else -1 */
	struct {
		int mark;     /* ... if this mark is set */
		int emit;     /* ... emit this */
	} comp[LC_MAX_EMITS]; /* the compensations a terminal transition owes */
	int ncomp;
	enum lc_after after[LC_MAX_STATES];
	uint32_t after_emits[LC_MAX_STATES]; /* LC_AFTER_COMPENSATE */
	struct lc_set sets[LC_MAX_SETS];
	int nsets;
	/* Its own statements (def->stmts): nfx from fx_first when it applies,
	 * cfx_n[s] from cfx_first[s] when it compensates after terminal s. */
	int fx_first, nfx;
	int cfx_first[LC_MAX_STATES], cfx_n[LC_MAX_STATES];
	int line;
};

/* One of the definition's own SQL statements (issue 45), as read: the
 * event it belongs to, the terminal state after which it runs when that
 * event compensates there (0: when the event applies), its place in its
 * list (1-based, as "statement N of EVENT" says) and its line. */
struct lc_stmt {
	struct lc_fx fx;
	int event;
	int after;
	int index;
	int line;
};

struct lc_rule {
	enum lc_decision decision;
	int next;
	uint32_t emits; /* for COMPENSATE; APPLY adds the event's own */
};

/* A destination's value as the definition writes it: the text itself, or
 * where to read it when the worker starts (lifecycle_dest.h). */
enum lc_value_from { LC_VALUE_TEXT = 0, LC_VALUE_ENV, LC_VALUE_FILE };
struct lc_value {
	enum lc_value_from from;
	char text[LC_VALUE_MAX + 1]; /* the text, the variable's name or the path; "" when absent */
};

/* An HTTP endpoint emitted events may go to (issue 45), as read; the
 * values are resolved into a struct http_dest by lc_dest_resolve. */
struct lc_dest {
	char name[LC_NAME_MAX + 1];
	struct lc_value url;
	bool put;                    /* PUT instead of POST */
	struct {
		char name[LC_NAME_MAX + 1];
		struct lc_value value;
	} headers[LC_DEST_MAX_HEADERS];
	int nheaders;
	struct lc_value ca_file;     /* text "": the system's store */
	long timeout_ms, connect_timeout_ms; /* 0: http_call's defaults */
	int line;
};

struct lc_def {
	/* What rows and held events remember it by (issue 46, item 3): the
	 * file's "version" when declared, else the first LC_VERSION_HASH hex
	 * digits of the SHA-256 of the file's JSON re-serialised compact with
	 * sorted keys (so an edit changes it and whitespace does not). */
	char version[LC_VERSION_MAX + 1];
	bool version_declared;
	char aggregate[LC_NAME_MAX + 1];
	char table[LC_NAME_MAX + 1];
	char key[LC_NAME_MAX + 1];
	char states[LC_MAX_STATES][LC_NAME_MAX + 1]; /* [0] = "" */
	int nstates;
	int path[LC_MAX_STATES]; /* the main path, as state indexes */
	int npath;
	uint32_t terminal;       /* bit s: state s is terminal */
	struct lc_event events[LC_MAX_EVENTS];
	int nevents;
	/* Emitted kinds (lifecycle_emit.h): a type, and the event whose
	 * effect it is when several are (its stable id names it), else -1. */
	char emits[LC_MAX_EMITS][LC_NAME_MAX + 1];
	int emit_cause[LC_MAX_EMITS];
	int nemits;
	int marks[LC_MAX_EVENTS]; /* mark bit -> event index */
	int nmarks;
	struct lc_rule rules[LC_MAX_STATES][LC_MAX_EVENTS];
	struct lc_stmt stmts[LC_MAX_STMTS];
	int nstmts;
	/* Where each emitted kind goes ("deliver"): emit_dests[k] bit d is
	 * dests[d]; bit k of emit_no_exchange: not to our exchange (only
	 * when the kind has a destination).  Nothing said: the exchange. */
	struct lc_dest dests[LC_MAX_DESTS];
	int ndests;
	uint32_t emit_dests[LC_MAX_EMITS];
	uint32_t emit_no_exchange;
	/* Events the producer numbers (issue 46, "sequence"): seq_field is
	 * the data field that carries an event's position in its aggregate's
	 * sequence (1, 2, ...); "" when the states alone order the events.
	 * seq_attr: the event's own "sequence" instead (CloudEvents' sequence
	 * extension attribute; a native message's top-level field), and
	 * seq_field is "sequence". */
	char seq_field[LC_NAME_MAX + 1];
	bool seq_attr;
	/* seq_header: an AMQP header of the delivery, named seq_field, in any
	 * envelope; the envelope layer puts its value where seq_attr's is (the
	 * event's own "sequence"), so the rest reads both alike. */
	bool seq_header;
};

/* Whether the producer numbers the definition's events. */
static inline bool lc_sequenced(const struct lc_def *d)
{
	return d->seq_field[0] != '\0';
}

/* Where a sequenced definition's number is, for people: "data.seq", "the
 * sequence attribute", "header x-seq" (into buf, cap bytes, returned). */
const char *lc_seq_source(const struct lc_def *d, char *buf, size_t cap);

struct lc_verdict {
	enum lc_decision decision;
	int next;
	uint32_t marks;
	uint32_t emits;
};

/* What is wrong with a definition: each error with its line and column
 * (1-based; 0 when it concerns the file as a whole) and what to write
 * instead. */
struct lc_errors {
	int n;
	struct {
		int line, column;
		char text[320];
	} e[LC_MAX_ERRORS];
	bool more; /* errors beyond LC_MAX_ERRORS were dropped */
};

/*
 * Read and validate a definition (text of len bytes; name is for messages).
 * Returns a new definition (lc_free it), or NULL with errs filled.  Allocation
 * failure is reported as an error at line 0.
 */
/* A column of the aggregate's table the worker writes itself, which no
 * event may set: lc_load refuses it at its line, and every command that
 * loads a definition (check, schema, migrate, run, dlq) with it. */
bool lc_column_reserved(const char *column);
struct lc_def *lc_load(const char *text, size_t len, struct lc_errors *errs);
/* lc_load of a file; a file that cannot be read is one error at line 0. */
struct lc_def *lc_load_file(const char *path, struct lc_errors *errs);
void lc_free(struct lc_def *def);

/* The built-in order lifecycle: lifecycles/order.json as compiled in. */
extern const char lc_builtin_order[];
extern const size_t lc_builtin_order_len;
/* lc_load of lc_builtin_order, its version LC_BUILTIN_ORDER_VERSION
 * unless the file declares one: every program that runs the built-in
 * definition loads it here, so rows it decides say the same version. */
struct lc_def *lc_load_builtin(struct lc_errors *errs);

/* Print errs one per line as "name:line:column: text". */
void lc_errors_print(const struct lc_errors *errs, const char *name, FILE *f);

struct lc_verdict lc_decide(const struct lc_def *def, int state, uint32_t marks, int ev);

/* Event index of a type name or alias; -1 when unknown. */
int lc_event_find(const struct lc_def *def, const char *name);
/* The statements event ev runs when decision (reached in state, the state
 * before it) takes effect: the count, and in *first the index of the first
 * in def->stmts.  0 for a decision that takes no effect. */
int lc_event_stmts(const struct lc_def *def, int ev, int state, enum lc_decision decision, int *first);
/* The same for a name of len bytes, not NUL-terminated (a message's). */
int lc_event_findn(const struct lc_def *def, const char *name, size_t len);
/* State index of a name; -1 when unknown ("" is not a name). */
int lc_state_find(const struct lc_def *def, const char *name);
/* "applied", "held", "ignored", "compensated", "dead_lettered" */
const char *lc_decision_outcome(enum lc_decision d);

/* The decision table as text, one row per state, one column per event. */
void lc_print_table(const struct lc_def *def, FILE *f);
/* Cell (state s, event e) of the table as lc_print_table shows it
 * ("-> Paid +OrderPaid", "hold", "compensate +RefundRequested"), cut at cap. */
void lc_cell_text(const struct lc_def *def, int s, int e, char *buf, size_t cap);

/*
 * The arrival-order property, exhaustively: for every set of one event per
 * type (and each set with one of its types arriving twice, as two messages),
 * every arrival order, with held events re-evaluated oldest-first and
 * newest-first, must end in the same state, marks, version, ledger rows,
 * emitted events and held events as the set in file order.
 *
 * A set with two events that lead into different terminal states (an order
 * both shipped and cancelled) is a conflict, not an arrival order: whichever
 * comes first wins and the other is dead-lettered as invalid-transition, as
 * SPEC says; such sets are counted in conflicts and not compared.
 */
struct lc_check {
	long runs;      /* arrival orders simulated (each twice: FIFO, LIFO) */
	long sets;      /* sets compared */
	long conflicts; /* sets skipped as conflicts */
	bool sequenced; /* the producer's numbers order the events: nothing simulated */
	int reachable;  /* sequenced: the states reachable from the creation */
	char why[1024]; /* when it fails: the two arrival orders and what differs */
};

/* true when the property holds; false with out->why set.  For a
 * sequenced definition (lc_sequenced) the numbers make every arrival
 * order the producer's, so what is checked instead is what still can be:
 * every state reachable from the creation, every event able to apply in
 * some state (out->sequenced, out->reachable). */
bool lc_check_order_independence(const struct lc_def *def, struct lc_check *out);

#endif
