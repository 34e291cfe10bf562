#include "client-lib/nccl/comm.h"

#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/plugin.h"

namespace podlink::ncclnet {

bool Mr::Covers(const void* p, size_t n) const {
  const char* q = static_cast<const char*>(p);
  return n == 0 || (q >= base && n <= size && static_cast<size_t>(q - base) <= size - n);
}

void Request::Post(int count, void** buffers, const size_t* sizes, Mr** mrs) {
  n = count;
  for (int i = 0; i < count; ++i) {
    data[i] = buffers[i];
    posted[i] = sizes[i];
    mr[i] = mrs[i];
  }
}

Comm::Comm(bool send, int dev, std::string peer, UniqueFd ctrl)
    : send(send), dev(dev), peer(std::move(peer)), ctrl(std::move(ctrl)), copies_(GpuOf(dev)) {}

Comm::~Comm() { magic = 0; }

Comm::LiveCount::LiveCount() {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  s.live_comms++;
}

Comm::LiveCount::~LiveCount() {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  s.live_comms--;
}

size_t Comm::Truncate(size_t size, size_t room) {
  if (!warned_truncation_) {
    warned_truncation_ = true;
    INFO("send of %zu bytes to %s truncated to the posted receive of %zu bytes (further truncations not logged)",
         size, peer.c_str(), room);
  }
  return room;
}

Result Comm::FailComm(Result r, const std::string& why) {
  failed = r;
  return Fail(r, absl::StrCat("connection with ", peer, ": ", why));
}

Comm* AsComm(void* p, bool send) {
  auto* c = static_cast<Comm*>(p);
  if (c == nullptr || c->magic != kCommMagic || c->send != send) return nullptr;
  return c;
}

Result MatchTag(const int32_t* tags, uint32_t n, uint32_t consumed, int tag, const std::string& peer, int* index) {
  for (uint32_t i = 0; i < n; ++i) {
    if ((consumed & (1u << i)) == 0 && tags[i] == tag) {
      *index = static_cast<int>(i);
      return nccl_abi::kSuccess;
    }
  }
  return Fail(nccl_abi::kInvalidUsage,
              absl::StrCat("send with tag ", tag, " to ", peer, " does not match the posted receive"));
}

}  // namespace podlink::ncclnet
