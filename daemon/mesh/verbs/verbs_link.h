// The RDMA verbs backend of the mesh links (RC queue pairs), both sides.
//
// Importing side (VerbsLinks, a DataLinks): per direct path, `qps_per_path`
// RC QPs on the RDMA device whose GID is the path's local address. A
// transfer is cut into slices that live QPs pull while they have a free
// staging slot (registered host memory of this daemon, `slices_in_flight`
// slots per QP): a write copies the slice into its slot and posts one RDMA
// WRITE into the owner's registered export; a read posts one RDMA READ and
// copies out on completion. Where the local side is a host export (LinkOp
// local_memory), it is registered itself (once per protection domain, on
// the submitting thread, local access only) and slices go straight from and
// into it: no copy on this side either. No SEND/RECV on the data path: the owner's CPU
// never sees a write or a read. A notification is one RDMA WRITE WITH
// IMMEDIATE of {grant, value} into the QP's mailbox on the owner, the
// immediate naming the mailbox slot; the owner's receive completion
// delivers it. A QP that fails (retry exhausted, remote access error, port
// down) hands its unfinished slices to the other QPs (at most kMaxAttempts
// sends each); a notification is never sent twice: it fails UNAVAILABLE.
//
// Exporting side (VerbsServer): one protection domain per (peer daemon,
// device), so an rkey leaked to one peer is useless on another's QPs; the
// peer's QPs are created in it with remote write/read access, and each
// granted export is registered in it (ibv_reg_mr over the daemon's mapping)
// when the grant is made, and deregistered when the grant closes or the
// export goes away. The importer's own QPs allow no remote access at all.
//
// Staged grants (the owner cannot register the export for the peer: a GPU
// export no NIC of it registers by dma-buf, memory it may not pin, or
// mesh.verbs_staged_only): the owner's CPU or copy engine moves every slice
// between the export and a bounce pool of its own (registered for local
// access only), and RDMA moves it between that pool and the importer's
// staging slot. The importer writes a record {kind, grant, offset, length,
// slot address and rkey, ack address} into the QP's mailbox (WRITE WITH
// IMMEDIATE); for a write the owner RDMA READs the slot, copies the bytes in
// and acknowledges; for a read it copies them out, RDMA WRITEs them into the
// slot and acknowledges. The acknowledgement is a WRITE WITH IMMEDIATE of
// {slot, status} into the importer's ack word. The owner's memory is never
// remotely accessible for such grants; the importer's staging slots and ack
// words are, to the owner of that path only (its own protection domain).
// Both sides must speak records of kRecordBytes (OpenVerbs `records`).
//
// Connection data (QPN, PSN, GID, MTU, rkeys) travels only over the
// mutually authenticated control channel (mesh.proto OpenVerbs/OpenRegion).
// The importer's QPs and staging allow remote access by that path's owner
// only (staged grants); its pods' exports are registered for local access.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/mesh/links/late_copies.h"
#include "daemon/mesh/links/links.h"
#include "daemon/mesh/links/slices.h"
#include "daemon/mesh/verbs/gid.h"
#include "daemon/mesh/verbs/verbs_api.h"

namespace podlink {
class MemoryObject;
}

