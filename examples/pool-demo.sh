#!/bin/sh
# The pool, as a user sees it: a daemon on a simulated 2x A100-40GB node, a dozen jobs with mixed
# shares (one runs past its memory and gets CUDA's out-of-memory error, some wait for room, one
# high-priority job goes first), `gpupool ps` and `gpupool gpus` along the way.
# Usage: examples/pool-demo.sh [BIN_DIR]   (BIN_DIR holds gpupool and python; default .venv/bin)
set -eu
BIN=${1:-.venv/bin}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpupool-demo.XXXXXX")
export GPUPOOL_URL="unix://$WORK/state/gpupool.sock"
JOB="$BIN/python $HERE/cuda_job.py"

say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
run() { printf '$ gpupool %s\n' "$*"; "$BIN/gpupool" "$@"; }
submit() {  # submit NAME OPTIONS... -- CMD: print the line a user types, keep the id quiet
    name=$1; shift
    id=$("$BIN/gpupool" submit --name "$name" "$@")
    printf '  job %-2s %-9s %s\n' "$id" "$name" "$(echo "$*" | sed "s|$BIN/python $HERE/||")"
}
stop() {
    if [ -n "${DAEMON:-}" ]; then kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap stop EXIT INT TERM

say "== The pool: gpupool serve on a simulated node of 2x A100-40GB =="
# the daemon's log goes to a file, shown where it has something to say: a line per job's end
# would otherwise interleave with the commands' output
LOG="$WORK/daemon.log"
"$BIN/gpupool" serve --simulate 2xA100-40GB --node-dir "$WORK/node" --state-dir "$WORK/state" \
    2>"$LOG" &
DAEMON=$!
i=0
until "$BIN/gpupool" ps >/dev/null 2>&1; do
    i=$((i + 1)); [ "$i" -lt 100 ] || { cat "$LOG" >&2; echo "the daemon did not start" >&2; exit 1; }
    sleep 0.1
done
cat "$LOG"

say "A dozen jobs (python programs on the simulated CUDA driver), queued while the node drains:"
run drain
submit train-a  --priority low --compute 50 --memory 16GiB -- $JOB 7 12000
submit train-b  --priority low --compute 50 --memory 16GiB -- $JOB 7 9000
submit infer-1  --priority low --compute 30 --memory 8GiB  -- $JOB 5 6000
submit infer-2  --priority low --compute 30 --memory 8GiB  -- $JOB 3 5000
submit greedy   --priority low --compute 10 --memory 2GiB  -- $JOB 1 1024 4096
submit sweep    --priority low --compute 60 --memory 10GiB -- $JOB 3 8000
submit pair     --priority low --gpus 2 --compute 50 --memory 10GiB -- $JOB 2 4000
submit eval-1   --priority low --compute 20 --memory 4GiB  -- $JOB 2 2000
submit eval-2   --priority low --compute 20 --memory 4GiB  -- $JOB 2 2000
submit eval-3   --priority low --compute 20 --memory 4GiB  -- $JOB 2 2000
submit whole    --priority low --mode exclusive -- $JOB 2 30000
submit urgent   --priority high --compute 60 --memory 20GiB -- $JOB 3 16000
run drain --off

sleep 1.5
say "Running and queued jobs: shares per GPU, live memory and utilisation"
run ps
say "The same node as the devices layer sees it"
run gpus --node-dir "$WORK/node"
say "Why is 'pair' waiting?"
run describe 7 | sed -n '1,4p;/waiting because/,/events/p' | grep -v '^  events:'

sleep 4
say "Later: room freed, waiting jobs started (eval-* beside the others, where they delay no one)"
run ps
run wait 1 2 3 4 6 7 8 9 10 11 12 && echo "(all exited 0)"
say "Every job, finished; 'greedy' asked for more than its 2GiB share"
run ps --all
run logs 5
say "The daemon's log: a line for each job's end, the job as its context (--log-format json too)"
grep 'job 5:' "$LOG"
say "Stopping the daemon (running jobs would go on, and be adopted at the next start)"
kill "$DAEMON"
wait "$DAEMON" 2>/dev/null || true
DAEMON=
tail -n 1 "$LOG"
