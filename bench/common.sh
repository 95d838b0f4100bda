# Helpers the bench scripts share (sourced).

wait_for_log() {  # FILE PATTERN PID: until FILE has PATTERN; fails if PID exits or 60 s pass
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { cat "$1" >&2; return 1; }
    sleep 0.1
  done
  echo "bench: timed out waiting for '$2' in $1" >&2
  return 1
}
