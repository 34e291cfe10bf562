// The plugin's per-step trace (docs/nccl.md, "Where the time of a step
// goes"): with PODLINK_NCCL_STEP_TRACE=DIR, every send and receive of the
// podlink transport records CLOCK_MONOTONIC timestamps of its stages, and
// finalize (or process exit) writes them to DIR/podlink-steps.<host>.<pid>.<random>.tsv, one
// line per step, for tests/gpu/nccl_steps.py. The clock is the host's, so
// the two pods' files line up. Off (the default), a step costs one branch.
//
// Sender:   try     NCCL first asked to send this step (the receiver's
//                   clear-to-send may not be there yet)
//           post    the clear-to-send was there: the request was accepted
//           submit  the copy was queued on the relay ring
//           done    test() saw the relay's completion and published it
// Receiver: post    irecv published the clear-to-send
//           done    test() saw the sender's completion
#pragma once

#include <cstdint>

namespace podlink::ncclnet::trace {

struct Step {
  char kind = 's';    // 's' send, 'r' receive
  uint64_t conn = 0;  // the connection's control region export (both sides name it alike)
  uint64_t seq = 0;
  int index = 0;      // buffer of a grouped receive
  uint64_t size = 0;
  uint64_t t_try = 0, t_post = 0, t_submit = 0, t_done = 0;
};

// Reads PODLINK_NCCL_STEP_TRACE (once per init); PODLINK_NCCL_STEP_TRACE_MAX
// bounds the steps kept (default 262144; the first ones are kept).
void Configure();
bool On();
uint64_t Now();
void Record(const Step& s);
// Writes what was recorded since the last flush; called by finalize and at exit.
void Flush();

}  // namespace podlink::ncclnet::trace
