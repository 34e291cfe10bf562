// The routing room's book of node adverts (mesh.proto NodeAdvert): this
// node's own, other nodes' as they came in (each checked against the mesh CA
// by the caller's `Verify`), the neighbours this node talked to over a direct
// path, and which cables between two other nodes both ends confirm. Every
// input is another node's: sizes, counts, times and names are bounded here.
// Its own lock, a leaf: `Verify` and the caller's logging run without it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "podlink/mesh/v1/mesh.pb.h"

namespace podlink::mesh {

class AdvertBook {
 public:
  static constexpr size_t kMaxAdvertsPerMessage = 48;
  static constexpr size_t kMaxAdvertEntry = 4 << 10;
  static constexpr int kLifetimes = 10;  // an advert older than this many intervals is stale
  static constexpr size_t kMaxNeighbours = 64;
  static constexpr size_t kMaxAdverts = 1024;
  static constexpr size_t kMaxSenders = 4096;

  // `self`: this node's name; `interval`: mesh.advert_interval.
  AdvertBook(std::string self, absl::Duration interval) : self_(std::move(self)), interval_(interval) {}

  // `node` was reached over a direct path at `address` (the caller checked
  // that): a neighbour, said in this node's next advert; at most kMaxNeighbours.
  void SawNeighbour(const std::string& node, const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  // This node's own advert: due once per interval (or at once after a new
  // neighbour); the entry to sign, with the recent neighbours; then what was
  // signed, which also drops the stale adverts of other nodes.
  bool OwnDue() ABSL_LOCKS_EXCLUDED(mu_);
  podlink::mesh::v1::AdvertEntry OwnEntry() ABSL_LOCKS_EXCLUDED(mu_);
  void SetOwn(podlink::mesh::v1::NodeAdvert signed_advert, const podlink::mesh::v1::AdvertEntry& entry)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether it is time to trade adverts with the neighbours again.
  bool TradeDue() ABSL_LOCKS_EXCLUDED(mu_);

  // What `from` sent: each advert that parses, is fresh, names another
  // valid node, is newer than the one held and verifies is kept; at most
  // kMaxAdvertsPerMessage are looked at, one batch per sender a second.
  using Verify = std::function<absl::Status(const podlink::mesh::v1::NodeAdvert& advert, const std::string& node)>;
  struct Learned {
    std::string node;
    std::vector<std::string> addresses;
    uint32_t port = 0;
    bool first = false;  // no advert of it was held before
  };
  std::vector<Learned> Accept(const std::string& from,
                              const google::protobuf::RepeatedPtrField<podlink::mesh::v1::NodeAdvert>& adverts,
                              const Verify& verify) ABSL_LOCKS_EXCLUDED(mu_);

  // What a Hello carries: this node's advert first, then the freshest others.
  void AddTo(google::protobuf::RepeatedPtrField<podlink::mesh::v1::NodeAdvert>* out) const ABSL_LOCKS_EXCLUDED(mu_);
  // Pairs of nodes (first < second) whose current adverts name each other.
  std::set<std::pair<std::string, std::string>> Confirmed() const ABSL_LOCKS_EXCLUDED(mu_);
  // When `node`'s advert was issued (unix seconds); -1: none held.
  int64_t IssuedOf(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Stored {
    podlink::mesh::v1::NodeAdvert advert;
    int64_t issued = 0;                // unix seconds
    std::set<std::string> neighbours;  // its entry's, parsed once
  };
  int64_t Oldest(int64_t now_s) const { return now_s - kLifetimes * absl::ToInt64Seconds(interval_); }

  const std::string self_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  std::map<std::string, Stored> adverts_ ABSL_GUARDED_BY(mu_);  // by node, this one's included
  std::map<std::string, absl::Time> from_ ABSL_GUARDED_BY(mu_);  // last batch taken, by sender
  std::map<std::string, absl::Time> neighbours_ ABSL_GUARDED_BY(mu_);  // when last talked to
  absl::Time own_signed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time traded_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace podlink::mesh
