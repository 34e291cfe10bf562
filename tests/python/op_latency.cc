// The C++ side of the Python binding's overhead benchmark (tests/python/bench_overhead.py): synchronous
// one-sided writes of host memory between two sessions of this process, as `ep.write` does them from Python.
// Prints one JSON line per size: {"api": "c++", "bytes": B, "ops": N, "us_per_op": X}; then one for a Writev of
// 4096 operations of 16 B into every other 16 B of the region (a scattered batch, as a KV hand-off writes):
// {"api": "c++", "call": "writev", "bytes": 16, "batch": 4096, "us_per_op": X}.
//
//   op_latency [OPS]        (podlinkd at $PODLINK_SOCKET_DIR)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "podlink/client.h"
#include "podlink/transfer.h"

int main(int argc, char** argv) {
  const int ops = argc > 1 ? std::atoi(argv[1]) : 20000;
  auto fail = [](const char* what, const absl::Status& s) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    return 1;
  };
  auto owner = podlink::Client::Connect();
  auto writer = podlink::Client::Connect();
  if (!owner.ok()) return fail("connect", owner.status());
  if (!writer.ok()) return fail("connect", writer.status());
  podlink::TransferEngine::Options o;
  o.log_transport = false;
  auto oe = podlink::TransferEngine::Create(**owner, o);
  auto we = podlink::TransferEngine::Create(**writer, o);
  if (!oe.ok() || !we.ok()) return fail("engine", oe.ok() ? we.status() : oe.status());
  auto dst = (*owner)->AllocateHost(1 << 16);
  auto src = (*writer)->AllocateHost(1 << 16);
  if (!dst.ok() || !src.ok()) return fail("alloc", dst.ok() ? src.status() : dst.status());
  auto dreg = (*oe)->Register(**dst);
  auto sreg = (*we)->Register(**src);
  if (!dreg.ok() || !sreg.ok()) return fail("register", dreg.ok() ? sreg.status() : dreg.status());
  auto desc = (*oe)->Describe(*dreg);
  if (!desc.ok()) return fail("describe", desc.status());
  auto remote = (*we)->Open(*podlink::RegionDescriptor::Parse(desc->Serialize()));
  if (!remote.ok()) return fail("open", remote.status());
  for (uint64_t bytes : {uint64_t{64}, uint64_t{4096}}) {
    podlink::TransferOp op{&*sreg, 0, &*remote, 0, bytes};
    for (int i = 0; i < 1000; ++i) (void)(*we)->Write(op);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < ops; ++i) {
      absl::Status s = (*we)->Write(op);
      if (!s.ok()) return fail("write", s);
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / ops;
    std::printf("{\"api\": \"c++\", \"bytes\": %llu, \"ops\": %d, \"us_per_op\": %.3f}\n",
                static_cast<unsigned long long>(bytes), ops, us);
  }
  std::vector<podlink::TransferOp> batch;
  for (uint64_t i = 0; i < 4096; ++i) batch.push_back({&*sreg, i * 16, &*remote, i * 32 % (1 << 16), 16});
  const int calls = ops / 100 + 1;
  for (int i = 0; i < 20; ++i) (void)(*we)->Writev(batch);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    absl::Status s = (*we)->Writev(batch);
    if (!s.ok()) return fail("writev", s);
  }
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls /
              batch.size();
  std::printf("{\"api\": \"c++\", \"call\": \"writev\", \"bytes\": 16, \"batch\": %zu, \"us_per_op\": %.3f}\n",
              batch.size(), us);
  return 0;
}
