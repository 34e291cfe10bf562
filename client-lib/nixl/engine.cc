#include "client-lib/nixl/engine.h"

#include <cstdlib>
#include <exception>
#include <limits>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client-lib/nixl/status.h"
#include "client-lib/nixl/wire.h"

namespace podlink::nixl {
namespace {

// How long the destructor and unloadMD wait for transfers whose handles were
// released in flight before they close what those transfers use.
constexpr absl::Duration kOrphanWait = absl::Seconds(5);

const char* MemName(nixl_mem_t m) {
  switch (m) {
    case DRAM_SEG:
      return "DRAM";
    case VRAM_SEG:
      return "VRAM";
    default:
      return "unsupported memory type";
  }
}

// A name from a peer (through NIXL's metadata), fit for a log line.
std::string Printable(absl::string_view s) {
  return absl::StrCat(absl::CHexEscape(s.substr(0, 128)), s.size() > 128 ? "..." : "");
}

bool EnvTrue(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::string_view(v) == "1" || std::string_view(v) == "true");
}

// The engine's metadata objects. NIXL hands them back as nixlBackendMD*
// (and, in one of its own test harnesses, the destination's registration
// where a loaded one belongs), so each carries its kind.
class PodlinkMD : public nixlBackendMD {
 public:
  enum class Kind : uint32_t { kLocal = 0x4c4f434c, kRemote = 0x52454d54 };
  PodlinkMD(Kind k, bool is_private) : nixlBackendMD(is_private), kind(k) {}
  const Kind kind;
  nixl_mem_t mem = DRAM_SEG;
  // The registered range [base, base + length) at `offset` in its export.
  uint64_t base = 0;
  uint64_t offset = 0;
  uint64_t length = 0;

  // Whether [addr, addr + len) lies inside the range; its export offset.
  bool Covers(uint64_t addr, uint64_t len, uint64_t& export_offset) const {
    if (addr < base || addr - base > length || len > length - (addr - base)) return false;
    export_offset = offset + (addr - base);
    return true;
  }
};

// registerMem's result.
class LocalMD : public PodlinkMD {
 public:
  LocalMD() : PodlinkMD(Kind::kLocal, true) {}
  LocalRegion region;
  RegionDescriptor descriptor;
  std::string public_data;
};

// loadRemoteMD's and loadLocalMD's result: a peer's (or this engine's own)
// region opened through podlinkd.
class RemoteMD : public PodlinkMD {
 public:
  RemoteMD() : PodlinkMD(Kind::kRemote, false) {}
  const RemoteRegion* region = nullptr;  // in the engine's opened_ table
  std::string key;                       // its key there (one reference)
  std::string agent;
};

const PodlinkMD* AsPodlink(const nixlBackendMD* md) {
  if (md == nullptr) return nullptr;
  const auto* p = static_cast<const PodlinkMD*>(md);
  return p->kind == PodlinkMD::Kind::kLocal || p->kind == PodlinkMD::Kind::kRemote ? p : nullptr;
}

// Takes over the engine's own metadata of `kind` behind `meta` (null: not
// this engine's, or of the other kind; `meta` is then left alone).
template <typename MD>
std::unique_ptr<MD> TakeOwn(nixlBackendMD* meta, PodlinkMD::Kind kind) {
  const PodlinkMD* p = AsPodlink(meta);
  if (p == nullptr || p->kind != kind) return nullptr;
  return std::unique_ptr<MD>(static_cast<MD*>(meta));
}

// Takes a batch's result once it completed: nullopt while in flight.
std::optional<absl::Status> PollBatch(TransferEngine& eng, uint64_t batch) {
  absl::StatusOr<bool> done = eng.Poll(batch);
  if (!done.ok()) return done.status();
  if (!*done) return std::nullopt;
  return eng.Wait(batch);
}

}  // namespace

// One prepared transfer. postXfer/checkXfer/releaseReqH of one handle may
// come from different threads; `mu` orders them.
class PodlinkNixlEngine::Handle : public nixlBackendReqH {
 public:
  enum class State { kIdle, kData, kNotify, kDone, kFailed };

  nixl_xfer_op_t op = NIXL_WRITE;
  std::string agent;
  bool self = false;                // the peer is this agent
  std::vector<TransferOp> ops;      // built once, merged
  bool has_notif = false;           // prepXfer's notification
  std::string notif_msg;

