# Sourced by the build scripts: compiles through ccache when it is installed, with one cache per
# machine outside the checkout (beside the Python environment), so that a fresh clone (CI's) or a
# rebuilt directory compiles only what changed. Paths are taken relative to the checkout, so two
# clones in different folders share the cache. SENTINEL_CCACHE=0 compiles without it.
sentinel_launcher=()
if [ "${SENTINEL_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  export CCACHE_DIR=${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/overflow-sentinel/ccache}
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  # An object with debug information would otherwise be keyed by its build directory too; shared,
  # its debug information names the directory of the clone that compiled it first.
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  # The tests' precompiled header (torch.h) is used through -include: these make it cacheable.
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  sentinel_launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
