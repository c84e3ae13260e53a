#include "transport/mpi/mpi_backend.h"

#include <climits>
#include <set>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "work/exit_gate.h"
#include "work/future_work.h"
#include "transport/split_sizes.h"

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

int count_of(int64_t n, const char* op) {
  TORCH_CHECK(n <= INT_MAX, "gradzip mpi: ", op, " moves ", n,
              " elements in one message; MPI counts are ints, so at most 2^31 - 1");
  return static_cast<int>(n);
}

void check_tensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), "gradzip mpi: ", op, " got an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "gradzip mpi: ", op, " takes CPU tensors, got one on ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "gradzip mpi: ", op, " takes dense tensors, got a ", t.layout(),
              " one");
}

void check_one(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "gradzip mpi: ", op, " takes one tensor per call, got ", tensors.size());
  check_tensor(tensors[0], op);
}

void check_same(const at::Tensor& t, const at::Tensor& like, int64_t numel, const char* op, const char* what) {
  check_tensor(t, op);
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "gradzip mpi: ", op, "'s ", what, " is ", t.scalar_type(),
              ", the input ", like.scalar_type());
  TORCH_CHECK(t.numel() == numel, "gradzip mpi: ", op, "'s ", what, " has ", t.numel(), " elements, expected ",
              numel);
}

void check_rank(int rank, int size, const char* op, const char* what) {
  TORCH_CHECK(rank >= 0 && rank < size, "gradzip mpi: ", op, "'s ", what, " ", rank,
              " is not a rank of this group of ", size);
}

void check_reduce(c10d::ReduceOp reduce, at::ScalarType dtype, const char* op) {
  using R = c10d::ReduceOp::RedOpType;
  switch (reduce.op_) {
    case R::SUM:
    case R::PRODUCT:
      return;
    case R::AVG:
      TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "gradzip mpi: ", op,
                  " averages floating-point tensors only (as Gloo does), not ", dtype);
      return;
    case R::MIN:
    case R::MAX:
      TORCH_CHECK(!at::isComplexType(dtype), "gradzip mpi: ", op, " has no MIN or MAX of complex tensors");
      return;
    case R::BAND:
    case R::BOR:
    case R::BXOR:
      TORCH_CHECK(at::isIntegralType(dtype, /*includeBool=*/true), "gradzip mpi: ", op,
                  " applies bitwise reductions to integer and bool tensors, not ", dtype);
      return;
    default:
      TORCH_CHECK(false, "gradzip mpi: ", op, " does not support this reduce op (PREMUL_SUM), as Gloo does not");
  }
}

// A contiguous tensor with `t`'s values: `t` itself when it is contiguous.
at::Tensor staged(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
// Copies `staging` back into `t` when it stood in for it.
void unstage(const at::Tensor& staging, const at::Tensor& t) {
  if (!staging.is_same(t)) t.copy_(staging.view(t.sizes()));
}
// All of `tensors`, flattened, one after another.
at::Tensor flat_cat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}
// Copies consecutive pieces of `flat` into `tensors`.
void flat_split(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

// The root's list of `size` tensors like `like` (gather's outputs, scatter's inputs);
// the other ranks pass none.
std::vector<at::Tensor> root_list(const std::vector<std::vector<at::Tensor>>& lists, bool is_root, int size,
                                  const at::Tensor& like, const char* op, const char* what) {
  if (!is_root) {
    TORCH_CHECK(lists.empty() || lists[0].empty(), "gradzip mpi: ", op, " takes ", what, "s on the root only");
    return {};
  }
  TORCH_CHECK(lists.size() == 1 && static_cast<int>(lists[0].size()) == size, "gradzip mpi: ", op,
              "'s root needs one ", what, " list of ", size, " tensors");
  for (const auto& t : lists[0]) check_same(t, like, like.numel(), op, what);
  return lists[0];
}

MPI_Datatype type_of(const at::Tensor& t) { return mpi::element_type(t.element_size()); }

std::vector<int> offsets_of(const std::vector<int>& counts, const char* op) {
  std::vector<int> offsets(counts.size());
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = count_of(at, op);
    at += counts[i];
  }
  count_of(at, op);
  return offsets;
}

