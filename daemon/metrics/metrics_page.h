// The daemon's /metrics page: each part of the daemon (broker, relay, mesh,
// gRPC listener, device plugins, pod directory) renders its own metric
// families; daemon/main.cc adds them here and the page joins them in that
// order (Prometheus text: a family's lines stay together within one part).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace podlink {

class MetricsPage {
 public:
  using Part = std::function<std::string()>;
  // Adds a part; call before the page is served.
  void Add(Part part) { parts_.push_back(std::move(part)); }
  std::string Render() const {
    std::string out;
    for (const Part& p : parts_) out += p();
    return out;
  }

 private:
  std::vector<Part> parts_;
};

}  // namespace podlink
