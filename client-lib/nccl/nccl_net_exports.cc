// The symbols NCCL looks up in libnccl-net-podlink.so: ncclNetPlugin_v8 ..
// ncclNetPlugin_v11, thin adapters over the version-agnostic core, and the
// tuner table ncclTunerPlugin_v4. The
// objects are non-const with default visibility (a const object in an
// extern "C" block would have internal linkage and not be exported).
#include <cstddef>
#include <new>

#include "client-lib/nccl/nccl_net_abi.h"
#include "client-lib/nccl/api.h"

namespace {

namespace abi = podlink::nccl_abi;
namespace core = podlink::ncclnet;
using abi::Result;

template <typename Props>
void FillCommon(const core::DeviceProps& p, Props* out) {
  out->name = const_cast<char*>(p.name);
  out->pciPath = const_cast<char*>(p.pci_path);
  out->guid = p.guid;
  out->ptrSupport = p.ptr_support;
  out->regIsGlobal = 0;
  out->speed = p.speed_mbps;
  out->port = p.port;
  out->latency = p.latency_us;
  out->maxComms = p.max_comms;
  out->maxRecvs = p.max_recvs;
  out->netDeviceType = abi::kDeviceHost;
  out->netDeviceVersion = 0;
}

template <typename Props>
void FillV9Plus(int dev, const core::DeviceProps& p, Props* out) {
  FillCommon(p, out);
  out->forceFlush = 0;
  out->vProps.ndevs = 1;
  out->vProps.devs[0] = dev;
  out->maxP2pBytes = p.max_p2p_bytes;
  out->maxCollBytes = p.max_coll_bytes;
}

Result GetPropsV8(int dev, abi::PropertiesV8* out) {
  if (out == nullptr) return abi::kInvalidArgument;
  core::DeviceProps p;
  Result r = core::GetProperties(dev, &p);
  if (r == abi::kSuccess) FillCommon(p, out);
  return r;
}

Result GetPropsV9(int dev, abi::PropertiesV9* out) {
  if (out == nullptr) return abi::kInvalidArgument;
  core::DeviceProps p;
  Result r = core::GetProperties(dev, &p);
  if (r == abi::kSuccess) FillV9Plus(dev, p, out);
  return r;
}

Result GetPropsV11(int dev, abi::PropertiesV11* out) {
  if (out == nullptr) return abi::kInvalidArgument;
  core::DeviceProps p;
  Result r = core::GetProperties(dev, &p);
  if (r == abi::kSuccess) {
    FillV9Plus(dev, p, out);
    out->maxMultiRequestSize = 1;
  }
  return r;
}

Result InitV8(abi::Logger logger) { return core::Init(logger); }
Result InitV10(abi::Logger logger, abi::ProfilerCallback) { return core::Init(logger); }

// v11: one context per communicator; finalize(ctx) follows every init, also
// a failed one.
struct CommContext {
  uint64_t comm_id;
  bool initialized;
};

Result InitV11(void** ctx, uint64_t comm_id, abi::CommConfig*, abi::Logger logger, abi::ProfilerCallback) {
  if (ctx == nullptr) return abi::kInvalidArgument;
  auto* c = new (std::nothrow) CommContext{comm_id, false};
  *ctx = c;
  if (c == nullptr) return abi::kSystemError;
  Result r = core::Init(logger);
  c->initialized = r == abi::kSuccess;
  return r;
}

Result FinalizeV11(void* ctx) {
  auto* c = static_cast<CommContext*>(ctx);
  Result r = abi::kSuccess;
  if (c != nullptr && c->initialized) r = core::Finalize();
  delete c;
  return r;
}

Result ListenV11(void*, int dev, void* handle, void** listen_comm) { return core::Listen(dev, handle, listen_comm); }

template <typename DevHandle>
Result ConnectAny(int dev, void* handle, void** send_comm, DevHandle** dev_comm) {
  if (dev_comm != nullptr) *dev_comm = nullptr;
  return core::Connect(dev, handle, send_comm);
}
Result ConnectV8(int dev, void* handle, void** send_comm, abi::DeviceHandle** dc) {
  return ConnectAny(dev, handle, send_comm, dc);
}
Result ConnectV10(int dev, abi::CommConfig*, void* handle, void** send_comm, abi::DeviceHandle** dc) {
  return ConnectAny(dev, handle, send_comm, dc);
}
Result ConnectV11(void*, int dev, void* handle, void** send_comm, abi::DeviceHandle** dc) {
  return ConnectAny(dev, handle, send_comm, dc);
}

Result AcceptAll(void* listen_comm, void** recv_comm, abi::DeviceHandle** dc) {
  if (dc != nullptr) *dc = nullptr;
  return core::Accept(listen_comm, recv_comm);
}

Result IsendV8(void* comm, void* data, int size, int tag, void* mh, void** request) {
  if (size < 0) return abi::kInvalidArgument;
  return core::Isend(comm, data, static_cast<size_t>(size), tag, mh, request);
}
Result IsendV9(void* comm, void* data, size_t size, int tag, void* mh, void** request) {
  return core::Isend(comm, data, size, tag, mh, request);
}
Result IsendV10(void* comm, void* data, size_t size, int tag, void* mh, void*, void** request) {
  return core::Isend(comm, data, size, tag, mh, request);
}

Result IrecvV8(void* comm, int n, void** data, int* sizes, int* tags, void** mhs, void** request) {
  if (request != nullptr) *request = nullptr;
  if (n < 1 || n > core::kMaxRecvs || sizes == nullptr) return core::Irecv(comm, n, data, nullptr, tags, mhs, request);
  size_t wide[core::kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return abi::kInvalidArgument;
    wide[i] = static_cast<size_t>(sizes[i]);
  }
  return core::Irecv(comm, n, data, wide, tags, mhs, request);
}
Result IrecvV9(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void** request) {
  return core::Irecv(comm, n, data, sizes, tags, mhs, request);
}
Result IrecvV10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void**, void** request) {
  return core::Irecv(comm, n, data, sizes, tags, mhs, request);
}