  absl::Mutex mu;
  State state ABSL_GUARDED_BY(mu) = State::kIdle;
  uint64_t batch ABSL_GUARDED_BY(mu) = 0;   // the data batch (kData) or the notification's (kNotify)
  bool post_notif ABSL_GUARDED_BY(mu) = false;  // this post's notification, framed
  std::string post_frame ABSL_GUARDED_BY(mu);
  std::string post_msg ABSL_GUARDED_BY(mu);  // unframed, for self-notifications
  nixl_status_t failure ABSL_GUARDED_BY(mu) = NIXL_ERR_BACKEND;
  // The peer's mailbox, opened by the first post with a notification; one
  // reference held until releaseReqH.
  const RemoteRegion* mailbox ABSL_GUARDED_BY(mu) = nullptr;
  std::string mailbox_key ABSL_GUARDED_BY(mu);
};

PodlinkNixlEngine::PodlinkNixlEngine(const nixlBackendInitParams* init_params) : nixlBackendEngine(init_params) {
  try {
    if (localAgent.empty() || localAgent.size() > kMaxAgentName) {
      initErr = true;
      Refuse(NIXL_ERR_INVALID_PARAM, "create engine",
             absl::StrCat("agent name of ", localAgent.size(), " bytes; podlink takes 1 to ", kMaxAgentName));
      return;
    }
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(ConnectOptions{});
    if (!c.ok()) {
      initErr = true;
      ToNixl(c.status(), absl::StrCat("agent '", localAgent,
                                      "': cannot reach podlinkd (is the podlink socket directory mounted in this "
                                      "pod? $PODLINK_SOCKET_DIR, else /run/podlink)"));
      return;
    }
    client_ = *std::move(c);
    TransferEngine::Options o;
    std::string v;
    o.force_relay = EnvTrue("PODLINK_NIXL_FORCE_RELAY") ||
                    (getInitParam("force_relay", v) == NIXL_SUCCESS && (v == "1" || v == "true"));
    absl::StatusOr<std::unique_ptr<TransferEngine>> e = TransferEngine::Create(*client_, o);
    if (!e.ok()) {
      initErr = true;
      ToNixl(e.status(), absl::StrCat("agent '", localAgent, "': create podlink transfer engine"));
      return;
    }
    engine_ = *std::move(e);
    absl::StatusOr<std::unique_ptr<HostBuffer>> buf = client_->AllocateHost(TransferEngine::kMaxNotifyBytes);
    absl::StatusOr<LocalRegion> reg = buf.ok() ? engine_->Register(**buf) : absl::StatusOr<LocalRegion>(buf.status());
    absl::StatusOr<RegionDescriptor> desc = reg.ok() ? engine_->Describe(*reg) : reg.status();
    if (!desc.ok()) {
      initErr = true;
      ToNixl(desc.status(), absl::StrCat("agent '", localAgent, "': notification mailbox"));
      return;
    }
    mailbox_buf_ = *std::move(buf);
    mailbox_ = *reg;
    conn_info_ = EncodeConnInfo(localAgent, *desc);
  } catch (const std::exception& ex) {
    initErr = true;
    Refuse(NIXL_ERR_BACKEND, "create engine", ex.what());
  }
}

PodlinkNixlEngine::~PodlinkNixlEngine() {
  if (engine_ != nullptr) {
    DrainOrphans(/*wait=*/true);
    {
      absl::MutexLock l(&mu_);
      for (auto& [key, o] : opened_) (void)engine_->Close(o.region);  // peers may be gone already
      opened_.clear();
      peers_.clear();
    }
    if (mailbox_.export_id != 0) (void)engine_->Unregister(mailbox_);
  }
  engine_.reset();  // before the memory it registered and the session it uses
  mailbox_buf_.reset();
  client_.reset();
}

bool PodlinkNixlEngine::Ready(const char* what) const {
  if (!initErr && engine_ != nullptr) return true;
  Refuse(NIXL_ERR_BACKEND, what, "the engine failed to start (see its earlier line)");
  return false;
}

std::string PodlinkNixlEngine::KeyOf(const RegionDescriptor& d) { return absl::StrCat(d.node_id, "/", d.export_id); }

