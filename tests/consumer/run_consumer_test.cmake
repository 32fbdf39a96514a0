# Installs the built project into a temporary prefix outside the checkout and uses it from there,
# as a user does: the installed `sentinel` starts in an empty environment (env -i) and its run
# paths name the libraries it linked (LibTorch's, the CUDA runtime's), nothing in the source or
# build tree; then a separate project finds the package with find_package(Sentinel), links
# sentinel::sentinel, and its program runs the same way.
string(RANDOM LENGTH 8 tag)
set(tmp_root "$ENV{TMPDIR}")
if(NOT tmp_root)
  set(tmp_root /tmp)
endif()
set(work "${tmp_root}/sentinel-install-${tag}")
set(prefix "${work}/prefix")
file(MAKE_DIRECTORY "${work}")
function(run_step)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${work}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN} (files left in ${work})")
  endif()
endfunction()
# A binary of the prefix: every library found with nothing set in the environment, and no run path
# into this checkout.
function(check_binary binary)
  execute_process(COMMAND env -i ldd "${binary}" OUTPUT_VARIABLE libraries RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR libraries MATCHES "not found")
    message(FATAL_ERROR "${binary}: ldd in an empty environment (${rc}):\n${libraries}")
  endif()
  execute_process(COMMAND readelf -d "${binary}" OUTPUT_VARIABLE dynamic)
  string(REGEX MATCH "(RPATH|RUNPATH)[^\n]*" run_path "${dynamic}")
  foreach(tree IN ITEMS "${SOURCE_DIR}" "${BUILD_DIR}")
    string(FIND "${run_path}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "${binary}: its run path names ${tree}: ${run_path}")
    endif()
  endforeach()
  message(STATUS "${binary}: ${run_path}")
endfunction()

run_step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")

if(WITH_CLI)
  set(sentinel "${prefix}/bin/sentinel")
  check_binary("${sentinel}")
  execute_process(COMMAND env -i "${sentinel}" --version WORKING_DIRECTORY "${work}"
    OUTPUT_VARIABLE version ERROR_VARIABLE error RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT version STREQUAL "${VERSION}")
    message(FATAL_ERROR "env -i ${sentinel} --version: exit ${rc}, '${version}' (expected ${VERSION}) ${error}")
  endif()
  execute_process(COMMAND env -i "${sentinel}" demo WORKING_DIRECTORY "${work}"
    OUTPUT_VARIABLE demo ERROR_VARIABLE demo RESULT_VARIABLE rc)
  if(NOT rc EQUAL 3 OR NOT demo MATCHES "Detected inf/nan during batch_number=3")
    message(FATAL_ERROR "env -i ${sentinel} demo: exit ${rc} (expected 3, the inf/nan of batch 3):\n${demo}")
  endif()
  message(STATUS "installed sentinel ${version} starts from ${prefix} and stops the demo at batch 3")
endif()

# Torch's own prefix (Torch_DIR is <prefix>/share/cmake/Torch) is searched before the system's
# paths: TorchConfig looks for its libraries by name, and a LibTorch installed in /usr/lib (another
# version) would otherwise be linked beside these headers.
get_filename_component(torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
run_step(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${work}/build"
         "-DCMAKE_PREFIX_PATH=${prefix}\;${torch_prefix}" -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build "${work}/build" -j 2)
check_binary("${work}/build/consumer")
run_step(env -i "${work}/build/consumer")
file(REMOVE_RECURSE "${work}")