namespace podlink::mesh::verbs {

struct VerbsOptions {
  uint32_t qps_per_path = 2;
  uint64_t slice_bytes = 512 << 10;
  uint32_t slices_in_flight = 4;   // staging slots per QP
  uint8_t timeout = 14;            // local ACK timeout, 4.096 us * 2^timeout (14: 67 ms)
  uint8_t retry_count = 7;         // transport retries before a QP fails
  int gid_index = -1;              // -1: chosen by address and RoCE version
  std::string sysfs = "/sys/class/infiniband";
  uint32_t max_qps_per_peer = 64;  // exporting side
  // A staged slice the owner has not answered in this long fails its QP
  // (its slices go elsewhere; checked by Sweep).
  absl::Duration answer_timeout = absl::Seconds(30);
};

// Mailbox record versions: 1 is {grant, value} notifications in 16-byte
// slots; 2 adds staged writes and reads (kRecordBytes slots); 3 numbers
// each staged slice's transfer and adds the DONE record that ends a staged
// write some slice of which was sent twice (VerbsServer: the late-copy guard).
constexpr uint32_t kRecordsNotifyOnly = 1;
constexpr uint32_t kRecordsStaged = 2;
constexpr uint32_t kRecordsStagedDone = 3;

// Bounce slots (of VerbsOptions::slice_bytes) per (peer, device) on the
// owner for staged grants (fewer where 8 slices are over 32 MiB).
constexpr uint32_t kStageSlots = 8;

// One QP as the other side needs it.
struct QpWire {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint64_t mailbox = 0;       // exporting side: the QP's notification mailbox (remote address)
  uint32_t mailbox_rkey = 0;
};

// One side of a path, as carried by OpenVerbs.
struct SideWire {
  std::string device;
  std::array<uint8_t, 16> gid{};
  uint32_t mtu = 0;  // ibv_mtu
  std::vector<QpWire> qps;
  uint32_t records = kRecordsNotifyOnly;  // mailbox record version this side speaks
};

using mesh::RegionKey;  // links.h

// An opened device (shared by every peer over it), with its async-event
// thread: port and QP events are logged and counted.
class Nic {
 public:
  static absl::StatusOr<std::shared_ptr<Nic>> Open(const VerbsApi* api, const std::string& device, uint8_t port);
  ~Nic();
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;
  const VerbsApi* api() const { return api_; }
  ibv_context* ctx() const { return ctx_; }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  ibv_mtu active_mtu() const { return mtu_; }
  uint64_t async_events() const { return async_events_.load(std::memory_order_relaxed); }
  // Whether the device registers dma-bufs (GPU memory, GPUDirect RDMA):
  // probed at open as NCCL does, an empty registration of no descriptor
  // that fails with EOPNOTSUPP / EPROTONOSUPPORT where the device cannot.
  bool dmabuf() const { return dmabuf_; }

 private:
  Nic(const VerbsApi* api, ibv_context* ctx, std::string name, uint8_t port, ibv_mtu mtu, bool dmabuf);
  void AsyncLoop();
  const VerbsApi* const api_;
  ibv_context* const ctx_;
  const std::string name_;
  const uint8_t port_;
  const ibv_mtu mtu_;
  const bool dmabuf_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> async_events_{0};
  std::thread async_;
};

// Devices by name, opened once per daemon.
class Nics {
 public:
  explicit Nics(const VerbsApi* api) : api_(api) {}
  absl::StatusOr<std::shared_ptr<Nic>> Get(const GidChoice& gid) ABSL_LOCKS_EXCLUDED(mu_);
  const VerbsApi* api() const { return api_; }

 private:
  const VerbsApi* const api_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Nic>> nics_ ABSL_GUARDED_BY(mu_);
};

class VerbsLinks final : public DataLinks {
 public:
  static constexpr uint32_t kMaxAttempts = 3;

  VerbsLinks(std::string node, VerbsOptions options);
  ~VerbsLinks() override;  // fails what is queued or in flight with UNAVAILABLE
  VerbsLinks(const VerbsLinks&) = delete;
  VerbsLinks& operator=(const VerbsLinks&) = delete;

