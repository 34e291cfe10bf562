// The importer's two-hop thread: what a striped transfer does next (a
// TwoRoutes' next submissions, or its end) runs here, one task at a time in
// the order posted, never on a link's own thread (importer/transfer.cc).
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace podlink::mesh {

class TaskThread {
 public:
  TaskThread() = default;
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;
  ~TaskThread();  // Stop()s

  // Starts the thread (once; later calls do nothing).
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `task`; false when the thread is not running (never started, or
  // stopping): the caller then runs it or fails where it is.
  bool Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new tasks, runs those already queued, and joins the thread.
  // Idempotent; not from a task.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // set by Start, joined by Stop (neither from a task)
};

}  // namespace podlink::mesh
