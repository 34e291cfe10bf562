// The TCP data server's writer of answers (conn_writer.h).
#include "daemon/mesh/tcp/conn_writer.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "common/log.h"

namespace podlink::mesh {
namespace {
const ComponentLog WriterLog("mesh");
}  // namespace

absl::Status SendAck(int fd, uint64_t tag, const absl::Status& st) {
  std::string text(st.message().substr(0, 4096));
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(FrameType::kAck);
  h.length = static_cast<uint32_t>(text.size());
  h.status = static_cast<int32_t>(st.code());
  h.tag = tag;
  return WriteFrame(fd, h, text.data(), text.size());
}

ConnWriter::ConnWriter(int fd) : fd_(fd), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

absl::Status ConnWriter::Ack(uint64_t tag, const absl::Status& st) {
  absl::MutexLock l(&mu_);
  if (closed_) return absl::UnavailableError("connection closed");
  return SendAck(fd_, tag, st);
}

absl::Status ConnWriter::Frame(const FrameHeader& h, const void* payload, size_t len) {
  absl::MutexLock l(&mu_);
  if (closed_) return absl::UnavailableError("connection closed");
  return WriteFrame(fd_, h, payload, len);
}

void ConnWriter::Post(uint64_t tag, std::shared_ptr<char[]> payload, size_t len, absl::Status st,
                      std::function<void()> after) {
  bool cut = false;
  {
    absl::MutexLock l(&queue_mu_);
    if (!queue_closed_ && queue_.size() < kMaxQueued) {
      queue_.push_back(Answer{tag, std::move(payload), len, std::move(st), std::move(after)});
      queued_.fetch_add(1, std::memory_order_release);
      uint64_t one = 1;
      (void)!::write(wake_.get(), &one, sizeof(one));
      return;
    }
    // The upstream has not taken kMaxQueued answers: it is cut, and the
    // serving thread ends (its read fails) and drops what is queued.
    cut = !queue_closed_;
    if (cut) ::shutdown(fd_, SHUT_RDWR);
  }
  if (cut) WriterLog()->warn("event=mesh_upstream_cut reason=\"{} answers not taken\"", kMaxQueued);
  if (after) after();
}

void ConnWriter::Drain() {
  uint64_t n;
  (void)!::read(wake_.get(), &n, sizeof(n));
}

absl::Status ConnWriter::Flush() {
  if (queued_.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  for (;;) {
    Answer a;
    {
      absl::MutexLock l(&queue_mu_);
      if (queue_.empty()) return absl::OkStatus();
      a = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    absl::Status io;
    if (a.payload != nullptr) {
      FrameHeader d{};
      d.magic = kFrameMagic;
      d.type = static_cast<uint16_t>(FrameType::kData);
      d.length = static_cast<uint32_t>(a.len);
      d.tag = a.tag;
      io = Frame(d, a.payload.get(), a.len);
    } else {
      io = Ack(a.tag, a.st);
    }
    if (a.after) a.after();
    if (!io.ok()) return io;
  }
}

void ConnWriter::Close() {
  {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }
  std::deque<Answer> dropped;
  {
    absl::MutexLock l(&queue_mu_);
    queue_closed_ = true;
    dropped.swap(queue_);
    queued_.store(0, std::memory_order_relaxed);
  }
  for (Answer& a : dropped) {
    if (a.after) a.after();
  }
}

}  // namespace podlink::mesh
