#!/usr/bin/env bash
cd /work/ab || exit 1
for r in 1 2 3; do
  for v in nowait plain; do
    if [ $v = plain ]; then export AB_PLAIN=1; else unset AB_PLAIN; fi
    echo "== round $r $v $(date +%T)"
    bench/run --messages 40000 --threads 8 --procs 1 --latency-messages 0 --out /work/ab/out/$v-$r > /work/ab/out/$v-$r.log 2>&1
    tail -3 /work/ab/out/$v-$r/table.txt
  done
done
echo "done $(date +%T)"
