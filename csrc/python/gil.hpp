// Releasing the GIL around a blocking native call, safe at interpreter exit.
//
// CPython 3.11-3.13 end a daemon thread that takes the GIL back after finalization
// began with pthread_exit(); its forced unwind runs into a noexcept frame (nanobind's
// gil_scoped_release destructor, its dispatcher's catch(...)) and std::terminate aborts
// the whole process ("terminate called without an active exception"). A thread that
// comes back from a wait once the interpreter is finalizing is parked here instead, as
// CPython 3.14 does itself: the process is exiting and nothing can run its Python code.
//
// The store's own threads never get here: tierstore/process.py closes every store
// and engine at exit, before finalization. This guard covers a caller's daemon thread
// blocked in Completion.wait() / synchronize() when the interpreter exits (a thread that
// starts taking the GIL back just before finalization begins is still CPython's).
#pragma once
#include <Python.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace tierstore::python {

inline bool interpreter_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// The thread running interpreter exit (tierstore/process.py's atexit hook records it):
// finalization runs there, and that thread must take the GIL back. 0 = not known yet
// (no exit began, or the hook never ran): then nothing is parked.
inline std::atomic<unsigned long> exit_thread{0};

inline void mark_exit_thread() noexcept { exit_thread.store(PyThread_get_thread_ident()); }

class GilRelease {
 public:
  GilRelease() noexcept : state_(PyEval_SaveThread()) {}
  ~GilRelease() {
    const unsigned long exiting = exit_thread.load();
    if (exiting != 0 && exiting != PyThread_get_thread_ident())
      while (interpreter_finalizing()) std::this_thread::sleep_for(std::chrono::hours(1));
    PyEval_RestoreThread(state_);
  }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace tierstore::python
