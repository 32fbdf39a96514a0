#!/usr/bin/env bash
# Runs the project's Python (the environment scripts/setup.sh made, with its PyTorch) with the
# module overflow_sentinel built into build/python (or $SENTINEL_BUILD_DIR/python) importable:
#   scripts/python.sh examples/python/train_t5_style.py --lr 5e5
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/venv_path.sh"
[ -x "$SENTINEL_PYTHON" ] || { echo "python.sh: no environment at $SENTINEL_VENV: run scripts/setup.sh first" >&2; exit 1; }
export PYTHONPATH="$root/${SENTINEL_BUILD_DIR:-build}/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$SENTINEL_PYTHON" "$@"
