// podlink's own declaration of the NIXL backend-plugin ABI, so that
// libplugin_PODLINK.so builds without NIXL's headers (they pull in Abseil
// logging) and without linking libnixl.
//
// Matches NIXL 1.4.0 (ai-dynamo/nixl tag v1.4.0, commit c0a1102b94d1), read
// from src/api/cpp/{nixl_types.h,nixl_descriptors.h}, src/api/cpp/backend/
// {backend_aux.h,backend_engine.h,backend_plugin.h} and
// src/core/telemetry/telemetry_event.h. Main at 8770b655 has the same bytes in
// those five API headers. Written by hand: nothing here is NIXL's text.
//
// What is ABI and must not be edited casually:
//   * the order of nixlBackendEngine's virtual functions (vtable slots), and of
//     nixlDescList's; the agent dispatches through slots, not names;
//   * the data members of every struct below, in order, with their exact
//     types (libnixl reads them: the base engine's backendType, customParams and
//     initErr through inline getters compiled into libnixl, the plugin struct
//     field by field, descriptor lists and option structs as plain data);
//   * the parameter types of every virtual (a `const T&` and a `T` are passed
//     differently).
// The static_asserts at the end pin the x86-64 libstdc++ (new string ABI)
// layout. Names of types and functions do not reach the vtable; they are kept as
// NIXL spells them for readability. NIXL's core never uses dynamic_cast or
// typeid on engines, metadata or request handles (its only dynamic casts are on
// its own plugin-handle classes, nixl_plugin_manager.cpp:497,520), so the RTTI
// of these classes need not match libnixl's either.
//
// Every function declared here is defined here (inline). NIXL defines several
// descriptor helpers out of line in libnixl_build.so (src/infra/
// nixl_descriptors.cpp: nixlBasicDesc's constructors, operator==, overlaps;
// nixlBlobDesc's constructors; every non-inline member of nixlDescList<T>,
// explicitly instantiated there); the equivalents below behave the same. No
// base-class virtual is defined out of line: all defaults are inline in NIXL
// too. Serialization and printing helpers are left out (not in any vtable).
// Everything is declared with hidden visibility so the plugin's copies never
// interpose on, or bind to, libnixl's; only nixl_plugin_init / nixl_plugin_fini
// are exported. Link with -Wl,--no-undefined.
//
// Run-time version: NIXL 1.0-1.4 give a plugin no way to learn the loading
// NIXL's version: api_version has been 1 throughout, the init params carry no
// version, libnixl exports no version symbol and has no versioned SONAME. The
// only version text is the NIXL_VERSION literal logged once by
// libnixl_common.so at INFO level. A heuristic (not tried on real binaries):
// probe the already-loaded libraries for symbols (find libnixl.so with dladdr on
// nixl_plugin_init's return address, then dlopen(path, RTLD_NOLOAD) + dlsym):
//   _ZN12nixlDescListI14nixlStrideDescE7addDescERKS0_ in libnixl_build.so: >= 1.4.0
//   _ZN13nixlMDManagerD2Ev in libnixl.so: newer than 1.4.0 (main after 1.4.0)
// The engine ABI itself is unchanged from 1.0.0 through main at 8770b655.
//
// Style: this file breaks Google naming on purpose where it mirrors NIXL.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#pragma GCC visibility push(hidden)

// ---------------------------------------------------------------------------
// Enumerations (nixl_types.h). All are 4 bytes.
// ---------------------------------------------------------------------------

// Segment kinds. The agent indexes per-type tables with these: FILE_SEG last.
enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };

enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

