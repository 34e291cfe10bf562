// A fake RDMA fabric behind a VerbsApi table (daemon/mesh/verbs/verbs_api.h):
// in-process RC RDMA WRITE, READ and WRITE WITH IMMEDIATE between fake QPs,
// rkeys checked against the target QP's protection domain like an HCA, QPs
// broken on demand, READ completions held back on demand. For the verbs
// transport's unit tests (tests/unit/verbs_fake_test.cc).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "daemon/mesh/verbs/verbs_api.h"

namespace podlink::mesh::verbs {

// --- the fake fabric ---------------------------------------------------------

struct FakeCq {
  ibv_cq cq{};
  ibv_comp_channel* channel = nullptr;
  std::deque<ibv_wc> wcs;
};
struct Waiting {  // a WRITE WITH IMMEDIATE held back by RNR until a receive is posted
  ibv_qp* from;
  char* local;
  char* remote;
  uint32_t length;
  ibv_wc send_wc;
  uint32_t imm;
};
struct FakeQp {
  ibv_qp qp{};
  std::deque<Waiting> rnr;
  uint32_t dest = 0;
  int access = 0;
  int recvs = 0;
  bool broken = false;
  int fail_after = -1;  // posts left before the QP breaks; -1: never
};
struct FakeMr {
  ibv_mr mr{};
  int access = 0;
  char* host = nullptr;  // a dma-buf registration: where its bytes are mapped here (mr.addr is the iova)
};

struct Fabric {
  std::recursive_mutex mu;
  std::map<uint32_t, FakeQp*> qps;
  std::map<uint32_t, FakeMr*> mrs;  // by rkey
  uint32_t next_qpn = 100;
  uint32_t next_key = 7;
  int fake_device = 0;
  void* refuse_registration = nullptr;  // reg_mr of this address fails (as over a read-only mapping)
  bool dmabuf = true;                   // the device registers dma-bufs (read when a device is opened)
  // RDMA READs whose completion is held back (the bytes land at once): the
  // next `hold_reads` of them, until the test completes them (ReleaseReads).
  int hold_reads = 0;
  std::vector<std::pair<FakeCq*, ibv_wc>> held_reads;
  ibv_device* devices[2] = {reinterpret_cast<ibv_device*>(&fake_device), nullptr};
};
inline Fabric* fabric = new Fabric;

inline void Complete(FakeCq* cq, const ibv_wc& wc) {
  cq->wcs.push_back(wc);
  uint64_t one = 1;
  if (cq->channel != nullptr) (void)!write(cq->channel->fd, &one, sizeof one);
}

inline FakeQp* Qp(ibv_qp* qp) { return reinterpret_cast<FakeQp*>(qp); }
inline FakeCq* Cq(ibv_cq* cq) { return reinterpret_cast<FakeCq*>(cq); }

// The remote range of an RDMA request, as the target HCA checks it: the key
// exists, belongs to the target QP's protection domain, allows the access
// and covers the range.
inline char* Target(FakeQp* target, uint32_t rkey, uint64_t addr, uint32_t len, int need) {
  auto it = fabric->mrs.find(rkey);
  if (it == fabric->mrs.end()) return nullptr;
  FakeMr* m = it->second;
  if (m->mr.pd != target->qp.pd || (m->access & need) != need || (target->access & need) != need) return nullptr;
  uint64_t base = reinterpret_cast<uintptr_t>(m->mr.addr);
  if (addr < base || addr + len > base + m->mr.length) return nullptr;
  return m->host != nullptr ? m->host + (addr - base) : reinterpret_cast<char*>(addr);
}

// The local side of a request, as the sending HCA checks it: the lkey exists
// in the QP's protection domain and covers the range, with local write
// access where the HCA writes there (RDMA READ results).
inline bool LocalOk(ibv_qp* qp, const ibv_sge& s, bool hca_writes) {
  auto it = fabric->mrs.find(s.lkey);
  if (it == fabric->mrs.end()) return false;
  FakeMr* m = it->second;
  if (m->mr.pd != qp->pd || (hca_writes && (m->access & IBV_ACCESS_LOCAL_WRITE) == 0)) return false;
  uint64_t base = reinterpret_cast<uintptr_t>(m->mr.addr);
  return s.addr >= base && s.addr + s.length <= base + m->mr.length;
}

inline void Deliver(FakeQp* t) {
  while (t->recvs > 0 && !t->rnr.empty()) {
    Waiting w = t->rnr.front();
    t->rnr.pop_front();
    --t->recvs;
    std::memcpy(w.remote, w.local, w.length);
    ibv_wc r{};
    r.status = IBV_WC_SUCCESS;
    r.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    r.imm_data = w.imm;
    r.qp_num = t->qp.qp_num;
    r.wc_flags = IBV_WC_WITH_IMM;
    Complete(Cq(t->qp.recv_cq), r);
    if (fabric->qps.contains(w.send_wc.qp_num)) Complete(Cq(w.from->send_cq), w.send_wc);
  }
}

inline int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::recursive_mutex> l(fabric->mu);
  FakeQp* q = Qp(qp);
  for (; wr != nullptr; wr = wr->next) {
    ibv_wc wc{};
    wc.wr_id = wr->wr_id;
    wc.qp_num = qp->qp_num;
    wc.status = IBV_WC_SUCCESS;
    if (q->fail_after == 0) q->broken = true;
    if (q->fail_after > 0) --q->fail_after;
    auto peer = fabric->qps.find(q->dest);
    if (q->broken || peer == fabric->qps.end()) {
      wc.status = q->broken ? IBV_WC_RETRY_EXC_ERR : IBV_WC_WR_FLUSH_ERR;
      Complete(Cq(qp->send_cq), wc);
      continue;
    }
    FakeQp* t = peer->second;
    const ibv_sge& s = wr->sg_list[0];
    char* local = reinterpret_cast<char*>(s.addr);
    if (!LocalOk(qp, s, wr->opcode == IBV_WR_RDMA_READ)) {
      wc.status = IBV_WC_LOC_PROT_ERR;
      q->broken = true;
      Complete(Cq(qp->send_cq), wc);
      continue;
    }
    int need = wr->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    char* remote = Target(t, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, s.length, need);
    if (remote == nullptr) {
      wc.status = IBV_WC_REM_ACCESS_ERR;
      q->broken = true;  // an RC QP goes to error
      Complete(Cq(qp->send_cq), wc);
      continue;
    }
    if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      // rnr_retry 7 retries for ever: the message lands once a receive is
      // posted (Deliver), in order.
      t->rnr.push_back(Waiting{qp, local, remote, s.length, wc, wr->imm_data});
      Deliver(t);
      continue;
    }
    if (wr->opcode == IBV_WR_RDMA_READ) {
      std::memcpy(local, remote, s.length);
      if (fabric->hold_reads > 0) {
        --fabric->hold_reads;
        fabric->held_reads.emplace_back(Cq(qp->send_cq), wc);
        continue;
      }
    } else {
      std::memcpy(remote, local, s.length);
    }
    Complete(Cq(qp->send_cq), wc);
  }
  *bad = nullptr;
  return 0;
}

