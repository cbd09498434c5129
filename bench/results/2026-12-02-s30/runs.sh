#!/bin/bash
L=/work/bisect/final.log
run() { # dir label env... -- args
  local d=$1 label=$2; shift 2
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  (cd $d && scripts/stack down >/dev/null 2>&1)
  echo "=== $label $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)" >> $L
  (cd $d && env "${envs[@]}" bench/run "$@" --out /work/bisect/final-$label > /work/bisect/final-$label.out 2>&1); echo "rc=$? $(date +%T)" >> $L
  grep -A4 '^procs' /work/bisect/final-$label.out | head -5 >> $L
  grep -A3 '^publish -> commit' /work/bisect/final-$label.out >> $L
}
run /work/bis-5bfff4a base X=1 -- --messages 60000 --threads 8 --procs 1 --seconds 5
run /work/main main X=1 -- --messages 60000 --threads 8 --procs 1 --seconds 5 --latency-messages 0
run /work/main relay INBOX_OUTBOX_DISPATCH=relay -- --messages 60000 --total 8 --procs "1 2 4" --seconds 5
run /work/main thread INBOX_OUTBOX_DISPATCH=thread -- --messages 60000 --total 8 --procs "1 2 4" --seconds 5 --latency-messages 0