std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* op) {
  std::vector<int> out;
  for (auto c : counts) out.push_back(count_of(c, op));
  return out;
}

}  // namespace

struct MpiBackend::PendingPointToPoint {
  MPI_Request request = MPI_REQUEST_NULL;
  at::Tensor target;   // the caller's tensor
  at::Tensor staging;  // contiguous; `target` itself when it is contiguous
  bool receive = false;
  int peer = 0;
  mpi::Clock::time_point deadline;
  std::string what;  // "send to rank 1 (tag 0) on rank 0 of 2"
  std::shared_ptr<std::atomic<int>> source = std::make_shared<std::atomic<int>>(-1);
  c10::intrusive_ptr<c10::ivalue::Future> future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
};

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

at::Tensor MpiBackend::scratch(int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  if (!scratch_.defined() || scratch_.numel() < bytes) scratch_ = at::empty({bytes}, at::kByte);
  return scratch_.narrow(0, 0, bytes).view(c10::typeMetaToScalarType(options.dtype()));
}

void MpiBackend::reduce_rows(const at::Tensor& pieces, const at::Tensor& out, c10d::ReduceOp reduce) const {
  using R = c10d::ReduceOp::RedOpType;
  at::Tensor result = out;  // the _out functions take a non-const reference
  out.copy_(pieces[0]);
  for (int64_t r = 1; r < pieces.size(0); ++r) {
    const at::Tensor piece = pieces[r];
    switch (reduce.op_) {
      case R::SUM:
      case R::AVG: out.add_(piece); break;
      case R::PRODUCT: out.mul_(piece); break;
      case R::MIN: at::minimum_out(result, out, piece); break;
      case R::MAX: at::maximum_out(result, out, piece); break;
      case R::BAND: out.bitwise_and_(piece); break;
      case R::BOR: out.bitwise_or_(piece); break;
      case R::BXOR: out.bitwise_xor_(piece); break;
      default: TORCH_CHECK(false, "gradzip mpi: unsupported reduce op");
    }
  }
  if (reduce.op_ == R::AVG) out.div_(pieces.size(0));
}

std::pair<std::vector<int>, std::vector<int>> MpiBackend::reduce_own_chunk(const char* op, const at::Tensor& flat,
                                                                           c10d::ReduceOp reduce) {
  const int size = getSize(), rank = getRank();
  const int64_t n = flat.numel();
  count_of(n, op);
  std::vector<int> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = static_cast<int>(n / size + (r < n % size ? 1 : 0));
  std::vector<int> offsets = offsets_of(counts, op);
  const int mine = counts[rank];
  const at::Tensor pieces = scratch(int64_t{size} * mine, flat.options()).view({size, mine});
  std::vector<int> piece_counts(size, mine), piece_offsets(size);
  for (int r = 0; r < size; ++r) piece_offsets[r] = r * mine;
  const MPI_Datatype type = type_of(flat);
  exchange(op, "MPI_Ialltoallv", [&](MPI_Request* request) {
    return MPI_Ialltoallv(flat.data_ptr(), counts.data(), offsets.data(), type, pieces.data_ptr(),
                          piece_counts.data(), piece_offsets.data(), type, comm_, request);
  });
  reduce_rows(pieces, flat.narrow(0, offsets[rank], mine), reduce);
  return {counts, offsets};
}

void MpiBackend::allreduce_flat(const char* op, const at::Tensor& flat, c10d::ReduceOp reduce) {
  auto [counts, offsets] = reduce_own_chunk(op, flat, reduce);
  const MPI_Datatype type = type_of(flat);
  exchange(op, "MPI_Iallgatherv", [&](MPI_Request* request) {
    return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, flat.data_ptr(), counts.data(), offsets.data(),
                           type, comm_, request);
  });
}

