#!/usr/bin/env bash
# Builds kvtier (Release) if needed and runs it. Without arguments it runs the main job.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/build.sh" default >&2
if [ $# -eq 0 ]; then
  # The main job: the quickstart serving simulation (configs/examples/quickstart.textproto).
  set -- sim "$root/configs/examples/quickstart.textproto"
fi
exec "$root/build/default/bin/kvtier" "$@"
