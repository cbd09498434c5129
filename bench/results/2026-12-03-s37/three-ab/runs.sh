#!/usr/bin/env bash
# Three variants of one build (/work/ab, AB_MODE), one stack folder, in rotation.
export INBOX_STACK_DIR=/tmp/abstack
mkdir -p /work/ab/out3
for r in 1 2 3; do
  for v in main plain setstmt; do
    if [ $v = main ]; then unset AB_MODE; else export AB_MODE=$v; fi
    echo "== round $r $v $(date +%T)"
    /work/ab/bench/run --messages 40000 --threads 8 --procs 1 --latency-messages 0 --out /work/ab/out3/$v-$r > /work/ab/out3/$v-$r.log 2>&1
    grep "r1  pool" /work/ab/out3/$v-$r/table.txt
  done
done
echo "done $(date +%T)"