enum nixl_status_t {
  NIXL_IN_PROG = 1,
  NIXL_SUCCESS = 0,
  NIXL_ERR_NOT_POSTED = -1,
  NIXL_ERR_INVALID_PARAM = -2,
  NIXL_ERR_BACKEND = -3,
  NIXL_ERR_NOT_FOUND = -4,
  NIXL_ERR_MISMATCH = -5,
  NIXL_ERR_NOT_ALLOWED = -6,
  NIXL_ERR_REPOST_ACTIVE = -7,
  NIXL_ERR_UNKNOWN = -8,
  NIXL_ERR_NOT_SUPPORTED = -9,
  NIXL_ERR_REMOTE_DISCONNECT = -10,  // the agent drops the peer on this
  NIXL_ERR_CANCELED = -11,
  NIXL_ERR_NO_TELEMETRY = -12,  // agent-level only
};

// Agent locking mode, copied into nixlBackendInitParams::syncMode as the user
// asked for it (the agent may run STRICT when it starts a listener thread).
enum class nixl_thread_sync_t {
  NIXL_THREAD_SYNC_NONE,    // agent takes no locks
  NIXL_THREAD_SYNC_STRICT,  // one exclusive lock around every agent call
  NIXL_THREAD_SYNC_RW,      // data path (prep/post/check, genNotif) under a shared lock
  NIXL_THREAD_SYNC_DEFAULT = NIXL_THREAD_SYNC_NONE,
};

// How estimateXferCost computed its answer.
enum class nixl_cost_t {
  ANALYTICAL_BACKEND = 0,
};

// ---------------------------------------------------------------------------
// Type aliases used in the engine's signatures (nixl_types.h, backend_aux.h).
// ---------------------------------------------------------------------------

using nixl_backend_t = std::string;  // the backend's (plugin's) name, e.g. "PODLINK"
using nixl_blob_t = std::string;     // opaque bytes; may hold NULs
using nixl_mem_list_t = std::vector<nixl_mem_t>;
using nixl_b_params_t = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH = void*;  // GPU device-API memory view

// Received notifications: (sender agent name, payload) pairs, appended to.
using notif_list_t = std::vector<std::pair<std::string, std::string>>;

// Passed by pointer only (estimateXferCost's last argument); never read here.
struct nixlAgentOptionalArgs;
using nixl_opt_args_t = nixlAgentOptionalArgs;

// ---------------------------------------------------------------------------
// Telemetry (src/core/telemetry/telemetry_event.h). Only the element type of a
// base-engine member; this header deliberately offers no addTelemetryEvent,
// whose inline body (and the event type) changed in 1.1 and 1.3. NIXL 1.4.0's
// core never reads a backend's events.
// ---------------------------------------------------------------------------

enum class nixl_telemetry_event_type_t : uint32_t;  // values not needed here

struct nixlTelemetryEvent {
  nixl_telemetry_event_type_t eventType_;
  uint64_t value_;
};

// ---------------------------------------------------------------------------
// Descriptors (nixl_descriptors.h, backend_aux.h). No vtables: plain data.
// ---------------------------------------------------------------------------

class nixlBackendMD;

// One contiguous range: absolute address, length, device (CUDA ordinal for
// VRAM, as the registering process numbers it; block/file id for storage).
class nixlBasicDesc {
 public:
  uintptr_t addr;
  size_t len;
  uint64_t devId;

  nixlBasicDesc() {}  // leaves the fields unset, as NIXL's does
  nixlBasicDesc(const uintptr_t& a, const size_t& l, const uint64_t& dev_id) : addr(a), len(l), devId(dev_id) {}
  nixlBasicDesc(const nixlBasicDesc&) = default;
  nixlBasicDesc& operator=(const nixlBasicDesc&) = default;
  ~nixlBasicDesc() = default;

  // Orders by device, then address, then length.
  bool operator<(const nixlBasicDesc& o) const noexcept {
    if (devId != o.devId) return devId < o.devId;
    if (addr != o.addr) return addr < o.addr;
    return len < o.len;
  }
  bool covers(const nixlBasicDesc& q) const noexcept {
    return devId == q.devId && addr <= q.addr && addr + len >= q.addr + q.len;
  }
  bool overlaps(const nixlBasicDesc& q) const noexcept {
    return devId == q.devId && addr + len > q.addr && q.addr + q.len > addr;
  }
  friend bool operator==(const nixlBasicDesc& a, const nixlBasicDesc& b) {
    return a.addr == b.addr && a.len == b.len && a.devId == b.devId;
  }
  friend bool operator!=(const nixlBasicDesc& a, const nixlBasicDesc& b) { return !(a == b); }
};

