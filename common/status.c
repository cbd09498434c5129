/*
 * status.c - strings for st_code.  The table is indexed by -code: a new
 * lowest code without a string fails the static assertion below, and one
 * left without a string in the middle is caught by tests/unit/test_status.c.
 */
#include "status.h"

#include <stddef.h>

static const char *const st_strings[] = {
	[-ST_OK] = "ok",
	[-ST_ERR_NOMEM] = "out of memory",
	[-ST_ERR_INVALID] = "invalid value",
	[-ST_ERR_IO] = "input/output error",
	[-ST_ERR_DB_DUPLICATE] = "duplicate key",
	[-ST_ERR_DB_DEADLOCK] = "deadlock, transaction rolled back",
	[-ST_ERR_DB_LOCK_TIMEOUT] = "lock wait timeout",
	[-ST_ERR_DB_CONN] = "database connection lost",
	[-ST_ERR_DB] = "database error",
	[-ST_ERR_MQ_CONN] = "broker connection lost",
	[-ST_ERR_MQ] = "broker error",
	[-ST_ERR_MQ_NACK] = "publish not confirmed",
	[-ST_ERR_TIMEOUT] = "timed out",
	[-ST_ERR_MIGRATION_CHANGED] = "applied migration changed",
	[-ST_ERR_FAULT] = "injected fault",
	[-ST_ERR_NOT_FOUND] = "not found",
	[-ST_ERR_STOPPED] = "stopped",
	[-ST_ERR_DB_DATA] = "value refused by the database",
	[-ST_ERR_ACCESS] = "access refused",
	[-ST_ERR_TLS_CERT] = "TLS certificates refused",
	[-ST_ERR_DB_CARDINALITY] = "subquery returned more than one row",
};
_Static_assert(sizeof st_strings / sizeof st_strings[0] == ST_CODE_COUNT,
               "st_strings must end at ST_CODE_MIN: one entry per st_code");

const char *st_strerror(int code)
{
	if (code > 0 || code < ST_CODE_MIN)
		return "unknown status";
	if (st_strings[-code] == NULL)
		return "unknown status";
	return st_strings[-code];
}
