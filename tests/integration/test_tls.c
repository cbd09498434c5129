/*
 * test_tls.c - both links over TLS, against the stack that `scripts/stack
 * up --tls` starts (INBOX_TLS_AMQP_URL, INBOX_TLS_DB_URL, INBOX_STACK_TLS_DIR
 * from `scripts/stack env`; missing ones fail the test, never skip it).
 *
 * The worker and inbox-loadgen apply and verify messages over TLS; a
 * certificate signed by a CA the client was not given is refused, and so is
 * a server that speaks no TLS when TLS was asked for: each with a log line
 * naming the link and the reason, and /readyz 503, never a quiet fall back
 * to plain text.  server_name_indication= is what the ClientHello names
 * (seen by an `openssl s_server`), and the certificate is checked against it.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "itest.h"
#include "status.h"

static const char *tls_env(const char *name)
{
	const char *v = getenv(name);

	cr_assert(v != NULL && v[0] != '\0', "%s is not set: start the stack with `scripts/stack up --tls` "
	          "and eval \"$(scripts/stack env)\"", name);
	return v;
}

/* A port from the stack's environment, checked (no atoi: a typo must not
 * read as port 0). */
static int tls_env_port(const char *name)
{
	const char *v = tls_env(name);
	char *end = NULL;
	long p = strtol(v, &end, 10);

	cr_assert(end != v && *end == '\0' && p > 0 && p < 65536, "%s is not a port: '%s'", name, v);
	return (int)p;
}

/* s with the first `from` replaced by `to`, into buf. */
static const char *replace1(char *buf, size_t cap, const char *s, const char *from, const char *to)
{
	const char *p = strstr(s, from);

	cr_assert_not_null(p, "'%s' not in '%s'", from, s);
	snprintf(buf, cap, "%.*s%s%s", (int)(p - s), s, to, p + strlen(from));
	return buf;
}

/* Poll log_path (bounded) until a line holds both a and b. */
static bool wait_log(const char *log_path, const char *a, const char *b, int timeout_s)
{
	return itest_wait_log_lines(log_path, (const char *const[]){ a, b, NULL }, 1, timeout_s) > 0;
}

static void log_path_for(char *buf, size_t cap, const char *name)
{
	char full[128];

	snprintf(full, sizeof full, "tls-%s", name);
	itest_log_path(buf, cap, full);
}

/* A worker with the given URLs and a metrics port; stderr into log. */
static pid_t tls_worker(const char *amqp_url, const char *db_url, int port, const char *log)
{
	static char amqp_env[2048], db_env[2048], addr_env[64];
	const char *args[] = { "run", "--threads", "2", NULL };
	const char *env[] = { amqp_env, db_env, addr_env, NULL };

	snprintf(amqp_env, sizeof amqp_env, "INBOX_AMQP_URL=%s", amqp_url);
	snprintf(db_env, sizeof db_env, "INBOX_DB_URL=%s", db_url);
	snprintf(addr_env, sizeof addr_env, "INBOX_METRICS_ADDR=127.0.0.1:%d", port);
	return itest_spawn_logged(args, env, log);
}

/* A worker on these URLs whose link cannot be opened: within 60 s a line
 * of its log (log, named after name) holds a and b, /readyz says 503, and
 * it is stopped.  what names the case in a failure. */
static void expect_refused(const char *amqp_url, const char *db_url, int port, const char *name, const char *a,
                           const char *b, const char *what, char *log, size_t cap)
{
	char body[4096];
	pid_t w;

	log_path_for(log, cap, name);
	w = tls_worker(amqp_url, db_url, port, log);
	cr_assert(wait_log(log, a, b, 60), "%s, see %s", what, log);
	cr_assert_eq(itest_wait_http(port, "/readyz", 503, body, sizeof body, 10), 503, "%s", body);
	itest_stop(w, SIGTERM, 30);
}

