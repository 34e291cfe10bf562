// The TCP data server's writer of answers on one data connection
// (tcp/data_server.cc serves the frames; this writes what they answer).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/mesh/links/wire.h"

namespace podlink::mesh {

// An ACK frame of `st` for the request `tag` (its message cut to 4 KiB).
absl::Status SendAck(int fd, uint64_t tag, const absl::Status& st);

// Answers on a data connection. Only the serving thread writes: answers of
// forwarded requests, completed on a link thread of this relay, are queued
// here and the serving thread is woken to write them, so an upstream that
// reads slowly or not at all holds its own connection's thread and never a
// link thread that other nodes' traffic shares. The queue is bounded; past
// the bound, or when one write makes no progress for the io_timeout
// (SO_SNDTIMEO), the upstream is cut. Nothing is written once the serving
// thread has let the connection go (its descriptor is closed and its number
// may be reused).
class ConnWriter {
 public:
  static constexpr size_t kMaxQueued = 1024;  // answers waiting for the serving thread

  explicit ConnWriter(int fd);
  ~ConnWriter() { Close(); }
  absl::Status Ack(uint64_t tag, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Frame(const FrameHeader& h, const void* payload, size_t len) ABSL_LOCKS_EXCLUDED(mu_);
  // Held while the serving thread writes a frame in pieces.
  absl::Mutex& mu() ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // From any thread, never blocking on the socket: an answer (a DATA frame
  // with `payload`, or an ack of `st`) for the serving thread to write.
  // `after` runs once it is written or dropped.
  void Post(uint64_t tag, std::shared_ptr<char[]> payload, size_t len, absl::Status st, std::function<void()> after)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // The descriptor that becomes readable when answers are queued.
  int wake_fd() const { return wake_.get(); }
  // Serving thread: takes the wake-ups poll reported.
  void Drain();
  // Serving thread: writes the queued answers (no system call when there are
  // none: it runs before every frame).
  absl::Status Flush() ABSL_LOCKS_EXCLUDED(queue_mu_, mu_);
  // No more writes; what is queued is dropped.
  void Close() ABSL_LOCKS_EXCLUDED(queue_mu_, mu_);

 private:
  struct Answer {
    uint64_t tag = 0;
    std::shared_ptr<char[]> payload;  // a READ's bytes; null: an ack of st
    size_t len = 0;
    absl::Status st;
    std::function<void()> after;
  };
  absl::Mutex mu_;
  const int fd_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex queue_mu_;
  UniqueFd wake_;
  std::deque<Answer> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool queue_closed_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::atomic<size_t> queued_{0};  // queue_.size(), read without the lock
};

}  // namespace podlink::mesh
