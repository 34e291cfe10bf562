// A callback answered exactly once, whoever ends up holding it (the engine's
// opens and the importer's fences: tasks queued on a peer's worker that may
// be dropped).
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace podlink::mesh {

// A callback answered exactly once: by a call, or — when the last holder
// lets go unanswered (a task dropped because the engine stopped, a peer
// evicted before its task ran) — with UNAVAILABLE and `dropped`. Shared by
// the tasks that may answer; never copied (a copy would answer too).
template <typename T>
class AnswerOnce {
 public:
  using Fn = std::function<void(absl::StatusOr<T>)>;
  AnswerOnce(Fn fn, std::string dropped) : fn_(std::move(fn)), dropped_(std::move(dropped)) {}
  AnswerOnce(const AnswerOnce&) = delete;
  AnswerOnce& operator=(const AnswerOnce&) = delete;
  ~AnswerOnce() {
    if (fn_) fn_(absl::UnavailableError(dropped_));
  }
  void operator()(absl::StatusOr<T> r) {
    Fn fn = std::move(fn_);
    fn_ = nullptr;
    if (fn) fn(std::move(r));
  }

 private:
  Fn fn_;
  const std::string dropped_;
};

}  // namespace podlink::mesh