static int loadgen(const char *const *args, const char *amqp_url, const char *db_url, const char *log)
{
	static char amqp_env[2048], db_env[2048];
	const char *env[] = { amqp_env, db_env, NULL };
	snprintf(amqp_env, sizeof amqp_env, "INBOX_AMQP_URL=%s", amqp_url);
	snprintf(db_env, sizeof db_env, "INBOX_DB_URL=%s", db_url);
	return itest_loadgen(args, env, log, 300);
}

Test(tls, worker_and_loadgen_over_tls_apply_every_message, .timeout = 600)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL"), *db = tls_env("INBOX_TLS_DB_URL");
	char ledger[256], wlog[256], plog[300], vlog[300], body[4096];
	const char *pub[] = { "publish", "--ledger", ledger, "--orders", "60", "--connections", "2",
	                      "--settle-timeout", "120", NULL };
	const char *ver[] = { "verify", "--ledger", ledger, "--timeout", "120", NULL };
	int port = itest_metrics_port(0);
	pid_t w;
	int rc;

	cr_assert(strncmp(amqp, "amqps://", 8) == 0 && strstr(db, "ssl-ca=") != NULL);
	itest_fresh();
	log_path_for(ledger, sizeof ledger, "ledger");
	log_path_for(wlog, sizeof wlog, "worker");
	snprintf(plog, sizeof plog, "%s.publish.log", ledger);
	snprintf(vlog, sizeof vlog, "%s.verify.log", ledger);
	w = tls_worker(amqp, db, port, wlog);
	cr_assert_eq(itest_wait_http(port, "/readyz", 200, body, sizeof body, 60), 200,
	             "the worker did not become ready over TLS (see %s): %s", wlog, body);
	cr_assert_eq(loadgen(pub, amqp, db, plog), 0, "publish over TLS failed, see %s", plog);
	rc = loadgen(ver, amqp, db, vlog);
	itest_stop(w, SIGTERM, 30);
	cr_assert_eq(rc, 0, "verify over TLS failed, see %s", vlog);
	/* The stack's inbox_tls account is REQUIRE SSL: a session that fell
	 * back to plain text could not have written these rows. */
	cr_assert_gt(itest_int("SELECT COUNT(*) FROM order_events"), 0);
}

/*
 * A worker on these URLs whose server certificate fails verification: a
 * certificate does not fix itself, so, as for a wrong password, it gives
 * up at start (itest_expect_fatal) with its log named after name (issue
 * 22, item 12).
 */
static void expect_fatal(const char *amqp_url, const char *db_url, int port, const char *name,
                         const char *const *texts, char *log, size_t cap)
{
	log_path_for(log, cap, name);
	itest_expect_fatal(tls_worker(amqp_url, db_url, port, log), log, name, texts, NULL);
}

Test(tls, a_certificate_from_another_ca_is_fatal_at_start, .timeout = 300)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL"), *db = tls_env("INBOX_TLS_DB_URL");
	const char *mq_texts[] = { "link=amqp", "amqps://inbox:***@localhost", "certificate",
	                           "tls handshake: SSL peer cert verification failed", NULL };
	const char *db_texts[] = { "link=db", "certificate", "error=\"2026 ", NULL };
	char bad_amqp[2048], bad_db[2048], log[256];
	int port = itest_metrics_port(1);

	itest_fresh();
	/* The broker's certificate checked against an unrelated CA. */
	replace1(bad_amqp, sizeof bad_amqp, amqp, "/ca.pem", "/other-ca.pem");
	expect_fatal(bad_amqp, db, port, "wrong-ca-amqp", mq_texts, log, sizeof log);

	/* The database's certificate likewise (2026: CR_SSL_CONNECTION_ERROR). */
	replace1(bad_db, sizeof bad_db, db, "/ca.pem", "/other-ca.pem");
	expect_fatal(amqp, bad_db, port, "wrong-ca-db", db_texts, log, sizeof log);
}

/* TLS files named in the URL that cannot be loaded (a wrong path, a key
 * that is not the certificate's): a configuration fault that waiting will
 * not fix, on either link: exit 1 with one line. */
