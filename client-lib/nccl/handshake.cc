#include "client-lib/nccl/handshake.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "client-lib/nccl/comm.h"
#include "client-lib/nccl/plugin.h"
#include "client-lib/nccl/transports.h"

namespace podlink::ncclnet {

bool WriteAll(int fd, const void* p, size_t n) {
  const char* q = static_cast<const char*>(p);
  for (int spins = 0; n > 0 && spins < 100000; ++spins) {
    auto r = SendSome(fd, q, n);
    if (!r.ok()) return false;
    q += *r;
    n -= *r;
  }
  return n == 0;
}

Result StartListen(int dev, void* handle, void** listen_comm) {
  State& s = S();
  SockAddr addr;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.refs == 0) return Fail(kInvalidUsage, "listen before init");
    addr = s.listen_addr;
  }
  auto fd = ListenOn(addr);
  if (!fd.ok()) return FailStatus(kSystemError, "listen", fd.status());
  auto* lc = new Listener();
  lc->dev = dev;
  lc->fd = *std::move(fd);
  lc->nonce = Random64();
  WireHandle h{};
  h.magic = kHandleMagic;
  h.version = kWireVersion;
  h.family = AF_INET;
  auto* in = reinterpret_cast<sockaddr_in*>(&addr.ss);
  std::memcpy(h.addr, &in->sin_addr, 4);
  h.port = in->sin_port;
  h.dev = static_cast<uint16_t>(dev);
  h.nonce = lc->nonce;
  {
    std::lock_guard<std::mutex> l(s.mu);
    std::snprintf(h.node_id, sizeof(h.node_id), "%s", s.node_id.c_str());
    if (!s.mesh_node.empty()) h.flags |= kHandleFlagMesh;
  }
  std::memset(handle, 0, nccl_abi::kHandleMaxSize);
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = lc;
  return kSuccess;
}

Result ConnectStep(int dev, WireHandle* h, void** send_comm) {
  State& s = S();
  void* handle = h;
  Connecting* st = nullptr;
  {
    std::lock_guard<std::mutex> l(s.mu);
    auto it = s.connecting.find(handle);
    if (it != s.connecting.end() && it->second->cookie == h->connect_cookie) st = it->second.get();
  }
  if (st == nullptr) {
    auto fresh = std::make_unique<Connecting>();
    fresh->cookie = Random64() | 1;
    h->connect_cookie = fresh->cookie;
    auto* in = reinterpret_cast<sockaddr_in*>(&fresh->to.ss);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, h->addr, 4);
    in->sin_port = h->port;
    fresh->to.len = sizeof(sockaddr_in);
    char peer_node[sizeof(h->node_id) + 1] = {};
    std::memcpy(peer_node, h->node_id, sizeof(h->node_id));
    int nsocks;
    {
      std::lock_guard<std::mutex> l(s.mu);
      fresh->transport = ChooseTransportLocked(s, peer_node, (h->flags & kHandleFlagMesh) != 0);
      nsocks = DataSocketsLocked(s, fresh->transport);
      fresh->hello.nonce = h->nonce;
      std::snprintf(fresh->hello.node_id, sizeof(fresh->hello.node_id), "%s", s.node_id.c_str());
    }
    fresh->hello.magic = kHelloMagic;
    fresh->hello.version = kWireVersion;
    fresh->hello.transport = static_cast<uint8_t>(fresh->transport);
    fresh->hello.conn_id = Random64();
    fresh->hello.nsocks = static_cast<uint32_t>(nsocks);
    fresh->hello.pid = static_cast<uint32_t>(::getpid());
    for (int i = 0; i <= nsocks; ++i) {
      auto fd = StartConnect(fresh->to);
      if (!fd.ok()) return FailStatus(kSystemError, "connect", fd.status());
      fresh->fds.push_back(*std::move(fd));
      fresh->hello_sent.push_back(false);
    }
    st = fresh.get();
    std::lock_guard<std::mutex> l(s.mu);
    s.connecting[handle] = std::move(fresh);
  }
  auto abandon = [&](Result r, const std::string& why) {
    std::lock_guard<std::mutex> l(s.mu);
    std::string peer = st->to.ToString();
    s.connecting.erase(handle);
    return Fail(r, absl::StrCat("connect to ", peer, ": ", why));
  };
  // Hellos, once each socket is connected.
  for (size_t i = 0; i < st->fds.size(); ++i) {
    if (st->hello_sent[i]) continue;
    auto up = ConnectDone(st->fds[i].get());
    if (!up.ok()) return abandon(kSystemError, up.status().ToString());
    if (!*up) return kSuccess;
    Hello hello = st->hello;
    hello.kind = i == 0 ? 0 : 1;
    hello.index = static_cast<uint32_t>(i == 0 ? 0 : i - 1);
    if (!WriteAll(st->fds[i].get(), &hello, sizeof(hello))) return abandon(kSystemError, "sending hello failed");
    st->hello_sent[i] = true;
  }
  // The receiver's welcome.
  while (st->welcome_got < sizeof(Welcome)) {
    auto n = RecvSome(st->fds[0].get(), reinterpret_cast<char*>(&st->welcome) + st->welcome_got,
                      sizeof(Welcome) - st->welcome_got);
    if (!n.ok()) return abandon(kRemoteError, absl::StrCat("no welcome: ", n.status().ToString()));
    if (*n == 0) return kSuccess;
    st->welcome_got += *n;
  }
  if (st->welcome.magic != kHelloMagic || st->welcome.status != 0) {
    std::string msg(st->welcome.message, strnlen(st->welcome.message, sizeof(st->welcome.message)));
    return abandon(kRemoteError, absl::StrCat("the receiver refused the connection: ", msg));
  }
  std::vector<UniqueFd> data;
  for (size_t i = 1; i < st->fds.size(); ++i) data.push_back(std::move(st->fds[i]));
  std::unique_ptr<Comm> c =
      MakeComm(st->transport, /*send=*/true, dev, st->to.ToString(), std::move(st->fds[0]), std::move(data));
  Welcome w = st->welcome;
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.connecting.erase(handle);  // st is gone
  }
  if (Result r = c->SetupSender(w); r != kSuccess) return r;
  INFO("connection to %s via %s", c->peer.c_str(), c->Describe().c_str());
  *send_comm = c.release();
  return kSuccess;
}

