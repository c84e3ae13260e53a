// The MPI transport built against a second MPI library. ctest compiles the transport's
// sources against MPICH where Debian's mpich is installed beside the Open MPI that the
// extension links, and runs this under MPICH's mpiexec with 3 ranks (CMakeLists.txt,
// MpiTransport.MPICH). The extension's own MPI is tested by tests/python/test_mpi.py.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <limits>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "transport/mpi/mpi_backend.h"
#include "transport/mpi/mpi_runtime.h"

namespace gradzip {
namespace {

using std::chrono::milliseconds;

c10::intrusive_ptr<MpiBackend>& world() {
  static c10::intrusive_ptr<MpiBackend> backend = [] {
    mpi::start();
    int rank = 0, size = 0;
    mpi::call([&] {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    });
    return c10::make_intrusive<MpiBackend>(rank, size, std::vector<int64_t>{}, milliseconds(60000));
  }();
  return backend;
}

at::Tensor input_of(int rank, int64_t n) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + rank);
  return at::randn({n}, generator);
}

void run(const c10::intrusive_ptr<c10d::Work>& work) { ASSERT_TRUE(work->wait()); }

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.view(at::kInt), b.view(at::kInt));
}

// CPU seconds this process has used (every thread).
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

TEST(MpiTransportTest, LinksTheExpectedLibrary) {
  EXPECT_NE(mpi::library_version().find(GRADZIP_EXPECTED_MPI), std::string::npos) << mpi::library_version();
}

TEST(MpiTransportTest, AllreduceIsTheRankOrderedSumOnEveryRank) {
  const int rank = world()->getRank(), size = world()->getSize();
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    std::vector<at::Tensor> tensors = {input_of(rank, n)};
    run(world()->allreduce(tensors, c10d::AllreduceOptions()));
    at::Tensor expected = input_of(0, n);
    for (int r = 1; r < size; ++r) expected.add_(input_of(r, n));
    EXPECT_TRUE(same_bits(tensors[0], expected)) << n << " elements";
  }
}

TEST(MpiTransportTest, BroadcastAllgatherReduceScatterAndAllToAllMoveEveryRanksBytes) {
  const int rank = world()->getRank(), size = world()->getSize();
  std::vector<at::Tensor> box = {input_of(rank, 257)};
  c10d::BroadcastOptions from_last;
  from_last.rootRank = size - 1;
  run(world()->broadcast(box, from_last));
  EXPECT_TRUE(same_bits(box[0], input_of(size - 1, 257)));

  at::Tensor mine = input_of(rank, 33), all = at::empty({33 * size});
  run(world()->_allgather_base(all, mine, c10d::AllgatherOptions()));
  for (int r = 0; r < size; ++r) EXPECT_TRUE(same_bits(all.narrow(0, 33 * r, 33), input_of(r, 33))) << r;

  at::Tensor chunk = at::empty({50});
  at::Tensor rows = input_of(rank, 50 * size);
  run(world()->_reduce_scatter_base(chunk, rows, c10d::ReduceScatterOptions()));
  at::Tensor expected = input_of(0, 50 * size).narrow(0, 50 * rank, 50).clone();
  for (int r = 1; r < size; ++r) expected.add_(input_of(r, 50 * size).narrow(0, 50 * rank, 50));
  EXPECT_TRUE(same_bits(chunk, expected));

  // Uneven splits: rank r sends r + d + 1 elements to rank d.
  std::vector<int64_t> send_splits, receive_splits;
  for (int d = 0; d < size; ++d) send_splits.push_back(rank + d + 1);
  for (int s = 0; s < size; ++s) receive_splits.push_back(s + rank + 1);
  at::Tensor send = at::arange(rank * 1000, rank * 1000 + (rank + 1) * size + size * (size - 1) / 2).to(at::kFloat);
  at::Tensor receive = at::empty({size * (rank + 1) + size * (size - 1) / 2});
  run(world()->alltoall_base(receive, send, receive_splits, send_splits, c10d::AllToAllOptions()));
  int64_t offset = 0;
  for (int s = 0; s < size; ++s) {
    const int64_t count = s + rank + 1;
    const int64_t first = s * 1000 + (s + 1) * rank + rank * (rank - 1) / 2;  // Σ_{d<rank} (s + d + 1)
    EXPECT_TRUE(at::equal(receive.narrow(0, offset, count), at::arange(first, first + count).to(at::kFloat)))
        << "from rank " << s;
    offset += count;
  }
  run(world()->barrier(c10d::BarrierOptions()));
}

TEST(MpiTransportTest, PointToPointTakesTheWholeTagRangeAndRefusesPastIt) {
  const int rank = world()->getRank(), size = world()->getSize();
  const int largest = world()->largest_tag();
  ASSERT_GE(largest, 32767);
  if (std::string(GRADZIP_EXPECTED_MPI) == "MPICH") EXPECT_EQ(largest, (1 << 28) - 1);
  std::vector<at::Tensor> out = {input_of(rank, 100)}, in = {at::empty({100})};
  auto receive = world()->recv(in, (rank + size - 1) % size, largest);
  run(world()->send(out, (rank + 1) % size, largest));
  run(receive);
  EXPECT_TRUE(same_bits(in[0], input_of((rank + size - 1) % size, 100)));
  if (largest < std::numeric_limits<int>::max()) {
    try {
      world()->send(out, (rank + 1) % size, largest + 1);
      ADD_FAILURE() << "a tag past MPI_TAG_UB was taken";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("outside MPI's range 0.." + std::to_string(largest)), std::string::npos)
          << e.what();
    }
  }
}

TEST(MpiTransportTest, WaitingForALatePeerHoldsNoCore) {
  // Rank 0 joins 1.5 s late; the others wait in a collective, then in a receive, and
  // must sleep through most of it (a polling loop that only yields would use ~1.5 s).
  const int rank = world()->getRank(), size = world()->getSize();
  for (const char* call : {"all_reduce", "recv"}) {
    run(world()->barrier(c10d::BarrierOptions()));
    std::vector<at::Tensor> tensors = {at::ones({10})};
    if (rank == 0) {
      std::this_thread::sleep_for(milliseconds(1500));
      if (std::string(call) == "all_reduce") {
        run(world()->allreduce(tensors, c10d::AllreduceOptions()));
      } else {
        for (int peer = 1; peer < size; ++peer) run(world()->send(tensors, peer, 7));
      }
      continue;
    }
    const auto start = std::chrono::steady_clock::now();
    const double cpu_before = cpu_seconds();
    if (std::string(call) == "all_reduce") {
      run(world()->allreduce(tensors, c10d::AllreduceOptions()));
      EXPECT_EQ(tensors[0][0].item<float>(), static_cast<float>(size));
    } else {
      run(world()->recv(tensors, 0, 7));
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = cpu_seconds() - cpu_before;
    EXPECT_GT(wall, 1.0) << call;
    EXPECT_LT(cpu, 0.25 * wall) << call << ": " << cpu << " CPU seconds in a wait of " << wall << " s";
  }
}

}  // namespace
}  // namespace gradzip

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  gradzip::world().reset();
  gradzip::MpiBackend::finish_all();
  return failed;
}
