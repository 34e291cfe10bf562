// The owner's side of the verbs transport over the fake fabric (fake_verbs.h): a VerbsServer on fake device
// fake0, one 1 MiB region, a sink for staged slices and notifications whose answers a test can delay, defer or
// hold; and the importer's side made against it (paths, regions, ops run to completion). Shared by the verbs
// transport's tests (tests/unit/verbs_fake_test.cc) and the slice scheduler's (tests/unit/mesh_slices_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/gpu/memory_object.h"
#include "daemon/mesh/verbs/verbs_link.h"
#include "tests/fakes/fake_verbs.h"

namespace podlink::mesh::verbs {

// Bytes to write and check: `n` of a pattern set by `seed`.
inline std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 31 + seed) & 0xff);
  return v;
}

// --- the two sides over it -------------------------------------------------------

// The local side of an op as the engine describes a host export's mapping;
// `record` stands for the export's record (LinkOp::keep), which lives while
// the export does.
struct Local {
  std::shared_ptr<MemoryObject> memory;
  char* base = nullptr;
  uint64_t size = 0;
  std::shared_ptr<const void> record = std::make_shared<int>(0);
};

class FakeVerbsOwner {
 public:
  FakeVerbsOwner() {
    char tmpl[] = "/tmp/podlink-fakeverbs-XXXXXX";
    sysfs_ = mkdtemp(tmpl);
    // The owner's address 10.0.0.2 is a RoCE v2 GID of fake0.
    std::string base = sysfs_ + "/fake0/ports/1";
    std::filesystem::create_directories(base + "/gids");
    std::filesystem::create_directories(base + "/gid_attrs/types");
    std::ofstream(base + "/gids/1") << "0000:0000:0000:0000:0000:ffff:0a00:0002\n";
    std::ofstream(base + "/gid_attrs/types/1") << "RoCE v2\n";
    options_.sysfs = sysfs_;
    options_.qps_per_path = 2;
    options_.slice_bytes = 64 << 10;
    options_.slices_in_flight = 2;
    server_ = std::make_unique<VerbsServer>(
        &nics_, options_,
        [this](const std::string& node, uint64_t g, uint64_t v) {
          std::lock_guard<std::mutex> l(mu_);
          notes_.push_back({node, g, v});
        },
        // Staged slices, checked as the engine checks them: the grant is
        // the node's, the range inside region_.
        [this](const std::string& node, uint64_t g, bool write, uint64_t offset, char* buf, uint64_t len,
               std::shared_ptr<const void> keep, std::function<void(absl::Status)> done) {
          auto copy = [this, node, g, write, offset, buf, len] {
            std::lock_guard<std::mutex> l(mu_);
            auto it = staged_.find(g);
            if (it == staged_.end() || it->second != node) return absl::NotFoundError("no such grant of that node");
            if (offset > region_.size() || len > region_.size() - offset) return absl::OutOfRangeError("outside");
            write ? std::memcpy(region_.data() + offset, buf, len) : std::memcpy(buf, region_.data() + offset, len);
            ++staged_copies_;
            return absl::OkStatus();
          };
          if (write && defer_next_write_.exchange(false)) {
            // Copied and answered when the test says (deferred_), as a
            // relay's onward send may land long after it took the bytes.
            std::lock_guard<std::mutex> l(mu_);
            deferred_ = [copy, keep = std::move(keep), done = std::move(done)] { done(copy()); };
            return;
          }
          absl::Status st = copy();
          if (hold_sink_) {  // never answered until the test lets go
            std::lock_guard<std::mutex> l(mu_);
            held_.emplace_back(std::move(keep), std::move(done));
            return;
          }
          // Answered later, from another thread, as a relay's onward transfer is.
          if (async_sink_) {
            ++sinks_started_;
            std::thread([keep = std::move(keep), done = std::move(done), st, delay = sink_delay_us_.load()] {
              usleep(delay);
              done(st);
            }).detach();
            return;
          }
          done(st);
        });
    region_.assign(1 << 20, 0);
  }
  ~FakeVerbsOwner() {
    server_.reset();
    std::filesystem::remove_all(sysfs_);
  }

