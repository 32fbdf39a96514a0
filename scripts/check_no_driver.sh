#!/usr/bin/env bash
# Fails if any binary built in BUILD_DIR names the CUDA driver library (libcuda.so.1) among the
# libraries it needs: such a binary cannot even start on a machine without a GPU driver, where
# its CUDA tests must run and report themselves skipped (docs/platform.md, "CUDA").
#   scripts/check_no_driver.sh BUILD_DIR
set -euo pipefail
build_dir=${1:?usage: check_no_driver.sh BUILD_DIR}
checked=0
bad=()
while IFS= read -r -d '' f; do
  head -c 4 "$f" 2>/dev/null | grep -q $'\x7fELF' || continue
  checked=$((checked + 1))
  if readelf -d "$f" 2>/dev/null | grep -q 'NEEDED.*\[libcuda\.so'; then bad+=("$f"); fi
done < <(find "$build_dir" -type f \( -perm -u+x -o -name '*.so' \) -not -path '*/CMakeFiles/*' -print0)
if [ ${#bad[@]} -gt 0 ]; then
  printf 'links the CUDA driver library: %s\n' "${bad[@]}"
  exit 1
fi
[ "$checked" -gt 0 ] || { echo "no binaries found in $build_dir"; exit 1; }
echo "check_no_driver: $checked binaries, none links libcuda"
