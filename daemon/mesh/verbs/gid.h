// Which RDMA device, port and GID index carry a mesh path: the GID that is
// the path's local IP address (IPv4 as ::ffff:a.b.c.d), RoCE v2 before
// RoCE v1, read from sysfs (/sys/class/infiniband/<dev>/ports/<p>/gids/<i>,
// gid_attrs/types/<i>, gid_attrs/ndevs/<i>) as rdma-core's tools do. Pure
// file reading, so tests run it on fake trees.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/mesh/routing/addresses.h"

namespace podlink::mesh::verbs {

struct GidChoice {
  std::string device;  // "rxe0", "mlx5_0"
  uint8_t port = 1;
  int index = -1;
  std::array<uint8_t, 16> gid{};
  std::string netdev;  // gid_attrs/ndevs, when the kernel says
  bool roce_v2 = false;
};

// The GID of `local` (its address, not its prefix) under `sysfs_class`
// (normally "/sys/class/infiniband"). `index_override` >= 0 takes that
// index on the device whose GID table holds the address anyway.
// NOT_FOUND names the address and what was seen.
absl::StatusOr<GidChoice> ChooseGid(const std::string& sysfs_class, const IpPrefix& local, int index_override = -1);

// "fe80:0000:...:0100" (sysfs's form) to bytes.
absl::StatusOr<std::array<uint8_t, 16>> ParseGid(const std::string& text);

}  // namespace podlink::mesh::verbs