  // The importer's GID on the fake device.
  static GidChoice Mine() {
    GidChoice g;
    g.device = "fake0";
    g.index = 1;
    return g;
  }
  // Path `name` of `node`'s `links` to the owner: `lanes` QPs (0:
  // qps_per_path), the owner's answer (dropping `replaces`, as a repair
  // asks), connected. Both sides' wire data.
  struct Sides {
    SideWire ours, owner;
  };
  absl::StatusOr<Sides> AddPath(VerbsLinks& links, const std::string& node, const std::string& name,
                                const std::vector<uint32_t>& replaces = {}, uint32_t lanes = 0) {
    auto nic = nics_.Get(Mine());
    if (!nic.ok()) return nic.status();
    auto prepared = links.PreparePath(*nic, Mine(), name, lanes);
    if (!prepared.ok()) return prepared.status();
    auto owner = server_->Accept(node, links.instance(), *IpPrefix::Parse("10.0.0.2/30"), prepared->second, replaces);
    if (!owner.ok()) return owner.status();
    if (absl::Status st = links.ConnectPath(prepared->first, *owner); !st.ok()) return st;
    return Sides{prepared->second, *owner};
  }
  // Importing side for `node`, one path to the owner, connected.
  std::unique_ptr<VerbsLinks> Connect(const std::string& node) {
    auto links = std::make_unique<VerbsLinks>(node, options_);
    auto sides = AddPath(*links, node, "test-path");
    EXPECT_TRUE(sides.ok()) << sides.status();
    return links;
  }
  std::vector<RegionKey> Register(const std::string& node, uint64_t grant) {
    auto keys = server_->Register(node, grant, nullptr, region_.data(), region_.size());
    EXPECT_TRUE(keys.ok()) << keys.status();
    return keys.ok() ? *keys : std::vector<RegionKey>{};
  }
  absl::Status Run(VerbsLinks& links, FrameType type, uint64_t grant, uint64_t offset, char* local, uint64_t len,
                   std::shared_ptr<const PathPreference> prefer = nullptr, const Local& whole = {}) {
    absl::Notification done;
    absl::Status result;
    LinkOp op;
    op.local_memory = whole.memory;
    op.keep = whole.record;
    op.local_base = whole.base;
    op.local_size = whole.size;
    op.prefer = std::move(prefer);
    op.type = type;
    op.grant = grant;
    op.offset = offset;
    op.length = len;
    op.local = local;
    op.done = [&](const absl::Status& st) {
      result = st;
      done.Notify();
    };
    absl::Status st = links.Submit(std::move(op));
    if (!st.ok()) return st;
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) return absl::DeadlineExceededError("no completion");
    return result;
  }
  // QP numbers of a link set (not under the fabric's lock: the link set
  // takes its own lock first, then the fabric's, as a device call would).
  std::vector<uint32_t> QpsOf(VerbsLinks& links) {
    std::vector<uint32_t> out;
    for (const auto& c : links.Connections()) {
      const std::string& name = std::get<0>(c);
      out.push_back(static_cast<uint32_t>(std::stoul(name.substr(name.rfind(' ') + 1))));
    }
    return out;
  }

  // Waits (at most 3 s) until the sink was handed `n` notifications.
  bool AwaitNotes(size_t n) {
    for (int i = 0; i < 300; ++i) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (notes_.size() >= n) return true;
      }
      usleep(10000);
    }
    return false;
  }

  std::string sysfs_;
  const VerbsApi api_ = MakeFakeApi();
  Nics nics_{&api_};
  VerbsOptions options_;
  std::unique_ptr<VerbsServer> server_;
  std::vector<char> region_;
  std::mutex mu_;
  struct Note {
    std::string node;
    uint64_t grant, value;
  };
  std::vector<Note> notes_;
  std::map<uint64_t, std::string> staged_;  // grant -> node, for the staging sink
  uint64_t staged_copies_ = 0;
  std::atomic<bool> async_sink_{false};      // the sink answers from another thread, after sink_delay_us_
  std::atomic<int> sink_delay_us_{2000};
  std::atomic<int> sinks_started_{0};
  std::atomic<bool> hold_sink_{false};  // the sink keeps its slices (held_) unanswered
  std::vector<std::pair<std::shared_ptr<const void>, std::function<void(absl::Status)>>> held_;
  std::atomic<bool> defer_next_write_{false};  // the next staged write's copy waits for the test (deferred_)
  std::function<void()> deferred_;
};

}  // namespace podlink::mesh::verbs