absl::StatusOr<std::pair<const RemoteRegion*, std::string>> PodlinkNixlEngine::Acquire(
    const RegionDescriptor& d) const {
  std::string key = KeyOf(d);
  {
    absl::MutexLock l(&mu_);
    auto it = opened_.find(key);
    if (it != opened_.end()) {
      ++it->second.refs;
      return std::make_pair(static_cast<const RemoteRegion*>(&it->second.region), key);
    }
  }
  absl::StatusOr<RemoteRegion> r = engine_->Open(d);  // gRPC: outside the lock
  if (!r.ok()) return r.status();
  absl::MutexLock l(&mu_);
  // Another thread may have opened it meanwhile: TransferEngine returned the same opening.
  auto [it, inserted] = opened_.try_emplace(key);
  if (inserted) it->second.region = *r;
  ++it->second.refs;
  return std::make_pair(static_cast<const RemoteRegion*>(&it->second.region), key);
}

void PodlinkNixlEngine::ReleaseOpened(const std::string& key) const {
  if (key.empty()) return;
  absl::MutexLock l(&mu_);
  auto it = opened_.find(key);
  if (it == opened_.end() || --it->second.refs > 0) return;
  // Under the lock: no Acquire may take this opening while it closes. An
  // error (the export is gone, or was this engine's own and is unregistered
  // already: NIXL unloads self MDs after deregisterMem at shutdown) changes
  // nothing for NIXL.
  absl::Status st = engine_->Close(it->second.region);
  if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
    LogLine(absl::StrCat("close region ", key, " (ignored): ", st.ToString()));
  }
  opened_.erase(it);
}

absl::StatusOr<std::pair<const RemoteRegion*, std::string>> PodlinkNixlEngine::AcquireMailbox(
    const std::string& agent) const {
  RegionDescriptor d;
  {
    absl::MutexLock l(&mu_);
    auto p = peers_.find(agent);
    if (p == peers_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no connection info of agent '", Printable(agent), "' was loaded (add_remote_agent first)"));
    }
    if (!p->second.mailbox_key.empty()) {
      auto it = opened_.find(p->second.mailbox_key);
      if (it != opened_.end()) {
        ++it->second.refs;
        return std::make_pair(static_cast<const RemoteRegion*>(&it->second.region), it->first);
      }
    }
    d = p->second.mailbox;
  }
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = Acquire(d);
  if (!a.ok()) return a.status();
  // The peer keeps the mailbox open too (until disconnect).
  absl::MutexLock l(&mu_);
  auto p = peers_.find(agent);
  if (p != peers_.end() && p->second.mailbox_key.empty() && KeyOf(p->second.mailbox) == a->second) {
    p->second.mailbox_key = a->second;
    ++opened_[a->second].refs;
  }
  return a;
}

void PodlinkNixlEngine::DrainOrphans(bool wait) const {
  std::vector<Orphan> todo;
  {
    absl::MutexLock l(&mu_);
    if (orphans_.empty()) return;
    todo.swap(orphans_);
  }
  const absl::Time deadline = absl::Now() + kOrphanWait;
  std::vector<Orphan> left;
  for (Orphan& o : todo) {
    std::optional<absl::Status> st = PollBatch(*engine_, o.batch);
    while (!st.has_value() && wait && absl::Now() < deadline) {
      absl::SleepFor(absl::Microseconds(200));
      st = PollBatch(*engine_, o.batch);
    }
    if (!st.has_value()) {
      left.push_back(std::move(o));
      continue;
    }
    // Nobody asks for a released transfer's result; an error is only worth a line.
    if (!st->ok()) LogLine(absl::StrCat("a transfer released in flight failed: ", st->ToString()));
    ReleaseOpened(o.release_key);
  }
  if (wait && !left.empty()) {
    LogLine(absl::StrCat(left.size(), " transfer(s) released in flight still run after ",
                         absl::FormatDuration(kOrphanWait)));
  }
  if (!left.empty()) {
    absl::MutexLock l(&mu_);
    for (Orphan& o : left) orphans_.push_back(std::move(o));
  }
}

void PodlinkNixlEngine::PushSelfNotification(std::string msg) const {
  absl::MutexLock l(&mu_);
  self_notifs_.emplace_back(localAgent, std::move(msg));
}

// ---------------------------------------------------------------------------
// Memory.
// ---------------------------------------------------------------------------