void MpiBackend::reduce_scatter_flat(const char* op, const at::Tensor& send, const at::Tensor& receive,
                                     c10d::ReduceOp reduce) {
  const int m = static_cast<int>(receive.numel());
  const at::Tensor pieces = scratch(int64_t{getSize()} * m, receive.options()).view({getSize(), m});
  exchange(op, "MPI_Ialltoall", [&](MPI_Request* request) {
    return MPI_Ialltoall(send.data_ptr(), m, type_of(send), pieces.data_ptr(), m, type_of(send), comm_, request);
  });
  reduce_rows(pieces, receive.view({-1}), reduce);
}

void MpiBackend::allgather_flat(const char* op, const at::Tensor& send, const at::Tensor& receive) {
  const int n = static_cast<int>(send.numel());
  exchange(op, "MPI_Iallgather", [&](MPI_Request* request) {
    return MPI_Iallgather(send.data_ptr(), n, type_of(send), receive.data_ptr(), n, type_of(send), comm_, request);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  check_rank(static_cast<int>(opts.rootRank), getSize(), "broadcast", "root");
  count_of(tensors[0].numel(), "broadcast");
  const at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  return collective("broadcast", tensors, opts.timeout, [this, t, root] {
    const at::Tensor flat = staged(t);
    exchange("broadcast", "MPI_Ibcast", [&](MPI_Request* request) {
      return MPI_Ibcast(flat.data_ptr(), static_cast<int>(flat.numel()), type_of(flat), root, comm_, request);
    });
    unstage(flat, t);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  check_one(tensors, "all_reduce");
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "all_reduce");
  const at::Tensor t = tensors[0];
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("all_reduce", tensors, opts.timeout, [this, t, reduce] {
    const at::Tensor flat = staged(t);
    allreduce_flat("all_reduce", flat.view({-1}), reduce);
    unstage(flat, t);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "gradzip mpi: all_reduce_coalesced got no tensors");
  for (const auto& t : tensors) {
    check_tensor(t, "all_reduce_coalesced");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "gradzip mpi: all_reduce_coalesced takes tensors of one dtype, got ", tensors[0].scalar_type(),
                " and ", t.scalar_type());
  }
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "all_reduce_coalesced");
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("all_reduce_coalesced", tensors, opts.timeout, [this, tensors, reduce] {
    const at::Tensor flat = flat_cat(tensors);
    allreduce_flat("all_reduce_coalesced", flat, reduce);
    flat_split(flat, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  check_rank(static_cast<int>(opts.rootRank), getSize(), "reduce", "root");
  check_reduce(opts.reduceOp, tensors[0].scalar_type(), "reduce");
  const at::Tensor t = tensors[0];
  const c10d::ReduceOp reduce = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  return collective("reduce", tensors, opts.timeout, [this, t, reduce, root] {
    const at::Tensor flat = t.reshape({-1}).clone();  // only the root's tensor changes
    auto [counts, offsets] = reduce_own_chunk("reduce", flat, reduce);
    const MPI_Datatype type = type_of(flat);
    const bool is_root = getRank() == root;
    const void* mine = static_cast<const char*>(flat.data_ptr()) + int64_t{offsets[getRank()]} * flat.element_size();
    exchange("reduce", "MPI_Igatherv", [&](MPI_Request* request) {
      return MPI_Igatherv(is_root ? MPI_IN_PLACE : mine, counts[getRank()], type, flat.data_ptr(), counts.data(),
                          offsets.data(), type, root, comm_, request);
    });
    if (is_root) t.copy_(flat.view(t.sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  check_tensor(input, "all_gather_into_tensor");
  check_same(output, input, input.numel() * getSize(), "all_gather_into_tensor", "output");
  count_of(output.numel(), "all_gather_into_tensor");
  const at::Tensor in = input, out = output;
  return collective("all_gather_into_tensor", {output}, opts.timeout, [this, in, out] {
    const at::Tensor send = staged(in), receive = staged(out);
    allgather_flat("all_gather_into_tensor", send, receive);
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) {
  check_one(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "gradzip mpi: all_gather needs one output list of ", getSize(), " tensors");
  for (const auto& o : outputs[0]) check_same(o, inputs[0], inputs[0].numel(), "all_gather", "output");
  count_of(inputs[0].numel() * getSize(), "all_gather");
  const at::Tensor in = inputs[0];
  const std::vector<at::Tensor> outs = outputs[0];
  return collective("all_gather", outs, opts.timeout, [this, in, outs] {
    const at::Tensor send = staged(in);
    const at::Tensor receive = at::empty({send.numel() * getSize()}, send.options());
    allgather_flat("all_gather", send, receive);
    flat_split(receive, outs);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == static_cast<size_t>(getSize()),
              "gradzip mpi: all_gather_coalesced needs one output list per rank (", getSize(), "), got ",
              outputs.size());
  for (const auto& per_rank : outputs) {
    TORCH_CHECK(per_rank.size() == inputs.size(), "gradzip mpi: all_gather_coalesced needs ", inputs.size(),
                " outputs per rank, got ", per_rank.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_tensor(inputs[i], "all_gather_coalesced");
      check_same(per_rank[i], inputs[i], inputs[i].numel(), "all_gather_coalesced", "output");
    }
  }
  const std::vector<at::Tensor> ins = inputs;
  const std::vector<std::vector<at::Tensor>> outs = outputs;
  std::vector<at::Tensor> all_outputs;
  for (const auto& per_rank : outputs) all_outputs.insert(all_outputs.end(), per_rank.begin(), per_rank.end());
  return collective("all_gather_coalesced", all_outputs, opts.timeout, [this, ins, outs] {
    // One all-gather of every input, flattened: rank r's block holds its inputs in order.
    const at::Tensor send = flat_cat(ins);
    const int n = count_of(send.numel() * getSize(), "all_gather_coalesced") / getSize();
    const at::Tensor receive = at::empty({send.numel() * getSize()}, send.options());
    allgather_flat("all_gather_coalesced", send, receive);
    for (int r = 0; r < getSize(); ++r) flat_split(receive.narrow(0, int64_t{r} * n, n), outs[r]);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "gradzip mpi: all_gather_into_tensor_coalesced got ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "all_gather_into_tensor_coalesced");
    check_same(outputs[i], inputs[i], inputs[i].numel() * getSize(), "all_gather_into_tensor_coalesced", "output");
    count_of(outputs[i].numel(), "all_gather_into_tensor_coalesced");
  }
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  return collective("all_gather_into_tensor_coalesced", outputs, opts.timeout, [this, ins, outs] {
    for (size_t i = 0; i < ins.size(); ++i) {
      const at::Tensor send = staged(ins[i]), receive = staged(outs[i]);
      allgather_flat("all_gather_into_tensor_coalesced", send, receive);
      unstage(receive, outs[i]);
    }
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, getSize(), "gather", "root");
  const bool is_root = getRank() == root;
  const std::vector<at::Tensor> outs = root_list(outputs, is_root, getSize(), inputs[0], "gather", "output");
  count_of(inputs[0].numel() * getSize(), "gather");
  const at::Tensor in = inputs[0];
  return collective("gather", outs, opts.timeout, [this, in, outs, root, is_root] {
    const at::Tensor send = staged(in);
    const at::Tensor receive = is_root ? at::empty({send.numel() * getSize()}, send.options()) : at::Tensor();
    exchange("gather", "MPI_Igather", [&](MPI_Request* request) {
      const int n = static_cast<int>(send.numel());
      return MPI_Igather(send.data_ptr(), n, type_of(send), is_root ? receive.data_ptr() : nullptr, n,
                         type_of(send), root, comm_, request);
    });
    if (is_root) flat_split(receive, outs);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  check_rank(root, getSize(), "scatter", "root");
  const bool is_root = getRank() == root;
  const std::vector<at::Tensor> ins = root_list(inputs, is_root, getSize(), outputs[0], "scatter", "input");
  count_of(outputs[0].numel() * getSize(), "scatter");
  const at::Tensor out = outputs[0];
  return collective("scatter", outputs, opts.timeout, [this, out, ins, root, is_root] {
    const at::Tensor send = is_root ? flat_cat(ins) : at::Tensor();
    const at::Tensor receive = staged(out);
    exchange("scatter", "MPI_Iscatter", [&](MPI_Request* request) {
      const int n = static_cast<int>(receive.numel());
      return MPI_Iscatter(is_root ? send.data_ptr() : nullptr, n, type_of(receive), receive.data_ptr(), n,
                          type_of(receive), root, comm_, request);
    });
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_tensor(output, "reduce_scatter_tensor");
  check_same(input, output, output.numel() * getSize(), "reduce_scatter_tensor", "input");
  check_reduce(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
  count_of(input.numel(), "reduce_scatter_tensor");
  const at::Tensor in = input, out = output;
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("reduce_scatter_tensor", {output}, opts.timeout, [this, in, out, reduce] {
    const at::Tensor send = staged(in), receive = staged(out);
    reduce_scatter_flat("reduce_scatter_tensor", send, receive, reduce);
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "gradzip mpi: reduce_scatter needs one input list of ", getSize(), " tensors");
  for (const auto& i : inputs[0]) check_same(i, outputs[0], outputs[0].numel(), "reduce_scatter", "input");
  check_reduce(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
  count_of(outputs[0].numel() * getSize(), "reduce_scatter");
  const at::Tensor out = outputs[0];
  const std::vector<at::Tensor> ins = inputs[0];
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("reduce_scatter", outputs, opts.timeout, [this, out, ins, reduce] {
    const at::Tensor send = flat_cat(ins), receive = staged(out);
    reduce_scatter_flat("reduce_scatter", send, receive, reduce);
    unstage(receive, out);
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "gradzip mpi: reduce_scatter_tensor_coalesced got ",
              outputs.size(), " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(outputs[i], "reduce_scatter_tensor_coalesced");
    check_same(inputs[i], outputs[i], outputs[i].numel() * getSize(), "reduce_scatter_tensor_coalesced", "input");
    check_reduce(opts.reduceOp, outputs[i].scalar_type(), "reduce_scatter_tensor_coalesced");
    count_of(inputs[i].numel(), "reduce_scatter_tensor_coalesced");
  }
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  const c10d::ReduceOp reduce = opts.reduceOp;
  return collective("reduce_scatter_tensor_coalesced", outputs, opts.timeout, [this, ins, outs, reduce] {
    for (size_t i = 0; i < ins.size(); ++i) {
      const at::Tensor send = staged(ins[i]), receive = staged(outs[i]);
      reduce_scatter_flat("reduce_scatter_tensor_coalesced", send, receive, reduce);
      unstage(receive, outs[i]);
    }
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_split_sizes,
                                                         std::vector<int64_t>& input_split_sizes,
                                                         const c10d::AllToAllOptions& opts) {
  check_tensor(input, "all_to_all_single");
  check_same(output, input, output.numel(), "all_to_all_single", "output");
  const std::vector<int> send_counts =
      int_counts(split_elements(input, input_split_sizes, getSize()), "all_to_all_single");
  const std::vector<int> receive_counts =
      int_counts(split_elements(output, output_split_sizes, getSize()), "all_to_all_single");
  const std::vector<int> send_offsets = offsets_of(send_counts, "all_to_all_single");
  const std::vector<int> receive_offsets = offsets_of(receive_counts, "all_to_all_single");
  const at::Tensor in = input, out = output;
  return collective("all_to_all_single", {output}, opts.timeout,
                    [this, in, out, send_counts, receive_counts, send_offsets, receive_offsets] {
                      const at::Tensor send = staged(in), receive = staged(out);
                      exchange("all_to_all_single", "MPI_Ialltoallv", [&](MPI_Request* request) {
                        return MPI_Ialltoallv(send.data_ptr(), send_counts.data(), send_offsets.data(),
                                              type_of(send), receive.data_ptr(), receive_counts.data(),
                                              receive_offsets.data(), type_of(send), comm_, request);
                      });
                      unstage(receive, out);
                    });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(static_cast<int>(inputs.size()) == getSize() && static_cast<int>(outputs.size()) == getSize(),
              "gradzip mpi: all_to_all needs ", getSize(), " inputs and outputs, got ", inputs.size(), " and ",
              outputs.size());
  std::vector<int64_t> send_counts, receive_counts;
  for (int r = 0; r < getSize(); ++r) {
    check_tensor(inputs[r], "all_to_all");
    check_same(outputs[r], inputs[0], outputs[r].numel(), "all_to_all", "output");
    check_same(inputs[r], inputs[0], inputs[r].numel(), "all_to_all", "input");
    send_counts.push_back(inputs[r].numel());
    receive_counts.push_back(outputs[r].numel());
  }
  const std::vector<int> sends = int_counts(send_counts, "all_to_all");
  const std::vector<int> receives = int_counts(receive_counts, "all_to_all");
  const std::vector<int> send_offsets = offsets_of(sends, "all_to_all");
  const std::vector<int> receive_offsets = offsets_of(receives, "all_to_all");
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  return collective("all_to_all", outputs, opts.timeout,
                    [this, ins, outs, sends, receives, send_offsets, receive_offsets] {
                      const at::Tensor send = flat_cat(ins);
                      int64_t total = 0;
                      for (int c : receives) total += c;
                      const at::Tensor receive = at::empty({total}, send.options());
                      exchange("all_to_all", "MPI_Ialltoallv", [&](MPI_Request* request) {
                        return MPI_Ialltoallv(send.data_ptr(), sends.data(), send_offsets.data(), type_of(send),
                                              receive.data_ptr(), receives.data(), receive_offsets.data(),
                                              type_of(send), comm_, request);
                      });
                      flat_split(receive, outs);
                    });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::barrier(const c10d::BarrierOptions& opts) {
  return collective("barrier", {}, opts.timeout, [this] {
    exchange("barrier", "MPI_Ibarrier", [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  });
}

c10::intrusive_ptr<c10d::Work> MpiBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  check_one(tensors, "send");
  check_rank(dst_rank, getSize(), "send", "destination");
  return point_to_point("send", tensors[0], dst_rank, tag, false);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_one(tensors, "recv");
  check_rank(src_rank, getSize(), "recv", "source");
  return point_to_point("recv", tensors[0], src_rank, tag, true);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_one(tensors, "recv");
  return point_to_point("recv", tensors[0], MPI_ANY_SOURCE, tag, true);
}

c10::intrusive_ptr<c10d::Work> MpiBackend::point_to_point(const char* op, at::Tensor tensor, int peer, int tag,
                                                          bool receive) {
  check_usable(op);
  const int n = count_of(tensor.numel(), op);
  TORCH_CHECK(tag >= 0 && tag <= largest_tag_, "gradzip mpi: ", op, "'s tag ", tag, " is outside MPI's range 0..",
              largest_tag_, " (MPI_TAG_UB of this MPI library)");
  auto entry = std::make_shared<PendingPointToPoint>();
  entry->target = tensor;
  entry->staging = receive && !tensor.is_contiguous() ? at::empty(tensor.sizes(), tensor.options()) : staged(tensor);
  entry->receive = receive;
  entry->peer = peer;
  entry->deadline = mpi::Clock::now() + timeout_;
  entry->what = c10::str(op, peer == MPI_ANY_SOURCE ? " from any rank" : (receive ? " from rank " : " to rank "),
                         peer == MPI_ANY_SOURCE ? "" : std::to_string(peer), " (tag ", tag, ") on rank ", getRank(),
                         " of ", getSize());
  mpi::call([&] {
    const MPI_Datatype type = type_of(entry->staging);
    mpi::check(receive ? MPI_Irecv(entry->staging.data_ptr(), n, type, peer, tag, comm_, &entry->request)
                       : MPI_Isend(entry->staging.data_ptr(), n, type, peer, tag, comm_, &entry->request),
               receive ? "MPI_Irecv" : "MPI_Isend");
  });
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    pending_.push_back(entry);
    ++posted_;
    if (!completer_.joinable()) completer_ = std::thread([this] { complete_point_to_point(); });
  }
  pending_wake_.notify_one();
  return c10::make_intrusive<FutureWork>(entry->future, entry->source);
}

int64_t MpiBackend::pending_bytes() const {
  int64_t bytes = 0;
  for (const auto& entry : pending_) bytes += entry->staging.nbytes();
  return bytes;
}

void MpiBackend::complete_point_to_point() {
  std::unique_lock<std::mutex> lock(pending_mutex_);
  mpi::Backoff backoff(0);
  uint64_t seen = 0;  // posted_ when the backoff last restarted
  while (true) {
    pending_wake_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    if (posted_ != seen) {  // a new call: poll at full pace again
      seen = posted_;
      backoff.restart(pending_bytes());
    }
    bool more = false;
    {  // a pass while futures complete and finished calls are let go, not while pausing
      const exit_gate::Pass pass = exit_gate::enter();
      if (!pass) return;  // the interpreter is exiting: the calls stay pending, kept with the communicator
      if (stopping_) {
        for (auto& entry : pending_) {
          entry->future->setError(std::make_exception_ptr(
              std::runtime_error("gradzip mpi: " + entry->what + " did not finish before the process group shut down")));
        }
        pending_.clear();
        return;
      }
      const auto entries = pending_;
      lock.unlock();
      std::vector<std::shared_ptr<PendingPointToPoint>> finished;
      for (const auto& entry : entries) {
        try {
          int done = 0;
          MPI_Status status;
          mpi::call([&] { mpi::check(MPI_Test(&entry->request, &done, &status), entry->what.c_str()); });
          if (done) {
            finished.push_back(entry);
            if (entry->receive) {
              int count = 0;
              MPI_Get_count(&status, type_of(entry->staging), &count);
              TORCH_CHECK(count == entry->staging.numel(), "gradzip mpi: ", entry->what, " expected ",
                          entry->staging.numel(), " elements, rank ", status.MPI_SOURCE, " sent ", count);
              entry->source->store(status.MPI_SOURCE);
              unstage(entry->staging, entry->target);
            }
            entry->future->markCompleted(c10::IValue(std::vector<at::Tensor>{entry->target}));
          } else if (mpi::Clock::now() >= entry->deadline) {
            const std::string reason = "gradzip mpi: " + entry->what +
                                       " did not finish within its timeout: the peer has stopped or died, or made "
                                       "no matching call. This communicator refuses every later call.";
            break_with(reason);
            finished.push_back(entry);
            entry->future->setError(std::make_exception_ptr(std::runtime_error(reason)));
          }
        } catch (...) {
          finished.push_back(entry);
          if (!entry->future->completed()) entry->future->setError(std::current_exception());
        }
      }
      lock.lock();
      for (const auto& entry : finished) pending_.remove(entry);
      if (!finished.empty()) backoff.restart(pending_bytes());
      more = !pending_.empty();
    }
    if (!more) continue;
    const auto pause = backoff.pause_at(mpi::Clock::now());
    if (pause == mpi::Clock::duration::zero()) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      pending_wake_.wait_for(lock, pause);  // a new call or shutdown wakes it at once
    }
  }
}

}  // namespace gradzip
