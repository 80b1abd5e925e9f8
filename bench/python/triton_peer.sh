# Triton's `tritonserver` with its Python backend, from PyPI's nvidia-pytriton, as a peer for
# the benchmarks (sourced by bench/python.sh and bench/streaming.sh).
#   peer_setup IMPORTS PACKAGE...   makes the peers' virtual environment ($peers) and installs the
#                                   packages there unless `import IMPORTS` already works; sets
#                                   $site and $triton and puts the Python backend's stub for that
#                                   interpreter where Triton looks for it (as pytriton does)
#   start_triton REPO PORT LOG      starts tritonserver on REPO (HTTP on PORT, gRPC on PORT + 1,
#                                   metrics on PORT + 2), its output in LOG; its pid is $!
#   triton_version                  what `tritonserver` came from
peers="${SHEAF_CACHE:-$HOME/.cache/sheaf}/peers"

peer_setup() {
  local imports=$1
  shift
  if [ ! -x "$peers/bin/python" ]; then
    python3 -m venv "$peers"
  fi
  if ! "$peers/bin/python" -c "import $imports" 2>/dev/null; then
    "$peers/bin/pip" install -q --disable-pip-version-check "$@"
  fi
  site=$("$peers/bin/python" -c "import pytriton, os; print(os.path.dirname(pytriton.__file__))")
  triton="$site/tritonserver"
  local pyver
  pyver=$("$peers/bin/python" -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")
  cp "$triton/python_backend_stubs/$pyver/triton_python_backend_stub" "$triton/backends/python/"
}

start_triton() {
  PATH="$peers/bin:$PATH" LD_LIBRARY_PATH="$site/../nvidia_pytriton.libs" \
    "$triton/bin/tritonserver" --model-repository "$1" \
    --backend-directory "$triton/backends" --http-port "$2" --grpc-port $(($2 + 1)) \
    --metrics-port $(($2 + 2)) --allow-metrics false >"$3" 2>&1 &
}

triton_version() {
  "$peers/bin/pip" show nvidia-pytriton 2>/dev/null | sed -n 's/^Version: /nvidia-pytriton /p'
}
