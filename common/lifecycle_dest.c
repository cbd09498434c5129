/*
 * lifecycle_dest.c - see lifecycle_dest.h.  Reading "destinations" and
 * "deliver" is lc_load's (the errors carry their lines); reading what the
 * values point at is lc_dest_resolve's, at start-up.
 */
#include "lifecycle_dest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lifecycle_int.h"
#include "status.h"

/* A file's value, as for a secret header: one trailing newline dropped. */
#define LC_DEST_FILE_MAX 8192

/* ---- reading the definition (lc_load) ------------------------------------ */

/* [a-z][a-z0-9_-]*, at most LC_NAME_MAX: it labels metrics and headers. */
static bool dest_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > LC_NAME_MAX || !(s[0] >= 'a' && s[0] <= 'z'))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
			return false;
	return strcmp(s, LC_DELIVER_EXCHANGE) != 0;
}

/* A value: "text", {"env": NAME} or {"file": PATH}, into *out. */
static void parse_value(struct lc_ctx *c, json_t *v, struct lc_value *out, const char *what)
{
	static const char *const keys[] = { "env", "file", NULL };
	json_t *env = json_is_object(v) ? json_object_get(v, "env") : NULL;
	json_t *file = json_is_object(v) ? json_object_get(v, "file") : NULL;
	const char *text;

	if (json_is_string(v)) {
		out->from = LC_VALUE_TEXT;
		text = json_string_value(v);
	} else if (json_is_object(v) && json_object_size(v) == 1 && (json_is_string(env) || json_is_string(file))) {
		out->from = env != NULL ? LC_VALUE_ENV : LC_VALUE_FILE;
		text = json_string_value(env != NULL ? env : file);
	} else {
		if (json_is_object(v))
			lc_known_keys(c, v, keys, what);
		lc_err(c, "%s is a string, {\"env\": \"NAME\"} (NAME, or the file NAME_FILE names) or {\"file\": \"PATH\"}",
		       what);
		return;
	}
	if (text[0] == '\0' || strlen(text) > LC_VALUE_MAX) {
		lc_err(c, "%s is 1 to %d characters", what, LC_VALUE_MAX);
		return;
	}
	if (out->from == LC_VALUE_ENV) {
		for (const char *p = text; *p != '\0'; p++) {
			if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) {
				lc_err(c, "%s: \"%s\" is not a variable's name (letters, digits and _)", what, text);
				return;
			}
		}
	}
	snprintf(out->text, sizeof out->text, "%s", text);
}

static long parse_ms(struct lc_ctx *c, json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	if (v == NULL)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > HTTP_TIMEOUT_MAX_MS) {
		lc_push_key(c, key);
		lc_err(c, "\"%s\" is a number of milliseconds, 1 to %ld", key, HTTP_TIMEOUT_MAX_MS);
		lc_pop(c);
		return 0;
	}
	return (long)json_integer_value(v);
}

static void parse_dest(struct lc_ctx *c, struct lc_dest *d, const char *name, json_t *obj)
{
	static const char *const keys[] = { "url", "method", "headers", "ca_file", "timeout_ms", "connect_timeout_ms",
		                            NULL };
	json_t *v;
	const char *hname;

	snprintf(d->name, sizeof d->name, "%s", name);
	d->line = lc_here_line(c);
	if (!json_is_object(obj)) {
		lc_err(c, "a destination is an object: {\"url\": \"https://...\", \"method\": \"POST\", ...}");
		return;
	}
	lc_known_keys(c, obj, keys, "a destination");
	v = json_object_get(obj, "url");
	if (v == NULL) {
		lc_err(c, "missing \"url\": write \"url\": \"https://host/path\" or {\"env\": \"NAME\"}");
	} else {
		lc_push_key(c, "url");
		parse_value(c, v, &d->url, "\"url\"");
		if (d->url.from == LC_VALUE_TEXT && strncmp(d->url.text, "http://", 7) != 0 &&
		    strncmp(d->url.text, "https://", 8) != 0)
			lc_err(c, "\"url\" starts with http:// or https://");
		lc_pop(c);
	}
	v = json_object_get(obj, "method");
	if (v != NULL) {
		lc_push_key(c, "method");
		if (json_is_string(v) && strcmp(json_string_value(v), "PUT") == 0)
			d->put = true;
		else if (!json_is_string(v) || strcmp(json_string_value(v), "POST") != 0)
			lc_err(c, "\"method\" is \"POST\" (the default) or \"PUT\"");
		lc_pop(c);
	}
	v = json_object_get(obj, "headers");
	if (v != NULL) {
		json_t *hv;

		lc_push_key(c, "headers");
		if (!json_is_object(v) || json_object_size(v) > LC_DEST_MAX_HEADERS)
			lc_err(c, "\"headers\" is an object of at most %d names and values", LC_DEST_MAX_HEADERS);
		else
			json_object_foreach(v, hname, hv) {
				lc_push_key(c, hname);
				if (hname[0] == '\0' || strlen(hname) > LC_NAME_MAX)
					lc_err(c, "a header's name is 1 to %d characters", LC_NAME_MAX);
				snprintf(d->headers[d->nheaders].name, sizeof d->headers[d->nheaders].name, "%s", hname);
				parse_value(c, hv, &d->headers[d->nheaders].value, "a header's value");
				d->nheaders++;
				lc_pop(c);
			}
		lc_pop(c);
	}
	v = json_object_get(obj, "ca_file");
	if (v != NULL) {
		lc_push_key(c, "ca_file");
		parse_value(c, v, &d->ca_file, "\"ca_file\"");
		lc_pop(c);
	}
	d->timeout_ms = parse_ms(c, obj, "timeout_ms");
	d->connect_timeout_ms = parse_ms(c, obj, "connect_timeout_ms");
	if (d->timeout_ms > 0 && d->connect_timeout_ms > d->timeout_ms)
		lc_err(c, "\"connect_timeout_ms\" is at most \"timeout_ms\": the whole call includes its connect");
}

