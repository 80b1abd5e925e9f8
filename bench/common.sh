# Sourced by the bench scripts that measure a build of sheaf given as SHEAF_BIN or this checkout's.
#
# sheaf_binary: sets `sheaf` to $SHEAF_BIN, or to this checkout's release binary, built first;
# `label` names what is measured (the binary's path, or the commit).
sheaf_binary() {
  label=${SHEAF_BIN:-$(git rev-parse --short HEAD)}
  if [ -z "${SHEAF_BIN:-}" ]; then
    cargo build --release --locked -p sheaf
    SHEAF_BIN="${CARGO_TARGET_DIR:-./target}/release/sheaf"
  fi
  sheaf=$SHEAF_BIN
}

# wait_for URL: returns once URL answers with success, or fails after 150 s saying so.
wait_for() {
  for _ in $(seq 300); do
    curl -sf "$1" >/dev/null && return 0
    sleep 0.5
  done
  echo "nothing answered at $1" >&2
  return 1
}