Test(tls, tls_files_that_cannot_be_loaded_are_fatal_at_start, .timeout = 300)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL"), *db = tls_env("INBOX_TLS_DB_URL");
	const char *mq_texts[] = { "link=amqp", "TLS", "cannot load cacertfile", "no-such-ca.pem", NULL };
	const char *db_ca[] = { "link=db", "TLS", "cannot load ssl-ca", "no-such-ca.pem: No such file", NULL };
	const char *db_key[] = { "link=db", "TLS", "cannot load ssl-key", "key values mismatch", NULL };
	char url[2048], log[256];
	int port = itest_metrics_port(7);

	itest_fresh();
	expect_fatal(replace1(url, sizeof url, amqp, "/ca.pem", "/no-such-ca.pem"), db, port, "nofile-amqp", mq_texts,
	             log, sizeof log);
	expect_fatal(amqp, replace1(url, sizeof url, db, "/ca.pem", "/no-such-ca.pem"), port, "nofile-db", db_ca, log,
	             sizeof log);
	/* ssl-cert the CA's certificate, ssl-key the client's key */
	expect_fatal(amqp, replace1(url, sizeof url, db, "/client.pem", "/ca.pem"), port, "nokey-db", db_key, log,
	             sizeof log);
}

/* ---- a server named by its IP address ------------------------------------ */

/* amqps://...@127.0.0.1 against a broker whose certificate names
 * IP:127.0.0.1: verified against the certificate's IP addresses, as every
 * OpenSSL client does, not refused by a check that knows only DNS names.
 * The database URL names 127.0.0.1 too. */
Test(tls, a_broker_named_by_its_ip_address_is_verified_against_the_certificate, .timeout = 300)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL"), *db = tls_env("INBOX_TLS_DB_URL");
	char by_ip[2048], from[64], to[64], wlog[256], body[4096], ev[512];
	int port = itest_metrics_port(5);
	struct mq *m;
	pid_t w;

	itest_fresh();
	snprintf(from, sizeof from, "@localhost:%s/", tls_env("INBOX_STACK_AMQP_TLS_PORT"));
	snprintf(to, sizeof to, "@127.0.0.1:%s/", tls_env("INBOX_STACK_AMQP_TLS_PORT"));
	replace1(by_ip, sizeof by_ip, amqp, from, to);
	cr_assert(strstr(db, "@127.0.0.1:") != NULL, "the stack's TLS database URL names 127.0.0.1: %s", db);
	log_path_for(wlog, sizeof wlog, "by-ip");
	w = tls_worker(by_ip, db, port, wlog);
	cr_assert_eq(itest_wait_http(port, "/readyz", 200, body, sizeof body, 60), 200,
	             "the worker did not become ready over TLS by IP address (see %s): %s", wlog, body);
	m = itest_mq();
	itest_event(ev, sizeof ev, "tls-by-ip-1", "OrderCreated", "tls-by-ip-order");
	itest_publish(m, "OrderCreated", ev, "tls-by-ip-1");
	mq_close(&m);
	cr_assert_eq(itest_wait_int("SELECT COUNT(*) FROM processed_messages WHERE message_id = 'tls-by-ip-1'", 1, 60),
	             1, "not applied over TLS by IP address, see %s", wlog);
	itest_stop_ok(w);
	cr_assert_not(itest_log_has(wlog, "verification failed"), "see %s", wlog);
}

/* The same servers reached at 127.0.0.2, an address their certificate does
 * not name: refused, at once and for good. */
