// The importer's transfers (transfer.h): two-hop striping, the pump,
// notifications; the handle lookups and path ranking they use.
#include "daemon/mesh/importer/transfer.h"

#include <algorithm>
#include <deque>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/mesh/routing/addresses.h"
#include "daemon/mesh/control/answer_once.h"
#include "daemon/mesh/links/range.h"
#include "daemon/mesh/seal/window.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

namespace {
const ComponentLog TransferLog("mesh");
}  // namespace

RemoteTransfers::RemoteTransfers(Options options, MeshHost* host, const HandleTable* handles)
    : options_(std::move(options)), host_(host), handles_(*handles) {}

// A striped transfer started meanwhile still ends on the two-hop thread, never
// inside its Transfer. Nothing is queued after this.
RemoteTransfers::~RemoteTransfers() { two_hop_thread_.Stop(); }

absl::Status RemoteTransfers::NotQueued(const std::string& node) const {
  return NotQueuedStatus(stopping_.load(std::memory_order_acquire), node);
}

// ---------------------------------------------------------------------------
// Two-hop striping: a transfer cut into chunks that the direct links and the
// relay's route each pull while they have fewer than kTwoHopWindow in flight.
// A chunk the relay's route fails is sent again on the direct links — for a
// write, only once the owner fenced the route (nothing the relay still holds
// can land after that); the transfer ends when every chunk landed, or with
// the direct links' error, and only once nothing of it is in flight.

class RemoteTransfers::TwoRoutes : public std::enable_shared_from_this<RemoteTransfers::TwoRoutes> {
 public:
  TwoRoutes(RemoteTransfers* e, LinkOp whole, std::shared_ptr<Peer> direct, std::shared_ptr<TwoHop> route,
            std::shared_ptr<const PathPreference> alt_prefer)
      : e_(e),
        whole_(std::move(whole)),
        direct_(direct),
        route_(route),
        alt_grant_(route->grant),
        alt_sealed_(route->sealed),
        alt_prefer_(std::move(alt_prefer)),
        chunks_((whole_.length + kTwoHopChunk - 1) / kTwoHopChunk) {}

