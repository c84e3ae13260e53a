// The exit gate: gradzip's threads and the interpreter's exit.
//
// gradzip's threads (the ordered worker, the checked receives' lanes, the MPI transport's
// completer) complete futures, which runs their callbacks (Python ones among them), and
// let go of the application's tensors, which frees their Python objects. Both take the
// GIL. Once Python has begun to finalize, a thread that takes the GIL is ended by Python
// where it stands, inside a C++ destructor or callback, and the process aborts: a script
// that ends without destroy_process_group() while a call, or a callback on its future,
// is still finishing dies at exit.
//
// So a thread takes a pass before it completes a future or lets go of what a finished
// call held, and gives it back afterwards. close() runs at interpreter exit, before
// finalization (gradzip's atexit handler): no pass is given from then on, and it waits
// until every pass given has come back (at most kExitWait, so that a stuck callback
// cannot hang the exit). A thread refused a pass completes nothing and hands what it
// holds to keep(), which holds it until the process ends: nobody waits any more.
#pragma once

#include <chrono>
#include <memory>

namespace gradzip::exit_gate {

constexpr std::chrono::seconds kExitWait{30};

class Pass {
 public:
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;
  ~Pass();
  explicit operator bool() const { return given_; }

 private:
  friend Pass enter();
  explicit Pass(bool given) : given_(given) {}
  bool given_;
};

// A pass, or an empty one (false) once close() has begun. Never blocks; may nest.
Pass enter();
// Refuses passes from now on; returns once every pass given has come back or after
// kExitWait. Call it without the GIL.
void close();
// Holds `what` until the process ends (it is never destroyed).
void keep(std::shared_ptr<void> what);

}  // namespace gradzip::exit_gate
