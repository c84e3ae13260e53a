// NodeSharedMemory: memory shared by the ranks of one node (a POSIX shared-memory
// object), for the hierarchical exchange's exact stages on the CPU: every rank writes its
// rows there and the others read them in place, instead of sending them through the
// node's transport (Gloo over loopback copies every byte through the kernel twice).
//
// Made by every rank of the node together, and grown together: next_region() is collective
// over the node, called with the same size in the same order on every rank (as the
// exchange's calls are). A node that cannot get the memory (a full /dev/shm) raises on
// every rank instead of faulting later: the space is allocated when it grows.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "gradzip/aggregation.h"

namespace gradzip {

class NodeSharedMemory {
 public:
  // `name` (a POSIX shm name, "/..."): the same on every rank of the node, unique to it.
  // The object is unlinked once every rank has opened it: nothing outlives the ranks.
  NodeSharedMemory(const std::string& name, c10::intrusive_ptr<c10d::Backend> node);
  ~NodeSharedMemory();
  NodeSharedMemory(const NodeSharedMemory&) = delete;
  NodeSharedMemory& operator=(const NodeSharedMemory&) = delete;

  // `bytes` of the object for one call's stages (collective like reserve()). Calls take
  // two regions in turn, so a call's writes never reach what a rank may still be reading
  // of the call before it: they reach the region of the call before that, which every
  // rank has left once it passed a barrier of the call in between.
  uint8_t* next_region(int64_t bytes);
  // Returns once every rank of the node has called it.
  void barrier();

 private:
  // At least `bytes` of the object, mapped here; the same bytes on every rank of the node.
  uint8_t* reserve(int64_t bytes);

  std::string name_;
  c10::intrusive_ptr<c10d::Backend> node_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  int64_t size_ = 0;
  uint64_t regions_taken_ = 0;
};

// Node levels over `node` and `lane` with their `ranks` (NodeLevels), with the node's
// shared memory named `shared_memory` when given (made here: collective over the node).
// Refuses `ranks` that do not hold every rank of the nodes once.
NodeLevels make_node_levels(c10::intrusive_ptr<c10d::Backend> node, c10::intrusive_ptr<c10d::Backend> lane,
                            std::vector<int64_t> ranks, const std::optional<std::string>& shared_memory);

}  // namespace gradzip
