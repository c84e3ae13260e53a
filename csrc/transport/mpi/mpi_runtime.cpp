#include "transport/mpi/mpi_runtime.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include <c10/util/Exception.h>

namespace gradzip::mpi {
namespace {

std::recursive_mutex& lock() {
  static std::recursive_mutex mutex;
  return mutex;
}

struct State {
  bool started = false;
  bool initialized_here = false;  // we called MPI_Init_thread, so we finalize
  bool finished = false;
  std::map<size_t, MPI_Datatype> element_types;
};

State& state() {
  static State s;
  return s;
}

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

}  // namespace

void start() {
  std::lock_guard<std::recursive_mutex> guard(lock());
  State& s = state();
  if (s.started) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  TORCH_CHECK(!finalized, "gradzip mpi: MPI was finalized already; it cannot be started again in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    s.initialized_here = true;
  }
  TORCH_CHECK(provided >= MPI_THREAD_SERIALIZED, "gradzip mpi: MPI offers ", level_name(provided),
              "; gradzip's communicators call MPI from their own threads and need at least "
              "MPI_THREAD_SERIALIZED (with mpi4py: set mpi4py.rc.thread_level = 'multiple' before importing MPI)");
  // Errors come back as codes that check() turns into exceptions, instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  s.started = true;
}

void finish(bool clean) {
  std::lock_guard<std::recursive_mutex> guard(lock());
  State& s = state();
  if (!s.started || s.finished) return;
  s.finished = true;
  for (auto& [bytes, type] : s.element_types) MPI_Type_free(&type);
  s.element_types.clear();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (s.initialized_here && clean && !finalized) MPI_Finalize();
}

bool running() {
  std::lock_guard<std::recursive_mutex> guard(lock());
  return state().started && !state().finished;
}

void call(const std::function<void()>& body) {
  std::lock_guard<std::recursive_mutex> guard(lock());
  TORCH_CHECK(state().started && !state().finished, "gradzip mpi: MPI is not running in this process (",
              state().finished ? "it was finalized at exit" : "no MPI communicator was created", ")");
  body();
}

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, message, &length);
  TORCH_CHECK(false, "gradzip mpi: ", what, " failed: ", std::string(message, length));
}

MPI_Datatype element_type(size_t bytes) {
  std::lock_guard<std::recursive_mutex> guard(lock());
  auto& types = state().element_types;
  auto found = types.find(bytes);
  if (found != types.end()) return found->second;
  MPI_Datatype type;
  check(MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &type), "MPI_Type_contiguous");
  check(MPI_Type_commit(&type), "MPI_Type_commit");
  types.emplace(bytes, type);
  return type;
}

Backoff::Backoff(int64_t bytes) { restart(bytes); }

void Backoff::restart(int64_t bytes) {
  start_ = Clock::now();
  spin_ = kSpin + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(static_cast<double>(std::max<int64_t>(bytes, 0)) / kSlowestRate));
}

Clock::duration Backoff::pause_at(Clock::time_point now) const {
  const auto waited = now - start_;
  if (waited < spin_) return Clock::duration::zero();
  return std::min<Clock::duration>(waited / 10, kLongestPause);
}

void Backoff::pause(Clock::time_point until) const {
  const auto now = Clock::now();
  const auto pause = std::min<Clock::duration>(pause_at(now), until - now);
  if (pause <= Clock::duration::zero()) {
    std::this_thread::yield();  // lets the ranks' other threads run on an oversubscribed machine
  } else {
    std::this_thread::sleep_for(pause);
  }
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, length);
}

bool wait(std::vector<MPI_Request>& requests, Clock::time_point deadline, int64_t bytes) {
  const Backoff backoff(bytes);
  while (true) {
    int done = 0;
    call([&] {
      check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
            "MPI_Testall");
    });
    if (done) return true;
    if (Clock::now() >= deadline) return false;
    backoff.pause(deadline);
  }
}

}  // namespace gradzip::mpi
