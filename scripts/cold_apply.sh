#!/bin/bash
# A fresh `wcoj apply` of one epoch as whole processes (exec to exit), side by side for several
# source trees run by one Python: warm (the state in the page cache) and with the state and the
# changes evicted, N of each, alternating trees, each on a fresh copy of a built state.
#
#   scripts/cold_apply.sh STATE EPOCH CHANGES N TREE...
#
# STATE is a state holding the epochs before EPOCH (never changed: each run applies to a copy;
# its output trace's batches are hard-linked into the copy, as an epoch neither reads nor changes
# them); CHANGES the epoch's changes (REL edge, undirected). TREE is a source tree holding
# wcoj_core (its byte-code compiled first: a stale .pyc is compiled on every run where
# PYTHONDONTWRITEBYTECODE is set). PY (default .venv/bin/python) runs every tree through
# PYTHONPATH, so only the code differs. Prints one line a run: wall, CPU (user + sys) and
# VmHWM from /usr/bin/time, the engine's own seconds and count from --json; and the load.
set -u
PY=${PY:-$(pwd)/.venv/bin/python}
STATE=$1; EPOCH=$2; CHANGES=$3; N=$4; shift 4
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
copy() {
  mkdir "$2"
  for e in "$1"/*; do
    if [ "$(basename "$e")" = traces ]; then
      mkdir "$2/traces"
      for t in "$e"/*; do
        case $(basename "$t") in out-*) cp -al "$t" "$2/traces/" ;; *) cp -a "$t" "$2/traces/" ;; esac
      done
    else
      cp -a "$e" "$2/"
    fi
  done
}
evict() {
  "$PY" - "$@" <<'EOF'
import os, sys
for root in sys.argv[1:]:
    found = [root] if os.path.isfile(root) else [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    for path in found:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
EOF
}
for tree in "$@"; do (cd "$tree" && "$PY" -m compileall -q wcoj_core); done
cat > "$WORK/wcoj.py" <<'EOF'
import sys
from wcoj_core.cli import main
sys.exit(main())
EOF
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T) UTC"
for mode in warm evicted; do
  for i in $(seq "$N"); do
    for tree in "$@"; do
      rm -rf "$WORK/s"; copy "$STATE" "$WORK/s"; sync
      [ "$mode" = evicted ] && evict "$WORK/s" "$CHANGES"
      PYTHONPATH=$tree /usr/bin/time -f "%e %U %S %M" -o "$WORK/t" "$PY" "$WORK/wcoj.py" apply \
        --query triangles --state "$WORK/s" --epoch "$EPOCH" --changes "edge=$CHANGES" \
        --undirected edge --json > "$WORK/out" 2> "$WORK/err"
      rc=$?
      read -r wall user sys kb < "$WORK/t"
      engine=$(tail -1 "$WORK/out" | "$PY" -c "import json, sys; d = json.loads(sys.stdin.read()); \
print(d['seconds'], 'count', d['count'], *(f'{k} {v:.3f}' for k, v in d['metrics']['seconds'].items()))" 2>/dev/null)
      printf '%-7s %-24s rc %s wall %s s cpu %.2f s VmHWM %d MiB engine %s\n' "$mode" "$tree" "$rc" \
        "$wall" "$(echo "$user + $sys" | bc)" $((kb / 1024)) "$engine"
    done
  done
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u +%T) UTC"
