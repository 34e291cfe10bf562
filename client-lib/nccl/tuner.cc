// The tuner of libnccl-net-podlink.so (ncclTuner_v4; see api.h).
#include <algorithm>
#include <mutex>

#include "client-lib/nccl/api.h"
#include "client-lib/nccl/plugin.h"

namespace podlink::ncclnet {

namespace {

struct TunerContext {
  uint32_t magic = 0x74756e65;  // "tune"
  size_t n_ranks = 0;
  size_t n_nodes = 0;
};

constexpr size_t kTunerBytesPerChannel = 4 << 20;
constexpr int kTunerMinChannels = 4;
constexpr int kTunerMaxChannels = 16;

}  // namespace

int TunerChannels(size_t n_ranks, size_t n_nodes, int coll_type, size_t bytes) {
  State& s = S();
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.node_id.empty()) return 0;  // no podlinkd: TCP only, NCCL's own tuning
  }
  if (n_ranks < 2 || n_nodes < 2 || EnvIs("PODLINK_NCCL_TUNER", "0")) return 0;
  if (coll_type < nccl_abi::kFuncBroadcast || coll_type > nccl_abi::kFuncAllReduce) return 0;
  size_t want = bytes / kTunerBytesPerChannel;
  if (want >= kTunerMaxChannels) return 0;  // large: NCCL's own choice (docs/nccl.md, the tuner)
  return static_cast<int>(std::max<size_t>(want, kTunerMinChannels));
}

Result TunerInit(size_t n_ranks, size_t n_nodes, nccl_abi::Logger logger, void** context) {
  if (context == nullptr) return kInvalidArgument;
  auto* t = new TunerContext();
  t->n_ranks = n_ranks;
  t->n_nodes = n_nodes;
  *context = t;
  State& s = S();
  if (logger != nullptr) {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.logger == nullptr) s.logger = logger;
  }
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "tuner: %zu ranks on %zu nodes; below 64 MiB channels = bytes / 4 MiB, at least 4, when podlinkd relays (%s)",
        n_ranks, n_nodes, TunerChannels(n_ranks, n_nodes, nccl_abi::kFuncAllReduce, 0) > 0 ? "active" : "inactive");
  return kSuccess;
}

Result TunerGetCollInfo(void* context, int coll_type, size_t bytes, int /*num_pipe_ops*/, float** /*cost_table*/,
                        int /*num_algo*/, int /*num_proto*/, int /*reg_buff*/, int* n_channels) {
  auto* t = static_cast<TunerContext*>(context);
  if (t == nullptr || t->magic != 0x74756e65 || n_channels == nullptr) {
    return Fail(kInvalidArgument, "tuner: getCollInfo without a podlink tuner context");
  }
  int nc = TunerChannels(t->n_ranks, t->n_nodes, coll_type, bytes);
  if (nc > 0) *n_channels = nc;  // algorithm and protocol stay NCCL's
  return kSuccess;
}

Result TunerDestroy(void* context) {
  auto* t = static_cast<TunerContext*>(context);
  if (t == nullptr || t->magic != 0x74756e65) return Fail(kInvalidArgument, "tuner: destroy of a foreign context");
  t->magic = 0;
  delete t;
  return kSuccess;
}

}  // namespace podlink::ncclnet
