#include "c10d/shared_check_board.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

namespace gradzip {

// The object: a header, then size pids, size posted-check counts, size closed flags, and
// two sets of slots (by the check's parity) of size × width int64. The atomics are
// lock-free 32- and 64-bit words, valid between processes.
struct SharedCheckBoard::Layout {
  uint64_t token;                    // rank 0's random number: the ranks mapped one object
  std::atomic<uint32_t> arrived;     // ranks at the barrier of the current check
  std::atomic<uint32_t> generation;  // checks completed (mod 2^32); the futex word

  static size_t bytes(int size, int width) {
    return sizeof(Layout) + sizeof(int64_t) * static_cast<size_t>(3 * size + 2 * size * width);
  }
  int64_t* words() { return reinterpret_cast<int64_t*>(reinterpret_cast<char*>(this) + sizeof(Layout)); }
  int64_t* pid(int rank) { return words() + rank; }
  std::atomic<int64_t>* posted(int size, int rank) { return reinterpret_cast<std::atomic<int64_t>*>(words() + size + rank); }
  std::atomic<int64_t>* closed(int size, int rank) { return reinterpret_cast<std::atomic<int64_t>*>(words() + 2 * size + rank); }
  int64_t* slot(int size, int width, uint64_t check, int rank) {
    return words() + 3 * size + static_cast<ptrdiff_t>((check % 2) * static_cast<uint64_t>(size) + rank) * width;
  }
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free);

namespace {

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

bool process_exists(int64_t pid) { return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// The minimum over the transport's ranks of `value` (an int64 all-reduce).
int64_t agreed_minimum(int64_t value, const c10::intrusive_ptr<c10d::Backend>& transport) {
  std::vector<at::Tensor> t = {at::full({1}, value, at::kLong)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MIN;
  transport->allreduce(t, opts)->wait();
  return t[0].item<int64_t>();
}

}  // namespace

std::unique_ptr<SharedCheckBoard> SharedCheckBoard::open(const std::string& name, int width,
                                                         const c10::intrusive_ptr<c10d::Backend>& transport) {
  const int rank = transport->getRank(), size = transport->getSize();
  const size_t bytes = Layout::bytes(size, width);
  // Rank 0 makes and fills the object; the token travels by the transport for the others
  // to compare with what they mapped.
  int fd = -1;
  void* base = MAP_FAILED;
  uint64_t token = 0;
  if (rank == 0) {
    token = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (base != MAP_FAILED) static_cast<Layout*>(base)->token = token;
    }
  }
  std::vector<at::Tensor> shared = {at::full({1}, static_cast<int64_t>(token), at::kLong)};
  transport->broadcast(shared)->wait();
  token = static_cast<uint64_t>(shared[0].item<int64_t>());
  if (rank != 0) {
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    struct stat st{};
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == static_cast<off_t>(bytes)) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
  }
  auto* layout = static_cast<Layout*>(base);
  bool mine_ok = base != MAP_FAILED && layout->token == token;
  if (mine_ok) *layout->pid(rank) = static_cast<int64_t>(getpid());
  // Every rank mapped the same object: then every rank checks it sees every process.
  const bool mapped = agreed_minimum(mine_ok ? 1 : 0, transport) == 1;
  bool sees = mapped;
  for (int r = 0; sees && r < size; ++r) sees = process_exists(*layout->pid(r));
  const bool usable = mapped && agreed_minimum(sees ? 1 : 0, transport) == 1;
  if (fd >= 0) close(fd);
  if (rank == 0 && fd >= 0) shm_unlink(name.c_str());
  if (!usable) {
    if (base != MAP_FAILED) munmap(base, bytes);
    return nullptr;
  }
  return std::unique_ptr<SharedCheckBoard>(new SharedCheckBoard(base, bytes, rank, size, width));
}

SharedCheckBoard::SharedCheckBoard(void* base, size_t bytes, int rank, int size, int width)
    : base_(base), bytes_(bytes), rank_(rank), size_(size), width_(width) {}

SharedCheckBoard::~SharedCheckBoard() {
  stop();
  munmap(base_, bytes_);
}

void SharedCheckBoard::stop() {
  stopped_.store(true);
  auto* layout = static_cast<Layout*>(base_);
  layout->closed(size_, rank_)->store(1, std::memory_order_release);
  futex(&layout->generation, FUTEX_WAKE, INT32_MAX, nullptr);  // the waiters look again now
}

std::vector<int64_t> SharedCheckBoard::exchange(const int64_t* mine, std::chrono::milliseconds timeout) {
  if (stopped_.load()) throw std::runtime_error("the process group was aborted");
  auto* layout = static_cast<Layout*>(base_);
  const uint64_t check = checks_++;
  std::memcpy(layout->slot(size_, width_, check, rank_), mine, sizeof(int64_t) * static_cast<size_t>(width_));
  layout->posted(size_, rank_)->store(static_cast<int64_t>(check + 1), std::memory_order_release);
  const uint32_t generation = layout->generation.load(std::memory_order_acquire);
  if (layout->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    layout->arrived.store(0, std::memory_order_relaxed);
    layout->generation.fetch_add(1, std::memory_order_release);
    futex(&layout->generation, FUTEX_WAKE, INT32_MAX, nullptr);
  } else {
    const auto start = std::chrono::steady_clock::now();
    const timespec slice{0, 50'000'000};
    while (layout->generation.load(std::memory_order_acquire) == generation) {
      futex(&layout->generation, FUTEX_WAIT, generation, &slice);
      if (layout->generation.load(std::memory_order_acquire) != generation) break;
      if (stopped_.load()) throw std::runtime_error("the process group was aborted while this rank waited for the others");
      std::vector<int> missing, closed, exited;
      for (int r = 0; r < size_; ++r) {
        if (layout->posted(size_, r)->load(std::memory_order_acquire) > static_cast<int64_t>(check)) continue;
        missing.push_back(r);
        if (!process_exists(*layout->pid(r))) {
          exited.push_back(r);
        } else if (layout->closed(size_, r)->load(std::memory_order_acquire) != 0) {
          closed.push_back(r);
        }
      }
      const bool late = std::chrono::steady_clock::now() - start > timeout;
      if (exited.empty() && closed.empty() && !late) continue;
      auto named = [](std::ostringstream& why, const std::vector<int>& ranks) {
        for (size_t i = 0; i < ranks.size(); ++i) why << (i ? ", " : " ") << ranks[i];
      };
      std::ostringstream why;
      if (!exited.empty()) {
        why << "the process of rank";
        named(why, exited);
        why << " exited before it reached this collective";
      } else if (!closed.empty()) {
        why << "rank";
        named(why, closed);
        why << " shut down or aborted its process group before it reached this collective";
      } else {
        why << "no word from rank";
        named(why, missing);
        why << " within the group's timeout of " << timeout.count() << " ms";
      }
      throw std::runtime_error(why.str());
    }
  }
  std::vector<int64_t> all(static_cast<size_t>(size_ * width_));
  for (int r = 0; r < size_; ++r) {
    std::memcpy(all.data() + static_cast<ptrdiff_t>(r) * width_, layout->slot(size_, width_, check, r),
                sizeof(int64_t) * static_cast<size_t>(width_));
  }
  return all;
}

}  // namespace gradzip
