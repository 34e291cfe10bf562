#include "tests/soak/worker.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "nlohmann/json.hpp"
#include "podlink/client.h"
#include "podlink/transfer.h"
#include "tests/soak/pattern.h"

namespace podlink::soak {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

void Emit(const json& j) { std::cout << j.dump() << "\n" << std::flush; }

std::string SocketDir() {
  const char* e = getenv("PODLINK_SOCKET_DIR");
  return e != nullptr ? e : "/run/podlink";
}

// Shuts down (without closing: the descriptors stay owned by libpodlink and
// gRPC) every socket of this process connected to podlinkd's socket
// directory: the gRPC connection and the descriptor channel.
int ShutdownDaemonSockets(const std::string& dir) {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  std::string prefix = dir + "/";
  while (dirent* e = ::readdir(d)) {
    int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == ::dirfd(d)) continue;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_un a{};
    socklen_t len = sizeof(a);
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sun_family != AF_UNIX) continue;
    if (std::strncmp(a.sun_path, prefix.c_str(), prefix.size()) != 0) continue;
    if (::shutdown(fd, SHUT_RDWR) == 0) ++n;
  }
  ::closedir(d);
  return n;
}

// Closes the session from a second thread `us` microseconds from now, while
// the main thread is in the middle of a command.
class MidCallCloser {
 public:
  MidCallCloser(int64_t us, std::string dir) {
    thread_ = std::thread([this, us, dir = std::move(dir)] {
      std::this_thread::sleep_for(std::chrono::microseconds(us));
      sockets_ = ShutdownDaemonSockets(dir);
      fired_at_ = Clock::now();
      fired_.store(true, std::memory_order_release);
    });
  }
  ~MidCallCloser() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool fired() const { return fired_.load(std::memory_order_acquire); }
  Clock::time_point fired_at() const { return fired_at_; }
  int sockets() const { return sockets_; }

 private:
  std::thread thread_;
  std::atomic<bool> fired_{false};
  Clock::time_point fired_at_;
  int sockets_ = 0;
};

json StatusJson(const absl::Status& s, const std::string& step) {
  return {{"ok", false},
          {"step", step},
          {"code", absl::StatusCodeToString(s.code())},
          {"msg", std::string(s.message()).substr(0, 300)}};
}

class Worker {
 public:
  explicit Worker(const WorkerOptions& o) : opt_(o), dir_(SocketDir()) {}

  absl::Status Connect() {
    auto c = Client::Connect();
    if (!c.ok()) return c.status();
    client_ = *std::move(c);
    TransferEngine::Options eo;
    eo.force_relay = true;  // host memory would otherwise be copied in-process
    eo.log_transport = false;
    // Bounds Notify (and a full queue): a notification whose session is
    // closed under it is never completed, and the engine spins until then.
    eo.timeout = absl::Seconds(2);
    auto e = TransferEngine::Create(*client_, eo);
    if (!e.ok()) return e.status();
    engine_ = *std::move(e);
    auto b = client_->AllocateHost(opt_.max_op);
    if (!b.ok()) return b.status();
    staging_ = *std::move(b);
    auto r = engine_->Register(*staging_);
    if (!r.ok()) return r.status();
    staging_region_ = *r;
    return absl::OkStatus();
  }

  // Drops the session and everything that belonged to it; opens a new one.
  void Reset() {
    engine_.reset();
    exports_.clear();
    pool_.clear();
    notified_.clear();
    staging_.reset();
    client_.reset();
    ConnectOrDie("reconnect");
  }

