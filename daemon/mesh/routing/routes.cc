#include "daemon/mesh/routing/routes.h"

#include <algorithm>
#include <limits>

#include <sys/socket.h>

namespace podlink::mesh {

bool ValidNodeName(const std::string& n) {
  if (n.empty() || n.size() > 253) return false;
  for (char ch : n) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.')) return false;
  }
  return true;
}

std::set<std::string> SharedSubnets(const std::vector<IpPrefix>& x, const std::vector<IpPrefix>& y) {
  std::set<std::string> out;
  for (const IpPrefix& a : x) {
    for (const IpPrefix& b : y) {
      if (a.prefix != b.prefix || !a.SameNetwork(b) || a.addr == b.addr) continue;
      IpPrefix net = a;
      for (int bit = a.prefix; bit < (a.family == AF_INET ? 32 : 128); ++bit) net.addr[bit / 8] &= ~(0x80 >> (bit % 8));
      out.insert(net.ToString());
    }
  }
  return out;
}

size_t TrustedCables(const std::string& x_name, const std::vector<IpPrefix>& x, const std::string& y_name,
                     const std::vector<IpPrefix>& y, bool y_is_target, const CableTrust& trust) {
  std::set<std::string> shared = SharedSubnets(x, y);
  if (trust.believe_all || trust.Confirmed(x_name, y_name)) return shared.size();
  static const std::vector<IpPrefix> kNone;
  auto configured = [&](const std::string& node) -> const std::vector<IpPrefix>& {
    auto it = trust.configured.find(node);
    return it == trust.configured.end() ? kNone : it->second;
  };
  std::set<std::string> vouched = SharedSubnets(configured(x_name), y_is_target ? y : configured(y_name));
  size_t n = 0;
  for (const std::string& subnet : shared) n += vouched.contains(subnet);
  return n;
}

std::optional<std::vector<std::string>> RelayPath(const std::string& self_name, const std::vector<IpPrefix>& self,
                                                  const std::map<std::string, std::vector<IpPrefix>>& known,
                                                  const std::string& target, const CableTrust& trust,
                                                  size_t max_relays) {
  auto target_it = known.find(target);
  if (target_it == known.end() || target == self_name) return std::nullopt;
  // Nodes by index: 0 is this node.
  std::vector<std::string> names = {self_name};
  std::vector<const std::vector<IpPrefix>*> addrs = {&self};
  for (const auto& [name, a] : known) {
    if (name == self_name) continue;
    names.push_back(name);
    addrs.push_back(&a);
  }
  const size_t n = names.size();
  // Cables: distinct shared subnets (a claim repeated counts once), between
  // two other nodes only those some word other than their own vouches for.
  auto width = [&](size_t x, size_t y) -> size_t {
    if (x == 0) return SharedSubnets(*addrs[x], *addrs[y]).size();
    return TrustedCables(names[x], *addrs[x], names[y], *addrs[y], names[y] == target, trust);
  };
  const size_t goal = static_cast<size_t>(std::find(names.begin(), names.end(), target) - names.begin());
  // Breadth first, one layer per hop; within a layer each node keeps the
  // predecessor that gives it the widest bottleneck.
  constexpr size_t kUnseen = std::numeric_limits<size_t>::max();
  std::vector<size_t> depth(n, kUnseen), prev(n, kUnseen), bottleneck(n, 0);
  depth[0] = 0;
  bottleneck[0] = std::numeric_limits<size_t>::max();
  std::vector<size_t> layer = {0};
  for (size_t hops = 0; !layer.empty() && hops <= max_relays; ++hops) {
    std::vector<size_t> next;
    for (size_t x : layer) {
      for (size_t y = 0; y < n; ++y) {
        if (depth[y] != kUnseen && depth[y] != hops + 1) continue;
        // Relays must be known nodes other than the target; the target
        // ends the walk.
        size_t w = width(x, y);
        if (w == 0) continue;
        size_t b = std::min(bottleneck[x], w);
        if (depth[y] == kUnseen) {
          depth[y] = hops + 1;
          next.push_back(y);
        }
        if (b > bottleneck[y]) {
          bottleneck[y] = b;
          prev[y] = x;
        }
      }
    }
    if (depth[goal] != kUnseen) break;
    // Only relays (not the goal) continue the walk.
    next.erase(std::remove(next.begin(), next.end(), goal), next.end());
    layer = std::move(next);
  }
  if (depth[goal] == kUnseen || depth[goal] > max_relays + 1) return std::nullopt;
  std::vector<std::string> via;
  for (size_t at = prev[goal]; at != 0; at = prev[at]) via.push_back(names[at]);
  std::reverse(via.begin(), via.end());
  return via;
}

std::optional<std::string> TwoHopRelay(const std::string& self_name, const std::vector<IpPrefix>& self,
                                       const std::map<std::string, std::vector<IpPrefix>>& known,
                                       const std::string& target, const std::vector<IpPrefix>& target_addrs,
                                       const CableTrust& trust) {
  std::optional<std::string> best;
  size_t best_cables = 0;
  for (const auto& [name, addrs] : known) {  // by name: the first of equals stays
    if (name == target || name == self_name || SharedSubnets(self, addrs).empty()) continue;
    size_t cables = TrustedCables(name, addrs, target, target_addrs, /*y_is_target=*/true, trust);
    if (cables > best_cables) {
      best = name;
      best_cables = cables;
    }
  }
  return best;
}

}  // namespace podlink::mesh