  // The first submissions, from Start: the transfer cannot end (and call
  // `done`) before Start returned.
  void Begin() {
    Pump();
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      begun_ = true;
      finish = Over();
    }
    if (finish && !e_->two_hop_thread_.Post([self = shared_from_this()] { self->Finish(); })) Finish();
  }

  // Submits what each route may take now, a chunk to each in turn. Never on
  // a link's own thread (the link set it holds for a moment could be its
  // last reference): from Start, the two-hop thread or the direct peer's
  // worker.
  void Pump() {
    for (bool more = true; more;) {
      more = false;
      for (int route : {kDirect, kAlt}) {
        uint64_t chunk = 0;
        {
          absl::MutexLock l(&mu_);
          if (!failed_.ok() || in_flight_[route] >= kTwoHopWindow || (route == kAlt && alt_down_)) continue;
          if (route == kDirect && !redo_.empty() && (!writes() || fence_ == Fence::kDone)) {
            chunk = redo_.front();
            redo_.pop_front();
          } else if (next_ < chunks_) {
            chunk = next_++;
          } else {
            continue;
          }
          ++in_flight_[route];
        }
        more = true;
        absl::Status st = Submit(route, chunk);
        if (!st.ok()) Ended(route, chunk, st, /*on_link_thread=*/false);
      }
    }
  }

 private:
  enum { kDirect = 0, kAlt = 1 };
  enum class Fence { kNone, kPending, kDone };
  bool writes() const { return whole_.type == FrameType::kWrite; }

  absl::Status Submit(int route, uint64_t chunk) {
    std::shared_ptr<Peer> peer;
    if (route == kDirect) {
      peer = direct_.lock();
    } else if (std::shared_ptr<TwoHop> r = route_.lock(); r != nullptr && !r->failed.load(std::memory_order_acquire) &&
                                                          r->peer->instance.load(std::memory_order_acquire) ==
                                                              r->instance) {
      peer = r->peer;
    }
    std::shared_ptr<DataLinks> links;
    if (route == kDirect) {
      links = peer != nullptr ? peer->links() : nullptr;
    } else if (peer != nullptr) {
      links = alt_sealed_;  // through the relay: sealed end to end
    }
    if (links == nullptr || links->live() == 0) {
      return absl::UnavailableError(absl::StrCat("no link of the ", route == kDirect ? "direct" : "two-hop",
                                                 " route is up"));
    }
    const uint64_t at = chunk * kTwoHopChunk;
    LinkOp op;
    op.type = whole_.type;
    op.grant = route == kDirect ? whole_.grant : alt_grant_;
    op.offset = whole_.offset + at;
    op.length = std::min<uint64_t>(kTwoHopChunk, whole_.length - at);
    op.local = whole_.local + at;
    op.keep = whole_.keep;
    op.local_is_export = route == kDirect && whole_.local_is_export;
    op.prefer = route == kDirect ? whole_.prefer : alt_prefer_;
    op.done = [self = shared_from_this(), route, chunk](const absl::Status& st) {
      self->Ended(route, chunk, st, /*on_link_thread=*/true);
    };
    return links->Submit(std::move(op));
  }

  void Ended(int route, uint64_t chunk, const absl::Status& st, bool on_link_thread) {
    bool fence = false, finish = false, failover = false;
    {
      absl::MutexLock l(&mu_);
      --in_flight_[route];
      if (st.ok()) {
        ++landed_;
        if (route == kAlt) {
          e_->counters_.two_hop_bytes.fetch_add(std::min<uint64_t>(kTwoHopChunk, whole_.length - chunk * kTwoHopChunk),
                                       std::memory_order_relaxed);
        }
      } else if (route == kDirect) {
        if (failed_.ok()) failed_ = st;
      } else {
        failover = !alt_down_;
        alt_down_ = true;
        redo_.push_back(chunk);
        e_->counters_.two_hop_failovers.fetch_add(1, std::memory_order_relaxed);
        if (writes() && fence_ == Fence::kNone) {
          fence_ = Fence::kPending;
          fence = true;
        }
      }
      finish = Over();
    }
    // What locks the route or the direct peer runs off the link's thread (a
    // reference taken there could be the last one); from Pump, here, and
    // Pump goes on by itself.
    auto next = [self = shared_from_this(), failover, fence, finish, pump = on_link_thread,
                 why = std::string(st.message().substr(0, 256))] {
      if (failover) self->RouteDown(why);
      if (fence) self->StartFence();
      if (finish) return self->Finish();
      if (pump) self->Pump();
    };
    if (on_link_thread && e_->two_hop_thread_.Post(next)) return;
    next();  // from Pump, or once the engine is being destroyed
  }

  // The relay's route failed: not used again for this region.
  void RouteDown(const std::string& why) {
    std::shared_ptr<TwoHop> r = route_.lock();
    if (r != nullptr && !r->failed.exchange(true, std::memory_order_acq_rel)) {
      TransferLog()->warn("event=mesh_two_hop_down relay={} why={} (its chunks go on the direct links)",
                          r->peer->node(), LogQuoted(why));
    }
  }

  // Asks the owner, over the direct link's control channel, to close the
  // relay's grant and let its landing writes finish.
  void StartFence() {
    std::shared_ptr<Peer> peer = direct_.lock();
    auto self = shared_from_this();
    auto answer = std::make_shared<AnswerOnce<uint32_t>>(
        [self](absl::StatusOr<uint32_t> r) { self->Fenced(r.status()); }, "the fence was dropped (podlinkd is stopping)");
    const uint64_t nonce = [&] {
      std::shared_ptr<TwoHop> r = route_.lock();
      return r != nullptr ? r->nonce : 0;
    }();
    if (peer == nullptr || nonce == 0) return (*answer)(absl::UnavailableError("the region was dropped"));
    Peer* p = peer.get();
    RemoteTransfers* e = e_;
    if (!p->Post([p, e, nonce, answer] {
          std::shared_ptr<pb::Mesh::Stub> stub = p->stub();
          if (stub == nullptr) return (*answer)(absl::UnavailableError("no control channel to the owner"));
          grpc::ClientContext ctx;
          ctx.set_deadline(absl::ToChronoTime(absl::Now() + 2 * e->options_.io_timeout + absl::Seconds(5)));
          pb::FenceRouteRequest req;
          req.set_nonce(nonce);
          pb::FenceRouteResponse resp;
          absl::Status st = FromGrpc(stub->FenceRoute(&ctx, req, &resp), p->node());
          if (!st.ok()) return (*answer)(st);
          e->counters_.two_hop_fences.fetch_add(1, std::memory_order_relaxed);
          (*answer)(resp.grants_closed());
        })) {
      (*answer)(e_->NotQueued(p->node()));
    }
  }

  void Fenced(const absl::Status& st) {
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      fence_ = Fence::kDone;
      if (!st.ok() && failed_.ok()) {
        failed_ = absl::UnavailableError(absl::StrCat(
            "a relay's route of this striped transfer failed, and the owner could not fence it: ", st.message()));
      }
      finish = Over();
    }
    if (finish) return Finish();
    // On the direct peer's worker: never a link's thread.
    Pump();
  }

  // Nothing in flight, no fence pending, and every chunk landed or the
  // transfer failed.
  bool Over() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!begun_ || in_flight_[kDirect] > 0 || in_flight_[kAlt] > 0 || fence_ == Fence::kPending || finished_) {
      return false;
    }
    if (failed_.ok() && landed_ < chunks_) return false;
    finished_ = true;
    return true;
  }

  void Finish() {
    absl::Status result;
    {
      absl::MutexLock l(&mu_);
      result = failed_;
    }
    auto done = std::move(whole_.done);
    whole_.done = nullptr;
    done(result);
  }

  RemoteTransfers* const e_;
  LinkOp whole_;
  // Weak: a link's thread may drop the last reference to this transfer.
  const std::weak_ptr<Peer> direct_;
  const std::weak_ptr<TwoHop> route_;
  const uint64_t alt_grant_;
  const std::shared_ptr<seal::SealedLinks> alt_sealed_;
  const std::shared_ptr<const PathPreference> alt_prefer_;
  const uint64_t chunks_;
  absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;    // the next chunk no route took yet
  uint64_t landed_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> redo_ ABSL_GUARDED_BY(mu_);  // chunks the relay's route failed
  uint32_t in_flight_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  bool alt_down_ ABSL_GUARDED_BY(mu_) = false;
  Fence fence_ ABSL_GUARDED_BY(mu_) = Fence::kNone;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  bool begun_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status RemoteTransfers::Transfer(MeshTransfer t, MeshPort::Done done) {
  PODLINK_ASSIGN_OR_RETURN(Handle h, FindHandle(t.session, t.handle));
  PODLINK_RETURN_IF_ERROR(CheckInstance(h));
  if (t.length == 0) return absl::InvalidArgumentError("length must be > 0");
  PODLINK_RETURN_IF_ERROR((ByteRange{t.remote_offset, t.length}.CheckIn(h.size, "the remote region")));
  std::shared_ptr<DataLinks> links = LinksOf(h);
  if (links == nullptr || links->live() == 0) {
    return absl::UnavailableError(absl::StrCat("no link to node ", h.peer->node(),
                                               " is up (open the region again to reconnect)"));
  }
  LinkOp op;
  op.type = t.write ? FrameType::kWrite : FrameType::kRead;
  op.grant = h.grant;
  op.offset = t.remote_offset;
  op.length = t.length;
  op.local = t.local;
  op.keep = t.keep;
  op.done = std::move(done);
  // A host export's own mapping (not a GPU export's staging): RDMA can go
  // straight from and into it; TCP may send from it without a copy when it is
  // this session's own export (pages that may still be read after the
  // transfer ended hold only the transferring pod's bytes) and the range lies
  // inside it.
  if (h.sealed == nullptr && t.keep != nullptr && t.staging == nullptr && t.keep->memory != nullptr) {
    if (absl::StatusOr<RelayView> view = t.keep->memory->MapForRelay(); view.ok() && !view->on_gpu) {
      const auto* base = reinterpret_cast<const char*>(view->address);
      op.local_is_export = t.keep->owner_session == t.session && t.local >= base &&
                           static_cast<uint64_t>(t.local - base) <= t.keep->size &&
                           t.length <= t.keep->size - static_cast<uint64_t>(t.local - base);
      // Links that register local memory (verbs) send from and read into it.
      op.local_memory = t.keep->memory;
      op.local_base = reinterpret_cast<char*>(view->address);
      op.local_size = t.keep->size;
    }
  }
  const std::string place = t.keep != nullptr ? host_->GpuBusId(*t.keep) : std::string();
  op.prefer = h.peer->Preference(place, [&](const std::vector<Path>& paths) { return RankFor(paths, place); });
  if (std::shared_ptr<TwoHop> route = h.two_hop;
      route != nullptr && t.length >= kTwoHopMinBytes && !route->failed.load(std::memory_order_acquire)) {
    std::shared_ptr<DataLinks> alt = route->peer->links();
    if (alt != nullptr && alt->live() > 0 && route->peer->instance.load(std::memory_order_acquire) == route->instance) {
      auto alt_prefer =
          route->peer->Preference(place, [&](const std::vector<Path>& paths) { return RankFor(paths, place); });
      auto striped = std::make_shared<TwoRoutes>(this, std::move(op), h.peer, route, std::move(alt_prefer));
      counters_.two_hop_transfers.fetch_add(1, std::memory_order_relaxed);
      striped->Begin();
      return absl::OkStatus();
    }
  }
  return links->Submit(std::move(op));
}

