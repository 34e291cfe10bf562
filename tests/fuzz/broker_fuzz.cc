// Fuzzes the broker's request handlers (daemon/broker/broker.h): the calls the
// gRPC layer (daemon/broker/grpc_service.cc) makes with each decoded request,
// and Broker::OnOffer, which the descriptor-channel server calls with each
// offered descriptor. Each input gets a fresh Broker (small limits, a
// HostMemfdBackend, no CUDA, a StandalonePodSource) and opens its sessions as
// daemon/broker/fd_server.cc does: Broker::OpenSession on the daemon's end of
// a SOCK_SEQPACKET socketpair, the other end being the client's channel.
// OpenSession identifies the peer from the kernel (SO_PEERCRED, a pidfd,
// /proc), so when the fuzzer runs as root each socketpair is made under
// another effective uid (a per-thread setresuid around socketpair): sessions
// in slots 0, 1, 2 (and 3, 4 when opened later: uid of slot k % 3) are then
//
//   uid 0     team-a/trainer-0, peer group job-7; root outside any pod: admin
//   uid 1000  team-a/decoder-1, peer group job-7
//   uid 2000  no rule matches: standalone/uid2000-..., no peer group
//
// and otherwise all one pod. The checks hold either way: they read each
// session's pod from the session itself.
//
// Input (every part may be cut short; missing bytes read as 0):
//
//   byte 0   bit k (k < kSlots): slot k's client reads its channel only at the
//            end of the input, and podlinkd's end has the smallest send buffer,
//            so acks and deliveries soon find it full
//   actions  at most kMaxActions; each is a byte (action = byte % 4), a byte
//            for the session slot s (% kSlots), then:
//     OFFER s slot kind   the session in slot s offers a descriptor in `slot`
//                         (one byte); kind % 11: sealed, allocated memfd of
//                         4 KiB or 64 KiB; sparse; unsealed; write-sealed;
//                         read-only; a relay ring (4/4/4, header written); an
//                         eventfd; a pipe; /dev/null; no descriptor at all
//     CALL s rpc n bytes  the session calls rpc % 6 (Export, Import, Release,
//                         List, OpenRelay, Authenticate) with the request
//                         parsed from the n bytes (protobuf wire format; bytes
//                         that do not parse are dropped, as gRPC would).
//                         Authenticate takes the bytes as the credential, or
//                         the session's real one when n is 0
//     CLOSE s             Broker::CloseSession
//     OPEN s              a new session in slot s, if it has none or a closed one
//
// Violations of these abort:
//
//   - every error a handler returns has a canonical non-OK code, which
//     ToGrpcStatus carries unchanged, and a message
//   - every message on a channel is well-formed: HELLO with the session id
//     first; an OFFER_ACK per offer saying exactly what the broker promises
//     (EBADF without a descriptor, EINVAL for a pipe, EMFILE past
//     max_pending_offers, EEXIST for a slot in use, EMFILE past the pod's or
//     the node's offers (max_pending_offers_per_pod, _total), else 0; none once the
//     session closed; possibly dropped for a client that does not read); a
//     DELIVER per OK Import with the promised slot, export id and a memfd of
//     at least the export's size
//   - after every action Broker::Stats() counts the open sessions and the
//     live exports (OK Exports, less OK Releases of kind EXPORT and the
//     exports of closed sessions); only an export's owner releases it as
//     EXPORT; an owner's List shows its exports as its own; List(all) is
//     refused unless Broker::CheckAdmin allows it, and then shows every
//     export; an OK Import names a live export, owned_by_caller right
//   - a session once closed gets no OK from Export, Import, Release or
//     OpenRelay and no longer authenticates; an open one authenticates with
//     its credential, and any credential that authenticates names an open
//     session
//   - an Import by id that the policy (daemon/policy/policy.h) denies fails:
//     PERMISSION_DENIED in the owner's namespace, and from another namespace
//     exactly as an Import of an id never used
//   - OpenRelay succeeds at most once per session
//   - after CloseAllSessions: Stats() says 0 sessions and 0 exports, every
//     channel ends (EOF) after its messages, the process holds the
//     descriptors it held with the fresh broker (the relay drops closed rings
//     on its own thread: waited for up to kFdWait), and after the broker is
//     gone those it held before the input.
#include <dirent.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/fd_channel.h"
#include "common/relay_ring.h"
#include "common/status_util.h"
#include "common/unique_fd.h"
#include "daemon/broker/broker.h"
#include "daemon/gpu/host_backend.h"
#include "daemon/identity/standalone_source.h"
#include "daemon/policy/policy.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/status.h"
#include "spdlog/spdlog.h"