  void ConnectOrDie(const char* what) {
    absl::Status s;
    for (int i = 0; i < 50; ++i) {
      s = Connect();
      if (s.ok()) return;
      engine_.reset();
      staging_.reset();
      client_.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    json j = StatusJson(s, what);
    j["ev"] = "fatal";
    Emit(j);
    std::_Exit(1);
  }

  uint64_t session() const { return client_->session_id(); }

  json Export(const json& cmd) {
    uint64_t cycle = cmd["cycle"], size = cmd["size"], seed = cmd["seed"];
    int slot = cmd["slot"];
    auto closer = MaybeCloser(cmd);
    json out = {{"ev", "exported"}, {"cycle", cycle}};
    std::unique_ptr<HostBuffer>& buf = pool_[slot];
    if (buf == nullptr || buf->size() != size || cmd.value("fresh", false)) {
      buf.reset();
      auto b = client_->AllocateHost(size);
      if (!b.ok()) return Finish(out, StatusJson(b.status(), "allocate"), closer.get());
      buf = *std::move(b);
    }
    FillPattern(static_cast<uint8_t*>(buf->data()), 0, size, seed);
    auto reg = engine_->Register(*buf);
    if (!reg.ok()) return Finish(out, StatusJson(reg.status(), "register"), closer.get());
    exports_[cycle] = {slot, *reg, seed};
    auto desc = engine_->Describe(*reg);
    if (!desc.ok()) return Finish(out, StatusJson(desc.status(), "describe"), closer.get());
    return Finish(out, {{"ok", true}, {"desc", desc->Serialize()}, {"export_id", reg->export_id}}, closer.get());
  }

  json Import(const json& cmd) {
    uint64_t cycle = cmd["cycle"];
    auto closer = MaybeCloser(cmd);
    json out = {{"ev", "imported"}, {"cycle", cycle}};
    auto desc = RegionDescriptor::Parse(cmd["desc"].get<std::string>());
    if (!desc.ok()) return Finish(out, StatusJson(desc.status(), "parse"), closer.get());
    auto remote = engine_->Open(*desc);
    if (!remote.ok()) return Finish(out, StatusJson(remote.status(), "open"), closer.get());
    RegionModel model(remote->size, cmd["base"]);
    uint64_t mismatch = 0, moved = 0;
    int first_bad_op = -1;
    json result = {{"ok", true}};
    auto* staging = static_cast<uint8_t*>(staging_->data());
    int index = 0;
    for (const json& op : cmd["ops"]) {
      if (closer && closer->fired()) {
        result = StatusJson(absl::AbortedError("session closed by the fault"), "ops");
        break;
      }
      std::string t = op[0];
      uint64_t off = op[1], len = op[2], loff = op[3];
      TransferOp top{&staging_region_, loff, &*remote, off, len};
      if (t == "w") {
        uint64_t seed = op[4];
        FillPattern(staging + loff, off, len, seed);
        absl::Status s = Transfer(true, top, closer.get());
        if (!s.ok()) {
          result = StatusJson(s, absl::StrCat("write#", index));
          break;
        }
        model.Write(off, len, seed);
      } else {
        std::memset(staging + loff, 0xEE, len);  // poison: a transfer that moved nothing shows
        absl::Status s = Transfer(false, top, closer.get());
        if (!s.ok()) {
          result = StatusJson(s, absl::StrCat("read#", index));
          break;
        }
        uint64_t bad = model.Check(staging + loff, off, len);
        if (bad != 0 && first_bad_op < 0) first_bad_op = index;
        mismatch += bad;
      }
      moved += len;
      ++index;
    }
    if (result["ok"] == true && closer && closer->fired()) {
      // Not notifying is a failed step: the exporter must not expect it.
      result = StatusJson(absl::AbortedError("session closed by the fault before the notification"), "notify");
    }
    if (result["ok"] == true) {
      absl::Status s = engine_->Notify(*remote, cycle);
      if (!s.ok()) {
        result = StatusJson(s, "notify");
        // Its batch stays behind and the engine's destructor would wait for it.
        if (s.code() == absl::StatusCode::kDeadlineExceeded) abandoned_ = true;
      }
    }
    if (!abandoned_) {
      absl::Status s = engine_->Close(*remote);
      if (!s.ok() && result["ok"] == true) result = StatusJson(s, "close");
    }
    if (result["ok"] == true && cmd.value("drop", false)) {
      // A plain import, mapped and checked through the mapping, then
      // forgotten: the import record stays until the owner withdraws.
      auto imp = client_->Import(desc->export_id);
      if (!imp.ok()) {
        result = StatusJson(imp.status(), "drop-import");
      } else {
        auto m = client_->Map(*imp);
        if (!m.ok()) {
          result = StatusJson(m.status(), "drop-map");
        } else {
          uint64_t bad = model.Check(static_cast<const uint8_t*>((*m)->host_ptr()), 0, model.size());
          if (bad != 0 && first_bad_op < 0) first_bad_op = 1000;
          mismatch += bad;
          moved += model.size();
        }
      }
    }
    result["mismatch"] = mismatch;
    result["bytes"] = moved;
    if (first_bad_op >= 0) result["first_bad_op"] = first_bad_op;
    return Finish(out, result, closer.get());
  }

  json Release(const json& cmd) {
    uint64_t cycle = cmd["cycle"];
    auto closer = MaybeCloser(cmd);
    json out = {{"ev", "released"}, {"cycle", cycle}};
    auto it = exports_.find(cycle);
    if (it == exports_.end()) {
      return Finish(out, StatusJson(absl::NotFoundError("no export of this cycle (session was reset)"), "find"),
                    closer.get());
    }
    json result = {{"ok", true}};
    if (cmd.value("verify", false)) {
      for (const Notification& n : engine_->PollNotifications()) notified_.insert(n.value);
      result["notified"] = notified_.count(cycle) > 0;
      const HostBuffer& buf = *pool_[it->second.slot];
      RegionModel model(buf.size(), it->second.seed);
      for (const json& w : cmd["writes"]) model.Write(w[0], w[1], w[2]);
      result["mismatch"] = model.Check(static_cast<const uint8_t*>(buf.data()), 0, buf.size());
    }
    if (cmd.value("exit_offers", 0) > 0) {
      if (closer) closer->Join();
      OfferAndExit(cmd["exit_offers"], cmd.value("exit_ack", false), out, result);
    }
    absl::Status s = engine_->Unregister(it->second.region);
    if (!s.ok()) result = StatusJson(s, "unregister");
    exports_.erase(cycle);
    // Notifications of earlier, faulted cycles are stale now.
    for (const Notification& n : engine_->PollNotifications()) notified_.insert(n.value);
    notified_.clear();
    return Finish(out, result, closer.get());
  }

  // Offers `n` memfds on a second descriptor channel (a session of its own)
  // and exits with them, this process's exports, imports and relay ring
  // outstanding: podlinkd must notice and clean up by itself.
  [[noreturn]] void OfferAndExit(int n, bool wait_acks, json out, json result) {
    UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::string path = dir_ + "/podlink.fd.sock";
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    int offered = 0, acked = 0;
    if (sock && ::connect(sock.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      auto hello = RecvFdMessage(sock.get(), false);  // HELLO
      if (hello.ok() && *hello && (*hello)->msg.type == static_cast<uint16_t>(FdMsgType::kHello)) {
        for (int i = 0; i < n; ++i) {
          UniqueFd m(::memfd_create("soak-offer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
          if (!m || ::ftruncate(m.get(), 4096 * (i + 1)) != 0) break;
          FdMessage msg;
          msg.type = static_cast<uint16_t>(FdMsgType::kOffer);
          msg.seq = i + 1;
          if (!SendFdMessage(sock.get(), msg, m.get(), false).ok()) break;
          ++offered;
        }
        for (int i = 0; wait_acks && i < offered; ++i) {
          auto r = RecvFdMessage(sock.get(), false);
          if (!r.ok() || !*r) break;
          ++acked;
        }
      }
    }
    out.update(result);
    out["exiting"] = true;
    out["offered"] = offered;
    out["acked"] = acked;
    Emit(out);
    std::_Exit(0);  // no cleanup at all
  }

  void Exit() {
    engine_.reset();
    exports_.clear();
    pool_.clear();
    staging_.reset();
    client_.reset();
    Emit({{"ev", "bye"}});
  }

 private:
  struct Exported {
    int slot;
    LocalRegion region;
    uint64_t seed;
  };

  std::unique_ptr<MidCallCloser> MaybeCloser(const json& cmd) {
    int64_t us = cmd.value("close_us", int64_t{-1});
    if (us < 0) return nullptr;
    return std::make_unique<MidCallCloser>(us, dir_);
  }

  // One relay transfer, polled so that a transfer whose session was closed
  // under it is given up (and the worker replaced) instead of waited for.
  absl::Status Transfer(bool write, const TransferOp& op, const MidCallCloser* closer) {
    auto id = write ? engine_->WriteAsync({op}) : engine_->ReadAsync({op});
    if (!id.ok()) return id.status();
    Clock::time_point deadline = Clock::now() + std::chrono::seconds(opt_.relay_timeout_s);
    for (int spins = 0;; ++spins) {
      auto done = engine_->Poll(*id);
      if (!done.ok()) {
        abandoned_ = true;
        return done.status();
      }
      if (*done) return engine_->Wait(*id);
      if (closer != nullptr && closer->fired() && Clock::now() - closer->fired_at() > std::chrono::milliseconds(200)) {
        abandoned_ = true;
        return absl::AbortedError("relay transfer in flight when the session was closed; abandoned");
      }
      if (Clock::now() > deadline) {
        abandoned_ = true;
        return absl::DeadlineExceededError(
            absl::StrCat("relay transfer of ", op.length, " bytes not complete after ", opt_.relay_timeout_s, " s"));
      }
      if (spins > 64) ::usleep(20);
    }
  }

  // Adds `result` to `out`; after a mid-call close, replaces the session.
  json Finish(json out, const json& result, MidCallCloser* closer) {
    out.update(result);
    if (closer != nullptr) {
      closer->Join();
      out["closed_sockets"] = closer->sockets();
      if (abandoned_) {
        out["abandoned"] = true;
        Emit(out);
        std::_Exit(3);
      }
      Reset();
      out["reset"] = true;
      out["session"] = session();
    } else if (abandoned_) {
      // Not a fault of ours: a transfer timed out on a live session.
      out["abandoned"] = true;
      Emit(out);
      std::_Exit(4);
    }
    return out;
  }

  const WorkerOptions opt_;
  const std::string dir_;
  // Destroyed in reverse: the engine before the buffers and the client.
  std::unique_ptr<Client> client_;
  std::unique_ptr<HostBuffer> staging_;
  std::map<int, std::unique_ptr<HostBuffer>> pool_;
  std::unique_ptr<TransferEngine> engine_;
  LocalRegion staging_region_;
  std::map<uint64_t, Exported> exports_;  // by cycle
  std::set<uint64_t> notified_;
  bool abandoned_ = false;
};

}  // namespace

int RunWorker(const WorkerOptions& options) {
  Worker w(options);
  w.ConnectOrDie("connect");
  Emit({{"ev", "ready"}, {"pod", options.pod}, {"session", w.session()}});
  std::string line;
  while (std::getline(std::cin, line)) {
    json cmd = json::parse(line, nullptr, false);
    if (cmd.is_discarded() || !cmd.contains("op")) {
      Emit({{"ev", "fatal"}, {"msg", "bad command: " + line.substr(0, 200)}});
      return 2;
    }
    std::string op = cmd["op"];
    if (op == "export") {
      Emit(w.Export(cmd));
    } else if (op == "import") {
      Emit(w.Import(cmd));
    } else if (op == "release") {
      Emit(w.Release(cmd));
    } else if (op == "offer-exit") {
      w.OfferAndExit(cmd.value("n", 1), cmd.value("ack", false), {{"ev", "offer-exit"}}, {{"ok", true}});
    } else if (op == "exit") {
      w.Exit();
      return 0;
    } else {
      Emit({{"ev", "fatal"}, {"msg", "unknown op " + op}});
      return 2;
    }
  }
  return 0;  // the driver went away
}

}  // namespace podlink::soak
