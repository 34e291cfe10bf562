#include "daemon/mesh/links/slices.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/mesh/links/nic_rank.h"

namespace podlink::mesh {

SliceScheduler::SliceScheduler(absl::Mutex* mu, Options options, std::function<bool()> can_queue,
                               std::function<void()> wake, std::string unavailable)
    : mu_(mu),
      options_(options),
      can_queue_(std::move(can_queue)),
      wake_(std::move(wake)),
      unavailable_(std::move(unavailable)) {}

absl::Status SliceScheduler::Cut(std::shared_ptr<Transfer> t, uint64_t slice_bytes) {
  if (slice_bytes == 0) return absl::InvalidArgumentError("slice size must be > 0");
  const LinkOp& op = t->op;
  uint64_t n = 1;
  if (op.type != FrameType::kNotify) {
    if (op.length == 0 && !options_.empty_is_one_slice) return absl::InvalidArgumentError("length must be > 0");
    n = op.length == 0 ? 1 : op.length / slice_bytes + (op.length % slice_bytes != 0 ? 1 : 0);
  }
  // Slice indices fit 32 bits beside the op's number in a tag (TCP), the largest kept for the DONE record.
  if (n >= kDoneSliceIndex) return absl::InvalidArgumentError("transfer too large for one mesh operation");
  t->slices = n;
  t->remaining.store(n, std::memory_order_relaxed);
  t->number = next_number_++;
  // The low 32 bits go into TCP's tags, where 0 is never a transfer.
  if (static_cast<uint32_t>(next_number_) == 0) ++next_number_;
  for (uint64_t i = 0; i < n; ++i) {
    Slice s;
    s.op = t;
    s.index = static_cast<uint32_t>(i);
    if (op.type != FrameType::kNotify) {
      s.offset = i * slice_bytes;
      s.length = std::min(slice_bytes, op.length - std::min(op.length, s.offset));
    }
    queue_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

std::optional<Slice> SliceScheduler::Next(const std::function<Verdict(const Slice&)>& choose, size_t* resume) {
  size_t seen = resume != nullptr ? std::min(*resume, queue_.size()) : 0;
  for (auto it = queue_.begin() + static_cast<std::ptrdiff_t>(seen); it != queue_.end() && seen < options_.scan;
       ++it, ++seen) {
    switch (choose(*it)) {
      case Verdict::kTake: {
        Slice s = std::move(*it);
        queue_.erase(it);
        if (resume != nullptr) *resume = seen;  // the slices before it were skipped
        return s;
      }
      case Verdict::kSkip:
        continue;
      case Verdict::kStop:
        if (resume != nullptr) *resume = seen;
        return std::nullopt;
    }
  }
  if (resume != nullptr) *resume = seen;
  return std::nullopt;
}

bool SliceScheduler::MayCarry(const Slice& s, const std::string& path, const std::set<std::string>& up) {
  return s.done_record || MayUse(s.op->op.prefer.get(), s.op->slices == 1, path, up);
}

void SliceScheduler::Sent(Slice& s, std::optional<absl::Time> now) {
  ++s.attempts;
  if (now.has_value()) s.sent = *now;
}

bool SliceScheduler::Resend(Slice s, bool mark_resent, bool nothing_left) {
  if (nothing_left || s.attempts >= options_.max_attempts) return false;
  if (mark_resent) s.op->resent.store(true, std::memory_order_release);
  queue_.push_front(std::move(s));
  return true;
}

std::vector<Slice> SliceScheduler::TakeAll() {
  std::vector<Slice> all(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  return all;
}

void SliceScheduler::Settle(const Slice& s, const absl::Status& st) {
  Transfer& op = *s.op;
  if (!st.ok()) {
    absl::MutexLock l(&op.mu);
    if (op.first_error.ok()) op.first_error = st;
  }
  if (op.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  absl::Status result;
  {
    absl::MutexLock l(&op.mu);
    result = op.first_error;
  }
  if ((result.ok() || options_.done_after_failure) && op.resent.load(std::memory_order_acquire) && !op.done_sent) {
    // Every slice was answered, but a copy of one may still be on its way
    // from an attempt whose carrier failed: the owner answers the DONE
    // record once no such copy can land any more (it drops later ones), and
    // only then is the op reported — its own result kept.
    op.done_sent = true;
    op.remaining.store(1, std::memory_order_release);
    Slice d;
    d.op = s.op;
    d.done_record = true;
    bool queued = false;
    {
      absl::MutexLock l(mu_);
      if (can_queue_()) {
        queue_.push_front(std::move(d));
        queued = true;
      }
    }
    if (queued) {
      wake_();
      return;
    }
    if (result.ok()) result = absl::UnavailableError(unavailable_);
  }
  if (op.op.done) op.op.done(result);
}

}  // namespace podlink::mesh
