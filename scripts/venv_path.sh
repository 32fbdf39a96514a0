# Sourced by the scripts: sets SENTINEL_VENV to the project's Python environment (made by
# scripts/setup.sh) and SENTINEL_PYTHON to its interpreter. The environment lives outside the
# checkout, keyed by the pinned packages and the interpreter, so every clone on a machine shares
# it; SENTINEL_VENV set by the caller wins.
sentinel_base_python=${SENTINEL_BASE_PYTHON:-/usr/bin/python3}
if [ -z "${SENTINEL_VENV:-}" ]; then
  sentinel_key=$( (cat "$(dirname "${BASH_SOURCE[0]}")/python-requirements.txt"
                   "$sentinel_base_python" -c 'import sys; print(sys.version)' 2>/dev/null) | sha256sum | cut -c1-12)
  SENTINEL_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/overflow-sentinel/venv-$sentinel_key"
fi
export SENTINEL_VENV
export SENTINEL_PYTHON="$SENTINEL_VENV/bin/python"