Result AcceptStep(Listener* lc, void** recv_comm) {
  State& s = S();
  for (;;) {
    int fd = ::accept4(lc->fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    if (lc->pending.size() >= 64) {  // someone is flooding the port; NCCL's peer opens at most 17
      ::close(fd);
      continue;
    }
    Listener::Pending p;
    p.fd.Reset(fd);
    lc->pending.push_back(std::move(p));
  }
  for (size_t i = 0; i < lc->pending.size();) {
    Listener::Pending& p = lc->pending[i];
    auto n = RecvSome(p.fd.get(), reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got);
    bool drop = !n.ok();
    if (n.ok()) p.got += *n;
    if (!drop && p.got == sizeof(Hello)) {
      const Hello& h = p.hello;
      drop = h.magic != kHelloMagic || h.version != kWireVersion || h.nonce != lc->nonce || h.kind > 1 ||
             h.nsocks > 16 || (h.kind == 1 && h.index >= h.nsocks) ||
             !IsTransportId(h.transport);
      if (drop) {
        WARN("accept: dropped a connection with a bad hello (not from the NCCL peer this handle went to)");
      } else {
        lc->groups[h.conn_id].push_back(std::move(p));
        lc->pending.erase(lc->pending.begin() + i);
        continue;
      }
    }
    if (drop) {
      lc->pending.erase(lc->pending.begin() + i);
      continue;
    }
    ++i;
  }
  for (auto it = lc->groups.begin(); it != lc->groups.end(); ++it) {
    auto& socks = it->second;
    const Listener::Pending* ctrl = nullptr;
    for (const auto& p : socks) {
      if (p.hello.kind == 0) ctrl = &p;
    }
    if (ctrl == nullptr || socks.size() != ctrl->hello.nsocks + 1) continue;
    const auto transport = static_cast<TransportId>(ctrl->hello.transport);
    UniqueFd ctrl_fd;
    std::vector<UniqueFd> data(ctrl->hello.nsocks);
    bool ok = true;
    for (auto& p : socks) {
      if (p.hello.kind == 0) {
        ctrl_fd = std::move(p.fd);
      } else if (!data[p.hello.index]) {
        data[p.hello.index] = std::move(p.fd);
      } else {
        ok = false;
      }
    }
    lc->groups.erase(it);
    SockAddr pa;
    socklen_t len = sizeof(pa.ss);
    if (::getpeername(ctrl_fd.get(), reinterpret_cast<sockaddr*>(&pa.ss), &len) == 0) pa.len = len;
    {
      std::lock_guard<std::mutex> l(s.mu);
      if (!UsableLocked(s, transport)) ok = false;
    }
    std::unique_ptr<Comm> c =
        MakeComm(transport, /*send=*/false, lc->dev, pa.ToString(), std::move(ctrl_fd), std::move(data));
    Welcome w{};
    w.magic = kHelloMagic;
    Result r = kSuccess;
    if (!ok) {
      r = Fail(kRemoteError, absl::StrCat("accept from ", c->peer, ": inconsistent connection (duplicate socket, or "
                                          "same-node transport without podlinkd here)"));
    } else {
      r = c->SetupReceiver(w);
    }
    if (r != kSuccess) {
      w.status = 1;
      std::snprintf(w.message, sizeof(w.message), "receiver setup failed, see its log");
      (void)WriteAll(c->ctrl.get(), &w, sizeof(w));
      return r;
    }
    if (!WriteAll(c->ctrl.get(), &w, sizeof(w))) return Fail(kRemoteError, "accept: the connector went away");
    INFO("connection from %s via %s", c->peer.c_str(), c->Describe().c_str());
    *recv_comm = c.release();
    return kSuccess;
  }
  return kSuccess;
}

void CloseListener(Listener* lc) {
  lc->magic = 0;
  delete lc;
}

}  // namespace podlink::ncclnet
