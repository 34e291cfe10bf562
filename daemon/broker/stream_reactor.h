// Server-stream reactor shared by the broker's Watch and the device
// plugin's ListAndWatch.
#pragma once

#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace podlink {

// A server stream whose messages queue up and are written one at a time.
// Push never blocks; Close ends the stream after what is queued. StartWrite
// and Finish are always called with mu_ released, since gRPC may run
// reactions inline. The reactor keeps itself alive until OnDone.
template <typename Msg>
class QueuedWriteReactor : public grpc::ServerWriteReactor<Msg> {
 public:
  // Events are a few hundred bytes: 256 per stream, 4 streams per session and
  // 64 sessions per pod bound what one pod can make podlinkd queue (~29 MB).
  static constexpr size_t kMaxQueued = 256;

  void Begin(std::shared_ptr<QueuedWriteReactor> self) {
    absl::MutexLock l(&mu_);
    self_ = std::move(self);
  }

  void Push(const Msg& e) {
    Action a;
    {
      absl::MutexLock l(&mu_);
      if (finishing_ || done_) return;
      if (queue_.size() >= kMaxQueued) {
        // A client that never reads its stream loses the stream, not the
        // daemon's memory.
        finishing_ = true;
        final_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                     "watch stream not drained; events dropped");
        DropQueuedLocked();
        a = NextLocked();
      } else {
        queue_.push_back(e);
        a = NextLocked();
      }
    }
    Run(a);
  }

  void Close(const Msg& final_event) {
    Action a;
    {
      absl::MutexLock l(&mu_);
      if (finishing_ || done_) return;
      queue_.push_back(final_event);
      finishing_ = true;
      a = NextLocked();
    }
    Run(a);
  }

  bool finished() const {
    absl::MutexLock l(&mu_);
    return done_ || finishing_;
  }

  void OnWriteDone(bool ok) override {
    Action a;
    {
      absl::MutexLock l(&mu_);
      writing_ = false;
      if (!queue_.empty()) queue_.pop_front();
      if (!ok) {
        finishing_ = true;
        queue_.clear();
        final_status_ = grpc::Status::CANCELLED;
      }
      a = NextLocked();
    }
    Run(a);
  }

  void OnCancel() override {
    Action a;
    {
      absl::MutexLock l(&mu_);
      finishing_ = true;
      DropQueuedLocked();
      final_status_ = grpc::Status::CANCELLED;
      a = NextLocked();
    }
    Run(a);
  }

  void OnDone() override {
    std::shared_ptr<QueuedWriteReactor> keep;
    {
      absl::MutexLock l(&mu_);
      done_ = true;
      keep = std::move(self_);
    }
    // `keep` may hold the last reference; this object can die on return.
  }

  // Ends the stream at once with `st` (used when Watch is refused).
  void FinishNow(const grpc::Status& st) {
    {
      absl::MutexLock l(&mu_);
      finishing_ = true;
      finished_ = true;
    }
    this->Finish(st);
  }

 private:
  struct Action {
    const Msg* write = nullptr;
    bool finish = false;
    grpc::Status status;
  };

  // Drops queued events, except the one being written.
  void DropQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_) {
      queue_.erase(queue_.begin() + 1, queue_.end());
    } else {
      queue_.clear();
    }
  }

  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Action a;
    if (writing_ || finished_) return a;
    if (!queue_.empty()) {
      writing_ = true;
      a.write = &queue_.front();  // stable: deque front is not popped while writing_
    } else if (finishing_) {
      finished_ = true;
      a.finish = true;
      a.status = final_status_;
    }
    return a;
  }

  void Run(const Action& a) {
    if (a.write != nullptr) this->StartWrite(a.write);
    if (a.finish) this->Finish(a.status);
  }

  mutable absl::Mutex mu_;
  std::deque<Msg> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;  // no more events accepted
  bool finished_ ABSL_GUARDED_BY(mu_) = false;   // Finish called
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  std::shared_ptr<QueuedWriteReactor> self_ ABSL_GUARDED_BY(mu_);
};

}  // namespace podlink
