#!/usr/bin/env bash
# Installs every build, test and run dependency from Debian's packages.
# Safe to run repeatedly: apt-get skips what is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU)
  libopenblas0-pthread    # without it LibTorch uses the reference BLAS (GEMMs ~18x slower)
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
  python3-torch python3-torchvision  # test fixtures: TorchScript models scripted at test time
  chromium                # the HTML report's test renders it headless and checks the DOM
  g++-aarch64-linux-gnu   # every source file is compiled for aarch64 too (scripts/check_aarch64.sh)
  python3-dev pybind11-dev python3-pytest  # the Python module overflow_sentinel and its tests
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
