#pragma once
// Whether a core stays idle while an op runs: only then does reading beside the op cost it
// nothing. With one BLAS thread per core (OpenBLAS's default), a GEMM already runs on every
// core, and a read beside it takes a core from the GEMM: the forward gets slower, not faster.
#include <algorithm>
#include <initializer_list>

namespace sentinel {
namespace overlap {

struct CoreUse {
  int cpus = 1;          // CPUs this process may run on (its affinity mask)
  int blas_threads = 0;  // threads of the BLAS LibTorch calls; 0: no BLAS known by name
  int aten_threads = 1;  // ATen's intra-op threads (element-wise ops, reductions, convolutions)
  int processes = 1;     // ranks sharing this machine (torchrun's LOCAL_WORLD_SIZE), each as busy
};

// What the process uses now. Cheap enough for every batch (one system call), not for every op.
CoreUse core_use();

// The first of `names` that the BLAS LibTorch calls exports, or null. LibTorch may have loaded
// its BLAS privately (RTLD_LOCAL, as a Python extension does), so the BLAS libraries already
// loaded are asked by name as well; none is ever loaded.
void* find_blas_function(std::initializer_list<const char*> names);

// A BLAS not known by name is taken to follow ATen's setting (LibTorch sets MKL's threads with
// its own).
inline bool core_left_idle(const CoreUse& u) {
  const int busy = std::max(u.blas_threads > 0 ? u.blas_threads : u.aten_threads, u.aten_threads);
  return u.cpus > static_cast<long>(busy) * std::max(u.processes, 1);
}

}  // namespace overlap
}  // namespace sentinel