#include "tests/fuzz/fuzz_check.h"

namespace podlink {
namespace {

constexpr size_t kSlots = 5;
constexpr size_t kMaxActions = 48;
constexpr uid_t kUids[3] = {0, 1000, 2000};
constexpr size_t kMaxPendingOffers = 4;
constexpr size_t kMaxPendingOffersPerPod = 6;  // two sessions of one pod reach it
constexpr size_t kMaxPendingOffersTotal = 10;
const size_t kMaxExportChunks = podlink::BrokerOptions{}.max_export_chunks;  // MakeBroker keeps the default
constexpr uint64_t kNeverUsedId = 987654321;  // far above any id an input can reach
constexpr auto kFdWait = std::chrono::seconds(2);

enum Action : uint8_t { kOffer, kCall, kClose, kOpen, kActions };
enum Rpc : uint8_t { kExport, kImport, kRelease, kList, kOpenRelay, kAuthenticate, kRpcs };
enum OfferKind : uint8_t {
  kMemfd4k,
  kMemfd64k,
  kSparse,
  kUnsealed,
  kWriteSealed,
  kReadOnly,
  kRing,
  kEventfd,
  kPipe,
  kDevNull,
  kNoDescriptor,
  kOfferKinds
};

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return size_ == 0; }
  uint8_t Byte() {
    if (size_ == 0) return 0;
    --size_;
    return *data_++;
  }
  std::string Bytes(size_t n) {
    n = std::min(n, size_);
    std::string s(reinterpret_cast<const char*>(data_), n);
    data_ += n;
    size_ -= n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

void CheckError(const absl::Status& st, const char* what) {
  const int code = static_cast<int>(st.code());
  FUZZ_CHECK(code >= 1 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated),
             "%s returned code %d, not a canonical error", what, code);
  FUZZ_CHECK(static_cast<int>(ToGrpcStatus(st).error_code()) == code, "%s: %s became gRPC code %d", what,
             st.ToString().c_str(), static_cast<int>(ToGrpcStatus(st).error_code()));
  FUZZ_CHECK(!st.message().empty(), "%s: %s has no message", what, st.ToString().c_str());
}

// --- descriptors a client offers ------------------------------------------

UniqueFd Memfd(uint64_t size, bool allocate, int seals) {
  UniqueFd fd(::memfd_create("podlink-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  FUZZ_CHECK(fd.valid(), "memfd_create: %s", std::strerror(errno));
  if (allocate) {
    int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size));
    FUZZ_CHECK(err == 0, "posix_fallocate: %s", std::strerror(err));
  } else {
    FUZZ_CHECK(::ftruncate(fd.get(), static_cast<off_t>(size)) == 0, "ftruncate: %s", std::strerror(errno));
  }
  if (seals != 0) FUZZ_CHECK(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0, "seal: %s", std::strerror(errno));
  return fd;
}

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

UniqueFd MakeOffer(OfferKind kind) {
  switch (kind) {
    case kMemfd4k:
      return Memfd(4096, true, kSeals);
    case kMemfd64k:
      return Memfd(65536, true, kSeals);
    case kSparse:
      return Memfd(4096, false, kSeals);
    case kUnsealed:
      return Memfd(4096, true, 0);
    case kWriteSealed:
      return Memfd(4096, true, kSeals | F_SEAL_WRITE);
    case kReadOnly: {
      UniqueFd rw = Memfd(4096, true, kSeals);
      UniqueFd ro(::open(absl::StrCat("/proc/self/fd/", rw.get()).c_str(), O_RDONLY | O_CLOEXEC));
      FUZZ_CHECK(ro.valid(), "reopen read-only: %s", std::strerror(errno));
      return ro;
    }
    case kRing: {
      // As client-lib/engine/transfer.cc makes it, for OpenRelay(4, 4, 4).
      absl::StatusOr<RingLayout> l = RingLayout::Make(4, 4, 4);
      FUZZ_CHECK(l.ok(), "RingLayout::Make: %s", l.status().ToString().c_str());
      UniqueFd fd = Memfd(l->total, true, 0);
      RingHeader h{};
      h.magic = kRingMagic;
      h.version = kRingVersion;
      h.sq_entries = h.cq_entries = h.nq_entries = 4;
      FUZZ_CHECK(::pwrite(fd.get(), &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h)), "pwrite: %s",
                 std::strerror(errno));
      FUZZ_CHECK(::fcntl(fd.get(), F_ADD_SEALS, kSeals) == 0, "seal: %s", std::strerror(errno));
      return fd;
    }
    case kEventfd:
      return UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    case kPipe: {
      int p[2];
      FUZZ_CHECK(::pipe2(p, O_CLOEXEC) == 0, "pipe2: %s", std::strerror(errno));
      ::close(p[1]);
      return UniqueFd(p[0]);
    }
    case kDevNull:
      return UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC));
    default:
      return UniqueFd();
  }
}