static void parse_route(struct lc_ctx *c, const char *type, json_t *list)
{
	struct lc_def *def = c->def;
	uint32_t dests = 0;
	bool exchange = false, found = false;
	size_t i;
	json_t *v;

	if (!json_is_array(list) || json_array_size(list) == 0) {
		lc_err(c, "a route is a non-empty list of destinations, like [\"mail\"] or [\"%s\", \"mail\"]",
		       LC_DELIVER_EXCHANGE);
		return;
	}
	json_array_foreach(list, i, v) {
		int d;

		lc_push_index(c, (int)i);
		if (!json_is_string(v)) {
			lc_err(c, "a destination is named by a string");
		} else if (strcmp(json_string_value(v), LC_DELIVER_EXCHANGE) == 0) {
			exchange = true;
		} else if ((d = lc_dest_find(def, json_string_value(v))) < 0) {
			lc_err(c, "\"%s\" is not a destination: declare it in \"destinations\", or write \"%s\" for ours",
			       json_string_value(v), LC_DELIVER_EXCHANGE);
		} else {
			if (dests & (1u << d))
				lc_err(c, "\"%s\" is listed twice: write it once", json_string_value(v));
			dests |= 1u << d;
		}
		lc_pop(c);
	}
	/* Every kind of the type: a type several causes emit is one kind
	 * per cause (lifecycle_emit.h), and each goes the same way. */
	for (int k = 0; k < def->nemits; k++) {
		if (strcmp(def->emits[k], type) != 0)
			continue;
		found = true;
		def->emit_dests[k] = dests;
		if (!exchange && dests != 0)
			def->emit_no_exchange |= 1u << k;
	}
	if (!found)
		lc_err(c, "\"%s\" is not an emitted type: route one an event \"emits\" or compensates with", type);
}

void lc_parse_destinations(struct lc_ctx *c, json_t *root)
{
	struct lc_def *def = c->def;
	json_t *dests = json_object_get(root, "destinations"), *deliver = json_object_get(root, "deliver"), *v;
	const char *key;

	if (dests != NULL) {
		lc_push_key(c, "destinations");
		if (!json_is_object(dests) || json_object_size(dests) == 0 || json_object_size(dests) > LC_MAX_DESTS) {
			lc_err(c, "\"destinations\" is an object of 1 to %d named destinations, like "
			       "{\"mail\": {\"url\": {\"env\": \"MAIL_URL\"}}}", LC_MAX_DESTS);
		} else {
			json_object_foreach(dests, key, v) {
				lc_push_key(c, key);
				if (!dest_name_ok(key))
					lc_err(c, "\"%s\" is not a destination's name: [a-z][a-z0-9_-]*, at most %d, and not \"%s\"",
					       key, LC_NAME_MAX, LC_DELIVER_EXCHANGE);
				parse_dest(c, &def->dests[def->ndests++], key, v);
				lc_pop(c);
			}
		}
		lc_pop(c);
	}
	if (deliver == NULL)
		return;
	lc_push_key(c, "deliver");
	if (!json_is_object(deliver)) {
		lc_err(c, "\"deliver\" is an object from emitted type to destinations, like {\"ReceiptRequested\": [\"mail\"]}");
	} else {
		json_object_foreach(deliver, key, v) {
			lc_push_key(c, key);
			parse_route(c, key, v);
			lc_pop(c);
		}
	}
	lc_pop(c);
}

int lc_dest_find(const struct lc_def *def, const char *name)
{
	for (int d = 0; d < def->ndests; d++)
		if (strcmp(def->dests[d].name, name) == 0)
			return d;
	return -1;
}

/* ---- resolving (start-up) ------------------------------------------------ */

/* path's content, one trailing newline dropped, into buf (a longer file
 * is refused, not cut). */
