// Reads beside ops only while a core is idle: what the process's BLAS and ATen use, as the
// watchdog sees it at each batch.
#include <gtest/gtest.h>

#include <sched.h>

#include <cstdlib>
#include <string>

#include "overlap/spare_core.h"
#include "support/compute_threads.h"

namespace {

using sentinel::overlap::core_left_idle;
using sentinel::overlap::CoreUse;

TEST(SpareCore, ACoreIsIdleOnlyWhileTheBlasAndAtenLeaveOne) {
  EXPECT_TRUE(core_left_idle(CoreUse{2, 1, 1}));
  EXPECT_FALSE(core_left_idle(CoreUse{2, 2, 1}));  // OpenBLAS's default: a thread per core
  EXPECT_FALSE(core_left_idle(CoreUse{2, 1, 2}));  // ATen's element-wise ops on every core
  EXPECT_FALSE(core_left_idle(CoreUse{1, 1, 1}));
  EXPECT_TRUE(core_left_idle(CoreUse{8, 4, 7}));
  EXPECT_FALSE(core_left_idle(CoreUse{8, 8, 1}));
  // A BLAS not known by name follows ATen's setting.
  EXPECT_TRUE(core_left_idle(CoreUse{2, 0, 1}));
  EXPECT_FALSE(core_left_idle(CoreUse{2, 0, 2}));
  // Ranks on one machine: each one's threads count.
  EXPECT_TRUE(core_left_idle(CoreUse{8, 1, 1, 4}));
  EXPECT_FALSE(core_left_idle(CoreUse{8, 1, 1, 8}));
  EXPECT_FALSE(core_left_idle(CoreUse{8, 2, 1, 4}));
}

TEST(SpareCore, ReadsTheThreadsThatTheBlasAndAtenUseNow) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  for (int blas : {1, 2, 3}) {
    for (int aten : {1, 2}) {
      sentinel_test::ScopedComputeThreads threads(blas, aten);
      ASSERT_TRUE(threads.blas_found());
      const CoreUse u = sentinel::overlap::core_use();
      if (threads.blas_by_name()) {
        EXPECT_EQ(u.blas_threads, blas);
        EXPECT_EQ(u.aten_threads, aten);
      } else {  // ATen's own MKL (PyPI's LibTorch): set through ATen's threads, whose count its
                // getter (where one is exported) reads back
        EXPECT_EQ(u.aten_threads, std::max(blas, aten));
        EXPECT_TRUE(u.blas_threads == 0 || u.blas_threads == u.aten_threads) << u.blas_threads;
      }
      EXPECT_EQ(u.cpus, CPU_COUNT(&set));
    }
  }
}

TEST(SpareCore, RanksOnOneMachineShareItsCores) {
  const char* before = std::getenv("LOCAL_WORLD_SIZE");
  const std::string saved = before ? before : "";
  setenv("LOCAL_WORLD_SIZE", "3", 1);
  EXPECT_EQ(sentinel::overlap::core_use().processes, 3);
  unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(sentinel::overlap::core_use().processes, 1);
  if (before) setenv("LOCAL_WORLD_SIZE", saved.c_str(), 1);
}

}  // namespace
