// The soak's worker: the program running inside one "pod". It holds one
// podlink session with a relay engine and obeys one JSON command per line on
// stdin, answering one JSON line per command on stdout:
//
//   {"op":"export","cycle":C,"slot":K,"size":S,"fresh":B,"seed":X[,"close_us":U]}
//       fills pool slot K (reallocated when fresh or of another size) with
//       seed X's pattern and registers it (exports it) -> {"ev":"exported","desc":...}
//   {"op":"import","cycle":C,"desc":D,"base":X,"ops":[[t,off,len,loff,seed],...],"drop":B[,"close_us":U]}
//       opens the peer's region (import, relay transport), runs the relay
//       reads ("r": checked against a model of the region) and writes ("w"),
//       notifies the owner with C, closes the region; with drop, imports it
//       once more, maps it, checks every byte through the mapping and
//       forgets it without releasing -> {"ev":"imported","mismatch":N,...}
//   {"op":"release","cycle":C,"verify":B,"writes":[[off,len,seed],...][,"exit_offers":N,"exit_ack":B][,"close_us":U]}
//       checks the notification and every byte of the region against the
//       writes, withdraws the export -> {"ev":"released",...}; with
//       exit_offers, instead of withdrawing: offers N memfds on a second
//       descriptor channel and exits with them (and the export) outstanding
//   {"op":"offer-exit","n":N,"ack":B}   the same exit, from any state
//   {"op":"exit"}                       clean teardown -> {"ev":"bye"}
//
// close_us: a thread shuts down this process's sockets to podlinkd U
// microseconds after the command starts (a session closed mid-call); the
// worker then opens a fresh session and answers with "reset":true. If a relay
// transfer was in flight when the session went, the worker answers with
// "abandoned":true and exits (its engine would wait for a completion that
// never comes); the driver restarts it.
#pragma once

#include <cstdint>

namespace podlink::soak {

struct WorkerOptions {
  int pod = 0;
  uint64_t max_op = 4 << 20;  // staging buffer: the largest transfer
  int relay_timeout_s = 30;   // a transfer not complete by then is an error
};

int RunWorker(const WorkerOptions& options);

}  // namespace podlink::soak
