#include "aggregate/node_shared_memory.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gradzip {

NodeSharedMemory::NodeSharedMemory(const std::string& name, c10::intrusive_ptr<c10d::Backend> node)
    : name_(name), node_(std::move(node)) {
  TORCH_CHECK(name_.size() > 1 && name_[0] == '/' && name_.find('/', 1) == std::string::npos,
              "gradzip: '", name_, "' is not a shared-memory name (one '/' first)");
  const bool first = node_->getRank() == 0;
  if (first) fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  barrier();
  if (!first) fd_ = shm_open(name_.c_str(), O_RDWR, 0600);
  const int error = fd_ < 0 ? errno : 0;
  barrier();
  if (first && fd_ >= 0) shm_unlink(name_.c_str());
  TORCH_CHECK(fd_ >= 0, "gradzip: cannot open the node's shared memory ", name_, ": ", std::strerror(error));
}

NodeLevels make_node_levels(c10::intrusive_ptr<c10d::Backend> node, c10::intrusive_ptr<c10d::Backend> lane,
                            std::vector<int64_t> ranks, const std::optional<std::string>& shared_memory) {
  const int64_t local_ranks = node->getSize(), nodes = lane->getSize();
  TORCH_CHECK(static_cast<int64_t>(ranks.size()) == local_ranks * nodes, "gradzip: node levels of ", nodes,
              " nodes of ", local_ranks, " ranks got ", ranks.size(), " ranks");
  std::vector<int64_t> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t r = 0; r < local_ranks * nodes; ++r) {
    TORCH_CHECK(sorted[r] == r, "gradzip: node levels' ranks must hold every rank of the group once");
  }
  NodeLevels levels{node, std::move(lane), std::move(ranks), nullptr};
  if (shared_memory) levels.shared = std::make_shared<NodeSharedMemory>(*shared_memory, std::move(node));
  return levels;
}

NodeSharedMemory::~NodeSharedMemory() {
  if (base_) munmap(base_, static_cast<size_t>(size_));
  if (fd_ >= 0) close(fd_);
}

void NodeSharedMemory::barrier() { node_->barrier()->wait(); }

uint8_t* NodeSharedMemory::reserve(int64_t bytes) {
  if (bytes <= size_) return base_;
  const int64_t grown = std::max(bytes, 2 * size_);
  barrier();  // nobody still reads the old mapping's contents
  if (node_->getRank() == 0) {
    const int error = posix_fallocate(fd_, 0, grown);
    if (error != 0) TORCH_WARN("gradzip: could not allocate ", grown, " bytes of shared memory: ", std::strerror(error));
  }
  barrier();
  struct stat st {};
  TORCH_CHECK(fstat(fd_, &st) == 0 && st.st_size >= grown, "gradzip: the node's shared memory could not grow to ",
              grown, " bytes (is /dev/shm full? df -h /dev/shm); set hierarchy=off or make /dev/shm larger");
  if (base_) munmap(base_, static_cast<size_t>(size_));
  void* mapped = mmap(nullptr, static_cast<size_t>(grown), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  base_ = nullptr;
  size_ = 0;
  TORCH_CHECK(mapped != MAP_FAILED, "gradzip: cannot map ", grown, " bytes of the node's shared memory: ",
              std::strerror(errno));
  base_ = static_cast<uint8_t*>(mapped);
  size_ = grown;
  return base_;
}

uint8_t* NodeSharedMemory::next_region(int64_t bytes) {
  reserve(2 * bytes);  // the halves move only when it grows, behind its barrier
  return base_ + (regions_taken_++ % 2) * (size_ / 2);
}

}  // namespace gradzip
