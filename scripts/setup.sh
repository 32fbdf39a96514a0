#!/usr/bin/env bash
# Installs every build, test and run dependency: Debian's packages, then PyTorch and the Python
# test packages from PyPI, pinned in scripts/python-requirements.txt, into a virtual environment
# outside the checkout (scripts/venv_path.sh says where). Safe to run repeatedly: what is already
# installed is not installed again, and a second run needs no network.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache                  # compiled objects kept across builds and clones (scripts/compiler_cache.sh)
  libfmt-dev
  libboost-stacktrace-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev
  libcli11-dev
  libgloo-dev             # c10d's ProcessGroupGloo headers: the multi-rank example and tests
  libyaml-cpp-dev         # YAML configs (Options::from_yaml)
  libprotobuf-dev protobuf-compiler  # TensorBoard event files
  python3-protobuf python3-crc32c    # the tests' independent reader of TensorBoard files
  chromium                # the HTML report's test renders it headless and checks the DOM
  g++-aarch64-linux-gnu   # every source file is compiled for aarch64 too (scripts/check_aarch64.sh)
  python3-dev python3-venv  # the environment PyTorch is installed into, and the headers the module needs
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# PyTorch from PyPI: its LibTorch (with CUDA) is what the project builds against, its Python what
# the module is built for and the fixtures are scripted with. A finished environment is marked; a
# half-made one (an interrupted download) is made again.
source "$(dirname "$0")/venv_path.sh"
requirements="$(dirname "$0")/python-requirements.txt"
if [ ! -f "$SENTINEL_VENV/.sentinel-complete" ]; then
  echo "setup: installing PyTorch and the test packages into $SENTINEL_VENV (once: several GB)"
  rm -rf "$SENTINEL_VENV"
  mkdir -p "$(dirname "$SENTINEL_VENV")"
  "$sentinel_base_python" -m venv "$SENTINEL_VENV"
  "$SENTINEL_PYTHON" -m pip install --quiet --no-cache-dir --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$SENTINEL_VENV/.sentinel-complete"
fi

# Packages added to the environment after it was named, each list installed whenever it changes:
# the pip package's build backend (python-build-requirements.txt) and test packages that came
# later (python-added-requirements.txt). Kept out of python-requirements.txt, whose hash names the
# environment: a new one is a new PyTorch download and a cold compiler cache.
for added in build added; do
  list="$(dirname "$0")/python-$added-requirements.txt"
  if ! cmp -s "$list" "$SENTINEL_VENV/.sentinel-$added-packages"; then
    echo "setup: installing $(basename "$list") into $SENTINEL_VENV"
    "$SENTINEL_PYTHON" -m pip install --quiet --no-cache-dir --disable-pip-version-check -r "$list"
    cp "$list" "$SENTINEL_VENV/.sentinel-$added-packages"
  fi
done
