// GilFreeDestructorPtr: the pybind11 holder of gradzip's c10d backends.
#pragma once

#include <thread>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

namespace gradzip::python {

// The thread that imported gradzip._C (module.cpp asks first): Python's main thread, as a rule.
inline std::thread::id import_thread() {
  static const std::thread::id id = std::this_thread::get_id();
  return id;
}

// Holds a c10d backend for Python and drops it without the GIL: destroying the inner Gloo
// backend joins its worker threads, which may need the GIL to free the tensors of
// finished work; holding it here would deadlock. On any thread but the importing one, the
// last reference (the others are only counts to drop) goes to a thread of its own: it may
// be dropped on one of the threads the destructor joins (a future's callback that held the
// group, let go of on the transport's thread or the worker's after the group was
// destroyed), and a thread cannot join itself. Same layout as c10::intrusive_ptr, which
// pybind11 relies on when it hands the object to torch as a c10d::Backend.
template <typename T>
class GilFreeDestructorPtr {
 public:
  GilFreeDestructorPtr() = default;
  explicit GilFreeDestructorPtr(T* raw) : impl_(c10::intrusive_ptr<T>::unsafe_reclaim_from_nonowning(raw)) {}
  GilFreeDestructorPtr(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}  // NOLINT: pybind11 converts
  GilFreeDestructorPtr(const GilFreeDestructorPtr&) = default;
  GilFreeDestructorPtr& operator=(const GilFreeDestructorPtr&) = default;
  ~GilFreeDestructorPtr() {
    if (impl_ && impl_.use_count() == 1 && std::this_thread::get_id() != import_thread()) {
      std::thread([impl = std::move(impl_)]() mutable { impl.reset(); }).detach();
      return;
    }
    if (impl_ && PyGILState_Check()) {
      pybind11::gil_scoped_release no_gil;
      impl_.reset();
    }
  }
  T* get() const { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};
static_assert(sizeof(GilFreeDestructorPtr<c10d::Backend>) == sizeof(c10::intrusive_ptr<c10d::Backend>));

}  // namespace gradzip::python

PYBIND11_DECLARE_HOLDER_TYPE(T, gradzip::python::GilFreeDestructorPtr<T>, true)