nixl_status_t PodlinkNixlEngine::registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                                             nixlBackendMD*& out) {
  const std::string what = absl::StrCat("registerMem ", MemName(nixl_mem), " [0x", absl::Hex(mem.addr), ", +",
                                        mem.len, ") dev ", mem.devId);
  if (!Ready(what.c_str())) return NIXL_ERR_BACKEND;
  if (mem.len == 0 || mem.addr == 0 || mem.addr > std::numeric_limits<uintptr_t>::max() - mem.len) {
    return Refuse(NIXL_ERR_INVALID_PARAM, what, "empty or wrapping range");
  }
  auto md = std::make_unique<LocalMD>();
  md->mem = nixl_mem;
  md->base = mem.addr;
  md->length = mem.len;
  if (nixl_mem == DRAM_SEG) {
    absl::StatusOr<TransferEngine::HostRange> r = engine_->RegisterHost(reinterpret_cast<void*>(mem.addr), mem.len);
    if (!r.ok()) return ToNixl(r.status(), what);
    md->region = r->region;
    md->offset = r->offset;
  } else if (nixl_mem == VRAM_SEG) {
    // Any range of cuMem memory with POSIX-FD handles: torch's expandable segments at any offset and over any
    // number of allocations (Client::ExportExisting); anything else is refused there, naming the way out.
    absl::StatusOr<LocalRegion> r = engine_->RegisterExisting(mem.addr, mem.len);
    if (!r.ok()) return ToNixl(r.status(), what);
    md->region = *r;
    md->offset = 0;
  } else {
    return Refuse(NIXL_ERR_NOT_SUPPORTED, what, "podlink moves DRAM and VRAM only");
  }
  absl::StatusOr<RegionDescriptor> d = engine_->Describe(md->region);
  if (!d.ok()) {
    (void)engine_->Unregister(md->region);
    return ToNixl(d.status(), what);
  }
  md->descriptor = *d;
  md->public_data = EncodePublicData({md->base, md->offset, md->length, *d});
  out = md.release();
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::deregisterMem(nixlBackendMD* meta) {
  std::unique_ptr<LocalMD> md = TakeOwn<LocalMD>(meta, PodlinkMD::Kind::kLocal);
  if (md == nullptr) return Refuse(NIXL_ERR_INVALID_PARAM, "deregisterMem", "not a registration of this engine");
  if (engine_ == nullptr) return NIXL_SUCCESS;
  // Self MDs opened from it may still exist (NIXL unloads them after this at
  // shutdown); their Close then tolerates the missing export.
  return ToNixl(engine_->Unregister(md->region), absl::StrCat("deregisterMem export ", md->region.export_id));
}

nixl_status_t PodlinkNixlEngine::getPublicData(const nixlBackendMD* meta, std::string& str) const {
  const PodlinkMD* p = AsPodlink(meta);
  if (p == nullptr || p->kind != PodlinkMD::Kind::kLocal) {
    return Refuse(NIXL_ERR_INVALID_PARAM, "getPublicData", "not a registration of this engine");
  }
  str = static_cast<const LocalMD*>(p)->public_data;
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) {
  if (!Ready("loadLocalMD")) return NIXL_ERR_BACKEND;
  const PodlinkMD* p = AsPodlink(input);
  if (p == nullptr || p->kind != PodlinkMD::Kind::kLocal) {
    return Refuse(NIXL_ERR_INVALID_PARAM, "loadLocalMD", "not a registration of this engine");
  }
  const auto* local = static_cast<const LocalMD*>(p);
  // This engine's own export, opened as a peer's would be: self transfers
  // then take the same path as remote ones.
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = Acquire(local->descriptor);
  if (!a.ok()) return ToNixl(a.status(), absl::StrCat("loadLocalMD export ", local->region.export_id));
  auto md = std::make_unique<RemoteMD>();
  md->mem = local->mem;
  md->base = local->base;
  md->offset = local->offset;
  md->length = local->length;
  md->region = a->first;
  md->key = a->second;
  md->agent = localAgent;
  output = md.release();
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                                              const std::string& remote_agent, nixlBackendMD*& output) {
  const std::string what = absl::StrCat("loadRemoteMD of agent '", Printable(remote_agent), "'");
  if (!Ready(what.c_str())) return NIXL_ERR_BACKEND;
  absl::StatusOr<PublicData> p = ParsePublicData(input.metaInfo);
  if (!p.ok()) return ToNixl(p.status(), what);
  const bool host = p->region.handle_type == HandleType::kHostMemfd ||
                    p->region.handle_type == HandleType::kProcessMemory;
  if ((nixl_mem != DRAM_SEG && nixl_mem != VRAM_SEG) || host != (nixl_mem == DRAM_SEG)) {
    return Refuse(NIXL_ERR_INVALID_PARAM, what,
                  absl::StrCat("metadata of a ", host ? "host" : "GPU", " region loaded as ", MemName(nixl_mem)));
  }
  if (input.addr != p->base || input.len != p->length) {
    return Refuse(NIXL_ERR_INVALID_PARAM, what,
                  absl::StrCat("metadata for [0x", absl::Hex(p->base), ", +", p->length, ") loaded for [0x",
                               absl::Hex(input.addr), ", +", input.len, ")"));
  }
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = Acquire(p->region);
  if (!a.ok()) return ToNixl(a.status(), absl::StrCat(what, ": open export ", p->region.export_id), Scope::kPeer);
  auto md = std::make_unique<RemoteMD>();
  md->mem = nixl_mem;
  md->base = p->base;
  md->offset = p->offset;
  md->length = p->length;
  md->region = a->first;
  md->key = a->second;
  md->agent = remote_agent;
  output = md.release();
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::unloadMD(nixlBackendMD* input) {
  std::unique_ptr<RemoteMD> md = TakeOwn<RemoteMD>(input, PodlinkMD::Kind::kRemote);
  if (md == nullptr) return Refuse(NIXL_ERR_INVALID_PARAM, "unloadMD", "not metadata this engine loaded");
  if (engine_ == nullptr) return NIXL_SUCCESS;
  DrainOrphans(/*wait=*/true);  // released transfers may still use the region
  ReleaseOpened(md->key);
  return NIXL_SUCCESS;
}

// ---------------------------------------------------------------------------
// Connections.
// ---------------------------------------------------------------------------

nixl_status_t PodlinkNixlEngine::getConnInfo(std::string& str) const {
  if (!Ready("getConnInfo")) return NIXL_ERR_BACKEND;
  str = conn_info_;
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::loadRemoteConnInfo(const std::string& remote_agent,
                                                    const std::string& remote_conn_info) {
  const std::string what = absl::StrCat("loadRemoteConnInfo of agent '", Printable(remote_agent), "'");
  if (!Ready(what.c_str())) return NIXL_ERR_BACKEND;
  absl::StatusOr<ConnInfo> c = ParseConnInfo(remote_conn_info);
  if (!c.ok()) return ToNixl(c.status(), what);
  if (c->agent != remote_agent) {
    return Refuse(NIXL_ERR_INVALID_PARAM, what,
                  absl::StrCat("the connection info names agent '", Printable(c->agent), "'"));
  }
  if (remote_agent == localAgent) return NIXL_SUCCESS;  // self-notifications never leave the process
  // Opened now: a peer podlinkd does not let this pod reach fails here, early.
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = Acquire(c->mailbox);
  if (!a.ok()) {
    return ToNixl(a.status(), absl::StrCat(what, ": open its notification mailbox (export ", c->mailbox.export_id, ")"),
                  Scope::kPeer);
  }
  std::string old;
  {
    absl::MutexLock l(&mu_);
    Peer& p = peers_[remote_agent];
    old = std::move(p.mailbox_key);
    p.mailbox = c->mailbox;
    p.mailbox_key = a->second;  // the reference Acquire took
  }
  ReleaseOpened(old);
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::connect(const std::string& remote_agent) {
  if (!Ready("connect")) return NIXL_ERR_BACKEND;
  if (remote_agent == localAgent) return NIXL_SUCCESS;
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = AcquireMailbox(remote_agent);
  if (!a.ok()) return ToNixl(a.status(), absl::StrCat("connect to agent '", Printable(remote_agent), "'"), Scope::kPeer);
  ReleaseOpened(a->second);  // the peer entry keeps its own reference
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::disconnect(const std::string& remote_agent) {
  if (engine_ == nullptr || remote_agent == localAgent) return NIXL_SUCCESS;
  std::string key;
  {
    absl::MutexLock l(&mu_);
    auto p = peers_.find(remote_agent);
    if (p == peers_.end()) return NIXL_SUCCESS;
    key = std::move(p->second.mailbox_key);
    p->second.mailbox_key.clear();  // the descriptor stays: a later notification reopens it
  }
  ReleaseOpened(key);
  return NIXL_SUCCESS;
}

// ---------------------------------------------------------------------------
// Transfers.
// ---------------------------------------------------------------------------

nixl_status_t PodlinkNixlEngine::prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                          const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                          nixlBackendReqH*& handle, const nixl_opt_b_args_t* opt_args) const {
  const char* what = "prepXfer";
  if (!Ready(what)) return NIXL_ERR_BACKEND;
  if (operation != NIXL_READ && operation != NIXL_WRITE) {
    return Refuse(NIXL_ERR_INVALID_PARAM, what, "not READ or WRITE");
  }
  if (local.descCount() != remote.descCount()) {
    return Refuse(NIXL_ERR_INVALID_PARAM, what,
                  absl::StrCat(local.descCount(), " local descriptors but ", remote.descCount(), " remote ones"));
  }
  if (opt_args != nullptr && opt_args->hasNotif && opt_args->notifMsg.size() > MaxNixlMessage(localAgent)) {
    return ToNixl(FrameNotification(localAgent, opt_args->notifMsg).status(), what);
  }
  auto h = std::make_unique<Handle>();
  h->op = operation;
  h->agent = remote_agent;
  h->self = remote_agent == localAgent;
  h->has_notif = opt_args != nullptr && opt_args->hasNotif;
  if (h->has_notif) h->notif_msg = opt_args->notifMsg;
  h->ops.reserve(static_cast<size_t>(local.descCount()));
  for (int i = 0; i < local.descCount(); ++i) {
    const nixlMetaDesc& l = local[static_cast<size_t>(i)];
    const nixlMetaDesc& r = remote[static_cast<size_t>(i)];
    if (l.len != r.len) {
      return Refuse(NIXL_ERR_INVALID_PARAM, what,
                    absl::StrCat("descriptor ", i, ": ", l.len, " local bytes but ", r.len, " remote"));
    }
    const PodlinkMD* lp = AsPodlink(l.metadataP);
    const PodlinkMD* rp = AsPodlink(r.metadataP);
    if (lp == nullptr || lp->kind != PodlinkMD::Kind::kLocal || rp == nullptr) {
      return Refuse(NIXL_ERR_INVALID_PARAM, what, absl::StrCat("descriptor ", i, ": no podlink metadata"));
    }
    if (rp->kind != PodlinkMD::Kind::kRemote) {
      // NIXL's engine-level test harness passes the destination's
      // registration here instead of loaded metadata.
      return Refuse(NIXL_ERR_NOT_SUPPORTED, what,
                    absl::StrCat("descriptor ", i, ": the remote side is a registration, not metadata loaded "
                                 "with loadRemoteMD/loadLocalMD"));
    }
    const auto* lmd = static_cast<const LocalMD*>(lp);
    const auto* rmd = static_cast<const RemoteMD*>(rp);
    if (rmd->agent != remote_agent) {
      return Refuse(NIXL_ERR_INVALID_PARAM, what,
                    absl::StrCat("descriptor ", i, ": metadata of agent '", Printable(rmd->agent), "' in a transfer to '",
                                 Printable(remote_agent), "'"));
    }
    uint64_t loff = 0, roff = 0;
    if (!lmd->Covers(l.addr, l.len, loff) || !rmd->Covers(r.addr, r.len, roff)) {
      return Refuse(NIXL_ERR_INVALID_PARAM, what,
                    absl::StrCat("descriptor ", i, ": [0x", absl::Hex(l.addr), ", +", l.len, ") -> [0x",
                                 absl::Hex(r.addr), ", +", r.len, ") is outside its registered region"));
    }
    if (l.len == 0) continue;
    if (!h->ops.empty()) {
      TransferOp& prev = h->ops.back();
      if (prev.local == &lmd->region && prev.remote == rmd->region && prev.local_offset + prev.length == loff &&
          prev.remote_offset + prev.length == roff) {
        prev.length += l.len;
        continue;
      }
    }
    h->ops.push_back({&lmd->region, loff, rmd->region, roff, l.len});
  }
  handle = h.release();
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::postXfer(const nixl_xfer_op_t& /*operation*/, const nixl_meta_dlist_t& /*local*/,
                                          const nixl_meta_dlist_t& /*remote*/, const std::string& /*remote_agent*/,
                                          nixlBackendReqH*& handle, const nixl_opt_b_args_t* opt_args) const {
  const char* what = "postXfer";
  if (!Ready(what)) return NIXL_ERR_BACKEND;
  if (handle == nullptr) return Refuse(NIXL_ERR_INVALID_PARAM, what, "no handle");
  auto* h = static_cast<Handle*>(handle);
  absl::MutexLock l(&h->mu);
  if (h->state == Handle::State::kData || h->state == Handle::State::kNotify) return NIXL_ERR_REPOST_ACTIVE;
  // The agent passes each post's notification (it may change between posts);
  // prepXfer's stands when it passes none.
  bool notif = opt_args != nullptr ? opt_args->hasNotif : h->has_notif;
  const std::string& msg = opt_args != nullptr ? opt_args->notifMsg : h->notif_msg;
  h->post_notif = notif;
  h->post_frame.clear();
  h->post_msg.clear();
  if (notif) {
    if (h->self) {
      if (msg.size() > MaxNixlMessage(localAgent)) return ToNixl(FrameNotification(localAgent, msg).status(), what);
      h->post_msg = msg;
    } else {
      absl::StatusOr<std::string> f = FrameNotification(localAgent, msg);
      if (!f.ok()) return ToNixl(f.status(), what);
      h->post_frame = *std::move(f);
      if (h->mailbox == nullptr) {
        absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = AcquireMailbox(h->agent);
        if (!a.ok()) {
          return ToNixl(a.status(), absl::StrCat(what, ": notification mailbox of agent '", Printable(h->agent), "'"),
                        Scope::kPeer);
        }
        h->mailbox = a->first;
        h->mailbox_key = a->second;
      }
    }
  }
  if (h->ops.empty()) {
    if (!notif) {
      h->state = Handle::State::kDone;
      return NIXL_SUCCESS;
    }
    if (h->self) {
      PushSelfNotification(h->post_msg);
      h->state = Handle::State::kDone;
      return NIXL_SUCCESS;
    }
    absl::StatusOr<uint64_t> b = engine_->NotifyAsync(*h->mailbox, kNotifyValue, h->post_frame);
    if (!b.ok()) return ToNixl(b.status(), absl::StrCat(what, ": notify agent '", Printable(h->agent), "'"), Scope::kPeer);
    h->batch = *b;
    h->state = Handle::State::kNotify;
    return NIXL_IN_PROG;
  }
  absl::StatusOr<uint64_t> b = h->op == NIXL_WRITE ? engine_->WriteAsync(h->ops) : engine_->ReadAsync(h->ops);
  if (!b.ok()) {
    return ToNixl(b.status(),
                  absl::StrCat(what, ": ", h->op == NIXL_WRITE ? "write to" : "read from", " agent '", Printable(h->agent), "'"),
                  Scope::kPeer);
  }
  h->batch = *b;
  h->state = Handle::State::kData;
  return NIXL_IN_PROG;
}

nixl_status_t PodlinkNixlEngine::checkXfer(nixlBackendReqH* handle) const {
  const char* what = "checkXfer";
  if (!Ready(what)) return NIXL_ERR_BACKEND;
  if (handle == nullptr) return Refuse(NIXL_ERR_INVALID_PARAM, what, "no handle");
  DrainOrphans(/*wait=*/false);
  auto* h = static_cast<Handle*>(handle);
  absl::MutexLock l(&h->mu);
  auto fail = [&](const absl::Status& st, absl::string_view step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h->mu) {
    h->state = Handle::State::kFailed;
    h->failure = ToNixl(st, absl::StrCat(what, ": ", step, " agent '", Printable(h->agent), "'"), Scope::kPeer);
    return h->failure;
  };
  switch (h->state) {
    case Handle::State::kIdle:
      return NIXL_ERR_NOT_POSTED;
    case Handle::State::kDone:
      return NIXL_SUCCESS;
    case Handle::State::kFailed:
      return h->failure;
    case Handle::State::kData: {
      std::optional<absl::Status> st = PollBatch(*engine_, h->batch);
      if (!st.has_value()) return NIXL_IN_PROG;
      if (!st->ok()) return fail(*st, h->op == NIXL_WRITE ? "write to" : "read from");
      if (!h->post_notif) {
        h->state = Handle::State::kDone;
        return NIXL_SUCCESS;
      }
      // Every byte of the post is at its destination (for READ: here): now
      // the notification.
      if (h->self) {
        PushSelfNotification(h->post_msg);
        h->state = Handle::State::kDone;
        return NIXL_SUCCESS;
      }
      absl::StatusOr<uint64_t> b = engine_->NotifyAsync(*h->mailbox, kNotifyValue, h->post_frame);
      if (!b.ok()) return fail(b.status(), "notify");
      h->batch = *b;
      h->state = Handle::State::kNotify;
      [[fallthrough]];
    }
    case Handle::State::kNotify: {
      std::optional<absl::Status> st = PollBatch(*engine_, h->batch);
      if (!st.has_value()) return NIXL_IN_PROG;
      if (!st->ok()) return fail(*st, "notify");
      h->state = Handle::State::kDone;
      return NIXL_SUCCESS;
    }
  }
  return NIXL_ERR_UNKNOWN;
}

nixl_status_t PodlinkNixlEngine::releaseReqH(nixlBackendReqH* handle) const {
  if (handle == nullptr) return NIXL_SUCCESS;
  std::unique_ptr<Handle> h(static_cast<Handle*>(handle));
  std::string release;
  {
    absl::MutexLock l(&h->mu);
    release = std::move(h->mailbox_key);
    if (h->state == Handle::State::kData || h->state == Handle::State::kNotify) {
      // Never blocks: the batch runs on, detached (its notification, if not
      // yet sent, is not); later calls poll it to completion.
      absl::MutexLock g(&mu_);
      orphans_.push_back({h->batch, std::move(release)});
      release.clear();
    }
  }
  ReleaseOpened(release);
  return NIXL_SUCCESS;
}

// ---------------------------------------------------------------------------
// Notifications.
// ---------------------------------------------------------------------------

nixl_status_t PodlinkNixlEngine::getNotifs(notif_list_t& notif_list) {
  // Never fails: NIXL's agent merges every backend's notifications into one
  // list, and vLLM does not catch errors here.
  if (initErr || engine_ == nullptr) return NIXL_SUCCESS;
  try {
    DrainOrphans(/*wait=*/false);
    {
      absl::MutexLock l(&mu_);
      while (!self_notifs_.empty()) {
        notif_list.push_back(std::move(self_notifs_.front()));
        self_notifs_.pop_front();
      }
    }
    for (Notification& n : engine_->PollNotifications()) {
      if (n.export_id != mailbox_.export_id || !n.has_message || n.value != kNotifyValue) continue;
      absl::StatusOr<std::pair<std::string, std::string>> f = UnframeNotification(n.message);
      if (!f.ok()) {
        LogLine(absl::StrCat("dropped a malformed notification from session ", n.from_session, ": ",
                             f.status().ToString()));
        continue;
      }
      notif_list.push_back(*std::move(f));
    }
  } catch (const std::exception& ex) {
    LogLine(absl::StrCat("getNotifs: ", ex.what()));
  }
  return NIXL_SUCCESS;
}

nixl_status_t PodlinkNixlEngine::genNotif(const std::string& remote_agent, const std::string& msg) const {
  const std::string what = absl::StrCat("genNotif to agent '", Printable(remote_agent), "'");
  if (!Ready(what.c_str())) return NIXL_ERR_BACKEND;
  absl::StatusOr<std::string> f = FrameNotification(localAgent, msg);
  if (!f.ok()) return ToNixl(f.status(), what);
  if (remote_agent == localAgent) {
    PushSelfNotification(msg);
    return NIXL_SUCCESS;
  }
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> a = AcquireMailbox(remote_agent);
  if (!a.ok()) return ToNixl(a.status(), what, Scope::kPeer);
  absl::Status st = engine_->Notify(*a->first, kNotifyValue, *f);
  ReleaseOpened(a->second);
  return ToNixl(st, what, Scope::kPeer);
}

}  // namespace podlink::nixl