Result GetDeviceMr(void*, void*, void** dptr) {
  if (dptr != nullptr) *dptr = nullptr;  // host-side plugin: no device handles
  return abi::kSuccess;
}
Result IrecvConsumed(void*, int, void*) { return abi::kSuccess; }
Result SetNetAttr(void*, abi::NetAttr*) { return abi::kSuccess; }  // no traffic classes to tune

}  // namespace

extern "C" {

__attribute__((visibility("default"))) abi::NetV8 ncclNetPlugin_v8 = {
    "podlink",         InitV8,          core::Devices,   GetPropsV8,    core::Listen,   ConnectV8,
    AcceptAll,         core::RegMr,     nullptr,         core::DeregMr, IsendV8,        IrecvV8,
    core::Iflush,      core::Test,      core::CloseSend, core::CloseRecv, core::CloseListen, GetDeviceMr,
    IrecvConsumed,
};

__attribute__((visibility("default"))) abi::NetV9 ncclNetPlugin_v9 = {
    "podlink",         InitV8,          core::Devices,   GetPropsV9,    core::Listen,   ConnectV8,
    AcceptAll,         core::RegMr,     nullptr,         core::DeregMr, IsendV9,        IrecvV9,
    core::Iflush,      core::Test,      core::CloseSend, core::CloseRecv, core::CloseListen, GetDeviceMr,
    IrecvConsumed,     nullptr,
};

__attribute__((visibility("default"))) abi::NetV10 ncclNetPlugin_v10 = {
    "podlink",         InitV10,         core::Devices,   GetPropsV9,    core::Listen,   ConnectV10,
    AcceptAll,         core::RegMr,     nullptr,         core::DeregMr, IsendV10,       IrecvV10,
    core::Iflush,      core::Test,      core::CloseSend, core::CloseRecv, core::CloseListen, GetDeviceMr,
    IrecvConsumed,     nullptr,
};

__attribute__((visibility("default"))) abi::NetV11 ncclNetPlugin_v11 = {
    "podlink",         InitV11,         core::Devices,   GetPropsV11,   ListenV11,      ConnectV11,
    AcceptAll,         core::RegMr,     nullptr,         core::DeregMr, IsendV10,       IrecvV10,
    core::Iflush,      core::Test,      core::CloseSend, core::CloseRecv, core::CloseListen, GetDeviceMr,
    IrecvConsumed,     nullptr,         FinalizeV11,     SetNetAttr,
};

__attribute__((visibility("default"))) abi::TunerV4 ncclTunerPlugin_v4 = {
    "podlink", core::TunerInit, core::TunerGetCollInfo, core::TunerDestroy,
};

}  // extern "C"
