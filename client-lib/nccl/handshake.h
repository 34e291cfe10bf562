// Connection set-up of the NCCL net plugin: listen writes a handle, connect
// opens the sockets and says hello, accept groups a connector's sockets and
// welcomes it. Non-blocking throughout: NCCL calls connect and accept again
// until they hand out a comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "client-lib/nccl/net_socket.h"
#include "client-lib/nccl/wire.h"
#include "common/unique_fd.h"

namespace podlink::ncclnet {

constexpr uint32_t kListenMagic = 0x4e54534c;  // "LSTN"

struct Listener {
  uint32_t magic = kListenMagic;
  int dev = 0;
  UniqueFd fd;
  uint64_t nonce = 0;
  struct Pending {
    UniqueFd fd;
    Hello hello{};
    size_t got = 0;
  };
  std::vector<Pending> pending;
  std::map<uint64_t, std::vector<Pending>> groups;  // conn_id -> sockets with a valid hello
};

struct Connecting {
  uint64_t cookie = 0;
  TransportId transport = TransportId::kTcp;
  SockAddr to;
  std::vector<UniqueFd> fds;  // [0] control
  std::vector<bool> hello_sent;
  Hello hello{};
  Welcome welcome{};
  size_t welcome_got = 0;
};

// Writes all of a small message to a non-blocking socket (bounded retries).
bool WriteAll(int fd, const void* p, size_t n);

// The steps behind NCCL's listen, connect, accept and closeListen; api.cc
// checks the arguments first (`h` is a well-formed listen handle).
Result StartListen(int dev, void* handle, void** listen_comm);
Result ConnectStep(int dev, WireHandle* h, void** send_comm);
Result AcceptStep(Listener* lc, void** recv_comm);
void CloseListener(Listener* lc);

}  // namespace podlink::ncclnet
