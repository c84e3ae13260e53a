#include "aggregate/ordered_worker.h"

#include <stdexcept>

#include "aggregate/future_work.h"

namespace gradzip {

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

c10::intrusive_ptr<c10d::Work> OrderedWorker::submit(std::vector<at::Tensor> tensors, std::function<void()> job) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  {
    std::unique_lock<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "gradzip: the process group's worker has stopped");
    TORCH_CHECK(aborted_.empty(), aborted_);
    if (thread_.joinable() && std::this_thread::get_id() == thread_.get_id()) {
      lock.unlock();
      Job now{std::move(job), std::move(tensors), future};
      run(now);
      return c10::make_intrusive<FutureWork>(future);
    }
    jobs_.push_back({std::move(job), std::move(tensors), future});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  wake_.notify_one();
  return c10::make_intrusive<FutureWork>(future);
}

void OrderedWorker::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
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

void OrderedWorker::run(Job& job) {
  std::exception_ptr error;
  try {
    job.run();
  } catch (...) {
    error = std::current_exception();
  }
  if (job.settled->exchange(true)) return;  // aborted meanwhile: the caller has its error
  if (error) {
    job.future->setError(error);
  } else {
    job.future->markCompleted(c10::IValue(job.tensors));
  }
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
    finished_ = Job();  // the job before, while this job's waiter is still alive to wait
    run(job);
    lock.lock();
    current_ = nullptr;
    lock.unlock();
    job.run = nullptr;  // its captures go here, before the queue may look idle
    finished_ = std::move(job);
    lock.lock();
    running_ = false;
    if (jobs_.empty()) idle_.notify_all();
  }
}

}  // namespace gradzip