// Completes the READs held back (their completion handled late, as by a
// poller that is behind).
inline void ReleaseReads() {
  std::lock_guard<std::recursive_mutex> l(fabric->mu);
  for (auto& [cq, wc] : fabric->held_reads) Complete(cq, wc);
  fabric->held_reads.clear();
}

inline int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::recursive_mutex> l(fabric->mu);
  for (; wr != nullptr; wr = wr->next) ++Qp(qp)->recvs;
  Deliver(Qp(qp));
  *bad = nullptr;
  return 0;
}

inline int PollCq(ibv_cq* cq, int n, ibv_wc* out) {
  std::lock_guard<std::recursive_mutex> l(fabric->mu);
  FakeCq* c = Cq(cq);
  int k = 0;
  while (k < n && !c->wcs.empty()) {
    out[k++] = c->wcs.front();
    c->wcs.pop_front();
  }
  return k;
}

inline VerbsApi MakeFakeApi() {
  VerbsApi v;
  v.get_device_list = [](int* n) {
    *n = 1;
    return fabric->devices;
  };
  v.free_device_list = [](ibv_device**) {};
  v.get_device_name = [](ibv_device*) { return "fake0"; };
  v.open_device = [](ibv_device*) {
    auto* ctx = new ibv_context{};
    ctx->async_fd = eventfd(0, EFD_NONBLOCK);
    return ctx;
  };
  v.close_device = [](ibv_context* ctx) {
    close(ctx->async_fd);
    delete ctx;
    return 0;
  };
  v.query_port = [](ibv_context*, uint8_t, ibv_port_attr* pa) {
    *pa = {};
    pa->state = IBV_PORT_ACTIVE;
    pa->active_mtu = IBV_MTU_1024;
    pa->link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
  };
  v.alloc_pd = [](ibv_context* ctx) {
    auto* pd = new ibv_pd{};
    pd->context = ctx;
    return pd;
  };
  v.dealloc_pd = [](ibv_pd* pd) {
    delete pd;
    return 0;
  };
  v.reg_mr = [](ibv_pd* pd, void* addr, size_t len, int access) -> ibv_mr* {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    if (addr == fabric->refuse_registration) {
      errno = EFAULT;
      return nullptr;
    }
    auto* m = new FakeMr;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = m->mr.rkey = fabric->next_key++;
    m->access = access;
    fabric->mrs[m->mr.rkey] = m;
    return &m->mr;
  };
  v.reg_dmabuf_mr = [](ibv_pd* pd, uint64_t offset, size_t len, uint64_t iova, int fd, int access) -> ibv_mr* {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    if (!fabric->dmabuf) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    void* host = fd < 0 ? MAP_FAILED : mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
    if (host == MAP_FAILED) {
      errno = EBADF;
      return nullptr;
    }
    auto* m = new FakeMr;
    m->mr.pd = pd;
    m->mr.addr = reinterpret_cast<void*>(iova);
    m->mr.length = len;
    m->mr.lkey = m->mr.rkey = fabric->next_key++;
    m->access = access;
    m->host = static_cast<char*>(host);
    fabric->mrs[m->mr.rkey] = m;
    return &m->mr;
  };
  v.dereg_mr = [](ibv_mr* mr) {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    if (FakeMr* m = reinterpret_cast<FakeMr*>(mr); m->host != nullptr) munmap(m->host, m->mr.length);
    fabric->mrs.erase(mr->rkey);
    delete reinterpret_cast<FakeMr*>(mr);
    return 0;
  };
  v.create_comp_channel = [](ibv_context* ctx) {
    auto* ch = new ibv_comp_channel{};
    ch->context = ctx;
    ch->fd = eventfd(0, EFD_NONBLOCK);
    return ch;
  };
  v.destroy_comp_channel = [](ibv_comp_channel* ch) {
    close(ch->fd);
    delete ch;
    return 0;
  };
  v.create_cq = [](ibv_context* ctx, int, void*, ibv_comp_channel* ch, int) {
    auto* c = new FakeCq;
    c->cq.context = ctx;
    c->cq.channel = ch;
    c->channel = ch;
    return &c->cq;
  };
  v.destroy_cq = [](ibv_cq* cq) {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    delete Cq(cq);
    return 0;
  };
  v.get_cq_event = [](ibv_comp_channel* ch, ibv_cq** cq, void** ctx) {
    uint64_t n = 0;
    if (read(ch->fd, &n, sizeof n) != sizeof n) return -1;
    *cq = nullptr;
    *ctx = nullptr;
    return 0;
  };
  v.ack_cq_events = [](ibv_cq*, unsigned) {};
  v.create_qp = [](ibv_pd* pd, ibv_qp_init_attr* a) {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    auto* q = new FakeQp;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_num = fabric->next_qpn++;
    fabric->qps[q->qp.qp_num] = q;
    return &q->qp;
  };
  v.modify_qp = [](ibv_qp* qp, ibv_qp_attr* a, int mask) {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    if (mask & IBV_QP_ACCESS_FLAGS) Qp(qp)->access = a->qp_access_flags;
    if (mask & IBV_QP_DEST_QPN) Qp(qp)->dest = a->dest_qp_num;
    if ((mask & IBV_QP_STATE) && a->qp_state == IBV_QPS_ERR) Qp(qp)->broken = true;
    return 0;
  };
  v.destroy_qp = [](ibv_qp* qp) {
    std::lock_guard<std::recursive_mutex> l(fabric->mu);
    fabric->qps.erase(qp->qp_num);
    delete Qp(qp);
    return 0;
  };
  v.get_async_event = [](ibv_context*, ibv_async_event*) { return -1; };
  v.ack_async_event = [](ibv_async_event*) {};
  v.wc_status_str = [](ibv_wc_status s) { return s == IBV_WC_SUCCESS ? "success" : "fake error"; };
  v.event_type_str = [](ibv_event_type) { return "fake event"; };
  v.post_send = PostSend;
  v.post_recv = PostRecv;
  v.poll_cq = PollCq;
  v.req_notify_cq = [](ibv_cq*, int) { return 0; };
  return v;
}

}  // namespace podlink::mesh::verbs
