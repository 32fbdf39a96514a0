#pragma once
// Waits for a child made by fork(), whose exit status is its verdict (gtest assertions do not
// reach the parent from there).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

namespace sentinel_test {

// Fails if the child hangs, is ended by a signal or exits with a status other than 0. The wait is
// a guard against a hang, not a timing: the children of the tests finish well under a second.
inline void expect_child_exits_with_zero(pid_t pid, const char* what_nonzero_means) {
  int status = 0;
  pid_t done = 0;
  for (int waited_ms = 0; (done = waitpid(pid, &status, WNOHANG)) == 0 && waited_ms < 120000; waited_ms += 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the forked child hung";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the forked child was ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << what_nonzero_means;
}

}  // namespace sentinel_test
