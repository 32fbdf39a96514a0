#!/usr/bin/env bash
# The pip package as a user installs it (pyproject.toml): a fresh virtual environment that already
# holds torch and transformers, `pip install --no-build-isolation` of this checkout, then, from a
# directory outside the checkout, the module imported and stopping a Hugging Face model at a
# planted overflow (installed_package.py), and `sentinel --version` and `sentinel demo` through the
# console script. The environment sees the project's torch through a .pth file naming the project
# environment's site-packages: nothing is downloaded (pip runs with --no-index), and the project's
# environment itself is never installed into. The compile goes through scripts/compiler_cache.sh's
# ccache, whose paths are relative to the checkout: objects build/ compiled are hits.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source scripts/venv_path.sh
source scripts/compiler_cache.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/sentinel-pip.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "pip_package: $*" >&2; exit 1; }

"$sentinel_base_python" -m venv "$work/env"
python="$work/env/bin/python"
site() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site "$SENTINEL_PYTHON" > "$(site "$python")/sentinel_project_environment.pth"
"$python" -c 'import torch, transformers, scikit_build_core' ||
  fail "the environment does not see the project's torch, transformers and scikit-build-core (run scripts/setup.sh)"

start=$SECONDS
export CMAKE_ARGS="${sentinel_launcher[*]}" CMAKE_BUILD_PARALLEL_LEVEL=${SENTINEL_JOBS:-2}
if ! "$python" -m pip install --no-build-isolation --no-index --disable-pip-version-check -v "$root" \
    > "$work/pip.log" 2>&1; then
  cat "$work/pip.log"
  fail "pip install of the checkout failed (its output is above)"
fi
echo "pip_package: pip install took $((SECONDS - start)) s"

# Outside the checkout, with no PYTHONPATH that could reach its build/python.
cd "$work"
unset PYTHONPATH
HF_HUB_OFFLINE=1 OPENBLAS_NUM_THREADS=1 "$python" "$root/tests/install/installed_package.py" > "$work/drop_in.log" 2>&1 ||
  { cat "$work/drop_in.log"; fail "the installed module did not stop the planted overflow (its output is above)"; }
tail -1 "$work/drop_in.log"

# The console script: a minimal environment, as a user's shell may have nothing set.
sentinel=$work/env/bin/sentinel
[ -x "$sentinel" ] || fail "pip installed no console script at $sentinel"
version=$(env -i HOME="$HOME" "$sentinel" --version) || fail "sentinel --version failed: $version"
package_version=$("$python" -c 'import importlib.metadata as m; print(m.version("overflow-sentinel"))')
[ "$version" = "$package_version" ] || fail "sentinel --version says '$version', the package is $package_version"
rc=0
env -i HOME="$HOME" "$sentinel" demo > "$work/demo.log" 2>&1 || rc=$?
grep -q "Detected inf/nan during batch_number=3" "$work/demo.log" && [ "$rc" -eq 3 ] ||
  { cat "$work/demo.log"; fail "sentinel demo exited $rc without its report of batch 3 (output above)"; }
echo "pip_package: sentinel $version from the console script; sentinel demo stopped at batch 3 (exit 3)"
