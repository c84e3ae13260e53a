#include "c10d/collective_check.h"

#include "c10d/shared_check_board.h"

#include <c10/util/Exception.h>

#include <array>
#include <functional>
#include <sstream>

namespace gradzip {
namespace {

// The collectives a fingerprint can name; the code travels as an int64.
constexpr std::array<const char*, 20> kOps = {
    "all_reduce",      "all_reduce_coalesced", "broadcast",           "reduce",
    "all_gather",      "all_gather_into_tensor", "all_gather_coalesced", "all_gather_into_tensor_coalesced",
    "gather",          "scatter",              "reduce_scatter",      "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "all_reduce_sparse",  "gather_single",       "unknown"};

int64_t op_code(const std::string& op) {
  for (size_t i = 0; i < kOps.size(); ++i) {
    if (op == kOps[i]) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(kOps.size() - 1);
}

std::string op_name(int64_t code) {
  return code >= 0 && code < static_cast<int64_t>(kOps.size()) ? kOps[code] : "an unknown collective";
}

std::string reduce_op_name(int64_t op) {
  constexpr std::array<const char*, 9> kNames = {"SUM", "AVG", "PRODUCT", "MIN", "MAX",
                                                 "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  return op < static_cast<int64_t>(kNames.size()) ? kNames[op] : "reduce op " + std::to_string(op);
}

constexpr int kCompared = 7;  // op, dtype, numel, count, shapes_hash, root, reduce_op
constexpr int kFinite = kCompared;  // then the finiteness flag; then the split sizes
constexpr int kHeader = kFinite + 1;

std::string describe(const int64_t* f) {
  std::ostringstream out;
  out << op_name(f[0]);
  if (f[1] >= 0) out << " of " << c10::toString(static_cast<c10::ScalarType>(f[1]));
  if (f[2] >= 0) out << " with " << f[2] << " elements";
  if (f[3] > 1) out << " in " << f[3] << " tensors";
  if (f[5] >= 0) out << ", root " << f[5];
  if (op_name(f[0]) == std::string("gather_single")) {
    if (f[4] >= 0) out << ", gathering into " << f[4] << " elements";
    if (f[4] == CollectiveCall::kUnusableOutput) out << ", gathering into an output not contiguous or on another device";
  }
  if (f[6] >= 0) out << ", " << reduce_op_name(f[6]);
  return out.str();
}

}  // namespace

CollectiveCall CollectiveCall::of(std::string op, const std::vector<at::Tensor>& tensors) {
  CollectiveCall call;
  call.op = std::move(op);
  call.count = static_cast<int64_t>(tensors.size());
  call.numel = 0;
  size_t hash = 0;
  for (const auto& t : tensors) {
    call.numel += t.numel();
    hash = hash * 1000003u + std::hash<int64_t>{}(t.numel());
  }
  if (!tensors.empty()) call.dtype = static_cast<int64_t>(tensors.front().scalar_type());
  // Single tensors agree by numel alone (shapes may differ, as in Gloo); lists by each numel.
  if (tensors.size() > 1) call.shapes_hash = static_cast<int64_t>(hash & 0x7fffffffffffffffULL);
  return call;
}

CollectiveCheck::CollectiveCheck(c10::intrusive_ptr<c10d::Backend> channel, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : channel_(std::move(channel)), rank_(rank), size_(size), timeout_(timeout) {}

CollectiveCheck::~CollectiveCheck() = default;

bool CollectiveCheck::use_shared_memory(const std::string& name) {
  board_ = SharedCheckBoard::open(name, kHeader + 2 * size_, channel_);
  return board_ != nullptr;
}

void CollectiveCheck::stop() {
  if (board_) board_->stop();
}

std::vector<int64_t> CollectiveCheck::exchange(const std::vector<int64_t>& mine, const std::string& op) {
  const int width = static_cast<int>(mine.size());
  try {
    if (board_) return board_->exchange(mine.data(), timeout_);
    // Every rank sends its fingerprint to every other in one all-to-all: one message
    // latency, where an all-gather (a ring in Gloo) takes P − 1 in a row.
    auto local = at::from_blob(const_cast<int64_t*>(mine.data()), {width}, at::kLong);
    auto all = at::empty({size_ * width}, at::kLong);
    auto to_each = local.repeat({size_});
    std::vector<int64_t> equal_splits;
    channel_->alltoall_base(all, to_each, equal_splits, equal_splits)->wait();
    const int64_t* f = all.data_ptr<int64_t>();
    return std::vector<int64_t>(f, f + size_ * width);
  } catch (const std::exception& e) {  // a dead or stopped peer, in the transport's words or the board's
    const c10::Error* error = dynamic_cast<const c10::Error*>(&e);
    TORCH_CHECK(false, "gradzip: ", op, " on rank ", rank_, " of ", size_,
                " failed while the ranks confirmed the call (the collective check): ",
                error ? error->what_without_backtrace() : e.what());
  }
}

bool CollectiveCheck::verify(const CollectiveCall& mine) {
  const int width = kHeader + 2 * size_;
  std::vector<int64_t> local(static_cast<size_t>(width), -1);
  int64_t* l = local.data();
  const std::array<int64_t, kHeader> header = {op_code(mine.op), mine.dtype,     mine.numel,     mine.count,
                                               mine.shapes_hash, mine.root, mine.reduce_op, mine.finite};
  std::copy(header.begin(), header.end(), l);
  if (!mine.send_counts.empty()) {
    TORCH_CHECK(mine.send_counts.size() == static_cast<size_t>(size_) &&
                    mine.recv_counts.size() == static_cast<size_t>(size_),
                "gradzip: ", mine.op, " needs one split size per rank (", size_, "), got ",
                mine.send_counts.size(), " input and ", mine.recv_counts.size(), " output split sizes");
    std::copy(mine.send_counts.begin(), mine.send_counts.end(), l + kHeader);
    std::copy(mine.recv_counts.begin(), mine.recv_counts.end(), l + kHeader + size_);
  }
  const std::vector<int64_t> all = exchange(local, mine.op);
  const int64_t* f = all.data();

  auto row = [&](int r) { return f + static_cast<ptrdiff_t>(r) * width; };
  for (int r = 1; r < size_; ++r) {
    if (!std::equal(row(0), row(0) + kCompared, row(r))) {
      std::ostringstream msg;
      msg << "gradzip: ranks disagree on a collective: ";
      for (int q = 0; q < size_; ++q) msg << (q ? "; " : "") << "rank " << q << " called " << describe(row(q));
      msg << ". Every rank must call the same collectives, in the same order, with tensors of the same "
             "dtype and size.";
      TORCH_CHECK(false, msg.str());
    }
  }
  bool finite = true;
  for (int r = 0; r < size_; ++r) finite = finite && row(r)[kFinite] != 0;
  if (row(0)[kHeader] < 0) return finite;  // not an all-to-all
  for (int src = 0; src < size_; ++src) {
    for (int dst = 0; dst < size_; ++dst) {
      const int64_t sent = row(src)[kHeader + dst];
      const int64_t expected = row(dst)[kHeader + size_ + src];
      TORCH_CHECK(sent == expected, "gradzip: ", op_name(row(0)[0]), " split sizes disagree: rank ", src,
                  " sends ", sent, " elements to rank ", dst, ", which expects ", expected, " from it");
    }
  }
  return finite;
}

}  // namespace gradzip
