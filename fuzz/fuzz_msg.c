/*
 * fuzz_msg.c - libFuzzer target for msg_parse and the canonical payload hash.
 *
 * Any bytes, with and without AMQP properties, must give a reason and a
 * bounded, printable detail line, and never crash, leak or read past len.
 * A body that parses must obey SPEC.md's field rules, and its hash must be
 * the SHA-256 of the compact, key-sorted serialisation computed here the
 * plain way (one json_dumps, one digest), which checks msg.c's streaming
 * hash.  That canonical form must itself parse to the same event and hash,
 * and re-serialise to the same bytes (idempotence), so whitespace and key
 * order never turn a duplicate into a conflict.
 *
 * Input layout: a first byte below 0x08 (never the start of JSON text)
 * selects properties: bit 0 a message-id property (length byte, bytes),
 * bit 1 a type property (length byte, bytes), bit 2 a small INBOX_MAX_BODY;
 * the rest is the body.  Any other first byte: the whole input is the body.
 *
 * Built by meson with -Dfuzz=true (see fuzz/meson.build); the same checks
 * run over the corpus and fuzz/regress/ in tests/unit/test_fuzz_regress.c.
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <string.h>

#include "fuzz.h"
#include "msg.h"

#define FUZZ_MAX_BODY 4096
#define FUZZ_SMALL_BODY 64

/* A property carved off the front: a length byte, then that many bytes. */
/* data.amount_cents as the order definition keeps it (PaymentAuthorized's
 * sets), 0 when the message does not carry it. */
static int64_t amount_of(const struct msg *m)
{
	const struct msg_val *v = msg_value(m, "amount_cents");

	return v != NULL ? v->i : 0;
}

static void take_prop(const uint8_t **data, size_t *size, unsigned mod, const char **s,
                      size_t *len)
{
	size_t n;

	if (*size == 0)
		return;
	n = (*data)[0] % mod;
	if (n > *size - 1)
		n = *size - 1;
	*s = (const char *)*data + 1;
	*len = n;
	*data += 1 + n;
	*size -= 1 + n;
}

