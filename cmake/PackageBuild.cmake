# The pip package's build (pyproject.toml, scikit-build-core sets SKBUILD), included first thing in
# configure: it builds against the torch of the Python that runs pip, with CUDA when that torch has
# it, and says in one message everything that is missing before anything is compiled.
# (python/package_build/torch_requirement.py has already checked that torch and its version.)

execute_process(
  COMMAND "${Python_EXECUTABLE}" -c "import torch; print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE torch_facts RESULT_VARIABLE torch_failed ERROR_VARIABLE torch_error
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(torch_failed)
  message(FATAL_ERROR "overflow-sentinel: ${Python_EXECUTABLE} cannot import torch:\n${torch_error}")
endif()
string(REPLACE "\n" ";" torch_facts "${torch_facts}")
list(GET torch_facts 0 torch_cmake_prefix)
list(LENGTH torch_facts torch_fact_count)
set(torch_cuda "")
if(torch_fact_count GREATER 1)
  list(GET torch_facts 1 torch_cuda)
endif()

# The build directory is kept between builds (pyproject.toml's build-dir): what it remembers of
# an earlier build's Python and torch is replaced by this one's. A torch elsewhere (another
# environment of the same Python) makes it forget every path it cached into the old one, so that
# LibTorch's package finds its libraries again, in the new one.
get_filename_component(torch_root "${torch_cmake_prefix}/../.." ABSOLUTE)
if(DEFINED CACHE{SENTINEL_PACKAGE_TORCH_ROOT} AND NOT SENTINEL_PACKAGE_TORCH_ROOT STREQUAL torch_root)
  get_cmake_property(cached CACHE_VARIABLES)
  set(forgotten 0)
  foreach(name IN LISTS cached)
    get_property(value CACHE ${name} PROPERTY VALUE)
    string(FIND "${value}" "${SENTINEL_PACKAGE_TORCH_ROOT}/" at)
    if(NOT at EQUAL -1)
      unset(${name} CACHE)
      math(EXPR forgotten "${forgotten} + 1")
    endif()
  endforeach()
  message(STATUS "Sentinel: torch is now ${torch_root}, not ${SENTINEL_PACKAGE_TORCH_ROOT}: "
    "${forgotten} cached paths into the old one forgotten")
endif()
set(SENTINEL_PACKAGE_TORCH_ROOT "${torch_root}" CACHE INTERNAL "The torch this build directory is configured for")
set(Torch_DIR "${torch_cmake_prefix}/Torch" CACHE PATH "LibTorch's CMake package" FORCE)
set(SENTINEL_FIXTURE_PYTHON "${Python_EXECUTABLE}" CACHE FILEPATH "The Python that builds the package" FORCE)
set(SENTINEL_PYTHON "${Python_EXECUTABLE}" CACHE FILEPATH "The Python whose torch the module is built for" FORCE)

set(missing "")
set(flags "")
# A package not found adds what to install to `missing`.
macro(sentinel_package_needs what package)
  find_package(${package} ${ARGN} QUIET)
  if(NOT ${package}_FOUND)
    list(APPEND missing "${what}")
  endif()
endmacro()
sentinel_package_needs("Boost.Stacktrace 1.74 or newer (Debian, Ubuntu: libboost-stacktrace-dev)" Boost 1.74
                       COMPONENTS stacktrace_backtrace)
sentinel_package_needs("fmt (Debian, Ubuntu: libfmt-dev)" fmt)
sentinel_package_needs("yaml-cpp (Debian, Ubuntu: libyaml-cpp-dev)" yaml-cpp)
sentinel_package_needs("CLI11 (Debian, Ubuntu: libcli11-dev)" CLI11)
sentinel_package_needs("nlohmann_json (Debian, Ubuntu: nlohmann-json3-dev)" nlohmann_json)
# Not find_package(Protobuf): the imported target it makes would replace the stand-in LibTorch's
# package defines under that name, and change what the targets that link torch compile with.
find_program(SENTINEL_PACKAGE_PROTOC protoc)
find_path(SENTINEL_PACKAGE_PROTOBUF_HEADERS google/protobuf/message.h)
if(NOT SENTINEL_PACKAGE_PROTOC OR NOT SENTINEL_PACKAGE_PROTOBUF_HEADERS)
  list(APPEND missing "Protocol Buffers' library and compiler, for TensorBoard files (Debian, Ubuntu: libprotobuf-dev protobuf-compiler)")
endif()
execute_process(COMMAND "${Python_EXECUTABLE}" -c "import sysconfig; print(sysconfig.get_paths()['include'])"
  OUTPUT_VARIABLE python_include OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT EXISTS "${python_include}/Python.h")
  list(APPEND missing "Python's headers, Python.h in ${python_include} (Debian, Ubuntu: python3-dev)")
endif()

# CUDA where the torch has it (its CUDA tensors are then read on the GPU): pyproject.toml passes
# TORCH, which is resolved here at every configure; -C cmake.define.SENTINEL_ENABLE_CUDA=OFF (or ON)
# on pip's command line chooses instead.
if(SENTINEL_ENABLE_CUDA STREQUAL "TORCH")
  if(torch_cuda)
    set(SENTINEL_ENABLE_CUDA ON CACHE STRING "" FORCE)
  else()
    set(SENTINEL_ENABLE_CUDA OFF CACHE STRING "" FORCE)
  endif()
endif()
if(SENTINEL_ENABLE_CUDA STREQUAL "ON")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    list(APPEND missing "a CUDA toolkit (nvcc) for torch's CUDA ${torch_cuda} (or CUDACXX naming its nvcc)")
    set(flags "\n  Or build without the CUDA kernels (then CUDA tensors are not read, and their frames say so):\n"
      "    pip install --no-build-isolation --config-settings=cmake.define.SENTINEL_ENABLE_CUDA=OFF ...")
  endif()
endif()

# One message, its lines indented so that CMake prints them as they are (a flag stays whole).
if(missing)
  list(JOIN missing "\n    - " missing_lines)
  string(JOIN "" flags_line ${flags})
  message(FATAL_ERROR "overflow-sentinel needs what this machine lacks; nothing was compiled.\n"
    "  Missing:\n    - ${missing_lines}\n"
    "  Install them (Debian 12's package names above; scripts/setup.sh installs all of them), then run\n"
    "  pip install again.${flags_line}")
endif()
