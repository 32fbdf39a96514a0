# Installs the built project into a private prefix, then configures, builds and runs a separate
# project that finds it with find_package(Sentinel) and links sentinel::sentinel.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}")
  endif()
endfunction()
run_step(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
# Torch's own prefix (Torch_DIR is <prefix>/share/cmake/Torch) is searched before the system's
# paths: TorchConfig looks for its libraries by name, and a LibTorch installed in /usr/lib (another
# version) would otherwise be linked beside these headers.
get_filename_component(torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
run_step(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build"
         "-DCMAKE_PREFIX_PATH=${prefix}\;${torch_prefix}" -DTorch_DIR=${Torch_DIR} -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build" -j 2)
run_step("${WORK_DIR}/build/consumer")
