// Fuzzes the descriptor-channel codec (common/fd_channel.h) with whatever a
// hostile client can put on its channel: datagrams of any size, with 0..19
// descriptors attached, optionally with credentials and a closed peer.
//
// Input (every part may be cut short; a short record sends what is left):
//
//   byte 0   flags: bit 0 SO_PASSCRED on the receiver (adds an SCM_CREDENTIALS
//            message to every datagram); bit 1 close the sending end after
//            the last datagram (the receiver must then see EOF)
//   records  [h][len][len payload bytes], at most kMaxRecords:
//            h bits 0-1  descriptors attached (0..3)
//            h bit 2     16 more: overflows the receiver's control buffer
//            h bits 4-5  what is attached: /dev/null, a pipe, a memfd, or
//                        the receiving socket itself
//
// Every datagram is received with RecvFdMessage(dontwait=true), which must
// return exactly what the header promises for it: OK (and the descriptor)
// for a well-formed 32-byte message with at most one descriptor, NOT_FOUND
// for an empty one (indistinguishable from EOF on SOCK_SEQPACKET),
// INVALID_ARGUMENT otherwise. Each OK message is sent on through
// SendFdMessage and must come back the same. Afterwards the process must hold
// exactly the descriptors it held before: every received one closed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/fd_channel.h"
#include "common/unique_fd.h"

#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

constexpr size_t kMaxRecords = 32;
constexpr int kMaxFdsPerRecord = 3 + 16;

// Descriptors the process keeps open for the whole run, so attaching one
// opens nothing (the kernel duplicates it in flight).
struct Attachables {
  UniqueFd dev_null, pipe_read, pipe_write, memfd;
  Attachables() {
    dev_null.Reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
    int p[2];
    if (::pipe2(p, O_CLOEXEC) == 0) {
      pipe_read.Reset(p[0]);
      pipe_write.Reset(p[1]);
    }
    memfd.Reset(::memfd_create("podlink-fuzz", MFD_CLOEXEC));
    FUZZ_CHECK(dev_null && pipe_read && memfd, "cannot open the descriptors to attach: %s", std::strerror(errno));
  }
};

const Attachables& Fds() {
  static const Attachables* fds = new Attachables();
  return *fds;
}

struct Pair {
  UniqueFd tx, rx;
  Pair() {
    int sv[2];
    FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
               std::strerror(errno));
    tx.Reset(sv[0]);
    rx.Reset(sv[1]);
  }
};

// What RecvFdMessage must make of one datagram.
struct Sent {
  std::vector<uint8_t> payload;
  int fds = 0;
};

bool WellFormed(const Sent& s) {
  if (s.payload.size() != sizeof(FdMessage) || s.fds > 1) return false;
  FdMessage m;
  std::memcpy(&m, s.payload.data(), sizeof(m));
  return m.magic == kFdMagic && m.version == kFdVersion;
}

// Sends one datagram with `nfds` copies of `fd` attached; false if the kernel
// refused it (buffer full, too many descriptors in flight), which is fine.
bool SendRaw(int sock, const std::vector<uint8_t>& payload, int fd, int nfds) {
  iovec iov{const_cast<uint8_t*>(payload.data()), payload.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerRecord)] = {};
  if (nfds > 0) {
    mh.msg_control = ctrl;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    for (int i = 0; i < nfds; ++i) std::memcpy(CMSG_DATA(c) + i * sizeof(int), &fd, sizeof(int));
  }
  return ::sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(payload.size());
}

// An accepted message must survive SendFdMessage -> RecvFdMessage unchanged.
void CheckRoundTrip(const ReceivedMessage& got) {
  Pair p;
  absl::Status sent = SendFdMessage(p.tx.get(), got.msg, got.fd.get(), /*dontwait=*/true);
  FUZZ_CHECK(sent.ok(), "SendFdMessage: %s", sent.ToString().c_str());
  auto back = RecvFdMessage(p.rx.get(), /*dontwait=*/true);
  FUZZ_CHECK(back.ok() && back->has_value(), "round trip lost the message: %s",
             back.ok() ? "nothing queued" : back.status().ToString().c_str());
  FUZZ_CHECK(std::memcmp(&(*back)->msg, &got.msg, sizeof(FdMessage)) == 0, "round trip changed the message");
  FUZZ_CHECK((*back)->fd.valid() == got.fd.valid(), "round trip changed whether a descriptor came along");
}

