// Fuzzes the mesh's data server (daemon/mesh/mesh_engine.cc, ServeFrames):
// the frames (daemon/mesh/links/wire.h) a peer daemon sends on a data connection
// once it has authenticated as node "peer". Three exports, sealed host memfds
// as Broker::Export accepts them:
//
//   A  16 KiB  granted to "peer"                      writes may land here
//   B   4 KiB  granted to "other" (another node)      poison: must never change
//   C   4 KiB  granted to "peer", export withdrawn    poison: must never change
//
// Input: frames until the input ends, each
//   byte kind   WRITE, READ, NOTIFY, DONE, AUTH (not valid here), or a raw type
//   byte grant  A, B, C, 0, an unknown one, or 8 raw bytes
//   byte bad    bit 0 wrong magic, bit 1 flags != 0, bit 2 a NOTIFY/DONE with a
//               payload length, bit 3 a length over the frame cap
//   byte xfer   the transfer number in the tag (0..7)
//   offset and length selectors (Pick), then for a WRITE its payload (made
//   from the next input byte)
// The frames go through a socketpair to ServeFrames on this thread; a reader
// thread collects the answers. A model of the server computes, frame by
// frame, what it must answer and what A must then hold: it stops at the first
// frame the server must refuse (the connection closes there), refuses grants
// of other nodes and of withdrawn exports (NOT_FOUND), out-of-range and
// overflowing ranges (OUT_OF_RANGE), zero lengths (INVALID_ARGUMENT), drops
// writes of finished transfers (after DONE, or a delivered NOTIFY) and
// delivers a NOTIFY once. Checked after each input: every answer matches the
// model's (type, code, and for a READ the bytes), A holds exactly the model's
// bytes, B and C are untouched, no descriptor leaks.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/gpu/host_backend.h"
#include "daemon/mesh/mesh_engine.h"
#include "daemon/mesh/links/wire.h"
#include "tests/fuzz/fuzz_check.h"

using namespace podlink;
using namespace podlink::mesh;

namespace {

constexpr uint64_t kSizeA = 16 << 10, kSizeBC = 4 << 10;
constexpr uint8_t kPoison = 0xA7;

UniqueFd SealedMemfd(uint64_t size) {
  UniqueFd fd(::memfd_create("mesh-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  FUZZ_CHECK(fd.valid(), "memfd_create: %s", std::strerror(errno));
  FUZZ_CHECK(::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)) == 0, "fallocate");
  FUZZ_CHECK(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0, "seal");
  return fd;
}

struct Export {
  UniqueFd fd;
  uint8_t* bytes = nullptr;  // the owner's mapping
  uint64_t size = 0;
  std::shared_ptr<const ExportRecord> record;
};

Export MakeExport(uint64_t id, uint64_t size, uint8_t fill) {
  Export e;
  e.size = size;
  e.fd = SealedMemfd(size);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, e.fd.get(), 0);
  FUZZ_CHECK(p != MAP_FAILED, "mmap");
  e.bytes = static_cast<uint8_t*>(p);
  std::memset(e.bytes, fill, size);
  UniqueFd dup(::fcntl(e.fd.get(), F_DUPFD_CLOEXEC, 0));
  auto m = HostMemfdBackend().Adopt({size, "", HandleKind::kHostMemfd}, std::move(dup), "");
  FUZZ_CHECK(m.ok(), "adopt: %s", m.status().ToString().c_str());
  ExportRecord rec;
  rec.id = id;
  rec.size = size;
  rec.kind = HandleKind::kHostMemfd;
  rec.memory = *std::move(m);
  e.record = std::make_shared<const ExportRecord>(std::move(rec));
  return e;
}

class FakeHost final : public MeshHost {
 public:
  absl::StatusOr<std::shared_ptr<const ExportRecord>> AuthorizeRemote(
      const PodInfo&, const podlink::mesh::v1::OpenRegionRequest&) override {
    return absl::NotFoundError("not in this harness");
  }
  bool ExportLive(const ExportRecord& rec) const override { return rec.id != 3; }  // C was withdrawn
  absl::Status NotifyOwner(const ExportRecord&, uint64_t) override { return absl::OkStatus(); }
};

