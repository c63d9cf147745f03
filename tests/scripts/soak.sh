#!/usr/bin/env bash
# Steady load (issue 13, item 11; docs/PERFORMANCE.md). Build first: cargo build --release -p turnstile-gateway.
# Steady load on a fixed pool of 30 sessions: 6 loops of sequential stream=false turns.
set -u
BIN=${TURNSTILE_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/turnstile}
DIR=$(mktemp -d /tmp/soak.XXXX)
cd "$DIR"
$BIN serve --addr 127.0.0.1:7791 --data-dir ./data > server.log 2>&1 &
PID=$!
sleep 2
end=$((SECONDS + ${SOAK_SECONDS:-600}))
WORKERS=()
for w in 0 1 2 3 4 5; do
  ( n=0; while [ $SECONDS -lt $end ]; do
      s=$(( (w * 5) + (n % 5) ))
      curl -s -o /dev/null -X POST http://127.0.0.1:7791/agents/scripted/runs -d session_id=pool$s -d stream=false --data-urlencode "message=turn $n of worker $w with some prose to make it realistic /reply done $n" 
      n=$((n+1))
    done ) &
  WORKERS+=($!)
done
start=$SECONDS
for t in 30 60 120 180 240 300 360 420 480 540 600; do
  [ "$t" -le "${SOAK_SECONDS:-600}" ] || break
  while [ $((SECONDS - start)) -lt $t ]; do sleep 1; done
  rss=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
  runs=$(curl -s http://127.0.0.1:7791/metrics/prometheus | awk '/^turnstile_runs_started_total/{print $2}')
  echo "t=${t}s rss_kib=$rss runs_completed=$runs"
done
# Only the load loops: a bare `wait` would wait for the server too, which never ends.
wait "${WORKERS[@]}"
kill -TERM $PID; wait $PID
echo "data dir $DIR"
