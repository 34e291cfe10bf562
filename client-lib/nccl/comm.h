// The objects NCCL holds handles to: registered memory (Mr), requests and
// comms. Comm is the transport interface: the API layer (api.cc) checks
// NCCL's arguments, then calls these virtuals; each transport is one class
// (transport_tcp.*, transport_podlink.*) and transports.cc is the one place
// that chooses and makes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "client-lib/nccl/api.h"
#include "client-lib/nccl/gpu_staging.h"
#include "client-lib/nccl/wire.h"
#include "common/unique_fd.h"

namespace podlink::ncclnet {

constexpr uint32_t kCommMagic = 0x4d4d4f43;  // "COMM"
constexpr uint32_t kMrMagic = 0x5247454d;    // "MEGR"
constexpr int kMaxRequests = nccl_abi::kMaxRequests;

class Comm;

// Memory NCCL registered on a comm. A transport that needs more (the
// podlink transport's export) derives from it; deleting it undoes the
// registration.
struct Mr {
  virtual ~Mr() = default;
  uint32_t magic = kMrMagic;
  Comm* comm = nullptr;
  char* base = nullptr;
  size_t size = 0;
  int type = 0;  // nccl_abi::kPtrHost or kPtrCuda
  // [p, p + n) lies inside the registration.
  bool Covers(const void* p, size_t n) const;
};

// One send, or one (grouped) receive. Transports derive their own with what
// they track per operation; each comm owns a fixed array of them.
struct Request {
  Comm* comm = nullptr;
  bool in_use = false;
  bool send = false;
  uint64_t seq = 0;
  int n = 1;
  Result error = nccl_abi::kSuccess;
  // send
  int index = 0;  // which buffer of the peer's grouped receive
  size_t size = 0;
  // receive
  void* data[kMaxRecvs] = {};
  size_t posted[kMaxRecvs] = {};
  size_t got[kMaxRecvs] = {};
  Mr* mr[kMaxRecvs] = {};
  void Post(int count, void** buffers, const size_t* sizes, Mr** mrs);
};

class Comm {
 public:
  Comm(bool send, int dev, std::string peer, UniqueFd ctrl);
  virtual ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  virtual TransportId id() const = 0;
  // For the connection log line ("podlink (...)", "TCP, 4 data sockets").
  virtual std::string Describe() const = 0;
  // Connection set-up after the sockets are grouped: the receiver fills in
  // its welcome, the sender reads it.
  virtual Result SetupReceiver(Welcome& w) = 0;
  virtual Result SetupSender(const Welcome& w) = 0;
  // A registration of [data, data + size) of memory `type` (host or CUDA).
  virtual Result RegMr(void* data, size_t size, int type, Mr** mr) = 0;
  // NCCL's isend/irecv/test, arguments already checked; *request stays null
  // when the operation cannot start now.
  virtual Result Isend(void* data, size_t size, int tag, Mr* mr, void** request) = 0;
  virtual Result Irecv(int n, void** data, const size_t* sizes, const int* tags, Mr** mrs, void** request) = 0;
  virtual Result Test(Request& r, int* done, int* sizes) = 0;

  uint32_t magic = kCommMagic;
  const bool send;
  const int dev;
  const std::string peer;  // for messages
  UniqueFd ctrl;           // the control socket (EOF: the peer went away)
  Result failed = nccl_abi::kSuccess;

 protected:
  // A send larger than the posted receive delivers what fits, as NCCL's own
  // IB transport does (NCCL 2.28 posts such sends: a receive sized for one
  // protocol's step may meet a larger send). Logged once per comm.
  size_t Truncate(size_t size, size_t room);
  // Marks the comm failed with `r` and logs why.
  Result FailComm(Result r, const std::string& why);

 private:
  // Counts the comm in State::live_comms from before its copy stream exists
  // until after it is gone: the last finalize destroys the copy contexts
  // once the count is zero. Declared before copies_, so destroyed after it.
  struct LiveCount {
    LiveCount();
    ~LiveCount();
  } live_;

 protected:
  CopyStream copies_;  // bounce and staging copies, in the plugin's copy context

 private:
  bool warned_truncation_ = false;
};

// The requests of one comm, of the transport's request type.
template <typename Req>
class RequestSlots {
 public:
  // A free request (the one at `slot` when given), reset, or nullptr.
  Req* Take(Comm* owner, int slot = -1) {
    for (int i = slot >= 0 ? slot : 0; i < (slot >= 0 ? slot + 1 : kMaxRequests); ++i) {
      Req& r = reqs_[i];
      if (r.in_use) continue;
      r = Req();
      r.comm = owner;
      r.in_use = true;
      return &r;
    }
    return nullptr;
  }
  Req& at(int i) { return reqs_[i]; }
  bool AnyInUse() const {
    for (const Req& r : reqs_) {
      if (r.in_use) return true;
    }
    return false;
  }
  template <typename F>
  void ForEachInUse(F&& f) {
    for (Req& r : reqs_) {
      if (r.in_use) f(r);
    }
  }

 private:
  Req reqs_[kMaxRequests];
};

// The comm behind an NCCL handle, or nullptr when it is not a live comm of
// that direction.
Comm* AsComm(void* p, bool send);

// The buffer of a clear-to-send entry a send with `tag` goes to: the first
// one not yet consumed with that tag (NCCL matches grouped receives by tag).
Result MatchTag(const int32_t* tags, uint32_t n, uint32_t consumed, int tag, const std::string& peer, int* index);

}  // namespace podlink::ncclnet