uint64_t Pick(FuzzInput& in, uint64_t size) {
  switch (in.Byte() % 8) {
    case 0: return 0;
    case 1: return in.Byte() % 64 + 1;
    case 2: return size - (in.Byte() % 16);
    case 3: return size + (in.Byte() % 16);
    case 4: return ~uint64_t{0} - (in.Byte() % 16);
    case 5: return uint64_t{1} << (32 + in.Byte() % 31);
    case 6: return (uint64_t{in.Byte()} << 8 | in.Byte()) % (size + 1);
    default: return in.U64();
  }
}

struct Expected {
  uint16_t type;          // kAck or kData
  int32_t status;         // kAck
  std::string data;       // kData
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FakeHost host;
  const int fds_before = OpenFdCount();
  {
    Export a = MakeExport(1, kSizeA, 0), b = MakeExport(2, kSizeBC, kPoison), c = MakeExport(3, kSizeBC, kPoison);
    std::unique_ptr<MeshEngine> engine = MeshEngine::ForTesting(MeshOptions{}, "self", &host);
    const uint64_t ga = engine->GrantForTesting("peer", a.record);
    const uint64_t gb = engine->GrantForTesting("other", b.record);
    const uint64_t gc = engine->GrantForTesting("peer", c.record);

    // Build the stream and, alongside, the answers the server owes.
    FuzzInput in{data, size};
    std::string stream;
    std::vector<Expected> want;
    std::vector<uint8_t> model(kSizeA, 0);
    std::set<uint32_t> finished;
    bool c_alive = true;  // the grant of C is dropped once the server notices
    while (!in.empty() && want.size() < 64) {
      uint8_t kind = in.Byte();
      uint16_t type = std::array<uint16_t, 6>{2, 3, 6, 7, 1, 0}[kind % 6];
      if (kind % 6 == 5) type = in.Byte();
      uint8_t gsel = in.Byte();
      uint64_t grant = std::array<uint64_t, 5>{ga, gb, gc, 0, 1000}[gsel % 6 == 5 ? 0 : gsel % 6 % 5];
      if (gsel % 6 == 5) grant = in.U64();
      uint8_t bad = in.Byte();
      uint32_t transfer = in.Byte() % 8;
      uint64_t offset = Pick(in, kSizeA);
      uint64_t len64 = Pick(in, kSizeA);
      FrameHeader h{};
      h.magic = (bad & 1) ? 0x12345678 : kFrameMagic;
      h.flags = (bad & 2) ? 1 : 0;
      h.type = type;
      h.tag = (uint64_t{transfer} << 32) | want.size();
      h.grant = grant;
      h.offset = offset;
      uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(len64, 64 << 10));
      if (type == 6 || type == 7) length = (bad & 4) ? 8 : 0;
      if (bad & 8) length = kMaxFramePayload + 1;
      h.length = length;
      stream.append(reinterpret_cast<const char*>(&h), sizeof(h));
      // What the server does with it.
      bool refused = h.magic != kFrameMagic || h.flags != 0 ||
                     ((type == 2 || type == 3) && length > kMaxFramePayload) ||
                     ((type == 6 || type == 7) && length != 0) || (type != 2 && type != 3 && type != 6 && type != 7);
      if (refused) break;  // the connection closes here; nothing after it is read
      std::string payload;
      if (type == 2) {
        uint8_t seed = in.Byte();
        payload.resize(length);
        for (uint32_t i = 0; i < length; ++i) payload[i] = static_cast<char>(seed + i * 7);
        stream += payload;
      }
      if (type == 7) {
        finished.insert(transfer);
        want.push_back({5, 0, ""});
        continue;
      }
      if (type != 3 && finished.count(transfer)) {
        want.push_back({5, 0, ""});  // a late copy, or a repeated notification
        continue;
      }
      absl::StatusCode code = absl::StatusCode::kOk;
      const bool is_a = grant == ga, is_c = grant == gc && c_alive;
      if (!is_a) {
        code = absl::StatusCode::kNotFound;
        if (is_c) c_alive = false;
      } else if (type != 6) {
        if (length == 0) {
          code = absl::StatusCode::kInvalidArgument;
        } else if (offset > kSizeA || length > kSizeA - offset) {
          code = absl::StatusCode::kOutOfRange;
        }
      }
      if (type == 3 && code == absl::StatusCode::kOk) {
        want.push_back({4, 0, std::string(model.begin() + offset, model.begin() + offset + length)});
        continue;
      }
      if (type == 2 && code == absl::StatusCode::kOk) std::memcpy(model.data() + offset, payload.data(), length);
      if (type == 6 && code == absl::StatusCode::kOk) finished.insert(transfer);
      want.push_back({5, static_cast<int32_t>(code), ""});
    }

