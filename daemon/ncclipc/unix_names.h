// Abstract Unix datagram socket names: NCCL's IPC socket names, listing the
// names bound in a network namespace (sock_diag), and making sockets inside
// another network namespace.
//
// NCCL (2.19 to 2.29, src/misc/ipcsocket.cc) binds SOCK_DGRAM sockets to the
// abstract name "\0tmp/nccl-socket-<rank>-<hex hash>", zero-padded to the whole
// 108-byte sun_path, and passes cuMem POSIX-FD handles over them with
// SCM_RIGHTS. Abstract names belong to one network namespace.
#pragma once

#include <linux/netlink.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace podlink::ncclipc {

// An abstract name exactly as bound: the sun_path bytes (starting with the
// NUL) up to the address length.
using UnixName = std::string;

// True for NCCL's IPC socket names and nothing else: "\0tmp/nccl-socket-",
// decimal rank, '-', lower-case hex, then only NUL bytes, at most 108 bytes.
bool IsNcclIpcName(const UnixName& name);

// "@tmp/nccl-socket-0-1a2b" for logs (the NUL padding dropped).
std::string Printable(const UnixName& name);

struct BoundName {
  uint64_t inode = 0;
  UnixName name;
};

// Every SOCK_DGRAM Unix socket bound to an abstract name in the network
// namespace `diag_fd` was made in (a NETLINK_SOCK_DIAG socket), with its inode.
absl::StatusOr<std::vector<BoundName>> ListAbstractDgramNames(int diag_fd);

// Makes sockets in other network namespaces: setns on the calling thread,
// socket(), setns back. Call only from a thread that does nothing else in
// between (the bridge's own thread).
class NetnsSockets {
 public:
  // Remembers the calling thread's network namespace as "home".
  static absl::StatusOr<NetnsSockets> Create();
  // A socket of (domain, type) in the network namespace `netns_fd`.
  absl::StatusOr<UniqueFd> Socket(int netns_fd, int domain, int type, int protocol) const;
  // A NETLINK_SOCK_DIAG socket of `netns_fd`'s namespace.
  absl::StatusOr<UniqueFd> DiagSocket(int netns_fd) const {
    return Socket(netns_fd, AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG);
  }
  int home() const { return home_.get(); }

 private:
  explicit NetnsSockets(UniqueFd home) : home_(std::move(home)) {}
  UniqueFd home_;
};

// The inode of a namespace file (its identity).
absl::StatusOr<uint64_t> NamespaceInode(int ns_fd);

}  // namespace podlink::ncclipc