Test(tls, a_certificate_not_issued_to_the_address_is_fatal_at_start, .timeout = 300)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL"), *db = tls_env("INBOX_TLS_DB_URL");
	const char *mq_texts[] = { "link=amqp", "amqps://inbox:***@127.0.0.2", "certificate",
	                           "IP address mismatch", NULL };
	const char *db_texts[] = { "link=db", "mysql://inbox_tls:***@127.0.0.2", "certificate", NULL };
	char url[2048], from[64], to[64], log[256];
	int port = itest_metrics_port(6), fport = itest_free_port();
	pid_t fw;

	itest_fresh();
	fw = itest_forward("127.0.0.2", fport, tls_env_port("INBOX_STACK_AMQP_TLS_PORT"));
	snprintf(from, sizeof from, "@localhost:%s/", tls_env("INBOX_STACK_AMQP_TLS_PORT"));
	snprintf(to, sizeof to, "@127.0.0.2:%d/", fport);
	expect_fatal(replace1(url, sizeof url, amqp, from, to), db, port, "other-ip-amqp", mq_texts, log, sizeof log);
	itest_stop(fw, SIGTERM, 30);

	fport = itest_free_port();
	fw = itest_forward("127.0.0.2", fport, itest_cfg()->db.port);
	snprintf(from, sizeof from, "@127.0.0.1:%d/", itest_cfg()->db.port);
	snprintf(to, sizeof to, "@127.0.0.2:%d/", fport);
	expect_fatal(amqp, replace1(url, sizeof url, db, from, to), port, "other-ip-db", db_texts, log, sizeof log);
	itest_stop(fw, SIGTERM, 30);
}

/* ---- a MySQL server that offers no TLS ------------------------------------ */

/* Answers every connection with a protocol-10 greeting whose capabilities
 * lack CLIENT_SSL, then waits for the client to give up. */
struct plain_db {
	int fd;
	int port;
	pthread_t thread;
};

static void *plain_db_main(void *arg)
{
	struct plain_db *s = arg;
	static const unsigned char payload[] = {
		0x0a, '5', '.', '5', '.', '5', '-', '1', '0', '.', '1', '1', '-', 'p', 'l', 'a', 'i', 'n', 0,
		1, 0, 0, 0,                             /* connection id */
		'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 0, /* scramble part 1, filler */
		0xff, 0xf7,                             /* capabilities: all but CLIENT_SSL (0x0800) */
		0x21, 0x02, 0x00,                       /* charset, status */
		0x08, 0x00,                             /* upper capabilities: CLIENT_PLUGIN_AUTH */
		21, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,       /* scramble length, reserved */
		'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p', 'q', 'r', 's', 't', 0,
		'm', 'y', 's', 'q', 'l', '_', 'n', 'a', 't', 'i', 'v', 'e', '_', 'p', 'a', 's', 's', 'w', 'o', 'r', 'd', 0,
	};
	unsigned char pkt[4 + sizeof payload];

	pkt[0] = sizeof payload & 0xff;
	pkt[1] = 0;
	pkt[2] = 0;
	pkt[3] = 0;
	memcpy(pkt + 4, payload, sizeof payload);
	for (;;) {
		char buf[512];
		int c = accept(s->fd, NULL, NULL);

		if (c < 0)
			return NULL; /* the listener was shut down */
		if (write(c, pkt, sizeof pkt) == (ssize_t)sizeof pkt) {
			struct timeval tv = { .tv_sec = 2 };

			(void)setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
			while (read(c, buf, sizeof buf) > 0)
				;
		}
		close(c);
	}
}

static void plain_db_start(struct plain_db *s)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof a;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	s->fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(s->fd, 0);
	cr_assert_eq(bind(s->fd, (struct sockaddr *)&a, sizeof a), 0, "bind: %s", strerror(errno));
	cr_assert_eq(listen(s->fd, 16), 0);
	cr_assert_eq(getsockname(s->fd, (struct sockaddr *)&a, &len), 0);
	s->port = ntohs(a.sin_port);
	cr_assert_eq(pthread_create(&s->thread, NULL, plain_db_main, s), 0);
}

static void plain_db_stop(struct plain_db *s)
{
	shutdown(s->fd, SHUT_RDWR);
	close(s->fd);
	pthread_join(s->thread, NULL);
}