// A range plus bytes: what registerMem gets (metaInfo as the user gave it) and
// what loadRemoteMD gets (metaInfo = the peer's getPublicData output).
class nixlBlobDesc : public nixlBasicDesc {
 public:
  nixl_blob_t metaInfo;

  using nixlBasicDesc::nixlBasicDesc;
  nixlBlobDesc(const uintptr_t& a, const size_t& l, const uint64_t& dev_id, const nixl_blob_t& meta)
      : nixlBasicDesc(a, l, dev_id), metaInfo(meta) {}
  nixlBlobDesc(const nixlBasicDesc& d, const nixl_blob_t& meta) : nixlBasicDesc(d), metaInfo(meta) {}
};

// A range plus the backend metadata it falls in: what prepXfer/postXfer get.
// metadataP is what registerMem (local side), loadLocalMD (remote side of a
// self transfer) or loadRemoteMD (remote side) returned for the covering region.
class nixlMetaDesc : public nixlBasicDesc {
 public:
  nixlBackendMD* metadataP;

  using nixlBasicDesc::nixlBasicDesc;  // leaves metadataP unset, as NIXL's does
  nixlMetaDesc() : nixlBasicDesc(), metadataP(nullptr) {}
  nixlMetaDesc(uintptr_t a, size_t l, uint64_t dev_id, nixlBackendMD* md)
      : nixlBasicDesc(a, l, dev_id), metadataP(md) {}
};

// Element of the remote memory-view list (prepMemView); plain data.
struct nixlRemoteMetaDesc : public nixlMetaDesc {
  std::string remoteAgent;

  using nixlMetaDesc::nixlMetaDesc;
  explicit nixlRemoteMetaDesc(const std::string& remote_agent) : nixlMetaDesc(), remoteAgent(remote_agent) {}
};

// A typed list of descriptors. It has a vtable (slots: destructor x2, resize,
// addDesc, getIndex); lists the plugin receives were built by libnixl and
// dispatch through libnixl's vtable. Read them through the inline members.
template <class T>
class nixlDescList {
 protected:
  nixl_mem_t type;
  std::vector<T> descs;

 public:
  explicit nixlDescList(const nixl_mem_t& mem_type, const int& init_size = 0)
      : type(mem_type), descs(static_cast<size_t>(init_size)) {}
  nixlDescList(const nixlDescList&) = default;
  nixlDescList& operator=(const nixlDescList&) = default;
  virtual ~nixlDescList() = default;

  nixl_mem_t getType() const { return type; }
  int descCount() const { return static_cast<int>(descs.size()); }
  bool isEmpty() const noexcept { return descs.empty(); }
  const T& operator[](size_t i) const { return descs[i]; }
  T& operator[](size_t i) { return descs[i]; }
  typename std::vector<T>::const_iterator begin() const { return descs.begin(); }
  typename std::vector<T>::const_iterator end() const { return descs.end(); }
  typename std::vector<T>::iterator begin() { return descs.begin(); }
  typename std::vector<T>::iterator end() { return descs.end(); }

  virtual void resize(const size_t& count) { descs.resize(count); }
  void reserve(size_t count) { descs.reserve(count); }
  void clear() { descs.clear(); }
  virtual void addDesc(const T& desc) { descs.push_back(desc); }
  template <class... Args>
  T& emplace(Args&&... args) {
    return descs.emplace_back(std::forward<Args>(args)...);
  }
  void remDesc(const int& index) {
    if (index < 0 || static_cast<size_t>(index) >= descs.size()) throw std::out_of_range("Index is out of range");
    descs.erase(descs.begin() + index);
  }
  // Index of the first element whose (addr, len, devId) equals `query`, or
  // NIXL_ERR_NOT_FOUND.
  virtual int getIndex(const nixlBasicDesc& query) const {
    for (size_t i = 0; i < descs.size(); ++i) {
      if (static_cast<const nixlBasicDesc&>(descs[i]) == query) return static_cast<int>(i);
    }
    return NIXL_ERR_NOT_FOUND;
  }

