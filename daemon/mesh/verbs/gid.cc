#include "daemon/mesh/verbs/gid.h"

#include <dirent.h>
#include <sys/socket.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace podlink::mesh::verbs {
namespace {

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// The first line; empty when unreadable (sysfs answers EINVAL for unused
// GID entries' attributes).
std::string ReadLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return {};
  return std::string(absl::StripAsciiWhitespace(line));
}

std::array<uint8_t, 16> GidOf(const IpPrefix& a) {
  std::array<uint8_t, 16> g{};
  if (a.family == AF_INET) {
    g[10] = 0xff;
    g[11] = 0xff;
    std::copy(a.addr.begin(), a.addr.begin() + 4, g.begin() + 12);
  } else {
    g = a.addr;
  }
  return g;
}

}  // namespace

absl::StatusOr<std::array<uint8_t, 16>> ParseGid(const std::string& text) {
  std::vector<std::string> groups = absl::StrSplit(text, ':');
  if (groups.size() != 8) return absl::InvalidArgumentError(absl::StrCat("not a GID: '", text, "'"));
  std::array<uint8_t, 16> g{};
  for (size_t i = 0; i < 8; ++i) {
    uint32_t v = 0;
    if (groups[i].empty() || groups[i].size() > 4 || !absl::SimpleHexAtoi(groups[i], &v)) {
      return absl::InvalidArgumentError(absl::StrCat("not a GID: '", text, "'"));
    }
    g[2 * i] = static_cast<uint8_t>(v >> 8);
    g[2 * i + 1] = static_cast<uint8_t>(v);
  }
  return g;
}

absl::StatusOr<GidChoice> ChooseGid(const std::string& sysfs_class, const IpPrefix& local, int index_override) {
  const std::array<uint8_t, 16> want = GidOf(local);
  std::vector<std::string> seen;
  std::optional<GidChoice> best;
  for (const std::string& dev : List(sysfs_class)) {
    const std::string ports = absl::StrCat(sysfs_class, "/", dev, "/ports");
    for (const std::string& port : List(ports)) {
      uint32_t port_num = 0;
      if (!absl::SimpleAtoi(port, &port_num) || port_num == 0 || port_num > 255) continue;
      const std::string base = absl::StrCat(ports, "/", port);
      for (const std::string& idx : List(base + "/gids")) {
        int index = 0;
        if (!absl::SimpleAtoi(idx, &index) || index < 0) continue;
        absl::StatusOr<std::array<uint8_t, 16>> gid = ParseGid(ReadLine(absl::StrCat(base, "/gids/", idx)));
        if (!gid.ok() || *gid != want) continue;
        std::string type = ReadLine(absl::StrCat(base, "/gid_attrs/types/", idx));
        GidChoice c;
        c.device = dev;
        c.port = static_cast<uint8_t>(port_num);
        c.index = index;
        c.gid = *gid;
        c.netdev = ReadLine(absl::StrCat(base, "/gid_attrs/ndevs/", idx));
        c.roce_v2 = absl::AsciiStrToLower(type) == "roce v2";
        seen.push_back(absl::StrCat(dev, ":", port, " index ", index, " (", type.empty() ? "?" : type, ")"));
        if (!best || (c.roce_v2 && !best->roce_v2) || (c.roce_v2 == best->roce_v2 && c.index < best->index &&
                                                       c.device == best->device)) {
          best = c;
        }
      }
    }
  }
  if (!best) {
    return absl::NotFoundError(absl::StrCat("no RDMA device under ", sysfs_class, " has a GID for ",
                                            local.AddressText(),
                                            " (is an RDMA device, e.g. rdma link add rxe0 type rxe netdev ",
                                            local.netdev.empty() ? "<netdev>" : local.netdev, ", on that netdev?)"));
  }
  if (index_override >= 0) {
    const std::string base = absl::StrCat(sysfs_class, "/", best->device, "/ports/", int{best->port});
    absl::StatusOr<std::array<uint8_t, 16>> gid = ParseGid(ReadLine(absl::StrCat(base, "/gids/", index_override)));
    if (!gid.ok() || *gid == std::array<uint8_t, 16>{}) {
      return absl::NotFoundError(absl::StrCat("GID index ", index_override, " of ", best->device, " port ",
                                              int{best->port}, " is empty"));
    }
    best->index = index_override;
    best->gid = *gid;
    best->roce_v2 = absl::AsciiStrToLower(ReadLine(absl::StrCat(base, "/gid_attrs/types/", index_override))) ==
                    "roce v2";
  }
  return *best;
}

}  // namespace podlink::mesh::verbs