  // Step 1 of a path: its QPs (RESET -> INIT) on `nic`, as the owner needs
  // them: `lanes` of them (0: qps_per_path; a repair makes as many as
  // failed). Returns the path's number for step 2.
  absl::StatusOr<std::pair<size_t, SideWire>> PreparePath(std::shared_ptr<Nic> nic, const GidChoice& gid,
                                                          std::string name, uint32_t lanes = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Step 2: the owner's QPs; ours go to RTR and RTS and start pulling.
  absl::Status ConnectPath(size_t path, const SideWire& owner) ABSL_LOCKS_EXCLUDED(mu_);
  // The owner's keys for a grant (OpenRegion); dropped with the handle.
  void AddRegion(uint64_t grant, std::vector<RegionKey> keys) override ABSL_LOCKS_EXCLUDED(mu_);
  // A grant the owner stages through its bounce pool (no keys): its slices
  // go as staged records (file comment), at most `slot_bytes` each (the
  // owner's bounce slots; 0: this side's slice size).
  void AddStagedRegion(uint64_t grant, uint64_t slot_bytes = 0) override ABSL_LOCKS_EXCLUDED(mu_);
  bool RegistersRegions() const override { return true; }
  void DropRegion(uint64_t grant) override ABSL_LOCKS_EXCLUDED(mu_);
  bool RepairsWholePath() const override { return true; }
  // Called (no lock held) with a path's name each time one of its QPs fails
  // (the engine makes a replacement for the failed ones, FailedRemoteQps,
  // while the path's other QPs carry on).
  void set_on_path_down(std::function<void(const std::string& path)> f) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    on_path_down_ = std::move(f);
  }
  // The owner's QP numbers of the failed QPs of path `name` not yet
  // reported (a repair asks the owner to drop them); MarkReported once the
  // owner was told.
  std::vector<uint32_t> FailedRemoteQps(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  void MarkReported(const std::vector<uint32_t>& remote_qps) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr size_t kMaxPaths = 64;  // repairs included

  const char* transport() const override { return "verbs"; }
  uint64_t instance() const override { return instance_; }
  absl::Status Submit(LinkOp op) override ABSL_LOCKS_EXCLUDED(mu_, reg_mu_);
  size_t live() const override ABSL_LOCKS_EXCLUDED(mu_);
  LinkStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_, reg_mu_);
  std::vector<std::tuple<std::string, bool, uint64_t>> Connections() const override ABSL_LOCKS_EXCLUDED(mu_);
  // Also fails QPs with a staged slice unanswered for answer_timeout.
  void Sweep() override ABSL_LOCKS_EXCLUDED(mu_, reg_mu_);
  // Local registrations held at most (least recently used idle ones go first).
  static constexpr size_t kMaxLocalRegistrations = 128;

 private:
  struct OpState;
  struct Path;
  // A local export registered in one path's protection domain (deregistered
  // when the last slice using it and the cache let go). mr null: being
  // registered (registering), or the device refused it: staged meanwhile.
  // Fields other than `memory` and `api` are guarded by reg_mu_.
  struct LocalReg {
    const VerbsApi* api = nullptr;
    std::shared_ptr<MemoryObject> memory;
    std::weak_ptr<const void> owner;  // the export (LinkOp::keep): once gone, the entry goes (Sweep)
    ibv_mr* mr = nullptr;
    bool registering = false;
    uint64_t last_use = 0;
    ~LocalReg();
  };
  // The registrations of `op`'s local memory on every path up now.
  std::vector<std::pair<const Path*, std::shared_ptr<LocalReg>>> LocalRegs(const LinkOp& op)
      ABSL_LOCKS_EXCLUDED(mu_, reg_mu_);
  // A slice of an OpState (links/slices.h); done_record: the DONE record of
  // a staged write sent partly twice.
  using Slice = ::podlink::mesh::Slice;
  struct Pending {
    Slice slice;
    uint32_t slot = 0;
    bool direct = false;  // from / into the local export itself, not the slot
    bool staged = false;  // done when the owner's acknowledgement arrives, not at the send's completion
    absl::Time since;     // staged: when its record went
  };
  struct Lane {  // one QP
    Path* path = nullptr;
    ibv_qp* qp = nullptr;
    QpWire remote;
    char* staging = nullptr;  // slices_in_flight slots of slice_bytes, notify slots, records, ack words
    ibv_mr* mr = nullptr;
    std::vector<uint32_t> free_slots;
    std::map<uint64_t, Pending> pending;  // by wr_id
    uint32_t notify_next = 0;   // local notification slots
    uint32_t mailbox_next = 0;  // the owner's mailbox slots (notifications and staged records)
    bool up = false, dead = false, reported = false;
    uint64_t bytes_sent = 0;
  };
  struct Path {
    std::string name;
    std::shared_ptr<Nic> nic;
    GidChoice gid;
    std::string remote_device;  // the owner's device at the other end
    uint32_t records = kRecordsNotifyOnly;  // what the owner answered
    ibv_pd* pd = nullptr;
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    std::vector<std::unique_ptr<Lane>> lanes;
    std::thread poller;
  };
  struct Post {
    Lane* lane;
    uint64_t wr_id;
    uint32_t slot;
    Slice slice;
    uint32_t lkey = 0;  // non-zero: the slice goes from / into the local export (Pending::direct)
  };

