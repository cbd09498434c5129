#!/usr/bin/env python3
"""How the pool cut its batches, from a MariaDB general log (bench/dbwork
--transactions).

Each claim request (the one that inserts into processed_messages) is one
transaction's batch; its keys are the rows of that INSERT.  A claim that
follows a probe (SELECT ... SKIP LOCKED) on the same connection is a
batch's first transaction; one that follows another claim without a probe
in between is the second part of a split batch (worker/inflight.h,
inbox_run_nowait).
"""
import collections
import re
import sys

ENTRY = re.compile(r"^\s*(?:\d{6}\s+[\d:]+\s+)?(\d+)\s+(Query|Connect|Quit|Prepare|Execute|Close stmt|Init DB)\t?(.*)")


def entries(path):
    cur = None
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = ENTRY.match(line)
            if m:
                if cur is not None:
                    yield cur
                cur = [int(m.group(1)), m.group(2), m.group(3)]
            elif cur is not None:
                cur[2] += "\n" + line
    if cur is not None:
        yield cur


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: dbwork_batches.py GENERAL_LOG")
    probed = {}
    first, second = [], []
    for conn, kind, text in entries(sys.argv[1]):
        if kind != "Query":
            continue
        if "SKIP LOCKED" in text:
            probed[conn] = True
            continue
        i = text.find("INSERT INTO processed_messages")
        if i < 0:
            continue
        j = text.find("ON DUPLICATE", i)
        keys = text[i:j].count("),(") + 1
        (first if probed.get(conn) else second).append(keys)
        probed[conn] = False
    claims = first + second
    if not claims:
        sys.exit("dbwork_batches.py: no claims in the log")
    print("\nthe pool's transactions (one claim each), from the general log:")
    print(f"  claims {len(claims)}, keys {sum(claims)}, keys a claim {sum(claims) / len(claims):.1f}")
    print(f"  after a probe (a batch's first or only transaction): {len(first)}, keys {sum(first)}")
    print(f"  without one (the second part of a split batch, or a batch of one): {len(second)}, keys {sum(second)}")
    hist = collections.Counter(min(k // 10 * 10, 100) for k in claims)
    print("  claims by keys: " + ", ".join(f"{b}-{b + 9}: {hist[b]}" if b < 100 else f"100+: {hist[b]}"
                                          for b in sorted(hist)))


if __name__ == "__main__":
    main()
