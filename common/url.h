/*
 * url.h - the broker's and the database's URLs as the configuration takes
 * them (INBOX_AMQP_URL, INBOX_DB_URL, INBOX_MIGRATE_DB_URL, and the load
 * generator's): amqp:// and amqps:// with RabbitMQ's URI spec options,
 * mysql:// and mariadb:// with ours (SPEC.md), one node or a
 * comma-separated list of one cluster's nodes.  The shape of a URL is
 * addr.c's (addr_url_split); what each scheme needs is decided here.
 *
 * Ownership: url_parse_amqp / url_parse_db fill a caller-provided struct
 * (struct cfg_amqp / struct cfg_db, declared in cfg.h as members of struct
 * cfg) and allocate its strings and its next nodes; url_amqp_free /
 * url_db_free release them all (NULL-safe) and leave the struct zeroed.
 * On error nothing is left to free.
 */
#ifndef INBOX_URL_H
#define INBOX_URL_H

#include <stddef.h>

#include "cfg.h"

/* Nodes one URL setting may list. */
#define URL_MAX_NODES 16

/* Each returns 0, or -1 with a reason in err (without the setting's name,
 * never the URL's text).  Several comma-separated URLs are the nodes of
 * one cluster (at most URL_MAX_NODES): the first fills *out, the others
 * hang from out->next in the same order; a bad one is named by its place
 * ("node 2 of the list: bad URL: missing host"). */
int url_parse_amqp(const char *url, struct cfg_amqp *out, char *err, size_t errlen);
int url_parse_db(const char *url, struct cfg_db *out, char *err, size_t errlen);
void url_amqp_free(struct cfg_amqp *a);
void url_db_free(struct cfg_db *d);

#endif
