// The TCP transport's LinkMaker (control/link_maker.h): a peer's data
// connections over every path, each dialed with a one-use cookie from the
// peer's OpenLink and authenticated by its first frame (wire.h); a connection
// that fails is dialed again over its path with a fresh cookie.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/mesh/control/link_maker.h"
#include "daemon/mesh/tcp/tcp_link.h"

namespace podlink::mesh {

class TcpLinkMaker final : public LinkMaker {
 public:
  struct Options {
    uint32_t connections_per_path = 4;
    uint64_t slice_bytes = 512 << 10;
    uint32_t slices_in_flight = 4;  // per connection
    absl::Duration answer_timeout = absl::Seconds(30);
    bool zero_copy = true;
    absl::Duration connect_timeout = absl::Seconds(5);
    absl::Duration io_timeout = absl::Seconds(5);  // TCP_USER_TIMEOUT and keepalive on each connection
  };
  // `repairs` outlives this.
  TcpLinkMaker(Options options, Repairs* repairs) : options_(options), repairs_(repairs) {}

  absl::Status Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target, const std::vector<Path>& paths,
                       std::shared_ptr<pb::Mesh::Stub> stub, const pb::HelloResponse& hello,
                       bool* verbs_failed) override;
  bool carries_relayed_grants() const override { return true; }
  bool stripes_two_hop() const override { return true; }

  // A data connection over `path` to `port`, AUTH sent with `cookie` for the
  // link set `link_instance`.
  absl::StatusOr<UniqueFd> DialData(const Path& path, uint32_t port, const std::string& cookie, uint64_t link_instance,
                                    absl::Duration timeout) const;

 private:
  // A failed connection of `links` dialed again over its path (a fresh cookie from the peer).
  std::function<void(const std::string&)> RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                       const std::shared_ptr<PeerLinks>& links,
                                                       const std::vector<Path>& paths, uint32_t data_port);

  const Options options_;
  Repairs* const repairs_;
};

}  // namespace podlink::mesh