  // Hands queued slices to lanes with room; posts outside the lock.
  void Pump() ABSL_LOCKS_EXCLUDED(mu_);
  void PostOne(const Post& p) ABSL_LOCKS_EXCLUDED(mu_);
  void PollLoop(Path* path);
  // A failed work request: its lane dies, the slice goes elsewhere or fails.
  void Fail(Lane* lane, uint64_t wr_id, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // The op's local registration on `p` (0: copied through the slots).
  static uint32_t LkeyFor(const Slice& s, const Path* p);
  void DestroyPath(Path& p);
  // The owner's acknowledgement of a staged slice (a receive completion).
  void Acknowledged(Lane* lane, uint32_t imm) ABSL_LOCKS_EXCLUDED(mu_);
  char* NotifySlot(const Lane& lane, uint32_t i) const;
  char* RecordSlot(const Lane& lane, uint32_t slot) const;
  char* AckWord(const Lane& lane, uint32_t slot) const;

  const std::string node_;
  const VerbsOptions options_;
  const uint64_t instance_;

  mutable absl::Mutex mu_;  // everything below and the Lane fields
  std::vector<std::unique_ptr<Path>> paths_ ABSL_GUARDED_BY(mu_);
  SliceScheduler sched_;  // the queue: guarded by mu_
  std::map<uint64_t, std::vector<RegionKey>> regions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> staged_regions_ ABSL_GUARDED_BY(mu_);  // grant -> slice bytes
  uint64_t next_wr_ ABSL_GUARDED_BY(mu_) = 1;
  size_t next_lane_ ABSL_GUARDED_BY(mu_) = 0;
  LinkStats stats_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_path_down_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  // Local registrations by (path, memory); device calls are made under it,
  // never under mu_.
  mutable absl::Mutex reg_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::pair<const Path*, const MemoryObject*>, std::shared_ptr<LocalReg>> local_regs_
      ABSL_GUARDED_BY(reg_mu_);
  uint64_t reg_clock_ ABSL_GUARDED_BY(reg_mu_) = 0;
};

// The exporting side: QPs and registrations for peer daemons.
class VerbsServer {
 public:
  // Called on a completion thread with a peer's notification; the engine
  // checks the grant belongs to `node`.
  using NotifySink = std::function<void(const std::string& node, uint64_t grant, uint64_t value)>;
  // Called on the staging thread for a staged slice of `node`'s grant:
  // moves `length` bytes at `offset` of the grant's memory from `buf`
  // (write) or into it (read) — copies them, or (a relay) sends them on —
  // and calls `done` once, on any thread, when `buf` is free again; checks
  // the grant is the node's and the range inside it. `keep` keeps `buf`
  // allocated (the bounce pool) until then. Null: staged records are refused.
  using StageSink = std::function<void(const std::string& node, uint64_t grant, bool write, uint64_t offset,
                                       char* buf, uint64_t length, std::shared_ptr<const void> keep,
                                       std::function<void(absl::Status)> done)>;
  VerbsServer(Nics* nics, VerbsOptions options, NotifySink sink, StageSink stage = nullptr);
  ~VerbsServer();

