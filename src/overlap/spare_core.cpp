#include "overlap/spare_core.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace sentinel {
namespace overlap {

void* find_blas_function(std::initializer_list<const char*> names) {
  static const char* const kLibraries[] = {"libblas.so.3", "libopenblas.so.0", "libopenblasp.so.0",
                                           "libmkl_rt.so.2", "libmkl_rt.so", "libblis.so.4"};
  for (const char* name : names) {
    if (void* f = dlsym(RTLD_DEFAULT, name)) return f;
  }
  for (const char* library : kLibraries) {
    void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);  // never loads one: only those in use
    if (!handle) continue;
    for (const char* name : names) {
      if (void* f = dlsym(handle, name)) return f;  // the handle is kept: f stays valid
    }
    dlclose(handle);
  }
  return nullptr;
}

CoreUse core_use() {
  using ThreadCount = int (*)();
  static const auto blas_threads = reinterpret_cast<ThreadCount>(
      find_blas_function({"openblas_get_num_threads", "mkl_get_max_threads", "bli_thread_get_num_threads"}));
  CoreUse u;
  cpu_set_t set;
  CPU_ZERO(&set);
  u.cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  u.blas_threads = blas_threads ? blas_threads() : 0;
  u.aten_threads = at::get_num_threads();
  // Ranks started on one machine share its cores; unpinned, each one's affinity is all of them.
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) u.processes = std::max(1, std::atoi(local));
  return u;
}

}  // namespace overlap
}  // namespace sentinel
