// The exit gate (work/exit_gate.h). close() is for good, so each test closes it in a
// child process (a death test) and reports through its exit code.
#include "work/exit_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace gradzip {
namespace {

using namespace std::chrono_literals;

// Exits 0 when close() waited for a pass held (and nested) on another thread, then
// gave no more; another code names what failed.
[[noreturn]] void close_while_a_pass_is_out() {
  std::atomic<bool> holding{false};
  std::atomic<bool> finished{false};
  std::thread completer([&] {
    const exit_gate::Pass pass = exit_gate::enter();
    if (!pass) std::_Exit(2);
    {
      const exit_gate::Pass nested = exit_gate::enter();  // a callback's own completion
      if (!nested) std::_Exit(3);
    }
    holding = true;
    std::this_thread::sleep_for(300ms);
    finished = true;
  });
  while (!holding) std::this_thread::yield();
  exit_gate::close();
  if (!finished) std::_Exit(4);           // close() returned before the pass came back
  if (exit_gate::enter()) std::_Exit(5);  // a pass after close()
  completer.join();
  std::_Exit(0);
}

// Exits 0 when close() with no pass out returns at once and a later enter() is refused
// without blocking.
[[noreturn]] void enter_after_close() {
  exit_gate::close();
  std::thread late([] {
    const exit_gate::Pass pass = exit_gate::enter();
    if (pass) std::_Exit(2);
    exit_gate::keep(std::make_shared<int>(7));  // held, never freed
  });
  late.join();
  std::_Exit(0);
}

TEST(ExitGateDeathTest, CloseWaitsForThePassesGivenThenGivesNoMore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh: no other test's threads
  EXPECT_EXIT(close_while_a_pass_is_out(), testing::ExitedWithCode(0), "");
}

TEST(ExitGateDeathTest, APassRefusedAfterCloseNeverBlocks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(enter_after_close(), testing::ExitedWithCode(0), "");
}

TEST(ExitGateTest, PassesNestAndComeBack) {
  const exit_gate::Pass outer = exit_gate::enter();
  ASSERT_TRUE(outer);
  const exit_gate::Pass inner = exit_gate::enter();
  EXPECT_TRUE(inner);
}

}  // namespace
}  // namespace gradzip
