// The tuner of libnccl-net-podlink.so (ncclTuner_v4; see api.h).
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "client-lib/nccl/api.h"
#include "client-lib/nccl/plugin.h"

namespace podlink::ncclnet {

namespace {

struct TunerContext {
  uint32_t magic = 0x74756e65;  // "tune"
  size_t n_ranks = 0;
  size_t n_nodes = 0;
  bool simple_only = false;  // TunerSimpleOnly at init
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

bool TunerSimpleOnly(size_t n_ranks, size_t n_nodes) {
  State& s = S();
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.node_id.empty()) return false;  // no podlinkd: TCP only, NCCL's own protocols
  }
  // A user's NCCL_PROTO stays the user's.
  return n_ranks >= 2 && n_nodes >= 2 && !EnvIs("PODLINK_NCCL_TUNER", "0") && !EnvIs("PODLINK_NCCL_KEEP_PROTO", "1") &&
         std::getenv("NCCL_PROTO") == nullptr;
}

// Simple only, where the communicator spans pods (NCCL sees nodes): LL and
// LL128 are slower over the relay at every size measured (docs/nccl.md).
// Communicators within one pod (one node) keep NCCL's protocols: NCCL's
// own P2P transport needs LL for small messages. The algorithm stays NCCL's.
void TunerKeepSimple(float** cost_table, int num_algo, int num_proto) {
  if (cost_table == nullptr || num_algo <= 0 || num_proto <= nccl_abi::kProtoSimple) return;
  // NCCL passes float[num_algo][num_proto] as float**.
  float* table = reinterpret_cast<float*>(cost_table);
  bool simple = false;
  for (int a = 0; a < num_algo; ++a) simple = simple || table[a * num_proto + nccl_abi::kProtoSimple] >= 0.0f;
  if (!simple) return;  // nothing left to choose: NCCL's table as it is
  for (int a = 0; a < num_algo; ++a) {
    for (int p = 0; p < num_proto; ++p) {
      if (p != nccl_abi::kProtoSimple) table[a * num_proto + p] = nccl_abi::kAlgoProtoIgnore;
    }
  }
}

Result TunerInit(size_t n_ranks, size_t n_nodes, nccl_abi::Logger logger, void** context) {
  if (context == nullptr) return kInvalidArgument;
  auto* t = new TunerContext();
  t->n_ranks = n_ranks;
  t->n_nodes = n_nodes;
  t->simple_only = TunerSimpleOnly(n_ranks, n_nodes);
  *context = t;
  State& s = S();
  if (logger != nullptr) {
    std::lock_guard<std::mutex> l(s.mu);
    if (s.logger == nullptr) s.logger = logger;
  }
  s.Log(nccl_abi::kLogInfo, __FILE__, __LINE__,
        "tuner: %zu ranks on %zu nodes; below 64 MiB channels = bytes / 4 MiB, at least 4, when podlinkd relays (%s); "
        "protocols: %s",
        n_ranks, n_nodes, TunerChannels(n_ranks, n_nodes, nccl_abi::kFuncAllReduce, 0) > 0 ? "active" : "inactive",
        t->simple_only ? "Simple only (the relay)" : "NCCL's");
  return kSuccess;
}

Result TunerGetCollInfo(void* context, int coll_type, size_t bytes, int /*num_pipe_ops*/, float** cost_table,
                        int num_algo, int num_proto, int /*reg_buff*/, int* n_channels) {
  auto* t = static_cast<TunerContext*>(context);
  if (t == nullptr || t->magic != 0x74756e65 || n_channels == nullptr) {
    return Fail(kInvalidArgument, "tuner: getCollInfo without a podlink tuner context");
  }
  int nc = TunerChannels(t->n_ranks, t->n_nodes, coll_type, bytes);
  if (nc > 0) *n_channels = nc;
  if (t->simple_only) TunerKeepSimple(cost_table, num_algo, num_proto);
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
