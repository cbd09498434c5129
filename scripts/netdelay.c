/*
 * netdelay.c - latency on a link for the network chaos (scripts/chaos
 * --network): this kernel has no sch_netem, so packets are handed to an
 * NFQUEUE (scripts/netfault ID queue N PORT...) and this program holds
 * each one for DELAY_MS +- JITTER_MS before it gives the verdict that lets
 * it go on.  Raw netlink (nfnetlink_queue), no library.
 *
 *   inbox-netdelay QUEUE_NUM DELAY_MS JITTER_MS SECONDS
 *
 * Packets leave in the order they came (each release time is at least the
 * one before it), so the link is slow, not reordering.  The queue is bound
 * fail-open: a packet the kernel cannot queue passes, it is never dropped
 * here.  Runs SECONDS (bounded), then lets every held packet go and exits
 * 0; exit 1 when the queue cannot be bound (not root, queue taken).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ND_HELD_MAX 65536 /* packets held at once; past it they pass at once */
#define ND_BUF 65536

struct nd_held {
	uint32_t id;
	int64_t release_us;
};

static struct nd_held nd_ring[ND_HELD_MAX];
static size_t nd_head, nd_n;
static uint32_t nd_seq;

static int64_t nd_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Append one attribute to the message at buf (its header's length grows). */
static void nd_attr(struct nlmsghdr *nh, uint16_t type, const void *data, uint16_t len)
{
	struct nlattr *a = (struct nlattr *)((char *)nh + NLMSG_ALIGN(nh->nlmsg_len));

	a->nla_type = type;
	a->nla_len = (uint16_t)(NLA_HDRLEN + len);
	memcpy((char *)a + NLA_HDRLEN, data, len);
	nh->nlmsg_len = NLMSG_ALIGN(nh->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static struct nlmsghdr *nd_msg(char *buf, uint16_t type, uint16_t queue, uint16_t flags)
{
	struct nlmsghdr *nh = (struct nlmsghdr *)buf;
	struct nfgenmsg *g;

	memset(buf, 0, 256);
	nh->nlmsg_len = NLMSG_LENGTH(sizeof *g);
	nh->nlmsg_type = (uint16_t)((NFNL_SUBSYS_QUEUE << 8) | type);
	nh->nlmsg_flags = (uint16_t)(NLM_F_REQUEST | flags);
	nh->nlmsg_seq = ++nd_seq;
	g = NLMSG_DATA(nh);
	g->nfgen_family = AF_UNSPEC;
	g->version = NFNETLINK_V0;
	g->res_id = htons(queue);
	return nh;
}

static int nd_send(int fd, struct nlmsghdr *nh)
{
	struct sockaddr_nl to = { .nl_family = AF_NETLINK };

	if (sendto(fd, nh, nh->nlmsg_len, 0, (struct sockaddr *)&to, sizeof to) < 0) {
		fprintf(stderr, "netdelay: sendto: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

/* Read the ack of a request sent with NLM_F_ACK: 0, or -1 with the error. */
static int nd_ack(int fd, const char *what)
{
	char buf[4096];
	ssize_t r = recv(fd, buf, sizeof buf, 0);
	struct nlmsghdr *nh = (struct nlmsghdr *)buf;

	if (r < 0) {
		fprintf(stderr, "netdelay: %s: %s\n", what, strerror(errno));
		return -1;
	}
	if (r >= (ssize_t)NLMSG_LENGTH(sizeof(struct nlmsgerr)) && nh->nlmsg_type == NLMSG_ERROR) {
		const struct nlmsgerr *e = NLMSG_DATA(nh);

		if (e->error != 0) {
			fprintf(stderr, "netdelay: %s: %s\n", what, strerror(-e->error));
			return -1;
		}
	}
	return 0;
}

static int nd_verdict(int fd, uint16_t queue, uint32_t id)
{
	char buf[256];
	struct nlmsghdr *nh = nd_msg(buf, NFQNL_MSG_VERDICT, queue, 0);
	struct nfqnl_msg_verdict_hdr v = { .verdict = htonl(NF_ACCEPT), .id = htonl(id) };

	nd_attr(nh, NFQA_VERDICT_HDR, &v, sizeof v);
	return nd_send(fd, nh);
}

/* Bind the queue: unbind any old binding of AF_INET's, bind, copy only the
 * metadata (the verdict needs the id alone), a long kernel queue, and
 * fail-open when it is full. */
static int nd_bind(int fd, uint16_t queue)
{
	char buf[256];
	struct nlmsghdr *nh;
	struct nfqnl_msg_config_cmd cmd = { .command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET) };
	struct nfqnl_msg_config_params params = { .copy_range = htonl(0), .copy_mode = NFQNL_COPY_META };
	uint32_t maxlen = htonl(8192), flags = htonl(NFQA_CFG_F_FAIL_OPEN);

	nh = nd_msg(buf, NFQNL_MSG_CONFIG, queue, NLM_F_ACK);
	nd_attr(nh, NFQA_CFG_CMD, &cmd, sizeof cmd);
	if (nd_send(fd, nh) != 0 || nd_ack(fd, "bind the queue") != 0)
		return -1;
	nh = nd_msg(buf, NFQNL_MSG_CONFIG, queue, NLM_F_ACK);
	nd_attr(nh, NFQA_CFG_PARAMS, &params, sizeof params);
	nd_attr(nh, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
	nd_attr(nh, NFQA_CFG_MASK, &flags, sizeof flags);
	nd_attr(nh, NFQA_CFG_FLAGS, &flags, sizeof flags);
	if (nd_send(fd, nh) != 0 || nd_ack(fd, "configure the queue") != 0)
		return -1;
	return 0;
}

/* One packet message: hold its id until its release time. */
static void nd_take(int fd, uint16_t queue, struct nlmsghdr *nh, int delay_ms, int jitter_ms)
{
	int len = (int)nh->nlmsg_len - (int)NLMSG_LENGTH(sizeof(struct nfgenmsg));
	struct nlattr *a = (struct nlattr *)((char *)NLMSG_DATA(nh) + NLMSG_ALIGN(sizeof(struct nfgenmsg)));

	while (len >= (int)NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= len) {
		if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR) {
			const struct nfqnl_msg_packet_hdr *ph = (const void *)((char *)a + NLA_HDRLEN);
			uint32_t id = ntohl(ph->packet_id);
			int64_t at = nd_now_us() + (int64_t)(delay_ms - jitter_ms + (jitter_ms > 0 ? rand() % (2 * jitter_ms + 1) : 0)) * 1000;

			if (nd_n == ND_HELD_MAX) {
				(void)nd_verdict(fd, queue, id); /* no room: it passes now */
				return;
			}
			if (nd_n > 0) {
				int64_t last = nd_ring[(nd_head + nd_n - 1) % ND_HELD_MAX].release_us;

				if (at < last)
					at = last; /* in order: slow, not reordered */
			}
			nd_ring[(nd_head + nd_n) % ND_HELD_MAX] = (struct nd_held){ id, at };
			nd_n++;
			return;
		}
		len -= NLA_ALIGN(a->nla_len);
		a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len));
	}
}

/* Let go of every packet due by now (all of them when all). */
static void nd_release(int fd, uint16_t queue, bool all)
{
	int64_t now = nd_now_us();

	while (nd_n > 0 && (all || nd_ring[nd_head].release_us <= now)) {
		(void)nd_verdict(fd, queue, nd_ring[nd_head].id);
		nd_head = (nd_head + 1) % ND_HELD_MAX;
		nd_n--;
	}
}

int main(int argc, char **argv)
{
	static char buf[ND_BUF];
	struct sockaddr_nl me = { .nl_family = AF_NETLINK };
	int fd, delay_ms, jitter_ms, seconds, rcvbuf = 8 << 20;
	uint16_t queue;
	int64_t end;

	if (argc != 5) {
		fprintf(stderr, "usage: inbox-netdelay QUEUE_NUM DELAY_MS JITTER_MS SECONDS\n");
		return 2;
	}
	queue = (uint16_t)strtoul(argv[1], NULL, 10);
	delay_ms = (int)strtol(argv[2], NULL, 10);
	jitter_ms = (int)strtol(argv[3], NULL, 10);
	seconds = (int)strtol(argv[4], NULL, 10);
	if (delay_ms < 0 || jitter_ms < 0 || jitter_ms > delay_ms || seconds <= 0 || seconds > 86400) {
		fprintf(stderr, "netdelay: DELAY_MS >= JITTER_MS >= 0, 0 < SECONDS <= 86400\n");
		return 2;
	}
	srand((unsigned)getpid());
	fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
	if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof me) != 0) {
		fprintf(stderr, "netdelay: netlink socket: %s\n", strerror(errno));
		return 1;
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
	if (nd_bind(fd, queue) != 0)
		return 1;
	fprintf(stderr, "netdelay: queue %u: %d ms +- %d for %d s\n", queue, delay_ms, jitter_ms, seconds);
	end = nd_now_us() + (int64_t)seconds * 1000000;
	while (nd_now_us() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int64_t wait_us = nd_n > 0 ? nd_ring[nd_head].release_us - nd_now_us() : 100000;
		ssize_t r;

		if (wait_us > 100000)
			wait_us = 100000;
		if (wait_us < 0)
			wait_us = 0;
		if (poll(&p, 1, (int)((wait_us + 999) / 1000)) > 0) {
			r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
			if (r < 0 && errno != EAGAIN && errno != ENOBUFS && errno != EINTR) {
				fprintf(stderr, "netdelay: recv: %s\n", strerror(errno));
				break;
			}
			for (struct nlmsghdr *nh = (struct nlmsghdr *)buf; r > 0 && NLMSG_OK(nh, (size_t)r);
			     nh = NLMSG_NEXT(nh, r))
				if ((nh->nlmsg_type & 0xff) == NFQNL_MSG_PACKET && (nh->nlmsg_type >> 8) == NFNL_SUBSYS_QUEUE)
					nd_take(fd, queue, nh, delay_ms, jitter_ms);
		}
		nd_release(fd, queue, false);
	}
	nd_release(fd, queue, true);
	close(fd);
	return 0;
}