Test(tls, a_server_without_tls_is_refused_when_tls_is_asked_for, .timeout = 300)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL"), *db = tls_env("INBOX_TLS_DB_URL");
	const char *dir = tls_env("INBOX_STACK_TLS_DIR");
	char plain_amqp[2048], plain_db_url[2048], tls_port[16], plain_port[16], log[256];
	struct plain_db fake;
	int port = itest_metrics_port(2);

	itest_fresh();
	/* amqps:// to the broker's plain-text listener. */
	snprintf(tls_port, sizeof tls_port, ":%s/", tls_env("INBOX_STACK_AMQP_TLS_PORT"));
	snprintf(plain_port, sizeof plain_port, ":%d/", itest_cfg()->amqp.port);
	replace1(plain_amqp, sizeof plain_amqp, amqp, tls_port, plain_port);
	expect_refused(plain_amqp, db, port, "plain-amqp", "broker unavailable", "tls handshake",
	               "no line names the broker and the reason", log, sizeof log);

	/* A database that offers no TLS, with only ssl-ca= in the URL: the
	 * client must refuse it, not log in in plain text. */
	plain_db_start(&fake);
	snprintf(plain_db_url, sizeof plain_db_url, "mysql://inbox_tls:inbox_tls@127.0.0.1:%d/inbox?ssl-ca=%s/ca.pem",
	         fake.port, dir);
	expect_refused(amqp, plain_db_url, port, "plain-db", "database unavailable", "error=\"2026 ",
	               "no TLS error (CR_SSL_CONNECTION_ERROR) named", log, sizeof log);
	plain_db_stop(&fake);
}

/* ---- server_name_indication ---------------------------------------------- */

/* `openssl s_server` on 127.0.0.1:port with the stack's server certificate,
 * expecting SNI sni.example.test; it prints `Hostname in TLS extension:
 * "NAME"` for each ClientHello that names one.  Its stdin is a pipe held
 * open by *stdin_fd: at EOF on stdin s_server quits. */
static pid_t sni_server(int port, const char *log, int *stdin_fd)
{
	const char *dir = tls_env("INBOX_STACK_TLS_DIR");
	char accept_arg[32], cert[512], key[512];
	int fds[2];
	pid_t pid;

	snprintf(accept_arg, sizeof accept_arg, "127.0.0.1:%d", port);
	snprintf(cert, sizeof cert, "%s/server.pem", dir);
	snprintf(key, sizeof key, "%s/server.key", dir);
	cr_assert_eq(pipe(fds), 0, "pipe: %s", strerror(errno));
	pid = fork();
	cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
	if (pid == 0) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || dup2(fds[0], 0) < 0 ||
		    freopen(log, "w", stdout) == NULL || dup2(1, 2) < 0)
			_exit(126);
		close(fds[0]);
		close(fds[1]);
		execlp("openssl", "openssl", "s_server", "-accept", accept_arg, "-cert", cert, "-key", key,
		       "-cert2", cert, "-key2", key, "-servername", "sni.example.test", (char *)NULL);
		_exit(127);
	}
	close(fds[0]);
	*stdin_fd = fds[1];
	cr_assert(wait_log(log, "ACCEPT", "ACCEPT", 30), "openssl s_server did not start, see %s", log);
	return pid;
}

static void sni_server_stop(pid_t pid, int stdin_fd)
{
	close(stdin_fd);
	itest_stop(pid, SIGTERM, 30);
}

/* The stack's amqps:// URL pointed at 127.0.0.1:port as host `host`, with
 * extra options appended. */
static const char *sni_url(char *buf, size_t cap, const char *host, int port, const char *extra)
{
	const char *amqp = tls_env("INBOX_TLS_AMQP_URL");
	char from[32], to[300], tmp[2048];

	snprintf(from, sizeof from, "@localhost:%s/", tls_env("INBOX_STACK_AMQP_TLS_PORT"));
	snprintf(to, sizeof to, "@%s:%d/", host, port);
	replace1(tmp, sizeof tmp, amqp, from, to);
	snprintf(buf, cap, "%s%s", tmp, extra);
	return buf;
}

