#!/usr/bin/env bash
# Here, before a GPU session: gathers the binaries built in build/ (against the project's PyTorch,
# the GPU machines' own build) and the Debian libraries they need that a GPU machine lacks into
# .devcarry/, for one device call that carries it and runs scripts/device_run.sh there
# (docs/platform.md, "A GPU session"). Binaries are stripped and gzipped (scripts/device_run.sh
# unpacks them there): the carried tree must stay under the device call's 64 MiB, and the five
# stripped binaries alone came to 65 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SENTINEL_BUILD_DIR:-build}
out=.devcarry
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
binaries=(sentinel tests/cuda/sentinel_cuda_tests tests/cuda/sentinel_cuda_watch_tests tests/sentinel_tests
          bench/bench_cuda)
for b in "${binaries[@]}"; do
  [ -x "$build_dir/$b" ] || { echo "device_pack: $build_dir/$b not built"; exit 1; }
  strip -o "$out/bin/$(basename "$b")" "$build_dir/$b"
done
# Every library they load from Debian's /usr/lib (not glibc's, not the toolkit's or torch's: the
# GPU machine has its own).
for b in "$out"/bin/*; do
  ldd "$b" | awk '$3 ~ /^(\/usr)?\/lib\/x86_64-linux-gnu\// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*|ld-linux*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
gzip -9 "$out"/bin/*
# The absolute source path compiled into the tests (their data and the CLI's path).
pwd >"$out/source_dir"
source scripts/venv_path.sh
"$SENTINEL_PYTHON" -c 'import torch; print(torch.__version__, torch.version.git_version)' >"$out/torch_build"
du -sh "$out"
