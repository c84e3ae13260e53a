#include "work/ordered_worker.h"

#include <stdexcept>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "work/exit_gate.h"
#include "work/future_work.h"

namespace gradzip {
namespace {

// `job` made to run on `side` after the work queued so far on the caller's current stream
// of `device`. It returns once its work is queued; when it raises, once that work is done
// too (nothing it queued is still running then). OrderedWorker::run synchronizes `side`
// after completing the job's future.
std::function<void()> after_current_stream(c10::Device device, c10::Stream side, const std::vector<at::Tensor>& tensors,
                                           std::function<void()> job) {
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device() == device, "gradzip: one call got tensors on ", device.str(), " and on ", t.device().str());
  }
  const c10::impl::VirtualGuardImpl impl(device.type());
  auto ready = std::make_shared<c10::Event>(device.type());
  ready->record(impl.getStream(device));
  return [ready, side, job = std::move(job)] {
    ready->block(side);
    try {
      job();
    } catch (...) {
      side.synchronize();
      throw;
    }
  };
}

}  // namespace

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

c10::intrusive_ptr<c10d::Work> OrderedWorker::submit(std::vector<at::Tensor> tensors, std::function<void()> job) {
  std::optional<c10::Stream> stream;
  std::vector<c10::Device> devices;
  if (!tensors.empty() && !tensors.front().device().is_cpu()) {
    const c10::Device device = tensors.front().device();
    stream = side_stream(device);
    job = after_current_stream(device, *stream, tensors, std::move(job));
    devices.push_back(device);
  }
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  Job next{std::move(job), std::move(tensors), future};
  next.stream = stream;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "gradzip: the process group's worker has stopped");
    TORCH_CHECK(aborted_.empty(), aborted_);
    if (thread_.joinable() && std::this_thread::get_id() == thread_.get_id()) {
      lock.unlock();
      run(next);
      let_go(next);
      return c10::make_intrusive<FutureWork>(future);
    }
    jobs_.push_back(std::move(next));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  wake_.notify_one();
  return c10::make_intrusive<FutureWork>(future);
}

void OrderedWorker::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  // On the worker thread (a job, or a future's callback, about to issue a call of its
  // own): every job before the running one has finished, and that one is the caller.
  if (std::this_thread::get_id() == thread_.get_id()) return;
  idle_.wait(lock, [this] { return jobs_.empty() && !running_; });
}

void OrderedWorker::abort(const std::string& reason) {
  std::vector<Job> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = reason;
    for (auto& job : jobs_) failed.push_back(std::move(job));
    jobs_.clear();
    if (current_) failed.push_back({{}, {}, current_->future, current_->settled});
  }
  idle_.notify_all();
  for (auto& job : failed) {
    if (!job.settled->exchange(true)) job.future->setError(std::make_exception_ptr(std::runtime_error(reason)));
  }
}

c10::Stream OrderedWorker::side_stream(c10::Device device) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& lent : side_streams_) {
    if (lent->stream().device() == device) return lent->stream();
  }
  side_streams_.push_back(std::make_unique<LentStream>(device));
  return side_streams_.back()->stream();
}

void OrderedWorker::run(Job& job) {
  std::optional<c10::StreamGuard> on_stream;  // the side stream and its device, current until completed
  if (job.stream) {
    // The job's device stays this thread's after it, for what the thread does next
    // (freeing the job's events, the next job): never a device 0 this rank does not use.
    c10::impl::VirtualGuardImpl(job.stream->device_type()).setDevice(job.stream->device());
    on_stream.emplace(*job.stream);
  }
  std::exception_ptr error;
  try {
    job.run();
  } catch (...) {
    error = std::current_exception();
  }
  const exit_gate::Pass pass = exit_gate::enter();
  if (!pass) {  // the interpreter is exiting: nobody waits for the job, and its callbacks would kill the thread
    exit_gate::keep(std::make_shared<Job>(job));
    return;
  }
  if (!job.settled->exchange(true)) {  // else aborted meanwhile: the caller has its error
    if (error) {
      job.future->setError(error);
    } else {
      job.future->markCompleted(c10::IValue(job.tensors));
    }
  }
  if (!job.stream) return;
  // The waiters' streams wait for the result (the future's events); this thread waits for
  // the side stream before it lets go of the job, whose captures that work may still read.
  try {
    job.stream->synchronize();
  } catch (const std::exception& e) {
    // A fault in the job's kernels (the future may have been completed already): every
    // later call fails with it, as the device's own later calls will.
    abort(std::string("gradzip: the device work of an earlier call failed: ") + e.what());
  }
}

void OrderedWorker::let_go(Job& job) {
  const exit_gate::Pass pass = exit_gate::enter();
  if (!pass) exit_gate::keep(std::make_shared<Job>(job));  // their last references must not go on this thread
  job = Job();
}

void OrderedWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and nothing left to run
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    running_ = true;
    current_ = &job;
    lock.unlock();
    run(job);
    lock.lock();
    current_ = nullptr;
    lock.unlock();
    let_go(job);  // its captures and tensors, before the queue may look idle
    lock.lock();
    running_ = false;
    if (jobs_.empty()) idle_.notify_all();
  }
}

}  // namespace gradzip
