#!/usr/bin/env python3
"""Where the server's CPU went, the emitting loop beside the pool.

bench/dbwork --profile calls this with the messages of each drain and two
files of `samples <TAB> [.]|[k] <TAB> symbol` lines (perf report --sort
sym, one per drain).  Samples are taken at a fixed rate of CPU time, so
samples per 1,000 messages compare the two drains' CPU, function by
function.  The groups are by symbol name, for MariaDB 10.11's exported
symbols; a named function that matches none is counted in the SQL layer.
"""
import collections
import re
import sys

GROUPS = [
    # (name, pattern on the demangled symbol); first match wins.  Only the
    # server's exported functions have names (Debian strips the rest, and
    # its debug symbols are not reachable here): InnoDB's are all among
    # the unnamed ones, which are counted apart.
    ("parser", r"MYSQLparse|Lex_input_stream|lex_one_token|\blex_start|Lex_ident|LEX::|"
               r"Parser_state|Item::set_name|Item_.*::Item_|Item::Item"),
    ("charset conversion", r"^my_(wc_mb|mb_wc|convert|numchars|charpos|well_formed|strnncoll|"
               r"strnxfrm|hash_sort|ismbchar|uni_utf8|utf8|copy_fix|lengthsp|casedn|caseup)"),
    ("memory", r"^(malloc|free|calloc|realloc|__libc_malloc|_int_malloc|_int_free|"
               r"__memcpy|__memmove|__memset|memcpy|memmove|memset|my_malloc|my_free|"
               r"alloc_root|free_root|operator new|operator delete|cfree|malloc_consolidate)"),
    ("locks and threads", r"pthread_|^syscall$|futex|psi_|mysql_mutex|mysql_cond"),
    ("network", r"^(vio_|my_net|net_|my_real_read|Vio|__send|__recv|__libc_(recv|send|read|write)|"
                r"__poll|epoll)"),
]
GROUP_RE = [(g, re.compile(p)) for g, p in GROUPS]


def load(path):
    out = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t", 2)
            if len(parts) != 3 or not parts[0].isdigit():
                continue
            kind = "k" if "k" in parts[1] else "u"
            key = (kind, parts[2].strip())
            out[key] = out.get(key, 0) + int(parts[0])
    return out


def group(kind, sym):
    if kind == "k":
        return "kernel"
    if sym.startswith("0x"):
        return "unnamed (InnoDB and the server's static functions)"
    for g, r in GROUP_RE:
        if r.search(sym):
            return g
    return "SQL layer, other named"


def by_group(samples):
    out = collections.Counter()
    for (kind, sym), n in samples.items():
        out[group(kind, sym)] += n
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: dbwork_profile.py MESSAGES LOOP.syms POOL.syms "
                 "(MESSAGES: one count, the same backlog for both)")
    msgs = int(sys.argv[1]) if sys.argv[1].isdigit() else 0
    if msgs <= 0:
        sys.exit("dbwork_profile.py: no messages")
    loop, pool = load(sys.argv[2]), load(sys.argv[3])
    per_k = 1000.0 / msgs
    tl, tp = sum(loop.values()), sum(pool.values())
    print(f"\nserver CPU samples per 1,000 messages (999 Hz: about ms of CPU), {msgs} messages")
    print(f"  {'total':<40} loop {tl * per_k:8.1f}   pool {tp * per_k:8.1f}")
    groups_l, groups_p = by_group(loop), by_group(pool)
    print("\nby group (pool minus loop: where the difference lies)")
    for g in sorted(set(groups_l) | set(groups_p), key=lambda g: (groups_l[g] - groups_p[g], g)):
        a, b = groups_l.get(g, 0) * per_k, groups_p.get(g, 0) * per_k
        print(f"  {g:<40} loop {a:8.1f}   pool {b:8.1f}   +{b - a:7.1f}")
    print("\nnamed functions, by the pool's excess over the loop (top 30)")
    keys = {k for k in set(loop) | set(pool) if not k[1].startswith("0x")}
    for k in sorted(keys, key=lambda k: (loop.get(k, 0) - pool.get(k, 0), k))[:30]:
        a, b = loop.get(k, 0) * per_k, pool.get(k, 0) * per_k
        name = k[1] if len(k[1]) <= 70 else k[1][:67] + "..."
        print(f"  {'[k] ' if k[0] == 'k' else ''}{name:<70} {a:7.1f} {b:7.1f} +{b - a:6.1f}")


if __name__ == "__main__":
    main()
