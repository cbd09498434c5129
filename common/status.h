/*
 * status.h - the one status code space of the project.
 *
 * Every fallible function of common/ returns ST_OK (0) or a negative
 * st_code.  Library errors (librabbitmq, libmysqlclient, libc) are translated
 * at the module boundary, so callers above db_ never read mysql_errno and
 * callers above mq_ never read amqp_status_enum.
 */
#ifndef INBOX_STATUS_H
#define INBOX_STATUS_H

enum st_code {
	ST_OK = 0,
	ST_ERR_NOMEM = -1,          /* allocation failed */
	ST_ERR_INVALID = -2,        /* bad argument or bad configuration value */
	ST_ERR_IO = -3,             /* file or socket I/O failed (errno kept) */
	ST_ERR_DB_DUPLICATE = -4,   /* 1062: the UNIQUE index already holds the key */
	ST_ERR_DB_DEADLOCK = -5,    /* 1213: transaction rolled back, retry it */
	ST_ERR_DB_LOCK_TIMEOUT = -6, /* 1205: statement rolled back, roll back and retry */
	ST_ERR_DB_CONN = -7,        /* 2006/2013/refused: connection lost or unreachable */
	ST_ERR_DB = -8,             /* any other database error */
	ST_ERR_MQ_CONN = -9,        /* broker connection lost or unreachable */
	ST_ERR_MQ = -10,            /* broker refused an operation (channel error) */
	ST_ERR_MQ_NACK = -11,       /* publish nacked or returned unroutable */
	ST_ERR_TIMEOUT = -12,       /* a bounded wait ran out */
	ST_ERR_MIGRATION_CHANGED = -13, /* an applied migration file was edited */
	ST_ERR_FAULT = -14,         /* a test fault hook fired */
	ST_ERR_NOT_FOUND = -15,     /* the row, file or key does not exist */
	ST_ERR_STOPPED = -16,       /* the stop flag was raised while waiting */
	ST_ERR_DB_DATA = -17,       /* the database refused a value for its column (too
	                             * long, invalid characters, out of range): the fault
	                             * of the data, not of the connection */
	ST_ERR_ACCESS = -18,        /* a server refused our credentials or their rights:
	                             * broker 403/530 at login, database 1044/1045/
	                             * 1049/...; retrying will not fix it */
	ST_ERR_TLS_CERT = -19,      /* TLS cannot work as configured: the server's
	                             * certificate fails verification (its chain, the
	                             * host it names) or the URL's certificate files
	                             * cannot be loaded; retrying will not fix it */
	ST_ERR_DB_CARDINALITY = -20, /* 1242: a scalar subquery gave more than one row
	                              * (the Galera claim guard's signal, common/inbox_write.c) */
	/*
	 * Not a code; keep it last.  Enumerators count upwards, so it takes
	 * the value one above the code written just before it: a new code
	 * goes above this line, one below the previous, and ST_CODE_MIN
	 * follows by itself.  status.c refuses to compile when its string
	 * table does not end at ST_CODE_MIN.
	 */
	ST_CODE_END_
};

/* The lowest code, for st_strerror and the tests that walk the enum. */
#define ST_CODE_MIN (ST_CODE_END_ - 1)
/* How many codes there are, ST_OK included. */
#define ST_CODE_COUNT (1 - ST_CODE_MIN)

/* Whether code is a refusal that retrying will not fix (ST_ERR_ACCESS,
 * ST_ERR_TLS_CERT): at start-up the programs stop with one line. */
static inline int st_refusal(int code)
{
	return code == ST_ERR_ACCESS || code == ST_ERR_TLS_CERT;
}

/* A static string for code; never NULL, "unknown status" for foreign values. */
const char *st_strerror(int code);

#endif
