#!/usr/bin/env bash
# Two builds of sheaf served in turn, in one run, on models whose batches are formed by the
# default policy (`latency_slo`): each round starts the first build, measures each model at each
# concurrency level, stops it, then does the same with the second, so that both see the same
# minutes of the machine. Prints, per model and level, each build's items/s of every round, the
# second's sum over the first's, and the means of the client's p50, of the mean batch and of the
# server's queue and infer stages per request (the stages `sheaf bench` reads from /stats).
#
# The models: `gpu`, a simulated device with an H200's cost curve for opennsfw (1.4 ms a batch
# of one, 4.1 ms a batch of 64: its instance sleeps, so the host's cores are left to the HTTP
# work, as a GPU leaves them); `gpu_slow`, the same shape three times slower (4 ms, 12 ms);
# `gpu_buckets`, the H200's served opennsfw curve (1.5 ms a batch of one, 2.0 of 8, 2.6 of 16,
# 4.1 of 32, 8.0 of 64) run only at the powers of two, as a GPU model runs its buckets (a batch
# between two is cut or padded); and the demo's `mlp` and `digits` (the scikit-learn forest behind
# the Python backend), which do their work on this machine's cores.
#
# Usage: bench/policy_ab.sh OLD_SHEAF NEW_SHEAF [ROUNDS (2)] [LEVELS (4,8,16,32,64)]
#          [SECONDS (3)] [MODELS (gpu,gpu_slow,mlp,digits)]
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ $# -ge 2 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
builds=("$1" "$2")
rounds=${3:-2} levels=${4:-4,8,16,32,64} secs=${5:-3} models=${6:-gpu,gpu_slow,mlp,digits}
bash scripts/setup.sh >/dev/null
port=${SHEAF_BENCH_PORT:-18571}
repo=$work/repo
sim() { # name, latency points, more config
  mkdir -p "$repo/$1"
  printf 'input: {name: x, shape: [-1, 16]}\noutput: {name: y}\nlatency_ms: {points: %s}\n' "$2" \
    >"$repo/$1/model.sim.yaml"
  printf 'max_batch_size: 64\n%b' "${3:-}" >"$repo/$1/config.yaml"
}
sim gpu "[[1, 1.4], [64, 4.1]]"
sim gpu_slow "[[1, 4.0], [64, 12.0]]"
sim gpu_buckets "[[1, 1.5], [8, 2.0], [16, 2.6], [32, 4.1], [64, 8.0]]" \
  'allowed_batch_sizes: [1, 2, 4, 8, 16, 32, 64]\n'
link_model mlp "$repo"
link_model digits "$repo"
label="$1 against $2"
machine_line "rounds $rounds, levels $levels, ${secs}s each"
IFS=, read -r -a names <<<"$models"
for r in $(seq "$rounds"); do
  for b in 0 1; do
    sheaf=${builds[$b]}
    serve "$work/server-$b.log" --model-repository "$repo" --http-port "$port" \
      --grpc-port $((port + 1)) --metrics-port $((port + 2)) --python "$root/.venv/bin/python"
    for m in "${names[@]}"; do
      "$sheaf" bench --url "http://127.0.0.1:$port" --model "$m" --concurrency "$levels" \
        --duration "$secs" --json "$work/$m-$r-$b.json" >/dev/null
    done
    stop "$server"
  done
done
python3 - "$work" "$rounds" "${names[@]}" <<'EOF'
import json, sys
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| model | clients | first build items/s | second build items/s | second / first | p50 ms | mean batch | queue ms | infer ms |")
print("|---|---|---|---|---|---|---|---|---|")
for m in names:
    runs = [[json.load(open(f"{work}/{m}-{r}-{b}.json")) for r in range(1, rounds + 1)] for b in (0, 1)]
    for i, level in enumerate(runs[0][0]):
        got = [[run[i] for run in runs[b]] for b in (0, 1)]
        rate = [[x["items_per_s"] for x in g] for g in got]
        mean = lambda g, k: sum(x[k] for x in g) / len(g)
        stage = lambda g, k: sum(x["server"][k] for x in g) / len(g)
        print(f"| {m} | {int(level['level'])} | {' / '.join(f'{v:,.0f}' for v in rate[0])} | "
              f"{' / '.join(f'{v:,.0f}' for v in rate[1])} | {sum(rate[1]) / sum(rate[0]):.2f} | "
              f"{mean(got[0], 'p50_ms'):.2f} → {mean(got[1], 'p50_ms'):.2f} | "
              f"{mean(got[0], 'mean_batch'):.1f} → {mean(got[1], 'mean_batch'):.1f} | "
              f"{stage(got[0], 'queue'):.2f} → {stage(got[1], 'queue'):.2f} | "
              f"{stage(got[0], 'infer'):.2f} → {stage(got[1], 'infer'):.2f} |")
EOF