  // A peer's path: `local` is this node's address the peer reaches;
  // `link_instance` the peer's VerbsLinks (QPs of its older instances go).
  // `replaces`: QPs of this server the peer saw fail; those of `node` go.
  absl::StatusOr<SideWire> Accept(const std::string& node, uint64_t link_instance, const IpPrefix& local,
                                  const SideWire& importer, const std::vector<uint32_t>& replaces = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // Registers [addr, addr + length) of `memory` in each of the node's
  // protection domains. GPU memory: `addr` is its address in this daemon
  // (the peer's remote addresses), and the bytes are registered through a
  // dma-buf of it that `dmabuf` makes (MemoryObject::DmaBuf) for each
  // device that needs a registration; FAILED_PRECONDITION where a device or
  // the library cannot register dma-bufs.
  absl::StatusOr<std::vector<RegionKey>> Register(const std::string& node, uint64_t grant,
                                                  std::shared_ptr<MemoryObject> memory, char* addr, uint64_t length,
                                                  std::function<absl::StatusOr<UniqueFd>()> dmabuf = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes ready the bounce pool of each of `node`'s protection domains for
  // staged grants (kStageSlots slots of slice_bytes, pinned once per peer
  // device and kept); FAILED_PRECONDITION when the node's queue pairs do not
  // speak staged records, RESOURCE_EXHAUSTED when the pool cannot be pinned.
  absl::Status PrepareStaging(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Staged slices served (acknowledged good) and refused.
  uint64_t staged_slices() const { return staged_slices_.load(std::memory_order_relaxed); }
  uint64_t staged_refused() const { return staged_refused_.load(std::memory_order_relaxed); }
  // Copies of staged writes dropped because their transfer had ended (an
  // attempt that failed over to another QP, reaching this side late).
  uint64_t staged_late_dropped() const { return staged_late_dropped_.load(std::memory_order_relaxed); }
  // DONE records answered (transfers whose staged writes were guarded).
  uint64_t staged_done() const { return staged_done_.load(std::memory_order_relaxed); }
  // Bounce slots free for `node` (all its devices); for tests.
  size_t FreeBounceSlots(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  // The bounce slots' size: staged slices longer than this are refused.
  uint64_t stage_slot_bytes() const { return options_.slice_bytes; }
  // Drops the registration of `grant` if `node` made it.
  void Unregister(uint64_t grant, const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Grant and node of every registration.
  std::vector<std::pair<uint64_t, std::string>> RegisteredGrants() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t qps() const ABSL_LOCKS_EXCLUDED(mu_);
  // Distinct registrations (exports registered for a peer), all grants together.
  uint64_t registrations() const ABSL_LOCKS_EXCLUDED(reg_mu_);
  uint64_t notifies() const { return notifies_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint32_t kRecvDepth = 16;          // notifications in flight per QP
  static constexpr uint32_t kMailboxSlots = 2 * kRecvDepth;
  static constexpr uint32_t kSendDepth = 2 * kRecvDepth + 2;  // staged slices' sends per QP
  static constexpr uint32_t kCqPerQp = kRecvDepth + kSendDepth + 1;
  static constexpr size_t kMaxHeldDone = 256;  // DONE records held for writes in the sink, per peer node
  struct Served;   // one QP of a peer
  struct NodeNic;  // a peer's protection domain and CQ on one device
  // A staged record on its way through the staging thread.
  struct StageJob {
    std::shared_ptr<NodeNic> nn;
    uint32_t qpn = 0;
    uint32_t kind = 0;    // the record's
    // The importer's link set and transfer (records v3; guarded = false
    // before): a write of a transfer that ended is a late copy.
    uint64_t link_instance = 0, transfer = 0;
    bool guarded = false;
    bool counted = false;  // a write in the sink, counted in writing_ until answered
    bool dropped = false;  // a late copy, answered without being copied
    bool landed = false;  // a write whose bytes are in the bounce slot
    uint64_t grant = 0, offset = 0, addr = 0, ack_addr = 0;
    uint32_t length = 0, rkey = 0, tag = 0;
    int32_t slot = -1;  // bounce slot, once it has one
    bool in_sink = false;  // handed to the sink, not answered yet: the slot stays taken whatever happens to the QP
    uint64_t recv_id = 0;  // the receive its record came by: posted again once answered
  };
  // One export's registration for one peer, shared by that peer's grants
  // of it (one MR per peer device, not per grant).
  struct Registration {
    std::string node;
    std::shared_ptr<MemoryObject> memory;  // keeps the mapping while registered
    std::vector<std::pair<std::shared_ptr<NodeNic>, ibv_mr*>> mrs;
    std::set<uint64_t> grants;
  };
  using RegKey = std::tuple<std::string, uintptr_t, uint64_t>;  // node, address, length
  void PollLoop(std::shared_ptr<NodeNic> nn);
  void Deregister(Registration& r);
  void StageLoop();
  // The (peer, device)'s bounce pool, made if it has none (pinned under mu_:
  // once per peer device).
  absl::Status EnsurePoolLocked(NodeNic& nn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Stage(StageJob job) ABSL_LOCKS_EXCLUDED(mu_, stage_mu_);
  // The answer to a staged slice: a good read's bytes, then the
  // acknowledgement with `st`'s code; gives the bounce slot back where no
  // answer can go.
  void Answer(const StageJob& job, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_, stage_mu_);
  void Queue(StageJob job) ABSL_LOCKS_EXCLUDED(stage_mu_);
  // A send of a staged slice completed (or failed): its bounce slot may be free.
  void SendDone(const std::shared_ptr<NodeNic>& nn, uint64_t wr_id, uint32_t qpn, bool ok)
      ABSL_LOCKS_EXCLUDED(mu_, stage_mu_);
  // Gives bounce slot `slot` back if QP `qpn`'s slice still holds it; a
  // slice waiting for one, if any, then goes on.
  std::optional<StageJob> ReleaseLocked(NodeNic& nn, int32_t slot, uint32_t qpn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts a receive of QP `qpn` again (a staged record was answered: flow
  // control, so a peer has at most kRecvDepth records per QP in hand here).
  void RepostLocked(NodeNic& nn, uint32_t qpn, uint64_t recv_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The late-copy guard (as the TCP server's BeginWrite / DONE): a DONE
  // record ends its transfer; a write of an ended transfer is dropped, and
  // DONE is answered once the transfer's writes already in the sink finish.
  using TransferKey = std::tuple<std::string, uint64_t, uint64_t>;  // node, link instance, transfer
  static TransferKey KeyOf(const StageJob& job);
  static LateCopies::Key LateKeyOf(const StageJob& job);

  Nics* const nics_;
  const VerbsOptions options_;
  const NotifySink sink_;
  const StageSink stage_sink_;
  const uint32_t stage_slots_;  // bounce slots per (peer, device): kStageSlots, fewer for slices over 4 MiB
  // What a sink's late `done` finds: this server, or null once it is going.
  struct Alive {
    absl::Mutex mu;
    VerbsServer* server ABSL_GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<Alive> alive_ = std::make_shared<Alive>();
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> notifies_{0};
  std::atomic<uint64_t> staged_slices_{0};
  std::atomic<uint64_t> staged_refused_{0};
  std::atomic<uint64_t> staged_late_dropped_{0};
  std::atomic<uint64_t> staged_done_{0};
  // The late-copy guard (links/late_copies.h; a late copy reaches the sink
  // within about the importer's answer_timeout, so twice that is kept, a
  // minute at least), and the DONE records held until their transfer's
  // writes in the sink finish. xfer_mu_ makes a DONE's check and its holding
  // one step against the last write's end; taken alone (never with mu_ or
  // stage_mu_ held), the guard's own lock inside it.
  LateCopies late_copies_;
  absl::Mutex xfer_mu_;
  std::map<TransferKey, std::vector<StageJob>> done_waiting_ ABSL_GUARDED_BY(xfer_mu_);
  // The staging thread (started with the first pool) and its jobs.
  absl::Mutex stage_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::deque<StageJob> jobs_ ABSL_GUARDED_BY(stage_mu_);
  std::thread stager_;

  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<NodeNic>> node_nics_ ABSL_GUARDED_BY(mu_);
  // Registrations (device calls under it; the pollers never take it).
  mutable absl::Mutex reg_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<RegKey, std::shared_ptr<Registration>> shared_ ABSL_GUARDED_BY(reg_mu_);
  std::map<uint64_t, std::shared_ptr<Registration>> registrations_ ABSL_GUARDED_BY(reg_mu_);  // by grant
};

}  // namespace podlink::mesh::verbs