void RunOne(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const uint8_t flags = data[0];
  ++data;
  --size;
  Pair p;
  if (flags & 1) {
    int on = 1;
    FUZZ_CHECK(::setsockopt(p.rx.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) == 0, "SO_PASSCRED: %s",
               std::strerror(errno));
  }
  std::vector<Sent> queued;
  while (size > 0 && queued.size() < kMaxRecords) {
    const uint8_t h = data[0];
    size_t len = size > 1 ? data[1] : 0;
    data += size > 1 ? 2 : 1;
    size -= size > 1 ? 2 : 1;
    len = std::min(len, size);
    Sent s;
    s.payload.assign(data, data + len);
    data += len;
    size -= len;
    s.fds = (h & 3) + ((h & 4) ? 16 : 0);
    const int kinds[] = {Fds().dev_null.get(), Fds().pipe_read.get(), Fds().memfd.get(), p.rx.get()};
    if (SendRaw(p.tx.get(), s.payload, kinds[(h >> 4) & 3], s.fds)) queued.push_back(std::move(s));
  }
  if (flags & 2) p.tx.Reset();

  for (size_t i = 0; i < queued.size(); ++i) {
    const Sent& s = queued[i];
    auto got = RecvFdMessage(p.rx.get(), /*dontwait=*/true);
    if (WellFormed(s)) {
      FUZZ_CHECK(got.ok(), "datagram %zu: well-formed message refused: %s", i, got.status().ToString().c_str());
      FUZZ_CHECK(got->has_value(), "datagram %zu: queued but not received", i);
      FUZZ_CHECK(std::memcmp(&(*got)->msg, s.payload.data(), sizeof(FdMessage)) == 0,
                 "datagram %zu: message bytes changed", i);
      FUZZ_CHECK((*got)->fd.valid() == (s.fds == 1), "datagram %zu: %d descriptors sent, fd valid=%d", i, s.fds,
                 (*got)->fd.valid());
      CheckRoundTrip(**got);
    } else if (s.payload.empty() && s.fds == 0) {
      FUZZ_CHECK(!got.ok() && got.status().code() == absl::StatusCode::kNotFound,
                 "datagram %zu: empty datagram not reported as EOF: %s", i,
                 got.ok() ? "OK" : got.status().ToString().c_str());
    } else {
      FUZZ_CHECK(!got.ok() && got.status().code() == absl::StatusCode::kInvalidArgument,
                 "datagram %zu (%zu bytes, %d fds) not refused as INVALID_ARGUMENT: %s", i, s.payload.size(), s.fds,
                 got.ok() ? "OK" : got.status().ToString().c_str());
    }
  }
  // Drained: nothing more queued, or EOF once the sender is gone.
  auto last = RecvFdMessage(p.rx.get(), /*dontwait=*/true);
  if (flags & 2) {
    FUZZ_CHECK(!last.ok() && last.status().code() == absl::StatusCode::kNotFound, "no EOF after the last datagram: %s",
               last.ok() ? "OK" : last.status().ToString().c_str());
  } else {
    FUZZ_CHECK(last.ok() && !last->has_value(), "more received than was sent: %s",
               last.ok() ? "a message" : last.status().ToString().c_str());
  }
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  podlink::Fds();  // opened once, before the first count
  const int before = OpenFdCount();
  podlink::RunOne(data, size);
  const int after = OpenFdCount();
  FUZZ_CHECK(after == before, "descriptor leak: %d open before this input, %d after", before, after);
  return 0;
}
