// The TCP transport's links to a peer: its data connections over every path,
// each dialed with a cookie from the peer's OpenLink; a connection that
// failed is dialed again over its path with a fresh cookie.
#include "daemon/mesh/tcp/tcp_connect.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/links/wire.h"
#include "daemon/mesh/tcp/admission.h"
#include "daemon/mesh/tcp/sockets.h"

namespace podlink::mesh {

namespace {
const ComponentLog ConnectLog("mesh");
}  // namespace

absl::Status TcpLinkMaker::Connect(const std::shared_ptr<Peer>& peer, const RemoteTarget& target,
                                   const std::vector<Path>& paths, std::shared_ptr<pb::Mesh::Stub> stub,
                                   const pb::HelloResponse& hello, bool* /*verbs_failed*/) {
  Peer& p = *peer;
  const std::string endpoint = HostPort(paths.front().remote, target.port);
  auto deadline = [this] { return absl::ToChronoTime(absl::Now() + options_.connect_timeout); };
  uint32_t per_path = options_.connections_per_path;
  pb::OpenLinkResponse link;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    pb::OpenLinkRequest req;
    req.set_connections(static_cast<uint32_t>(std::min<size_t>(64, paths.size() * per_path)));
    // Where its connections come from: each path binds its own local address.
    for (const Path& path : paths) {
      if (path.fallback || req.sources_size() >= static_cast<int>(DataAdmission::kMaxClaimedSources)) continue;
      std::string local = path.local.AddressText();
      if (std::find(req.sources().begin(), req.sources().end(), local) == req.sources().end()) {
        req.add_sources(std::move(local));
      }
    }
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub->OpenLink(&ctx, req, &link), target.node_name));
  }
  auto links = std::make_shared<PeerLinks>(target.node_name, options_.slice_bytes, options_.slices_in_flight,
                                           options_.answer_timeout, options_.zero_copy);
  int cookie = 0;
  absl::Status last;
  for (const Path& path : paths) {
    for (uint32_t i = 0; i < per_path && cookie < link.cookies_size(); ++i) {
      absl::StatusOr<UniqueFd> fd =
          DialData(path, link.data_port(), link.cookies(cookie++), links->instance(), options_.connect_timeout);
      if (fd.ok()) {
        links->AddConnection(*std::move(fd), PathName(path));
      } else {
        last = fd.status();
      }
    }
  }
  if (links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no data connection to node ", target.node_name, ": ", last.message()));
  }
  ConnectLog()->info("event=mesh_peer_connected node={} control={} paths={} connections={}", target.node_name, endpoint,
                     paths.size(), links->live());
  // A connection that fails later is dialed again over its path.
  links->set_on_down(RepairOnDown(peer, links, paths, link.data_port()));
  p.set_stub(std::move(stub));
  p.instance.store(hello.instance(), std::memory_order_release);
  p.set_links(std::move(links));
  return absl::OkStatus();
}

std::function<void(const std::string&)> TcpLinkMaker::RepairOnDown(const std::shared_ptr<Peer>& peer,
                                                                   const std::shared_ptr<PeerLinks>& links,
                                                                   const std::vector<Path>& paths, uint32_t data_port) {
  std::weak_ptr<PeerLinks> weak = links;
  RedoPath redo = [this, weak, data_port](const Path& path, const std::string& name, Peer& peer,
                                          pb::Mesh::Stub& stub) -> absl::Status {
    std::shared_ptr<PeerLinks> links = weak.lock();
    if (links == nullptr) return absl::OkStatus();
    pb::OpenLinkResponse link;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    pb::OpenLinkRequest req;
    req.set_connections(1);
    PODLINK_RETURN_IF_ERROR(FromGrpc(stub.OpenLink(&ctx, req, &link), peer.node()));
    if (link.cookies_size() != 1) return absl::UnavailableError("OpenLink returned no cookie");
    PODLINK_ASSIGN_OR_RETURN(UniqueFd fd,
                             DialData(path, data_port, link.cookies(0), links->instance(), absl::Seconds(2)));
    links->AddConnection(std::move(fd), name);
    return absl::OkStatus();
  };
  return RepairWithStub(*repairs_, peer, links, std::move(redo), paths);
}

absl::StatusOr<UniqueFd> TcpLinkMaker::DialData(const Path& path, uint32_t port, const std::string& cookie,
                                                uint64_t link_instance, absl::Duration timeout) const {
  if (cookie.size() != kCookieBytes) return absl::UnavailableError("the peer issued a malformed link cookie");
  PODLINK_ASSIGN_OR_RETURN(UniqueFd fd, Dial(path, static_cast<uint16_t>(port), timeout));
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.type = static_cast<uint16_t>(FrameType::kAuth);
  h.length = kCookieBytes;
  h.grant = link_instance;
  PODLINK_RETURN_IF_ERROR(WriteFrame(fd.get(), h, cookie.data(), cookie.size()));
  TuneDataSocket(fd.get(), options_.io_timeout);
  return fd;
}

}  // namespace podlink::mesh
