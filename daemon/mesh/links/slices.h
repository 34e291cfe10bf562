// What every mesh transport does with an operation, written once: cut it
// into slices, hand the slices to whichever connection or queue pair may
// carry them (its path preference, nic_rank.h), put back the slices of a
// connection that failed (at most `max_attempts` sends each), settle each
// slice with the first error winning, and — when some slice went out twice —
// end the operation with a DONE record before reporting it, so the owner can
// drop a late copy (wire.h).
//
// The scheduler holds the queue; the link set that owns it holds the lock:
// every call but Settle is made with that lock (`mu`) held. Settle is called
// without it, by whichever thread finishes a slice.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/mesh/links/links.h"

namespace podlink::mesh {

// The largest slice index is never a slice's: an op has fewer slices, and TCP's tags give it to the DONE record.
inline constexpr uint32_t kDoneSliceIndex = 0xffffffff;

// One operation, shared by its slices. A transport may derive from it to keep
// what its slices need (verbs: the local memory's registrations).
struct Transfer {
  virtual ~Transfer() = default;
  LinkOp op;
  uint64_t slices = 0;  // how many it was cut into
  uint64_t number = 0;  // the link set's number for it (tags, staged records)
  std::atomic<uint64_t> remaining{0};
  // A slice went out again after its carrier failed: an earlier copy may
  // still land at the owner, so a DONE record ends the operation.
  std::atomic<bool> resent{false};
  bool done_sent = false;  // only the thread settling the last slice reads and sets it
  absl::Mutex mu;
  absl::Status first_error ABSL_GUARDED_BY(mu);
};

struct Slice {
  std::shared_ptr<Transfer> op;
  uint32_t index = 0;        // within the op
  uint64_t offset = 0;       // within the op
  uint64_t length = 0;
  uint32_t attempts = 0;     // sends so far (Sent)
  bool done_record = false;  // not a slice of bytes: the DONE record ending the op
  absl::Time sent;           // when it last went out (Sent with the time; a transport that keeps its own leaves it)
};

class SliceScheduler {
 public:
  struct Options {
    uint32_t max_attempts = 3;
    // A DONE record also after a failed op (verbs' staged writes: the next
    // write to those bytes must not be overwritten by a late copy), or only
    // before reporting success (TCP).
    bool done_after_failure = false;
    // A write or read of 0 bytes is one empty slice (TCP) or refused (verbs).
    bool empty_is_one_slice = true;
    // How far into the queue a carrier looks for a slice it may take: a
    // slice that prefers other paths waits near the front for them.
    size_t scan = 256;
  };
  enum class Verdict { kTake, kSkip, kStop };

  // `mu`: the owning link set's lock. `can_queue`: with `mu` held, whether
  // anything can still carry a slice (a DONE record is queued only then).
  // `wake`: called without the lock after a DONE record was queued.
  // `unavailable`: the error of an op whose DONE record nothing could carry.
  SliceScheduler(absl::Mutex* mu, Options options, std::function<bool()> can_queue, std::function<void()> wake,
                 std::string unavailable);

  const Options& options() const { return options_; }

  // Cuts `t` (its op set) into slices of at most `slice_bytes` and queues
  // them; a notification is one slice. Numbers it. INVALID_ARGUMENT: an op
  // of 0 bytes where refused, or more slices than a tag can count.
  absl::Status Cut(std::shared_ptr<Transfer> t, uint64_t slice_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The first queued slice, within the scan, that `choose` takes (DONE
  // records and slices alike are offered): kTake hands it out, kSkip looks
  // further, kStop ends the look (nothing can carry more now).
  // `resume`, where a caller takes several slices under one hold of `mu` and
  // a slice it skipped stays skipped (its carriers' room only shrinks): where
  // to start looking, moved past the slices skipped for the next call.
  std::optional<Slice> Next(const std::function<Verdict(const Slice&)>& choose, size_t* resume = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether path `path` may carry `s` (nic_rank.h MayUse; DONE records go
  // anywhere), given the paths up now.
  static bool MayCarry(const Slice& s, const std::string& path, const std::set<std::string>& up);

  // A slice goes out: counts the attempt, and stamps `now` where a transport times slices by it (TCP's ACK
  // timeout; verbs keeps its own clock per work request and passes nothing).
  static void Sent(Slice& s, std::optional<absl::Time> now = std::nullopt);
  // A slice whose carrier failed: queued first in line again unless it was
  // sent `max_attempts` times already or `nothing_left` (returned false:
  // the caller settles it with the failure). `mark_resent`: an earlier copy
  // may land late, so the op will end with a DONE record.
  bool Resend(Slice s, bool mark_resent, bool nothing_left) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Everything queued, taken out (nothing can carry it any more).
  std::vector<Slice> TakeAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t queued() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.size(); }

  // Settles slice `s` with `st` (without the lock). The op's last slice
  // reports it through its `done`, with its first error — or, where a slice
  // was resent, first queues the DONE record, whose settling reports it.
  void Settle(const Slice& s, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex* const mu_;
  const Options options_;
  const std::function<bool()> can_queue_;
  const std::function<void()> wake_;
  const std::string unavailable_;
  std::deque<Slice> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace podlink::mesh