    int sv[2];
    FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
    UniqueFd server(sv[0]), client(sv[1]);
    std::string answers;
    std::thread writer([&] {
      (void)WriteFull(client.get(), stream.data(), stream.size());
      ::shutdown(client.get(), SHUT_WR);
    });
    std::thread reader([&] {
      char buf[65536];
      for (;;) {
        ssize_t n = ::recv(client.get(), buf, sizeof(buf), 0);
        if (n <= 0) break;
        answers.append(buf, static_cast<size_t>(n));
      }
    });
    engine->ServeFramesForTesting(server.get(), "peer", 42);
    ::shutdown(server.get(), SHUT_RDWR);  // the connection ends: the reader sees EOF
    writer.join();
    reader.join();

    // The answers, one per frame the model says was served, in order.
    size_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      FUZZ_CHECK(answers.size() - at >= sizeof(FrameHeader), "answer %zu of %zu missing", i, want.size());
      FrameHeader r;
      std::memcpy(&r, answers.data() + at, sizeof(r));
      at += sizeof(r);
      FUZZ_CHECK(r.magic == kFrameMagic && r.flags == 0, "answer %zu malformed", i);
      FUZZ_CHECK(r.type == want[i].type, "answer %zu: type %u, want %u", i, r.type, want[i].type);
      FUZZ_CHECK(r.tag >> 32 <= 7 && (r.tag & 0xffffffff) == i, "answer %zu names request %llx", i,
                 static_cast<unsigned long long>(r.tag));
      FUZZ_CHECK(answers.size() - at >= r.length, "answer %zu cut short", i);
      if (r.type == 5) {
        FUZZ_CHECK(r.status == want[i].status, "answer %zu: status %d, want %d", i, r.status, want[i].status);
        FUZZ_CHECK(r.length <= 4096, "answer %zu: %u bytes of text", i, r.length);
      } else {
        FUZZ_CHECK(r.length == want[i].data.size() &&
                       std::memcmp(answers.data() + at, want[i].data.data(), r.length) == 0,
                   "answer %zu: DATA differs from the export's bytes", i);
      }
      at += r.length;
    }
    FUZZ_CHECK(at == answers.size(), "%zu bytes of answers beyond the %zu owed", answers.size() - at, want.size());
    FUZZ_CHECK(std::memcmp(a.bytes, model.data(), kSizeA) == 0, "export A differs from the model");
    for (const Export* e : {&b, &c}) {
      for (uint64_t i = 0; i < e->size; ++i) {
        FUZZ_CHECK(e->bytes[i] == kPoison, "export %llu changed at %llu",
                   static_cast<unsigned long long>(e->record->id), static_cast<unsigned long long>(i));
      }
    }
    for (Export* e : {&a, &b, &c}) ::munmap(e->bytes, e->size);
  }
  FUZZ_CHECK(OpenFdCount() == fds_before, "descriptors leaked: %d -> %d", fds_before, OpenFdCount());
  return 0;
}