Test(tls, server_name_indication_is_what_the_client_hello_names, .timeout = 300)
{
	const char *db = tls_env("INBOX_TLS_DB_URL");
	char url[2048], slog[256], wlog[256];
	int port = itest_free_port(), mport = itest_metrics_port(3), in;
	pid_t srv, w;

	itest_fresh();
	/* With the option: the ClientHello names it, not the URL's host. */
	log_path_for(slog, sizeof slog, "sni-server");
	log_path_for(wlog, sizeof wlog, "sni-worker");
	srv = sni_server(port, slog, &in);
	w = tls_worker(sni_url(url, sizeof url, "localhost", port,
	                       "&server_name_indication=sni.example.test&verify=verify_none"),
	               db, mport, wlog);
	cr_assert(wait_log(slog, "Hostname in TLS extension: \"sni.example.test\"", "", 60),
	          "the ClientHello did not name sni.example.test, see %s and %s", slog, wlog);
	cr_assert_not(itest_log_has(slog, "Hostname in TLS extension: \"localhost\""), "see %s", slog);
	itest_stop(w, SIGTERM, 30);
	sni_server_stop(srv, in);

	/* Without it: the URL's host, as before. */
	port = itest_free_port();
	log_path_for(slog, sizeof slog, "nosni-server");
	log_path_for(wlog, sizeof wlog, "nosni-worker");
	srv = sni_server(port, slog, &in);
	w = tls_worker(sni_url(url, sizeof url, "localhost", port, "&verify=verify_none"), db, mport, wlog);
	cr_assert(wait_log(slog, "Hostname in TLS extension: \"localhost\"", "", 60),
	          "the ClientHello did not name the URL's host, see %s and %s", slog, wlog);
	cr_assert_not(itest_log_has(slog, "sni.example.test\""), "see %s", slog);
	itest_stop(w, SIGTERM, 30);
	sni_server_stop(srv, in);

	/* A host that is an IP address: no name at all (RFC 6066 allows DNS
	 * names only); the handshake goes on to AMQP's protocol header. */
	port = itest_free_port();
	log_path_for(slog, sizeof slog, "ipsni-server");
	log_path_for(wlog, sizeof wlog, "ipsni-worker");
	srv = sni_server(port, slog, &in);
	w = tls_worker(sni_url(url, sizeof url, "127.0.0.1", port, "&verify=verify_none"), db, mport, wlog);
	cr_assert(wait_log(slog, "AMQP", "", 60), "the handshake did not complete, see %s and %s", slog, wlog);
	cr_assert_not(itest_log_has(slog, "Hostname in TLS extension"), "an IP address was sent as SNI, see %s",
	              slog);
	itest_stop(w, SIGTERM, 30);
	sni_server_stop(srv, in);
}

/* As in RabbitMQ's URI spec (Erlang's ssl): with server_name_indication the
 * certificate must be issued to that name; the URL's host no longer counts.
 * The stack's server certificate names localhost and 127.0.0.1 only. */
Test(tls, server_name_indication_is_the_name_the_certificate_is_checked_against, .timeout = 300)
{
	const char *db = tls_env("INBOX_TLS_DB_URL");
	char url[2048], slog[256], wlog[256];
	int port = itest_free_port(), mport = itest_metrics_port(4), in;
	pid_t srv, w;

	itest_fresh();
	log_path_for(slog, sizeof slog, "sni-verify-server");
	srv = sni_server(port, slog, &in);
	{
		const char *texts[] = { "link=amqp", "certificate", "tls handshake: SSL peer cert verification failed",
		                        "hostname mismatch", NULL };

		expect_fatal(sni_url(url, sizeof url, "localhost", port, "&server_name_indication=sni.example.test"),
		             db, mport, "sni-verify-worker", texts, wlog, sizeof wlog);
	}
	sni_server_stop(srv, in);

	/* The same server and URL without the option: the certificate names
	 * the URL's host, so the handshake passes and rabbitmq-c, which sends
	 * nothing before it has verified, sends AMQP's protocol header. */
	port = itest_free_port();
	log_path_for(slog, sizeof slog, "nosni-verify-server");
	log_path_for(wlog, sizeof wlog, "nosni-verify-worker");
	srv = sni_server(port, slog, &in);
	w = tls_worker(sni_url(url, sizeof url, "localhost", port, ""), db, mport, wlog);
	cr_assert(wait_log(slog, "AMQP", "", 60), "the verified handshake did not complete, see %s and %s", slog,
	          wlog);
	cr_assert_not(itest_log_has(wlog, "verification failed"), "see %s", wlog);
	itest_stop(w, SIGTERM, 30);
	sni_server_stop(srv, in);
}