// --- sessions --------------------------------------------------------------

// Root may make each socketpair under another effective uid, which the
// kernel then reports as the peer's (SO_PEERCRED). The raw syscall changes
// this thread's credentials only, not the relay worker's nor libFuzzer's.
bool CanSwitchUid() {
  static const bool can = ::geteuid() == 0;
  return can;
}

// {client end, podlinkd's end}.
std::pair<UniqueFd, UniqueFd> Channel(uid_t uid) {
  const bool switched = CanSwitchUid() && uid != 0 && ::syscall(SYS_setresuid, -1, uid, -1) == 0;
  int sv[2];
  const int rc = ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
  const int err = errno;
  if (switched) FUZZ_CHECK(::syscall(SYS_setresuid, -1, 0, -1) == 0, "back to euid 0: %s", std::strerror(errno));
  FUZZ_CHECK(rc == 0, "socketpair: %s", std::strerror(err));
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

// A message the client must, or may, receive.
struct Expected {
  FdMsgType type;
  uint64_t seq = 0, a = 0;
  bool optional = false;  // may be dropped: the client does not read
  uint64_t min_size = 0;  // DELIVER: the descriptor's least size
};

struct Slot {
  std::shared_ptr<Session> session;  // null before the first open
  bool closed = false;
  bool lazy = false;  // reads its channel only at the end
  uint64_t id = 0;
  std::string credential;  // "<id>.<token hex>", from HELLO
  UniqueFd client;         // the client's end of the channel
  std::set<uint64_t> offers;
  std::deque<Expected> expected;
  bool relay_open = false;
  bool live() const { return session != nullptr && !closed; }
  uid_t uid = 0;  // the session's peer uid, which names its pod (MakeBroker's rules)
};

struct LiveExport {
  uint64_t id = 0, session = 0, size = 0;
  std::string name;
  PodInfo owner;
  std::vector<PodName> allowed_importers;
};

struct Harness {
  std::unique_ptr<Broker> broker;
  std::unique_ptr<RelayEngine> relay;  // wired to the broker as podlinkd wires it (daemon/main.cc)
  std::array<Slot, kSlots> slots;
  std::map<uint64_t, LiveExport> exports;  // the broker's live exports, as the harness sees them
  uint32_t lazy_bits = 0;                  // input byte 0

  // Reads every queued message of slot k (until EOF when `to_eof`) and
  // matches it against what the client was promised.
  void Drain(size_t k, bool to_eof) {
    Slot& s = slots[k];
    if (!s.client.valid()) return;
    for (;;) {
      absl::StatusOr<std::optional<ReceivedMessage>> got = RecvFdMessage(s.client.get(), /*dontwait=*/true);
      if (got.ok() && !got->has_value()) {
        FUZZ_CHECK(!to_eof, "slot %zu: the channel of a closed session is still open", k);
        return;
      }
      if (!got.ok()) {
        FUZZ_CHECK(absl::IsNotFound(got.status()), "slot %zu: podlinkd sent a malformed message: %s", k,
                   got.status().ToString().c_str());
        FUZZ_CHECK(s.closed, "slot %zu: EOF on the channel of an open session", k);
        break;
      }
      const ReceivedMessage& m = **got;
      while (!s.expected.empty() && s.expected.front().optional &&
             (s.expected.front().type != static_cast<FdMsgType>(m.msg.type) || s.expected.front().seq != m.msg.seq)) {
        s.expected.pop_front();  // dropped on a full channel
      }
      FUZZ_CHECK(!s.expected.empty(), "slot %zu: unexpected message type %u seq %llu a %llu", k, m.msg.type,
                 static_cast<unsigned long long>(m.msg.seq), static_cast<unsigned long long>(m.msg.a));
      const Expected want = s.expected.front();
      s.expected.pop_front();
      FUZZ_CHECK(static_cast<FdMsgType>(m.msg.type) == want.type && m.msg.seq == want.seq,
                 "slot %zu: got message type %u seq %llu, expected type %u seq %llu", k, m.msg.type,
                 static_cast<unsigned long long>(m.msg.seq), static_cast<unsigned>(want.type),
                 static_cast<unsigned long long>(want.seq));
      switch (want.type) {
        case FdMsgType::kHello:
          s.credential = absl::StrFormat("%d.%016x%016x", m.msg.seq, m.msg.a, m.msg.b);
          FUZZ_CHECK(!m.fd.valid(), "slot %zu: HELLO carried a descriptor", k);
          break;
        case FdMsgType::kOfferAck:
        case FdMsgType::kGoodbye:
          FUZZ_CHECK(m.msg.a == want.a, "slot %zu: message type %u seq %llu says %llu, expected %llu", k, m.msg.type,
                     static_cast<unsigned long long>(m.msg.seq), static_cast<unsigned long long>(m.msg.a),
                     static_cast<unsigned long long>(want.a));
          FUZZ_CHECK(!m.fd.valid(), "slot %zu: message type %u carried a descriptor", k, m.msg.type);
          if (want.type == FdMsgType::kGoodbye && m.msg.b > 0) {
            // The reason follows as one packet of exactly b bytes of text (docs/contract.md).
            FUZZ_CHECK(m.msg.b <= kGoodbyeTextMax, "slot %zu: GOODBYE announces %llu bytes of reason", k,
                       static_cast<unsigned long long>(m.msg.b));
            std::string text(kGoodbyeTextMax + 1, '\0');
            ssize_t n = ::recv(s.client.get(), text.data(), text.size(), MSG_DONTWAIT);
            FUZZ_CHECK(n == static_cast<ssize_t>(m.msg.b), "slot %zu: GOODBYE announced %llu bytes, %zd came", k,
                       static_cast<unsigned long long>(m.msg.b), n);
          }
          break;
        case FdMsgType::kDeliver: {
          FUZZ_CHECK(m.msg.a == want.a && m.fd.valid(), "slot %zu: DELIVER of export %llu (expected %llu), fd %d", k,
                     static_cast<unsigned long long>(m.msg.a), static_cast<unsigned long long>(want.a), m.fd.get());
          struct stat st {};
          char link[64] = {};
          FUZZ_CHECK(::fstat(m.fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= want.min_size &&
                         ::readlink(absl::StrCat("/proc/self/fd/", m.fd.get()).c_str(), link, sizeof(link) - 1) > 0 &&
                         std::strncmp(link, "/memfd:", 7) == 0,
                     "slot %zu: delivered descriptor is %s of %lld bytes, export holds %llu", k, link,
                     static_cast<long long>(st.st_size), static_cast<unsigned long long>(want.min_size));
          break;
        }
        default:
          FUZZ_CHECK(false, "slot %zu: podlinkd sent message type %u", k, m.msg.type);
      }
    }
    for (const Expected& e : s.expected) {
      FUZZ_CHECK(e.optional, "slot %zu: message type %u seq %llu never arrived", k, static_cast<unsigned>(e.type),
                 static_cast<unsigned long long>(e.seq));
    }
    s.expected.clear();
    s.client.Reset();
  }

  void Open(size_t k) {
    Slot& s = slots[k];
    if (s.live()) return;
    if (s.session != nullptr) Drain(k, /*to_eof=*/true);  // the closed session's channel ends
    const bool lazy = lazy_bits & (1u << k);
    auto [client, daemon] = Channel(kUids[k % 3]);
    ucred cred{};
    socklen_t cred_len = sizeof(cred);
    FUZZ_CHECK(::getsockopt(daemon.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0, "SO_PEERCRED: %s",
               std::strerror(errno));
    if (lazy) {
      int one = 1;  // the kernel's minimum
      FUZZ_CHECK(::setsockopt(daemon.get(), SOL_SOCKET, SO_SNDBUF, &one, sizeof(one)) == 0, "SO_SNDBUF: %s",
                 std::strerror(errno));
    }
    const size_t sessions_before = broker->Stats().sessions;
    absl::StatusOr<std::shared_ptr<Session>> opened = broker->OpenSession(std::move(daemon));
    s = Slot{};
    s.lazy = lazy;
    s.client = std::move(client);
    if (!opened.ok()) {
      CheckError(opened.status(), "OpenSession");
      FUZZ_CHECK(broker->Stats().sessions == sessions_before, "a refused session was counted");
      s.expected.push_back({FdMsgType::kGoodbye, 0, static_cast<uint64_t>(opened.status().code()), true});
      s.closed = true;  // nothing to call with; the channel still ends with GOODBYE
      Drain(k, /*to_eof=*/true);
      return;
    }
    s.session = *opened;
    s.id = s.session->id;
    s.uid = cred.uid;  // its pod: a uid of its own only where this process could switch (root)
    s.expected.push_back({FdMsgType::kHello, s.id, 0, false});
    if (!s.lazy) Drain(k, false);
  }

  void Close(size_t k) {
    Slot& s = slots[k];
    if (s.session == nullptr) return;
    broker->CloseSession(s.id, "fuzz");
    s.closed = true;
    s.offers.clear();
    std::erase_if(exports, [&](const auto& kv) { return kv.second.session == s.id; });
  }

  // Offers held by the open sessions of the pod of `uid` (every pod: -1).
  size_t PendingOffers(int64_t uid = -1) const {
    size_t n = 0;
    for (size_t j = 0; j < kSlots; ++j) {
      if (slots[j].live() && (uid < 0 || slots[j].uid == uid)) n += slots[j].offers.size();
    }
    return n;
  }

  void Offer(size_t k, uint64_t slot, OfferKind kind) {
    Slot& s = slots[k];
    if (s.session == nullptr) return;
    UniqueFd fd = MakeOffer(kind);
    std::optional<uint64_t> err;  // the ack the broker promises; none once closed
    if (kind == kNoDescriptor) {
      err = EBADF;
    } else if (kind == kPipe) {
      err = EINVAL;
    } else if (!s.closed) {
      if (s.offers.size() >= kMaxPendingOffers) {
        err = EMFILE;
      } else if (s.offers.contains(slot)) {
        err = EEXIST;
      } else if (PendingOffers(s.uid) >= kMaxPendingOffersPerPod || PendingOffers() >= kMaxPendingOffersTotal) {
        err = EMFILE;
      } else {
        err = 0;
        s.offers.insert(slot);
      }
    }
    broker->OnOffer(*s.session, slot, std::move(fd));
    if (err && !s.closed) s.expected.push_back({FdMsgType::kOfferAck, slot, *err, s.lazy});
  }

  void Call(size_t k, Rpc rpc, const std::string& bytes) {
    Slot& s = slots[k];
    if (s.session == nullptr) return;
    Session& session = *s.session;
    switch (rpc) {
      case kExport: {
        v1::ExportRequest req;
        if (!req.ParseFromString(bytes)) return;
        if (req.chunks_size() > 0) {
          // A chunked export takes each chunk's offer (not fd_slot's), unless it names too many chunks.
          if (static_cast<size_t>(req.chunks_size()) <= kMaxExportChunks) {
            for (const v1::ExportChunk& c : req.chunks()) s.offers.erase(c.fd_slot());
          }
        } else if (req.handle_type() == v1::HANDLE_TYPE_POSIX_FD ||
                   req.handle_type() == v1::HANDLE_TYPE_HOST_MEMFD) {
          s.offers.erase(req.fd_slot());  // taken whatever happens next
        }
        absl::StatusOr<v1::ExportResponse> r = broker->Export(session, req);
        if (!r.ok()) return CheckError(r.status(), "Export");
        FUZZ_CHECK(!s.closed, "Export OK for closed session %llu", static_cast<unsigned long long>(s.id));
        FUZZ_CHECK(!exports.contains(r->export_id()), "Export returned id %llu, already live",
                   static_cast<unsigned long long>(r->export_id()));
        LiveExport& e = exports[r->export_id()];
        e.id = r->export_id();
        e.session = s.id;
        e.size = req.size();
        e.name = req.name();
        e.owner = session.pod;
        for (const v1::PodRef& p : req.allowed_importers()) e.allowed_importers.push_back({p.namespace_(), p.name()});
        return;
      }
      case kImport: {
        v1::ImportRequest req;
        if (!req.ParseFromString(bytes)) return;
        absl::StatusOr<v1::ImportResponse> r = broker->Import(session, req);
        if (req.target_case() == v1::ImportRequest::kExportId) {
          if (auto it = exports.find(req.export_id()); it != exports.end()) CheckDenial(session, it->second, r);
        }
        if (!r.ok()) return CheckError(r.status(), "Import");
        FUZZ_CHECK(!s.closed, "Import OK for closed session %llu", static_cast<unsigned long long>(s.id));
        const uint64_t id = r->export_().export_id();
        auto it = exports.find(id);
        FUZZ_CHECK(it != exports.end(), "Import OK of export %llu, which is not live",
                   static_cast<unsigned long long>(id));
        FUZZ_CHECK(r->export_().owned_by_caller() == (it->second.session == s.id), "Import: owned_by_caller wrong");
        s.expected.push_back({FdMsgType::kDeliver, r->delivery_slot(), id, false, it->second.size});
        return;
      }
      case kRelease: {
        v1::ReleaseRequest req;
        if (!req.ParseFromString(bytes)) return;
        absl::StatusOr<v1::ReleaseResponse> r = broker->Release(session, req);
        if (!r.ok()) return CheckError(r.status(), "Release");
        FUZZ_CHECK(!s.closed, "Release OK for closed session %llu", static_cast<unsigned long long>(s.id));
        if (r->kind() == v1::ReleaseResponse::KIND_EXPORT) {
          auto it = exports.find(req.export_id());
          FUZZ_CHECK(it != exports.end() && it->second.session == s.id,
                     "session %llu released export %llu as EXPORT, which it does not own",
                     static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(req.export_id()));
          exports.erase(it);
        }
        return;
      }
      case kList: {
        v1::ListRequest req;
        if (!req.ParseFromString(bytes)) return;
        absl::StatusOr<v1::ListResponse> r = broker->List(session, req);
        const bool admin = Broker::CheckAdmin(session).ok();
        if (req.all() && !admin) {
          FUZZ_CHECK(!r.ok() && absl::IsPermissionDenied(r.status()), "List(all) for a non-admin: %s",
                     r.status().ToString().c_str());
        }
        if (!r.ok()) return CheckError(r.status(), "List");
        std::set<uint64_t> listed;
        for (const v1::ExportInfo& e : r->exports()) {
          auto it = exports.find(e.export_id());
          FUZZ_CHECK(it != exports.end(), "List shows export %llu, which is not live",
                     static_cast<unsigned long long>(e.export_id()));
          FUZZ_CHECK(e.owned_by_caller() == (it->second.session == s.id), "List: owned_by_caller of %llu wrong",
                     static_cast<unsigned long long>(e.export_id()));
          listed.insert(e.export_id());
        }
        for (const auto& [id, e] : exports) {
          FUZZ_CHECK(listed.contains(id) || (!req.all() && e.session != s.id), "List%s misses export %llu%s",
                     req.all() ? "(all)" : "", static_cast<unsigned long long>(id), req.all() ? "" : " of the caller");
        }
        return;
      }
      case kOpenRelay: {
        v1::OpenRelayRequest req;
        if (!req.ParseFromString(bytes)) return;
        if (s.offers.erase(req.ring_slot()) > 0) s.offers.erase(req.doorbell_slot());
        absl::StatusOr<v1::OpenRelayResponse> r = broker->OpenRelay(session, req);
        if (!r.ok()) return CheckError(r.status(), "OpenRelay");
        FUZZ_CHECK(!s.closed, "OpenRelay OK for closed session %llu", static_cast<unsigned long long>(s.id));
        FUZZ_CHECK(!s.relay_open, "a second relay ring for session %llu", static_cast<unsigned long long>(s.id));
        s.relay_open = true;
        return;
      }
      case kAuthenticate: {
        const std::string credential = bytes.empty() ? s.credential : bytes;
        absl::StatusOr<std::shared_ptr<Session>> r = broker->Authenticate(credential);
        if (bytes.empty() && !s.credential.empty()) {
          FUZZ_CHECK(r.ok() == !s.closed && (!r.ok() || *r == s.session),
                     "session %llu (%s) with its own credential: %s", static_cast<unsigned long long>(s.id),
                     s.closed ? "closed" : "open", r.ok() ? "OK" : r.status().ToString().c_str());
        }
        if (!r.ok()) {
          FUZZ_CHECK(absl::IsUnauthenticated(r.status()), "Authenticate: %s", r.status().ToString().c_str());
          return CheckError(r.status(), "Authenticate");
        }
        FUZZ_CHECK(std::any_of(slots.begin(), slots.end(), [&](const Slot& o) { return o.live() && o.session == *r; }),
                   "Authenticate(\"%s\") returned session %llu, which is not open", credential.c_str(),
                   static_cast<unsigned long long>((*r)->id));
        return;
      }
      default:
        return;
    }
  }

  // An Import by id the policy (daemon/policy/policy.h) denies fails: with
  // PERMISSION_DENIED in the owner's namespace, and from another namespace
  // exactly as an Import of an id never used.
  void CheckDenial(Session& session, const LiveExport& e, const absl::StatusOr<v1::ImportResponse>& got) {
    ExportPolicyView view{e.id, e.name, &e.owner, &e.allowed_importers};
    if (CheckImport(view, session.pod).ok()) return;
    FUZZ_CHECK(!got.ok(), "pod %s imported export %llu of pod %s against the policy", session.pod.Ref().c_str(),
               static_cast<unsigned long long>(e.id), e.owner.Ref().c_str());
    if (e.owner.namespace_ == session.pod.namespace_) {
      FUZZ_CHECK(absl::IsPermissionDenied(got.status()), "denied Import in the owner's namespace: %s",
                 got.status().ToString().c_str());
      return;
    }
    v1::ImportRequest probe;
    probe.set_export_id(kNeverUsedId);
    absl::StatusOr<v1::ImportResponse> never = broker->Import(session, probe);
    FUZZ_CHECK(!never.ok(), "Import of never-used id %llu succeeded", static_cast<unsigned long long>(kNeverUsedId));
    const std::string want =
        absl::StrReplaceAll(never.status().ToString(), {{absl::StrCat(kNeverUsedId), absl::StrCat(e.id)}});
    FUZZ_CHECK(got.status().ToString() == want,
               "denied Import of export %llu from another namespace reads \"%s\", not \"%s\"",
               static_cast<unsigned long long>(e.id), got.status().ToString().c_str(), want.c_str());
  }

  void CheckStats() {
    size_t open = 0;
    for (const Slot& s : slots) open += s.live();
    const BrokerStats st = broker->Stats();
    FUZZ_CHECK(st.sessions == open && st.exports == exports.size(),
               "Stats: %zu sessions, %zu exports; expected %zu, %zu", st.sessions, st.exports, open, exports.size());
  }
};

// Limits small enough for a short input to reach each of them; the two
// rules of the file comment. (RunOne attaches one relay worker.)
std::unique_ptr<Broker> MakeBroker() {
  BrokerOptions o;
  o.max_sessions = 4;
  o.max_sessions_per_pod = 3;
  o.max_pending_offers = kMaxPendingOffers;
  o.max_pending_offers_per_pod = kMaxPendingOffersPerPod;
  o.max_pending_offers_total = kMaxPendingOffersTotal;
  o.max_allowed_importers = 4;
  o.max_export_size = uint64_t{1} << 20;
  o.registry.max_exports_per_session = 3;
  o.registry.max_exports_per_pod = 4;
  o.registry.max_exports_total = 6;
  std::vector<StandalonePodRule> rules(2);
  rules[0].uid = 0;
  rules[0].namespace_ = "team-a";
  rules[0].name = "trainer-0";
  rules[0].annotations[kPeerGroupAnnotation] = "job-7";
  rules[1].uid = 1000;
  rules[1].namespace_ = "team-a";
  rules[1].name = "decoder-1";
  rules[1].annotations[kPeerGroupAnnotation] = "job-7";
  GpuInventory inventory;
  inventory.cuda_available = false;
  std::vector<std::unique_ptr<MemoryBackend>> backends;
  backends.push_back(std::make_unique<HostMemfdBackend>(nullptr, std::make_shared<MappingBudget>(uint64_t{64} << 20)));
  return std::make_unique<Broker>(o, std::make_unique<StandalonePodSource>(std::move(rules)), std::move(inventory),
                                  std::move(backends));
}

void RunOne(const uint8_t* data, size_t size, int fds_before) {
  Input in(data, size);
  Harness h;
  h.lazy_bits = in.Byte();
  h.broker = MakeBroker();
  RelayOptions relay_options;
  relay_options.workers = 1;
  relay_options.spin_before_sleep_us = 20;
  h.relay = std::make_unique<RelayEngine>(h.broker->RelayResolver(), h.broker->inventory(), relay_options);
  h.broker->Attach(h.relay.get(), nullptr);
  const int fds_with_broker = OpenFdCount();
  for (size_t k = 0; k < 3; ++k) h.Open(k);
  for (size_t n = 0; n < kMaxActions && !in.empty(); ++n) {
    const Action action = static_cast<Action>(in.Byte() % kActions);
    const size_t k = in.Byte() % kSlots;
    switch (action) {
      case kOffer: {
        const uint64_t slot = in.Byte();
        h.Offer(k, slot, static_cast<OfferKind>(in.Byte() % kOfferKinds));
        break;
      }
      case kCall: {
        const Rpc rpc = static_cast<Rpc>(in.Byte() % kRpcs);
        const size_t len = in.Byte();
        h.Call(k, rpc, in.Bytes(len));
        break;
      }
      case kClose:
        h.Close(k);
        break;
      case kOpen:
        h.Open(k);
        break;
      default:
        break;
    }
    for (size_t j = 0; j < kSlots; ++j) {
      if (h.slots[j].live() && !h.slots[j].lazy) h.Drain(j, false);
    }
    h.CheckStats();
  }

  h.broker->CloseAllSessions("fuzz input done");
  const BrokerStats st = h.broker->Stats();
  FUZZ_CHECK(st.sessions == 0 && st.exports == 0, "after CloseAllSessions: %zu sessions, %zu exports", st.sessions,
             st.exports);
  for (size_t k = 0; k < kSlots; ++k) {
    h.slots[k].closed = true;
    h.Drain(k, /*to_eof=*/true);
    h.slots[k].session.reset();
  }
  const auto deadline = std::chrono::steady_clock::now() + kFdWait;
  int fds = OpenFdCount();
  while (fds != fds_with_broker && std::chrono::steady_clock::now() < deadline) {
    timespec ts{0, 100 * 1000};
    ::nanosleep(&ts, nullptr);
    fds = OpenFdCount();
  }
  FUZZ_CHECK(fds == fds_with_broker, "descriptor leak: %d open with the fresh broker, %d after closing every session",
             fds_with_broker, fds);
  h.relay.reset();
  h.broker.reset();
  fds = OpenFdCount();
  FUZZ_CHECK(fds == fds_before, "descriptor leak: %d open before this input, %d after the broker is gone", fds_before,
             fds);
}

}  // namespace
}  // namespace podlink

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // the broker logs every export and session at info
  // Requests with invalid UTF-8 in string fields fail to parse, each with an
  // ERROR line from protobuf (3.x): thousands of them would bury the log.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  podlink::RunOne(data, size, OpenFdCount());
  return 0;
}
