# Sourced by controlplane.sh and node.sh: processes the harness started, by their PID files.
#   alive PIDFILE      true while the process in PIDFILE runs
#   stop_pid PIDFILE   TERM, then KILL after 10 s, the process in PIDFILE (only that PID); removes
#                      the file
#   free_port          a free TCP port on 127.0.0.1 (bound and released)

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() {
  alive "$1" || { rm -f "$1"; return 0; }
  local pid
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