  friend struct nixlAbiLayoutCheck;  // podlink's layout asserts; no effect on layout
};

using nixl_xfer_dlist_t = nixlDescList<nixlBasicDesc>;
using nixl_reg_dlist_t = nixlDescList<nixlBlobDesc>;
using nixl_meta_dlist_t = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;

// ---------------------------------------------------------------------------
// Backend-side helper types (backend_aux.h).
// ---------------------------------------------------------------------------

// Per-post options. The agent fills notifMsg/hasNotif (an empty message with
// hasNotif=true is a valid notification) and customParam (createXferReq only).
struct nixlBackendOptionalArgs {
  nixl_blob_t notifMsg;
  bool hasNotif = false;
  nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

// What create_engine receives; valid only during the call (a stack object in
// nixlAgent::createBackend).
class nixlBackendInitParams {
 public:
  std::string localAgent;                  // this agent's name
  nixl_backend_t type;                     // the backend name the user asked for
  nixl_b_params_t* customParams = nullptr;  // user's map; empty from Python for non-UCX backends
  bool enableProgTh = false;               // agent config useProgThread (Python default: true)
  uint64_t pthrDelay = 0;                  // progress-thread delay, microseconds (nixlTime::us_t)
  nixl_thread_sync_t syncMode;             // as configured; not the agent's effective mode
  bool enableTelemetry_ = false;           // agent has telemetry on
};

// Base of the plugin's per-transfer handle; the agent only stores the pointer.
class nixlBackendReqH {
 public:
  nixlBackendReqH() {}
  virtual ~nixlBackendReqH() {}
};

// Base of the plugin's metadata objects (registrations, loaded remote/self
// metadata); the agent only stores and passes back the pointer.
class nixlBackendMD {
 protected:
  bool isPrivateMD;

 public:
  explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
  virtual ~nixlBackendMD() {}

  friend struct nixlAbiLayoutCheck;  // podlink's layout asserts; no effect on layout
};

// ---------------------------------------------------------------------------
// The engine (backend_engine.h).
// ---------------------------------------------------------------------------

class nixlBackendEngine {
 private:
  // Read by libnixl through the inline getters below (compiled into libnixl):
  // getType() names the plugin whose destroy_engine frees this engine and the
  // backend in the agent's metadata, so it must stay the plugin's name;
  // getCustomParams() is copied by nixlAgent::getBackendParams (Python's
  // create_backend calls it).
  nixl_backend_t backendType;
  nixl_b_params_t customParams;
  // Layout only: never touched by this header or by NIXL 1.4.0's core.
  std::vector<nixlTelemetryEvent> telemetryEvents_;
  std::mutex telemetryEventsMutex_;

 protected:
  // Set on a failed construction; nixlAgent::createBackend reads it through
  // getInitErr() right after create_engine and then destroys the engine.
  bool initErr = false;
  const std::string localAgent;
  const bool enableTelemetry_;

  // Adds a parameter unless the key exists (then NIXL_ERR_NOT_ALLOWED).
  [[nodiscard]] nixl_status_t setInitParam(const std::string& key, const std::string& value) {
    return customParams.emplace(key, value).second ? NIXL_SUCCESS : NIXL_ERR_NOT_ALLOWED;
  }
  // Looks a parameter up (NIXL_ERR_INVALID_PARAM when absent).
  [[nodiscard]] nixl_status_t getInitParam(const std::string& key, std::string& value) const {
    const auto it = customParams.find(key);
    if (it == customParams.end()) return NIXL_ERR_INVALID_PARAM;
    value = it->second;
    return NIXL_SUCCESS;
  }

