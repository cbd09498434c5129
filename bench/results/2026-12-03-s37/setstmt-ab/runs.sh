#!/usr/bin/env bash
for r in 1 2 3; do
  for v in main setstmt; do
    if [ $v = main ]; then R=/work/main; else R=/work/ab; fi
    echo "== round $r $v $(date +%T)"
    $R/bench/run --messages 40000 --threads 8 --procs 1 --latency-messages 0 --out /work/ab/out2/$v-$r > /work/ab/out2/$v-$r.log 2>&1
    grep "r1  pool" /work/ab/out2/$v-$r/table.txt
  done
done
echo "done $(date +%T)"
