#!/usr/bin/env bash
# Builds kvtier (Release) if needed and runs it. Without arguments it runs the main job.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/build.sh" default >&2
if [ $# -eq 0 ]; then
  # The main job until the serving simulator lands: the hardware and model catalogue.
  set -- presets list
fi
exec "$root/build/default/bin/kvtier" "$@"
