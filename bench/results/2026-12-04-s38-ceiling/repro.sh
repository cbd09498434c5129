#!/usr/bin/env bash
# The batched ceiling's lost claims (s38): drain a 5,000-message saga
# backlog with `min_pipeline --batch 100` at 8, 4 and 2 threads and count
# what it wrote.  Before 3652fe4 the claims came out 5-20 % short of the
# originals (the ledger whole or nearly); after it, equal.  Needs the stack
# up and build-bench built (bench/run builds it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
eval "$(scripts/stack env)"
export INBOX_METRICS_ADDR="" INBOX_LOG_LEVEL=warn
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
B="${BUILD:-build-bench}"
VHOST="${INBOX_AMQP_URL##*/}"; VHOST="${VHOST//%2[fF]//}"; [ -n "$VHOST" ] || VHOST=/
sql() { scripts/stack sql -N -B -e "$1"; }
for t in 8 4 2; do
    sql "TRUNCATE processed_messages; TRUNCATE order_events; TRUNCATE orders; TRUNCATE order_locks;
         TRUNCATE held_events; TRUNCATE outbox;"
    inbox_bench_empty_queues scripts/stack "$VHOST"
    "$B/loadgen/inbox-loadgen" publish --ledger /tmp/repro-ledger.jsonl --messages 5000 --dup-rate 0.2 \
        --concurrent-dups 0 --delayed-dups 0 --conflicts 0 --malformed 0 --invalid-share 0 \
        --interleave 2000 --reorder-window 0 --connections 4 >/dev/null 2>&1
    run="$(head -1 /tmp/repro-ledger.jsonl)"
    published="$(grep -o '"published":[0-9]*' <<<"$run" | cut -d: -f2)"
    originals="$(grep -o '"originals":[0-9]*' <<<"$run" | cut -d: -f2)"
    "$B/bench/min_pipeline" --threads "$t" --batch 100 --expect "$published" --idle 3 >/dev/null
    echo "threads $t: originals $originals, claims $(sql 'SELECT COUNT(*) FROM processed_messages'), ledger $(sql 'SELECT COUNT(*) FROM order_events')"
done
