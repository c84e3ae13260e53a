#include "work/exit_gate.h"

#include <condition_variable>
#include <mutex>
#include <vector>

namespace gradzip::exit_gate {
namespace {

struct Gate {
  std::mutex mutex;
  std::condition_variable returned;
  int passes = 0;
  bool closed = false;
  std::vector<std::shared_ptr<void>> kept;
};

// Never destroyed: threads may still use it while static destructors run.
Gate& gate() {
  static Gate* const instance = new Gate();
  return *instance;
}

}  // namespace

Pass::~Pass() {
  if (!given_) return;
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (--g.passes == 0) g.returned.notify_all();
}

Pass enter() {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.closed) return Pass(false);
  ++g.passes;
  return Pass(true);
}

void close() {
  Gate& g = gate();
  std::unique_lock<std::mutex> lock(g.mutex);
  g.closed = true;
  g.returned.wait_for(lock, kExitWait, [&] { return g.passes == 0; });
}

void keep(std::shared_ptr<void> what) {
  Gate& g = gate();
  std::lock_guard<std::mutex> lock(g.mutex);
  g.kept.push_back(std::move(what));
}

}  // namespace gradzip::exit_gate
