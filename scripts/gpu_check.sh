#!/usr/bin/env bash
# GPU check: GPT-2 small, bf16 + torch.compile, ~2 minutes from a synthetic tokenloom table;
# prints tokens/s, MFU and the data-stall share. For a single-GPU machine without network:
# run scripts/gpu_wheels.sh where pip works, carry .whl/ along, then from the repo root:
#
#   bash scripts/gpu_check.sh [--seconds 120] [--json out.json]
#
# Packages the machine lacks (Lance, by default) come from .whl/: wheels, or the pylance wheel
# repacked as pylance.tar.xz (it is 85 MB zipped; 64 MB transfer limits are common).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${TOKENLOOM_WHEELS:-.whl}
SITE=${TOKENLOOM_SITE:-/tmp/tokenloom-site}
if ! python3 -c "import lance" 2>/dev/null; then
  mkdir -p "$SITE"
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WHEELS"/*.whl
  fi
  for archive in "$WHEELS"/*.tar.xz; do
    [ -e "$archive" ] && tar -xJf "$archive" -C "$SITE"
  done
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -c "import lance, torch; print(f'lance {lance.__version__}, torch {torch.__version__}')"
exec python3 scripts/gpu_check.py "$@"
