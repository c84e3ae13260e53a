#include "work/lent_stream.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#if GRADZIP_WITH_CUDA
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace gradzip {

#if GRADZIP_WITH_CUDA
namespace {

// Streams returned by earlier lenders, per device index. Never freed (see the header):
// allocated once and left to the process's end, which may come after CUDA's own teardown.
struct FreeStreams {
  std::mutex mutex;
  std::map<c10::DeviceIndex, std::vector<cudaStream_t>> by_device;
};

FreeStreams& free_streams() {
  static auto* streams = new FreeStreams();
  return *streams;
}

cudaStream_t take_cuda_stream(c10::DeviceIndex device) {
  {
    FreeStreams& free = free_streams();
    std::lock_guard<std::mutex> lock(free.mutex);
    auto& streams = free.by_device[device];
    if (!streams.empty()) {
      cudaStream_t stream = streams.back();
      streams.pop_back();
      return stream;
    }
  }
  const c10::cuda::CUDAGuard on_device(device);
  int least = 0, greatest = 0;
  C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  return stream;
}

}  // namespace
#endif

LentStream::LentStream(c10::Device device) : stream_(c10::Stream::DEFAULT, device), owned_(false) {
#if GRADZIP_WITH_CUDA
  if (device.is_cuda()) {
    stream_ = c10::cuda::getStreamFromExternal(take_cuda_stream(device.index()), device.index()).unwrap();
    owned_ = true;
    return;
  }
#endif
  // High priority: the pool's other half from the streams torch.cuda.Stream() and NCCL
  // take by default.
  stream_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, true);
}

LentStream::~LentStream() {
#if GRADZIP_WITH_CUDA
  if (owned_) {
    FreeStreams& free = free_streams();
    std::lock_guard<std::mutex> lock(free.mutex);
    free.by_device[stream_.device_index()].push_back(c10::cuda::CUDAStream(stream_).stream());
  }
#endif
}

}  // namespace gradzip
