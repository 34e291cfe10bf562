// What both ends of the verbs transport share (internal to verbs/): the
// mailbox record, the notification and acknowledgement layout, and queue-pair
// helpers.
#pragma once

#include "daemon/mesh/verbs/verbs_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_util.h"
#include "daemon/gpu/memory_object.h"
#include "daemon/mesh/links/log_limit.h"
#include "daemon/mesh/links/random.h"

namespace podlink::mesh::verbs {

// Notifications a lane has in flight, and the owner's mailbox slots per QP
// (twice as many, so a slot is rewritten only after the owner read it: the
// owner reposts a receive only after reading its slot, and a sender with
// kNotifyDepth unacknowledged writes has had kNotifyDepth consumed).
constexpr uint32_t kNotifyDepth = 16;
constexpr uint32_t kMailboxSlots = 2 * kNotifyDepth;
constexpr uint32_t kNotifyBytes = 16;  // {grant, value}, little endian

// A mailbox record of version 2 or 3 (kRecordsStaged, kRecordsStagedDone),
// in slots of kRecordBytes; version 1 is its first kNotifyBytes, a
// notification. Version 2 is its first 48 bytes. Little endian.
struct Record {
  uint64_t grant = 0;
  uint64_t value = 0;  // a notification's value; a staged slice's offset in the export
  uint32_t kind = 0;   // kRecordNotify, kRecordStagedWrite, kRecordStagedRead
  uint32_t length = 0;
  uint64_t addr = 0;   // the importer's staging slot (staged slices)
  uint32_t rkey = 0;   // its key
  uint32_t tag = 0;    // the importer's slot number, echoed in the acknowledgement
  uint64_t ack_addr = 0;  // the importer's ack word for it (same key)
  uint64_t transfer = 0;  // version 3: the importer's op the slice is of (a DONE record's: the op it ends)
};
static_assert(sizeof(Record) == 56);
constexpr uint32_t kRecordV2Bytes = 48;
constexpr uint32_t kRecordBytes = 64;
constexpr uint32_t kRecordNotify = 0;
constexpr uint32_t kRecordStagedWrite = 1;
constexpr uint32_t kRecordStagedRead = 2;
constexpr uint32_t kRecordStagedDone = 3;  // version 3: every slice of `transfer` landed; answered once no copy of one can land later
constexpr uint32_t kAckBytes = 8;
// The acknowledgement's immediate: the importer's slot, then an
// absl::StatusCode in the low byte.
inline uint32_t AckImm(uint32_t tag, absl::StatusCode code) { return (tag << 8) | (static_cast<uint32_t>(code) & 0xff); }

// Said at most every 10 s (a peer must not be able to flood the log).
inline LogLimit refused_log;
inline LogLimit unexpected_ack_log;

inline uint32_t RandomPsn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & 0xffffff;
}

inline absl::Status Errno(const char* what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

inline std::string Gid(const std::array<uint8_t, 16>& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, g.data(), buf, sizeof buf);
  return buf;
}

inline void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

inline ibv_qp* CreateRcQp(const VerbsApi* api, ibv_pd* pd, ibv_cq* cq, uint32_t max_send, uint32_t max_recv) {
  ibv_qp_init_attr a{};
  a.send_cq = cq;
  a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = max_send;
  a.cap.max_recv_wr = max_recv;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.sq_sig_all = 0;
  return api->create_qp(pd, &a);
}

inline absl::Status ToInit(const VerbsApi* api, ibv_qp* qp, uint8_t port, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = access;
  if (int rc = api->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    return Errno("ibv_modify_qp(INIT)", rc);
  }
  return absl::OkStatus();
}

struct ConnectArgs {
  uint8_t port = 1;
  int gid_index = 0;
  std::array<uint8_t, 16> remote_gid{};
  uint32_t remote_qpn = 0, remote_psn = 0, local_psn = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t timeout = 14, retry = 7;
};

inline absl::Status ToRts(const VerbsApi* api, ibv_qp* qp, const ConnectArgs& c) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = c.mtu;
  a.dest_qp_num = c.remote_qpn;
  a.rq_psn = c.remote_psn;
  a.max_dest_rd_atomic = 8;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  std::memcpy(a.ah_attr.grh.dgid.raw, c.remote_gid.data(), 16);
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(c.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = c.port;
  if (int rc = api->modify_qp(qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return Errno("ibv_modify_qp(RTR)", rc);
  }
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = c.timeout;
  r.retry_cnt = c.retry;
  r.rnr_retry = 7;  // a notification waits for the owner to repost a receive
  r.sq_psn = c.local_psn;
  r.max_rd_atomic = 8;
  if (int rc = api->modify_qp(qp, &r,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC)) {
    return Errno("ibv_modify_qp(RTS)", rc);
  }
  return absl::OkStatus();
}

inline void ToError(const VerbsApi* api, ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  (void)api->modify_qp(qp, &a, IBV_QP_STATE);
}

inline ibv_mtu MtuOf(uint32_t v) {
  return v >= IBV_MTU_256 && v <= IBV_MTU_4096 ? static_cast<ibv_mtu>(v) : IBV_MTU_1024;
}

// A completion channel's pending events, without blocking: the channel's fd
// is non-blocking and polled with a timeout so threads can stop.
inline bool WaitEvent(const VerbsApi* api, ibv_comp_channel* ch, ibv_cq* cq, const std::atomic<bool>& stop) {
  pollfd p{ch->fd, POLLIN, 0};
  if (::poll(&p, 1, 200) <= 0) return !stop.load(std::memory_order_acquire);
  ibv_cq* got = nullptr;
  void* ctx = nullptr;
  while (api->get_cq_event(ch, &got, &ctx) == 0) api->ack_cq_events(got, 1);
  api->req_notify_cq(cq, 0);
  return !stop.load(std::memory_order_acquire);
}

}  // namespace podlink::mesh::verbs
