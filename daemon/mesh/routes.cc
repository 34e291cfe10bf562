#include "daemon/mesh/routes.h"

#include <algorithm>
#include <limits>

namespace podlink::mesh {

std::optional<std::vector<std::string>> RelayPath(const std::string& self_name, const std::vector<IpPrefix>& self,
                                                  const std::map<std::string, std::vector<IpPrefix>>& known,
                                                  const std::string& target, size_t max_relays) {
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
  auto width = [&](size_t x, size_t y) { return ChoosePaths(*addrs[x], *addrs[y], false).size(); };
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

}  // namespace podlink::mesh