 public:
  // Same member initialisation as NIXL's (inline there too); tolerates a null
  // customParams, which the agent never passes.
  explicit nixlBackendEngine(const nixlBackendInitParams* init_params)
      : backendType(init_params->type),
        customParams(init_params->customParams ? *init_params->customParams : nixl_b_params_t()),
        localAgent(init_params->localAgent),
        enableTelemetry_(init_params->enableTelemetry_) {}
  nixlBackendEngine(nixlBackendEngine&&) = delete;
  nixlBackendEngine(const nixlBackendEngine&) = delete;
  void operator=(nixlBackendEngine&&) = delete;
  void operator=(const nixlBackendEngine&) = delete;

  // Vtable slots 0 (complete) and 1 (deleting). destroy_engine runs it.
  virtual ~nixlBackendEngine() = default;

  bool getInitErr() const noexcept { return initErr; }
  const nixl_backend_t& getType() const noexcept { return backendType; }
  const nixl_b_params_t& getCustomParams() const noexcept { return customParams; }

  // Slots 2-5: capabilities, asked again and again (not cached by the agent).
  // supportsRemote requires supportsNotif, or createBackend fails.
  virtual bool supportsRemote() const = 0;
  virtual bool supportsLocal() const = 0;
  virtual bool supportsNotif() const = 0;
  virtual nixl_mem_list_t getSupportedMems() const = 0;  // read once, at creation

  // Slots 6-7: one call per registered region.
  virtual nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem, nixlBackendMD*& out) = 0;
  virtual nixl_status_t deregisterMem(nixlBackendMD* meta) = 0;

  // Slots 8-9: connect(self) at creation when supportsLocal; connect(peer)
  // only from nixlAgent::makeConnection; disconnect(peer) on invalidation.
  virtual nixl_status_t connect(const std::string& remote_agent) = 0;
  virtual nixl_status_t disconnect(const std::string& remote_agent) = 0;

  // Slot 10: frees what loadRemoteMD / loadLocalMD returned.
  virtual nixl_status_t unloadMD(nixlBackendMD* input) = 0;

  // Slots 11-14: the data path (const; concurrent in RW sync mode).
  virtual nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                 const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                 nixlBackendReqH*& handle, const nixl_opt_b_args_t* opt_args = nullptr) const = 0;
  virtual nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                 const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                                 nixlBackendReqH*& handle, const nixl_opt_b_args_t* opt_args = nullptr) const = 0;
  virtual nixl_status_t checkXfer(nixlBackendReqH* handle) const = 0;
  virtual nixl_status_t releaseReqH(nixlBackendReqH* handle) const = 0;

  // Slots 15-17: GPU device-API memory views. Defaults as NIXL's.
  virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t&, nixlMemViewH&,
                                    const nixl_opt_b_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t prepMemView(const nixl_meta_dlist_t&, nixlMemViewH&, const nixl_opt_b_args_t* = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual void releaseMemView(nixlMemViewH) const {}

  // Slots 18-21: needed when supportsRemote. Defaults as NIXL's.
  virtual nixl_status_t getPublicData(const nixlBackendMD* /*meta*/, std::string& /*str*/) const {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t getConnInfo(std::string& /*str*/) const { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t loadRemoteConnInfo(const std::string& /*remote_agent*/,
                                           const std::string& /*remote_conn_info*/) {
    return NIXL_ERR_BACKEND;
  }
  virtual nixl_status_t loadRemoteMD(const nixlBlobDesc& /*input*/, const nixl_mem_t& /*nixl_mem*/,
                                     const std::string& /*remote_agent*/, nixlBackendMD*& /*output*/) {
    return NIXL_ERR_BACKEND;
  }

  // Slot 22: needed when supportsLocal. Default as NIXL's.
  virtual nixl_status_t loadLocalMD(nixlBackendMD* /*input*/, nixlBackendMD*& /*output*/) { return NIXL_ERR_BACKEND; }

  // Slots 23-24: needed when supportsNotif. Defaults as NIXL's. getNotifs
  // appends to a list the agent cleared; genNotif may target this agent itself.
  virtual nixl_status_t getNotifs(notif_list_t& /*notif_list*/) { return NIXL_ERR_BACKEND; }
  virtual nixl_status_t genNotif(const std::string& /*remote_agent*/, const std::string& /*msg*/) const {
    return NIXL_ERR_BACKEND;
  }

  // Slots 25-26: optional. Defaults as NIXL's.
  virtual nixl_status_t queryMem(const nixl_reg_dlist_t& /*descs*/, std::vector<nixl_query_resp_t>& /*resp*/) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }
  virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t& /*operation*/, const nixl_meta_dlist_t& /*local*/,
                                         const nixl_meta_dlist_t& /*remote*/, const std::string& /*remote_agent*/,
                                         nixlBackendReqH* const& /*handle*/, std::chrono::microseconds& /*duration*/,
                                         std::chrono::microseconds& /*err_margin*/, nixl_cost_t& /*method*/,
                                         const nixl_opt_args_t* /*extra_params*/ = nullptr) const {
    return NIXL_ERR_NOT_SUPPORTED;
  }

  friend struct nixlAbiLayoutCheck;  // podlink's layout asserts; no effect on layout
};

