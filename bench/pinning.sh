#!/usr/bin/env bash
# Instances pinned to cores of their own (`instance_cpus`, `serve --io-cpus`) against the same
# server unpinned, alternating, then the same in-process loop pinned to each core in turn: how
# much a core's own speed moves. Needs a machine with at least 4 cores (the last two take the
# instances, the rest the server and the load generator).
# Usage: bench/pinning.sh [rounds, default 3] [seconds per level, default 3]
set -euo pipefail
export SHEAF_DRAIN_DELAY=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
rounds=${1:-3}
secs=${2:-3}
if [ -z "${SHEAF_BIN:-}" ]; then
  bash scripts/setup.sh
  cargo build --release --locked -p sheaf
fi
S=${SHEAF_BIN:-${CARGO_TARGET_DIR:-./target}/release/sheaf}
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
layout=$("$python" - <<'PY'
import os
cpus = sorted(os.sched_getaffinity(0))
if len(cpus) < 4:
    raise SystemExit("bench/pinning.sh needs at least 4 cores")
def siblings(c):
    out = set()
    path = f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"
    for part in open(path).read().strip().split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out
a = cpus[-1]
b = max(c for c in cpus if c not in siblings(a))
io = [c for c in cpus if c not in siblings(a) | siblings(b)]
print(a, b, ",".join(map(str, io)))
PY
)
read -r A B IO <<<"$layout"
echo "machine: $(nproc) cores; sheaf $(git rev-parse --short HEAD); instances on cores $A and $B, server and load generator on $IO"
ready() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/v2/health/ready" >/dev/null && return 0; sleep 0.1; done; echo "not ready on $1"; return 1; }
stop() { kill -TERM "$1" 2>/dev/null || true; wait "$1" || true; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/u" "$work/p"
cp -r model_repository/mlp model_repository/orientation model_repository/digits "$work/u/"
cp -r "$work/u/." "$work/p/"
printf 'instance_cpus: [%s]\n' "$A" >>"$work/p/mlp/config.yaml"
printf 'instance_cpus: [%s]\n' "$B" >>"$work/p/orientation/config.yaml"
printf 'instance_cpus: [%s, %s]\n' "$A" "$B" >>"$work/p/digits/config.yaml"

# $1: u (unpinned) or p (pinned); $2: the round.
variant() {
  local repo=$work/$1 extra=() run=()
  if [ "$1" = p ]; then extra=(--io-cpus "$IO"); run=(taskset -c "$IO"); fi
  echo "== $([ "$1" = p ] && echo pinned || echo unpinned), round $2"
  "$S" serve --model-repository "$repo" --python "$python" --http-port 18431 --grpc-port 0 \
    --metrics-port 0 "${extra[@]}" >"$work/server-$1-$2.log" 2>&1 &
  local s=$!
  ready 18431
  "${run[@]}" "$S" bench --url http://127.0.0.1:18431 --model mlp --concurrency 1,64 --duration "$secs" \
    --in-process "$repo/mlp/1/model.onnx" --batch-sizes 1,32,64
  "${run[@]}" "$S" bench --url http://127.0.0.1:18431 --model orientation --concurrency 1,64 \
    --duration "$secs" --in-process "$repo/orientation/1/model.onnx" --batch-sizes 1,4,16
  "${run[@]}" "$S" bench --url http://127.0.0.1:18431 --model digits --concurrency 64 --duration "$secs"
  stop $s
}

echo "== digits in-process"
"$python" bench/python/inprocess.py "$work/u/digits" "$secs" 32,64
for r in $(seq "$rounds"); do variant u "$r"; variant p "$r"; done

echo "== the MLP's in-process loop at batch 32, pinned to each core in turn"
"$S" serve --model-repository "$work/u" --http-port 18431 --grpc-port 0 --metrics-port 0 \
  --model-control-mode explicit >"$work/server-cores.log" 2>&1 &
s=$!
ready 18431
curl -sf -X POST http://127.0.0.1:18431/v2/repository/models/mlp/load >/dev/null
loop() { taskset -c "$1" "$S" bench --url http://127.0.0.1:18431 --model mlp --concurrency 1 \
  --duration 0.6 --in-process "$work/u/mlp/1/model.onnx" --batch-sizes 32 2>/dev/null |
  awk '$1 == 32 {print $3}'; }
cores=$("$python" -c "import os; print(' '.join(map(str, sorted(os.sched_getaffinity(0)))))")
all=$(echo "$cores" | tr ' ' ',')
for pass in $(seq "$rounds"); do
  line="pass $pass, items/s by core:"
  for c in $cores; do line="$line $c:$(loop "$c")"; done
  echo "$line"
done
echo "unpinned: $(loop "$all") $(loop "$all") $(loop "$all")"
stop $s