std::shared_ptr<DataLinks> RemoteTransfers::LinksOf(const Handle& h) {
  if (h.sealed != nullptr) return h.sealed;
  return h.peer->links();
}

absl::Status RemoteTransfers::Notify(uint64_t session, uint64_t handle, uint64_t value,
                                     MeshPort::Done done) {
  PODLINK_ASSIGN_OR_RETURN(Handle h, FindHandle(session, handle));
  PODLINK_RETURN_IF_ERROR(CheckInstance(h));
  std::shared_ptr<DataLinks> links = LinksOf(h);
  if (links == nullptr) return absl::UnavailableError(absl::StrCat("no link to node ", h.peer->node(), " is up"));
  LinkOp op;
  op.type = FrameType::kNotify;
  op.grant = h.grant;
  op.offset = value;
  op.done = std::move(done);
  return links->Submit(std::move(op));
}

absl::Status RemoteTransfers::CheckInstance(const Handle& h) {
  if (h.peer->instance.load(std::memory_order_acquire) != h.instance) {
    return absl::UnavailableError(absl::StrCat("node ", h.peer->node(),
                                               "'s podlinkd restarted since the region was opened: open it again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Handle> RemoteTransfers::FindHandle(uint64_t session, uint64_t handle) const {
  std::optional<Handle> h = handles_.Find(session, handle);
  if (!h.has_value()) {
    if (stopping_.load(std::memory_order_acquire)) return StoppingStatus();
    return absl::NotFoundError(absl::StrCat("remote region ", handle, " was not opened by this session"));
  }
  return *std::move(h);
}

PathPreference RemoteTransfers::RankFor(const std::vector<Path>& paths, const std::string& gpu_bus_id) const {
  std::vector<RankedPath> ranked;
  for (const Path& p : paths) ranked.push_back({PathName(p), ReadNic(options_.sysfs, p.local.netdev)});
  MemoryPlace place = gpu_bus_id.empty() ? MemoryPlace{} : GpuPlace(options_.sysfs, gpu_bus_id);
  return RankPaths(ranked, place);
}

}  // namespace podlink::mesh
