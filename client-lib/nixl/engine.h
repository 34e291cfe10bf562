// PodlinkNixlEngine: one NIXL backend engine = one podlink Client (a
// session with podlinkd) + one TransferEngine (its relay ring). The
// version-free logic of libplugin_PODLINK.so; plugin.cc only fills NIXL's
// plugin struct.
//
// What NIXL gets:
//   getConnInfo    "podlink-nixl1;<name len>;<agent>;<mailbox descriptor>" (wire.h): a 4 KiB
//                  host region every notification to this agent is sent to;
//   getPublicData  "podlink-nixl1;<base>;<offset>;<len>;<descriptor>" per registered region;
//   a transfer     one TransferEngine batch per post (contiguous descriptors merged once, in
//                  prepXfer), then, once the data is complete, the notification to the peer's
//                  mailbox framed with this agent's name (so a peer that never loaded this
//                  agent's metadata, as vLLM's prefill, still learns who sent it).
// Data-path calls (prepXfer, postXfer, checkXfer, releaseReqH, genNotif) are
// const and may run concurrently (NIXL's RW sync mode); getNotifs and the
// control path may run beside them. Several engines per process work (each
// has its own Client).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client-lib/nixl/nixl_abi.h"
#include "podlink/client.h"
#include "podlink/transfer.h"

namespace podlink::nixl {

// The value every plugin notification carries ("NIXL"); the bytes hold the frame.
inline constexpr uint64_t kNotifyValue = 0x4e49584c;

class PodlinkNixlEngine : public nixlBackendEngine {
 public:
  // Never throws; on failure sets initErr (NIXL then destroys the engine) and logs why.
  explicit PodlinkNixlEngine(const nixlBackendInitParams* init_params);
  ~PodlinkNixlEngine() override;

  bool supportsRemote() const override { return true; }
  bool supportsLocal() const override { return true; }
  bool supportsNotif() const override { return true; }
  nixl_mem_list_t getSupportedMems() const override { return {DRAM_SEG, VRAM_SEG}; }

  nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem, nixlBackendMD*& out) override;
  nixl_status_t deregisterMem(nixlBackendMD* meta) override;

  nixl_status_t connect(const std::string& remote_agent) override;
  nixl_status_t disconnect(const std::string& remote_agent) override;

  nixl_status_t unloadMD(nixlBackendMD* input) override;

  nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                         const nixl_meta_dlist_t& remote, const std::string& remote_agent, nixlBackendReqH*& handle,
                         const nixl_opt_b_args_t* opt_args = nullptr) const override;
  nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                         const nixl_meta_dlist_t& remote, const std::string& remote_agent, nixlBackendReqH*& handle,
                         const nixl_opt_b_args_t* opt_args = nullptr) const override;
  nixl_status_t checkXfer(nixlBackendReqH* handle) const override;
  nixl_status_t releaseReqH(nixlBackendReqH* handle) const override;

  nixl_status_t getPublicData(const nixlBackendMD* meta, std::string& str) const override;
  nixl_status_t getConnInfo(std::string& str) const override;
  nixl_status_t loadRemoteConnInfo(const std::string& remote_agent, const std::string& remote_conn_info) override;
  nixl_status_t loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem, const std::string& remote_agent,
                             nixlBackendMD*& output) override;
  nixl_status_t loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) override;

  nixl_status_t getNotifs(notif_list_t& notif_list) override;
  nixl_status_t genNotif(const std::string& remote_agent, const std::string& msg) const override;

 private:
  class Handle;

  // A peer region opened through TransferEngine::Open, shared by every MD,
  // mailbox and transfer handle that uses it (TransferEngine returns one
  // opening per export and Close ends it for all). Closed when the last
  // reference goes. Entries are never moved (unordered_map nodes), so
  // `&region` stays valid while referenced.
  struct Opened {
    RemoteRegion region;
    int refs = 0;
  };
  struct Peer {
    RegionDescriptor mailbox;   // from loadRemoteConnInfo
    std::string mailbox_key;    // key in opened_ while this peer holds a reference; empty: none
  };
  // A batch whose handle was released while it was in flight, polled to
  // completion by later calls; `release_key` is an opening it kept alive.
  struct Orphan {
    uint64_t batch = 0;
    std::string release_key;
  };

  static std::string KeyOf(const RegionDescriptor& d);
  // Opens (or shares) the region `d`; returns the stable RemoteRegion and its key.
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> Acquire(const RegionDescriptor& d) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseOpened(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // The peer's mailbox, opened if it is not (a reference for the caller).
  absl::StatusOr<std::pair<const RemoteRegion*, std::string>> AcquireMailbox(const std::string& agent) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Polls orphaned batches; with `wait`, waits (bounded) for every one.
  void DrainOrphans(bool wait) const ABSL_LOCKS_EXCLUDED(mu_);
  void PushSelfNotification(std::string msg) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Ready(const char* what) const;

  // Set once by the constructor; the engine's own region for notifications.
  std::unique_ptr<Client> client_;
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<HostBuffer> mailbox_buf_;
  LocalRegion mailbox_;
  std::string conn_info_;

  // Guards the tables below (not the TransferEngine, which is thread-safe).
  // Held across a call into podlinkd only to Close a region (so that no
  // Acquire can pick up an opening being closed).
  mutable absl::Mutex mu_;
  mutable std::unordered_map<std::string, Opened> opened_ ABSL_GUARDED_BY(mu_);
  mutable std::unordered_map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<Orphan> orphans_ ABSL_GUARDED_BY(mu_);
  mutable std::deque<std::pair<std::string, std::string>> self_notifs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace podlink::nixl
