#include "daemon/mesh/importer/task_thread.h"

#include <utility>

namespace podlink::mesh {

TaskThread::~TaskThread() { Stop(); }

void TaskThread::Start() {
  absl::MutexLock l(&mu_);
  if (stop_ || thread_.joinable()) return;
  running_ = true;
  thread_ = std::thread([this] { Loop(); });
}

bool TaskThread::Post(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  if (!running_ || stop_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void TaskThread::Stop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void TaskThread::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) {
        running_ = false;
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace podlink::mesh
