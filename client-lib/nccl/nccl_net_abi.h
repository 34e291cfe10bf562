// podlink's own declarations of NCCL's network-plugin interface, versions 8
// to 11 (NCCL 2.20 - 2.29), written from shared/specs/nccl-net-abi.md. The
// layouts NCCL reads are pinned with static_asserts below (x86-64).
#pragma once

#include <cstddef>
#include <cstdint>

namespace podlink::nccl_abi {

enum Result : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

enum LogLevel : int { kLogNone = 0, kLogVersion = 1, kLogWarn = 2, kLogInfo = 3, kLogAbort = 4, kLogTrace = 5 };
inline constexpr unsigned long kLogSubsysInit = 0x1;
inline constexpr unsigned long kLogSubsysNet = 0x10;

using Logger = void (*)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
using ProfilerCallback = Result (*)(void** eHandle, int type, void* pHandle, int64_t pluginId, void* extData);

inline constexpr int kHandleMaxSize = 128;
inline constexpr int kPtrHost = 1;
inline constexpr int kPtrCuda = 2;
inline constexpr int kPtrDmabuf = 4;
inline constexpr int kMaxRequests = 32;
inline constexpr uintptr_t kOptionalRecvCompletion = 0x1;
inline constexpr int kDeviceHost = 0;

struct DeviceHandle {  // ncclNetDeviceHandle_v7..v11
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};

struct VDeviceProps {
  int ndevs;
  int devs[4];
};

struct CommConfig {  // v10, v11
  int trafficClass;  // -1: undefined
};

struct PropertiesV8 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
};

struct PropertiesV9 {  // also v10
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
using PropertiesV10 = PropertiesV9;

struct PropertiesV11 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
};

struct CommAttr {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
};

struct NetAttr {
  CommAttr send;
  CommAttr recv;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
};

struct NetV8 {
  const char* name;
  Result (*init)(Logger logFunction);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV8* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm, DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
};

struct NetV9 {
  const char* name;
  Result (*init)(Logger logFunction);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV9* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm, DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};

struct NetV10 {
  const char* name;
  Result (*init)(Logger logFunction, ProfilerCallback profFunction);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV10* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, CommConfig* config, void* handle, void** sendComm, DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                  void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};

struct NetV11 {
  const char* name;
  Result (*init)(void** ctx, uint64_t commId, CommConfig* config, Logger logFunction, ProfilerCallback profFunction);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV11* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  Result (*connect)(void* ctx, int dev, void* handle, void** sendComm, DeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, DeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** phandles,
                  void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
  Result (*finalize)(void* ctx);
  Result (*setNetAttr)(void* ctx, NetAttr* netAttr);
};

// ---- Tuner, ncclTuner_v4 (not in the net spec; checked against NCCL's
// src/include/plugin/tuner/tuner_v4.h). NCCL 2.28 tries tuner v6..v2 in the
// library NCCL_TUNER_PLUGIN names, and without one in the net plugin's
// library, so exporting ncclTunerPlugin_v4 here is enough.
enum Func : int { kFuncBroadcast = 0, kFuncReduce = 1, kFuncAllGather = 2, kFuncReduceScatter = 3, kFuncAllReduce = 4 };
// Protocol columns of the cost table (NCCL_PROTO_LL, _LL128, _SIMPLE), and
// the entry that removes a choice (NCCL_ALGO_PROTO_IGNORE).
enum Proto : int { kProtoLL = 0, kProtoLL128 = 1, kProtoSimple = 2 };
constexpr float kAlgoProtoIgnore = -1.0f;

struct TunerV4 {
  const char* name;
  Result (*init)(size_t nRanks, size_t nNodes, Logger logFunction, void** context);
  // collCostTable: float[numAlgo][numProto] of estimated times, -1 for
  // ignored entries; nChannels: 0 leaves NCCL's choice.
  Result (*getCollInfo)(void* context, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                        int numAlgo, int numProto, int regBuff, int* nChannels);
  Result (*destroy)(void* context);
};

// Layouts from the spec (x86-64).
static_assert(sizeof(DeviceHandle) == 32);
static_assert(offsetof(DeviceHandle, handle) == 8 && offsetof(DeviceHandle, size) == 16 &&
              offsetof(DeviceHandle, needsProxyProgress) == 24);
static_assert(sizeof(VDeviceProps) == 20);
static_assert(sizeof(CommAttr) == 16 && sizeof(NetAttr) == 44);

static_assert(sizeof(PropertiesV8) == 64);
static_assert(offsetof(PropertiesV8, pciPath) == 8 && offsetof(PropertiesV8, guid) == 16 &&
              offsetof(PropertiesV8, ptrSupport) == 24 && offsetof(PropertiesV8, regIsGlobal) == 28 &&
              offsetof(PropertiesV8, speed) == 32 && offsetof(PropertiesV8, port) == 36 &&
              offsetof(PropertiesV8, latency) == 40 && offsetof(PropertiesV8, maxComms) == 44 &&
              offsetof(PropertiesV8, maxRecvs) == 48 && offsetof(PropertiesV8, netDeviceType) == 52 &&
              offsetof(PropertiesV8, netDeviceVersion) == 56);

static_assert(sizeof(PropertiesV9) == 104);
static_assert(offsetof(PropertiesV9, forceFlush) == 32 && offsetof(PropertiesV9, speed) == 36 &&
              offsetof(PropertiesV9, port) == 40 && offsetof(PropertiesV9, latency) == 44 &&
              offsetof(PropertiesV9, maxComms) == 48 && offsetof(PropertiesV9, maxRecvs) == 52 &&
              offsetof(PropertiesV9, netDeviceType) == 56 && offsetof(PropertiesV9, netDeviceVersion) == 60 &&
              offsetof(PropertiesV9, vProps) == 64 && offsetof(PropertiesV9, maxP2pBytes) == 88 &&
              offsetof(PropertiesV9, maxCollBytes) == 96);

static_assert(sizeof(PropertiesV11) == 112);
static_assert(offsetof(PropertiesV11, vProps) == 64 && offsetof(PropertiesV11, maxP2pBytes) == 88 &&
              offsetof(PropertiesV11, maxCollBytes) == 96 && offsetof(PropertiesV11, maxMultiRequestSize) == 104);

// Function tables: name, then the entries in the spec's order.
static_assert(sizeof(NetV8) == 19 * sizeof(void*));
static_assert(offsetof(NetV8, isend) == 10 * sizeof(void*) && offsetof(NetV8, irecvConsumed) == 18 * sizeof(void*));
static_assert(sizeof(NetV9) == 20 * sizeof(void*));
static_assert(offsetof(NetV9, makeVDevice) == 19 * sizeof(void*));
static_assert(sizeof(NetV10) == 20 * sizeof(void*));
static_assert(sizeof(NetV11) == 22 * sizeof(void*));
static_assert(offsetof(NetV11, finalize) == 20 * sizeof(void*) && offsetof(NetV11, setNetAttr) == 21 * sizeof(void*));
static_assert(sizeof(TunerV4) == 4 * sizeof(void*) && offsetof(TunerV4, getCollInfo) == 2 * sizeof(void*));

}  // namespace podlink::nccl_abi