// ---------------------------------------------------------------------------
// The plugin descriptor (backend_plugin.h).
// ---------------------------------------------------------------------------

// Checked by the plugin manager against its own value; 1 in every NIXL so far.
#ifndef NIXL_PLUGIN_API_VERSION
#define NIXL_PLUGIN_API_VERSION 1
#endif

// Returned by nixl_plugin_init; must stay valid until nixl_plugin_fini. NIXL
// calls each function pointer only if non-null (names and versions fall back
// to "unknown", options and memory lists to empty).
class nixlBackendPlugin {
 public:
  int api_version;
  nixlBackendEngine* (*create_engine)(const nixlBackendInitParams* init_params);  // null = failure
  void (*destroy_engine)(nixlBackendEngine* engine);
  const char* (*get_plugin_name)();
  const char* (*get_plugin_version)();
  nixl_b_params_t (*get_backend_options)();  // nixlAgent::getPluginParams
  nixl_mem_list_t (*get_backend_mems)();     // nixlAgent::getPluginParams
};

namespace podlink::nixl_abi {

// The NIXL release whose ABI this file declares.
inline constexpr char kMatchesVersion[] = "1.4.0";
inline constexpr char kMatchesCommit[] = "c0a1102b94d173049a5478c23e765ba37681e2ca";
inline constexpr int kPluginApiVersion = NIXL_PLUGIN_API_VERSION;

}  // namespace podlink::nixl_abi

// ---------------------------------------------------------------------------
// Layout checks: x86-64, libstdc++ with the C++11 string ABI (NIXL's
// manylinux_2_28 wheels and source builds use it). Sizes worked out by hand
// from std::string 32, std::unordered_map 56, std::vector 24, std::mutex 40.
// ---------------------------------------------------------------------------

#if defined(__x86_64__) && defined(__GLIBCXX__)
static_assert(_GLIBCXX_USE_CXX11_ABI, "NIXL is built with the C++11 std::string ABI");

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
struct nixlAbiLayoutCheck {
  static_assert(sizeof(nixl_mem_t) == 4 && sizeof(nixl_xfer_op_t) == 4 && sizeof(nixl_status_t) == 4);
  static_assert(sizeof(nixl_thread_sync_t) == 4 && sizeof(nixl_cost_t) == 4);

