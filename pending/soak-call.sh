#!/bin/bash
# Issue 13's 10-minute soak (bench/gpu-soak: 64 streaming clients,
# prompts of 16-2,000 tokens, 10% abandoned; passes on 0 errors, the server
# idle again and device memory back to its idle level), which is longer
# than one call (at most 600 s): `start` runs it in the background and
# returns after ~9 minutes; `finish`, the very next call (the machine is
# held 30 s between calls, and the soak goes on meanwhile), waits for it
# and prints the result. Pack: `bench/gpu-check --pack gpu-x/p` of main,
# then `tar cJf gpu-x/p.tar.xz -C gpu-x p` (carry it and this file).
#   run(command="bash gpu-x/soak-call.sh start", carry=[...p.tar.xz, this])
#   run(command="bash gpu-x/soak-call.sh finish", carry=[same])
set -u
cd "$(dirname "$0")"; D=$PWD
W=/tmp/soak; mkdir -p $W
case "${1:-}" in
start)
    tar xJf p.tar.xz -C $W || exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    export KILN_SHARED_DIR=$W/p/shared KILN_CACHE_DIR=/tmp/kiln-cache
    cp -r ../bench $W/bench
    nohup bash -c "$W/bench/gpu-soak $W/p/bin/kiln ${SIZE:-1b} 64 600 > $W/soak.log 2>&1; echo \"rc=\$?\" >> $W/soak.log" > /dev/null 2>&1 &
    sleep 560; tail -5 $W/soak.log ;;
finish)
    for _ in $(seq 110); do grep -q "^rc=" $W/soak.log 2>/dev/null && break; sleep 5; done
    tail -15 $W/soak.log ;;
*) echo "usage: soak-call.sh start|finish" >&2; exit 2 ;;
esac
