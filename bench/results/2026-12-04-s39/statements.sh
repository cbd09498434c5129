#!/bin/bash
# Server time per statement kind, the emitting loop against the pool, one
# thread each (no lock waits, so time is the statements' own, plus the
# commit's fsync), from performance_schema's statement summaries.  Needs a
# stack started with it on:
#   scripts/stack down; INBOX_STACK_DB_ARGS="--performance-schema=ON" scripts/stack up
#   bench/results/2026-12-04-s39/statements.sh   (after bench/run or ninja -C build-bench)
# Output of s39: statements-t1.txt.
set -euo pipefail
cd "$(dirname "$0")/../../.."
eval "$(scripts/stack env)"
. scripts/lib.sh
export INBOX_METRICS_ADDR="" INBOX_LOG_LEVEL=warn INBOX_MIGRATIONS_DIR=$PWD/migrations
B=${B:-build-bench} N=${N:-20000} T=${T:-1}
sql() { scripts/stack sql -N -B -e "$1"; }
reset() {
    sql "TRUNCATE processed_messages; TRUNCATE order_events; TRUNCATE orders; TRUNCATE order_locks;
         TRUNCATE held_events; TRUNCATE outbox;"
    inbox_bench_empty_queues scripts/stack inbox
    "$B/loadgen/inbox-loadgen" publish --ledger /tmp/statements-ledger.jsonl --messages "$N" --dup-rate 0.2 \
        --concurrent-dups 0 --delayed-dups 0 --conflicts 0 --malformed 0 --invalid-share 0 --interleave 2000 \
        --reorder-window 0 --connections 4 >/dev/null 2>&1
    P="$(grep -o '"published":[0-9]*' /tmp/statements-ledger.jsonl | head -1 | cut -d: -f2)"
    sql "TRUNCATE performance_schema.events_statements_summary_global_by_event_name"
}
report() {
    echo "== $1: server microseconds per message, statements, microseconds each, rows examined, rows affected"
    sql "SELECT ROUND(SUM_TIMER_WAIT / 1e6 / $P, 2), COUNT_STAR, ROUND(SUM_TIMER_WAIT / COUNT_STAR / 1e6, 1),
                SUM_ROWS_EXAMINED, SUM_ROWS_AFFECTED, EVENT_NAME
         FROM performance_schema.events_statements_summary_global_by_event_name
         WHERE COUNT_STAR > 0 AND EVENT_NAME NOT LIKE '%truncate%' ORDER BY SUM_TIMER_WAIT DESC LIMIT 8"
    sql "SELECT ROUND(SUM(SUM_TIMER_WAIT) / 1e6 / $P, 1) FROM performance_schema.events_statements_summary_global_by_event_name
         WHERE EVENT_NAME NOT LIKE '%truncate%'" | sed 's/^/   total /'
}
settled() { curl -fsS "http://127.0.0.1:19577/metrics" 2>/dev/null | awk '/^inbox_messages_total\{/ { n += $2 } END { print n + 0 }'; }
reset
"$B/bench/min_pipeline" --threads "$T" --expect "$P" --idle 3 --batch 100 --emit
report "emitting loop, $T thread(s), $P messages"
reset
INBOX_METRICS_ADDR=127.0.0.1:19577 INBOX_THREADS="$T" "$B/worker/inbox-worker" run >/tmp/statements-worker.log 2>&1 &
W=$!
while [ "$(settled)" -lt "$P" ]; do sleep 0.2; done
sleep 0.5
report "pool, $T thread(s), $P messages"
kill "$W"; wait "$W" || true