  static_assert(sizeof(nixlBasicDesc) == 24);
  static_assert(offsetof(nixlBasicDesc, addr) == 0 && offsetof(nixlBasicDesc, len) == 8);
  static_assert(offsetof(nixlBasicDesc, devId) == 16);
  static_assert(sizeof(nixlBlobDesc) == 56 && offsetof(nixlBlobDesc, metaInfo) == 24);
  static_assert(sizeof(nixlMetaDesc) == 32 && offsetof(nixlMetaDesc, metadataP) == 24);
  static_assert(sizeof(nixlRemoteMetaDesc) == 64 && offsetof(nixlRemoteMetaDesc, remoteAgent) == 32);

  // vptr, type (+4 padding), vector.
  static_assert(sizeof(nixl_meta_dlist_t) == 40);
  static_assert(offsetof(nixl_meta_dlist_t, type) == 8 && offsetof(nixl_meta_dlist_t, descs) == 16);
  static_assert(sizeof(nixl_reg_dlist_t) == 40 && sizeof(nixl_remote_meta_dlist_t) == 40);

  static_assert(sizeof(nixlTelemetryEvent) == 16);
  static_assert(sizeof(nixlBackendReqH) == 8);
  static_assert(sizeof(nixlBackendMD) == 16 && offsetof(nixlBackendMD, isPrivateMD) == 8);

  static_assert(sizeof(nixlBackendOptionalArgs) == 72);
  static_assert(offsetof(nixlBackendOptionalArgs, notifMsg) == 0);
  static_assert(offsetof(nixlBackendOptionalArgs, hasNotif) == 32);
  static_assert(offsetof(nixlBackendOptionalArgs, customParam) == 40);

  static_assert(sizeof(nixlBackendInitParams) == 96);
  static_assert(offsetof(nixlBackendInitParams, localAgent) == 0);
  static_assert(offsetof(nixlBackendInitParams, type) == 32);
  static_assert(offsetof(nixlBackendInitParams, customParams) == 64);
  static_assert(offsetof(nixlBackendInitParams, enableProgTh) == 72);
  static_assert(offsetof(nixlBackendInitParams, pthrDelay) == 80);
  static_assert(offsetof(nixlBackendInitParams, syncMode) == 88);
  static_assert(offsetof(nixlBackendInitParams, enableTelemetry_) == 92);

  static_assert(sizeof(std::mutex) == 40 && sizeof(nixl_b_params_t) == 56);
  static_assert(sizeof(nixlBackendEngine) == 208);
  static_assert(offsetof(nixlBackendEngine, backendType) == 8);
  static_assert(offsetof(nixlBackendEngine, customParams) == 40);
  static_assert(offsetof(nixlBackendEngine, telemetryEvents_) == 96);
  static_assert(offsetof(nixlBackendEngine, telemetryEventsMutex_) == 120);
  static_assert(offsetof(nixlBackendEngine, initErr) == 160);
  static_assert(offsetof(nixlBackendEngine, localAgent) == 168);
  static_assert(offsetof(nixlBackendEngine, enableTelemetry_) == 200);

  static_assert(sizeof(nixlBackendPlugin) == 56);
  static_assert(offsetof(nixlBackendPlugin, api_version) == 0);
  static_assert(offsetof(nixlBackendPlugin, create_engine) == 8);
  static_assert(offsetof(nixlBackendPlugin, destroy_engine) == 16);
  static_assert(offsetof(nixlBackendPlugin, get_plugin_name) == 24);
  static_assert(offsetof(nixlBackendPlugin, get_plugin_version) == 32);
  static_assert(offsetof(nixlBackendPlugin, get_backend_options) == 40);
  static_assert(offsetof(nixlBackendPlugin, get_backend_mems) == 48);
};
#pragma GCC diagnostic pop
#endif  // __x86_64__ && __GLIBCXX__

#pragma GCC visibility pop

// The two entry points NIXL looks up with dlsym (only init is required). NIXL
// may call init again after fini on the same mapped image (it dlopens with
// RTLD_NODELETE and unloads plugins it loaded only to read their options).
extern "C" {
__attribute__((visibility("default"))) nixlBackendPlugin* nixl_plugin_init();
__attribute__((visibility("default"))) void nixl_plugin_fini();
}