static void sha256(const char *s, size_t len, unsigned char out[32])
{
	unsigned int n = 0;

	FUZZ_CHECK(EVP_Digest(s, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32);
}

/* The string member key of o (NULL when absent, null or not a string). */
static json_t *member_string(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_string(v) ? v : NULL;
}

static bool same_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
	return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

/* Fields of an accepted event, against SPEC.md and against the body. */
static void check_accepted(const struct msg *m, json_t *root, const struct msg_props *props)
{
	json_t *v;
	size_t tlen = strlen(m->occurred_at);

	FUZZ_CHECK(msg_id_valid(m->message_id, strlen(m->message_id), 1, MSG_ID_MAX));
	FUZZ_CHECK(msg_id_valid(m->order_id, strlen(m->order_id), 1, MSG_ORDER_ID_MAX));
	FUZZ_CHECK(msg_id_valid(m->source, strlen(m->source), 0, MSG_SOURCE_MAX));
	FUZZ_CHECK(msg_type_from_name(m->type_name, strlen(m->type_name)) == (int)m->type);
	FUZZ_CHECK(m->detail[0] == '\0');
	FUZZ_CHECK(amount_of(m) >= 0);
	FUZZ_CHECK(tlen == 0 || (tlen >= 20 && tlen <= MSG_TIME_MAX));
	for (size_t i = 0; i < tlen; i++)
		FUZZ_CHECK(strchr("0123456789-:.+TtZz", m->occurred_at[i]) != NULL);

	/* Each value came from the body, or from the property when the body
	 * lacks it; never from anywhere else. */
	v = member_string(root, "message_id");
	if (v != NULL)
		FUZZ_CHECK(same_bytes(m->message_id, strlen(m->message_id), json_string_value(v),
		                      json_string_length(v)));
	else
		FUZZ_CHECK(same_bytes(m->message_id, strlen(m->message_id), props->message_id,
		                      props->message_id_len));
	v = member_string(root, "type");
	if (v != NULL)
		FUZZ_CHECK(same_bytes(m->type_name, strlen(m->type_name), json_string_value(v),
		                      json_string_length(v)));
	else
		FUZZ_CHECK(same_bytes(m->type_name, strlen(m->type_name), props->type, props->type_len));
	v = member_string(root, "order_id");
	FUZZ_CHECK(v != NULL && strcmp(m->order_id, json_string_value(v)) == 0);
	v = json_object_get(json_object_get(root, "data"), "amount_cents");
	FUZZ_CHECK(json_is_integer(v) && m->type == MSG_PAYMENT_AUTHORIZED ? amount_of(m) == json_integer_value(v)
	                                                                 : amount_of(m) == 0);
}

/* The canonical form hashes to m's hash, parses to the same event, and is a
 * fixed point of the canonicalisation. */
static void check_canonical(const struct msg *m, json_t *root, const struct msg_props *props)
{
	char *canon = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	char *again = NULL;
	json_t *root2 = NULL;
	unsigned char sha[32];
	struct msg m2;
	size_t clen;

	FUZZ_CHECK(canon != NULL);
	clen = strlen(canon);
	sha256(canon, clen, sha);
	FUZZ_CHECK(memcmp(sha, m->sha256, 32) == 0);

	/* The canonical form may be longer than the body ("1e2" -> "100.0"),
	 * so its own length is the limit. */
	FUZZ_CHECK(msg_parse(canon, clen, clen, props, &m2) == MSG_REASON_NONE);
	FUZZ_CHECK(memcmp(m2.sha256, m->sha256, 32) == 0);
	FUZZ_CHECK(strcmp(m2.message_id, m->message_id) == 0);
	FUZZ_CHECK(strcmp(m2.source, m->source) == 0);
	FUZZ_CHECK(strcmp(m2.order_id, m->order_id) == 0);
	FUZZ_CHECK(strcmp(m2.type_name, m->type_name) == 0 && m2.type == m->type);
	FUZZ_CHECK(strcmp(m2.occurred_at, m->occurred_at) == 0);
	FUZZ_CHECK(amount_of(&m2) == amount_of(m));

	root2 = json_loadb(canon, clen, JSON_REJECT_DUPLICATES, NULL);
	FUZZ_CHECK(root2 != NULL);
	again = json_dumps(root2, JSON_COMPACT | JSON_SORT_KEYS);
	FUZZ_CHECK(again != NULL && strcmp(again, canon) == 0);
	free(again);
	json_decref(root2);
	free(canon);
}

void fuzz_msg_one(const uint8_t *data, size_t size)
{
	struct msg m;
	struct msg_props props = { 0 };
	size_t max_body = FUZZ_MAX_BODY;
	enum msg_reason r;
	json_t *root;

	if (size >= 1 && data[0] < 0x08) {
		unsigned sel = data[0];

		data++;
		size--;
		/* 160 and 40: past MSG_ID_MAX and past the longest type name. */
		if (sel & 1)
			take_prop(&data, &size, 160, &props.message_id, &props.message_id_len);
		if (sel & 2)
			take_prop(&data, &size, 40, &props.type, &props.type_len);
		if (sel & 4)
			max_body = FUZZ_SMALL_BODY;
	}
	if (size == 0) {
		/* The argument edges: no body at all, and no output. */
		FUZZ_CHECK(msg_parse(NULL, 1, max_body, &props, &m) == MSG_REASON_MALFORMED_JSON);
		FUZZ_CHECK(msg_parse(NULL, 0, max_body, &props, &m) == MSG_REASON_MALFORMED_JSON);
		FUZZ_CHECK(msg_parse(data, size, max_body, &props, NULL) == MSG_REASON_MALFORMED_JSON);
	}
	r = msg_parse(data, size, max_body, &props, &m);
	/* Only the reasons a parse can give; the others are the database's. */
	FUZZ_CHECK(r == MSG_REASON_NONE || r == MSG_REASON_MALFORMED_JSON ||
	           r == MSG_REASON_MISSING_FIELD || r == MSG_REASON_INVALID_FIELD ||
	           r == MSG_REASON_UNKNOWN_TYPE || r == MSG_REASON_TOO_LARGE);
	FUZZ_CHECK(strlen(m.detail) < MSG_DETAIL_MAX);
	FUZZ_CHECK(strlen(m.message_id) <= MSG_ID_MAX);
	for (const char *p = m.detail; *p != '\0'; p++)
		FUZZ_CHECK(*p >= 0x20 && *p <= 0x7e);
	if (r != MSG_REASON_NONE) {
		FUZZ_CHECK(m.detail[0] != '\0');
		/* A rejected message is logged under its id only when it is one. */
		FUZZ_CHECK(m.message_id[0] == '\0' ||
		           msg_id_valid(m.message_id, strlen(m.message_id), 1, MSG_ID_MAX));
		FUZZ_CHECK(r != MSG_REASON_TOO_LARGE || size > max_body);
		return;
	}
	FUZZ_CHECK(size <= max_body);

	/* Accepted: the body is one JSON object jansson reads the same way. */
	root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	FUZZ_CHECK(json_is_object(root));
	check_accepted(&m, root, &props);
	check_canonical(&m, root, &props);
	json_decref(root);
}

#ifdef FUZZ_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_msg_one(data, size);
	return 0;
}
#endif