static int read_small(const char *path, char *buf, size_t cap, char *why, size_t whylen)
{
	FILE *f = fopen(path, "r");
	size_t n;

	if (f == NULL) {
		snprintf(why, whylen, "cannot read %.300s: %s", path, strerror(errno));
		return errno == ENOENT ? ST_ERR_NOT_FOUND : ST_ERR_IO;
	}
	n = fread(buf, 1, cap - 1, f);
	if (ferror(f) || !feof(f)) {
		snprintf(why, whylen, ferror(f) ? "cannot read %.300s" : "%.300s is longer than %zu bytes", path, cap - 2);
		fclose(f);
		return ST_ERR_IO;
	}
	fclose(f);
	buf[n] = '\0';
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = '\0';
	if (n > 0 && buf[n - 1] == '\r')
		buf[--n] = '\0';
	return ST_OK;
}

/* v's value into buf; *secret: it came from the environment or a file. */
static int value_read(const struct lc_value *v, char *buf, size_t cap, bool *secret, char *why, size_t whylen)
{
	char name[LC_VALUE_MAX + 8];
	const char *path, *s;

	*secret = v->from != LC_VALUE_TEXT;
	switch (v->from) {
	case LC_VALUE_TEXT:
		snprintf(buf, cap, "%s", v->text);
		return ST_OK;
	case LC_VALUE_FILE:
		return read_small(v->text, buf, cap, why, whylen);
	case LC_VALUE_ENV:
		snprintf(name, sizeof name, "%s_FILE", v->text);
		path = getenv(name);
		if (path != NULL && path[0] != '\0')
			return read_small(path, buf, cap, why, whylen);
		s = getenv(v->text);
		if (s == NULL || s[0] == '\0') {
			snprintf(why, whylen, "neither %.150s nor %.150s is set", v->text, name);
			return ST_ERR_NOT_FOUND;
		}
		if (strlen(s) >= cap) {
			snprintf(why, whylen, "%.300s is longer than %zu bytes", v->text, cap - 1);
			return ST_ERR_INVALID;
		}
		snprintf(buf, cap, "%s", s);
		return ST_OK;
	}
	return ST_ERR_INVALID;
}

int lc_dest_resolve(const struct lc_def *def, int d, struct http_dest *out, char *err, size_t errlen)
{
	const struct lc_dest *ld = &def->dests[d];
	char *buf = malloc(LC_DEST_FILE_MAX + 2);
	char why[400] = "";
	bool secret;
	int rc;

	memset(out, 0, sizeof *out);
	if (buf == NULL) {
		snprintf(err, errlen, "destination %s: out of memory", ld->name);
		return ST_ERR_NOMEM;
	}
	rc = value_read(&ld->url, buf, LC_DEST_FILE_MAX + 2, &secret, why, sizeof why);
	if (rc != ST_OK) {
		snprintf(err, errlen, "destination %s: url: %s", ld->name, why);
		goto cleanup;
	}
	rc = http_dest_init(out, buf, ld->put ? HTTP_PUT : HTTP_POST, why, sizeof why);
	if (rc != ST_OK) {
		snprintf(err, errlen, "destination %s: url: %s", ld->name, why);
		goto cleanup;
	}
	for (int h = 0; h < ld->nheaders; h++) {
		rc = value_read(&ld->headers[h].value, buf, LC_DEST_FILE_MAX + 2, &secret, why, sizeof why);
		if (rc == ST_OK)
			rc = http_dest_header(out, ld->headers[h].name, buf, why, sizeof why);
		if (rc != ST_OK) {
			snprintf(err, errlen, "destination %s: header %s: %s", ld->name, ld->headers[h].name, why);
			goto cleanup;
		}
		out->headers[out->n_headers - 1].secret = secret;
	}
	if (ld->ca_file.text[0] != '\0') {
		rc = value_read(&ld->ca_file, buf, LC_DEST_FILE_MAX + 2, &secret, why, sizeof why);
		if (rc == ST_OK)
			rc = http_dest_ca_file(out, buf, why, sizeof why);
		if (rc != ST_OK) {
			snprintf(err, errlen, "destination %s: ca_file: %s", ld->name, why);
			goto cleanup;
		}
	}
	if (ld->timeout_ms > 0 || ld->connect_timeout_ms > 0) {
		long t = ld->timeout_ms > 0 ? ld->timeout_ms : HTTP_TIMEOUT_DEFAULT_MS;
		long ct = ld->connect_timeout_ms > 0 ? ld->connect_timeout_ms : HTTP_CONNECT_TIMEOUT_DEFAULT_MS;

		if (ct > t)
			ct = t;
		rc = http_dest_timeouts(out, t, ct, why, sizeof why);
		if (rc != ST_OK) {
			snprintf(err, errlen, "destination %s: %s", ld->name, why);
			goto cleanup;
		}
	}
cleanup:
	/* a secret read into buf is not left in freed memory */
	memset(buf, 0, LC_DEST_FILE_MAX + 2);
	free(buf);
	if (rc != ST_OK)
		http_dest_free(out);
	return rc;
}
