// MpiBackend's communicator and its life: created over the group's ranks in c10d order,
// registered until released (finish_all releases the rest and finalizes MPI), and broken
// for good by the first call that fails or times out. collective() queues a call on the
// worker thread; exchange() runs one of its MPI requests within the call's deadline.
#include "transport/mpi/mpi_backend.h"

#include <set>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "transport/mpi/mpi_argument_checks.h"

namespace gradzip {
namespace {

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::set<MpiBackend*>& registry() {
  static std::set<MpiBackend*> live;
  return live;
}

}  // namespace

MpiBackend::MpiBackend(int rank, int size, const std::vector<int64_t>& global_ranks,
                       std::chrono::milliseconds timeout)
    : Backend(rank, size), timeout_(timeout), worker_(std::make_unique<OrderedWorker>()) {
  mpi::start();
  mpi::call([&] {
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    std::vector<int> ranks(global_ranks.begin(), global_ranks.end());
    if (ranks.empty()) {
      TORCH_CHECK(world_size == size && world_rank == rank, "gradzip mpi: MPI's world has this process as rank ",
                  world_rank, " of ", world_size, ", but the process group says rank ", rank, " of ", size,
                  " (the MPI transport needs the job launched by mpirun, one process per rank)");
      for (int r = 0; r < size; ++r) ranks.push_back(r);
    }
    TORCH_CHECK(static_cast<int>(ranks.size()) == size, "gradzip mpi: the group lists ", ranks.size(),
                " global ranks for ", size, " members");
    for (int r : ranks) check_rank(r, world_size, "the group", "global rank");
    TORCH_CHECK(ranks[rank] == world_rank, "gradzip mpi: the group says this process is global rank ", ranks[rank],
                ", MPI says ", world_rank);
    bool whole_world = size == world_size;
    for (int r = 0; whole_world && r < size; ++r) whole_world = ranks[r] == r;
    if (whole_world) {
      mpi::check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    } else {
      MPI_Group world_group, group;
      mpi::check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
      mpi::check(MPI_Group_incl(world_group, size, ranks.data(), &group), "MPI_Group_incl");
      // The tag tells apart groups created at the same time; the same ranks give the same tag.
      size_t tag = 17;
      for (int r : ranks) tag = tag * 31 + static_cast<size_t>(r);
      mpi::check(MPI_Comm_create_group(MPI_COMM_WORLD, group, static_cast<int>(tag % 32768), &comm_),
                 "MPI_Comm_create_group");
      MPI_Group_free(&group);
      MPI_Group_free(&world_group);
    }
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int* tag_upper_bound = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_upper_bound, &found);
    largest_tag_ = found ? *tag_upper_bound : 32767;  // the least the standard allows
    int comm_rank = -1;
    MPI_Comm_rank(comm_, &comm_rank);
    TORCH_CHECK(comm_rank == rank, "gradzip mpi: the communicator has this process as rank ", comm_rank,
                ", the process group as ", rank);
  });
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(this);
}

MpiBackend::~MpiBackend() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(this);
  }
  release();
}

void MpiBackend::finish_all() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  bool clean = true;
  for (MpiBackend* backend : registry()) {
    backend->release();
    std::lock_guard<std::mutex> broken(backend->broken_mutex_);
    clean = clean && backend->broken_.empty();
  }
  registry().clear();
  mpi::finish(clean);
}

void MpiBackend::release() {
  if (closed_.exchange(true)) return;
  worker_.reset();  // queued collectives run first, each within its timeout
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    stopping_ = true;
  }
  pending_wake_.notify_all();
  if (completer_.joinable()) completer_.join();
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (broken_.empty() && comm_ != MPI_COMM_NULL && mpi::running()) {
    mpi::call([&] { MPI_Comm_free(&comm_); });
  }
}

void MpiBackend::shutdown() { release(); }

void MpiBackend::abort() {
  break_with("the process group was aborted");
  if (worker_) worker_->abort("gradzip mpi: the process group was aborted");
}

void MpiBackend::break_with(const std::string& reason) {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (broken_.empty()) broken_ = reason;
}

void MpiBackend::check_usable(const char* op) const {
  TORCH_CHECK(!closed_, "gradzip mpi: ", op, " refused: the process group was shut down");
  std::lock_guard<std::mutex> lock(broken_mutex_);
  TORCH_CHECK(broken_.empty(), "gradzip mpi: ", op,
              " refused: this communicator is unusable since an earlier call failed: ", broken_);
}

std::chrono::milliseconds MpiBackend::timeout_of(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout_ : requested;
}

c10::intrusive_ptr<c10d::Work> MpiBackend::collective(const char* op, std::vector<at::Tensor> tensors,
                                                      std::chrono::milliseconds timeout, std::function<void()> body) {
  check_usable(op);
  const auto limit = timeout_of(timeout);
  int64_t bytes = 0;  // what the call moves, about: the Backoff's spin
  for (const auto& t : tensors) bytes += static_cast<int64_t>(t.numel()) * t.element_size() * getSize();
  return worker_->submit(std::move(tensors), [this, op, limit, bytes, body = std::move(body)] {
    {
      std::lock_guard<std::mutex> lock(broken_mutex_);
      TORCH_CHECK(broken_.empty(), "gradzip mpi: ", op,
                  " refused: this communicator is unusable since an earlier call failed: ", broken_);
    }
    deadline_ = mpi::Clock::now() + limit;
    call_bytes_ = bytes;
    body();
  });
}

void MpiBackend::exchange(const char* op, const char* call, const Post& post) {
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  mpi::call([&] { mpi::check(post(&requests[0]), call); });
  bool done = false;
  try {
    done = mpi::wait(requests, deadline_, call_bytes_);
  } catch (const std::exception& e) {  // an MPI error: the request may stay posted
    break_with(e.what());
    throw;
  }
  if (!done) {
    const std::string reason = c10::str("gradzip mpi: ", op, " on rank ", getRank(), " of a group of ", getSize(),
                                        " did not finish within its timeout: a rank has stopped or died, or the "
                                        "ranks called different collectives. This communicator refuses every "
                                        "later call.");
    break_with(reason);
    TORCH_CHECK(false, reason);
  }
}

}  // namespace gradzip
