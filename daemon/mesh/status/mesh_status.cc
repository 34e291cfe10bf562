// The mesh's status and metrics (mesh_status.h).
#include "daemon/mesh/status/mesh_status.h"

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/metrics/metrics.h"

namespace podlink::mesh {

namespace pb = podlink::mesh::v1;

podlink::v1::MeshStatus MeshStatusOf(const MeshView& v) {
  podlink::v1::MeshStatus st;
  st.set_enabled(true);
  st.set_node_name(v.node_name);
  for (const std::string& a : v.addresses) st.add_addresses(a);
  st.set_port(v.control_port);
  st.set_data_port(v.data_port);
  const std::map<std::string, std::shared_ptr<Peer>> peers = v.peers->Snapshot();
  std::map<std::string, uint32_t> handles;
  std::map<std::pair<std::string, std::vector<std::string>>, uint32_t> routes;
  for (const Handle& h : v.handles->All()) {
    ++handles[h.peer->tcp() ? h.peer->node() + "/tcp" : h.peer->node()];
    ++routes[{h.destination, h.via}];
  }
  const GrantTable::Counts held = v.owner->grants().counts();
  st.set_grants(held.grants);
  st.set_relayed_grants(held.relayed);
  {
    st.set_relay_forwarded_bytes(v.owner->counters().relay_forwarded_bytes);
    const int64_t now_s = absl::ToUnixSeconds(absl::Now());
    for (const auto& [node, k] : v.known->Snapshot()) {
      podlink::v1::MeshStatus::KnownNode* kn = st.add_known_nodes();
      kn->set_node(node);
      for (const std::string& a : k.addresses) kn->add_addresses(a);
      kn->set_port(k.port);
      const int64_t issued = v.adverts->IssuedOf(node);
      kn->set_advert_age_seconds(issued < 0 ? -1 : std::max<int64_t>(0, now_s - issued));
    }
    st.set_served_write_bytes(v.owner->counters().bytes_written_in);
    st.set_served_read_bytes(v.owner->counters().bytes_read_out);
    st.set_refused_connections(v.admission->counts().refused);
    st.set_refused_frames(v.data_server->counts().refused_frames);
    st.set_denials(v.owner->counters().denials);
  }
  for (const auto& [route, n] : routes) {
    podlink::v1::MeshStatus::Route* r = st.add_routes();
    r->set_destination(route.first);
    for (const std::string& relay : route.second) r->add_via(relay);
    r->set_remote_handles(n);
  }
  auto copy_link = [](const pb::LinkInfo& from, podlink::v1::MeshStatus::Link* to) {
    to->set_address(from.address());
    to->set_netdev(from.netdev());
    to->set_speed_mbps(from.speed_mbps());
    to->set_pci_path(from.pci_path());
    to->set_numa_node(from.numa_node());
    to->set_rdma_device(from.rdma_device());
    to->set_gid_index(from.gid_index());
    to->set_gid_type(from.gid_type());
  };
  for (const pb::LinkInfo& l : v.local_links) copy_link(l, st.add_links());
  for (const auto& [key, p] : peers) {
    podlink::v1::MeshStatus::Peer* out = st.add_peers();
    out->set_node(p->node());
    out->set_remote_handles(handles[key]);
    for (const pb::LinkInfo& l : p->advertised()) copy_link(l, out->add_links());
    std::shared_ptr<DataLinks> links = p->links();
    if (links == nullptr) continue;
    LinkStats s = links->Stats();
    out->set_transport(links->transport());
    out->set_connections_up(static_cast<uint32_t>(s.connections_up));
    out->set_bytes_sent(s.bytes_sent);
    out->set_bytes_received(s.bytes_received);
    out->set_connection_failures(s.connection_failures);
    out->set_resent_slices(s.resent_slices);
    for (const auto& [path, up, sent] : links->Connections()) {
      podlink::v1::MeshStatus::Connection* c = out->add_connections();
      c->set_path(path);
      c->set_up(up);
      c->set_bytes_sent(sent);
    }
  }
  return st;
}

std::string RenderMeshMetrics(const MeshView& v) {
  std::string out;
  std::map<std::string, double> up, sent, received, failures, resent, zero_copy, local_regs, tcp_zc_bytes,
      tcp_zc_completed, tcp_zc_copied, tcp_zc_fell_back;
  const std::vector<std::shared_ptr<Peer>> peers = v.peers->All();
  const GrantTable::Counts held = v.owner->grants().counts();
  const double grants = static_cast<double>(held.grants);
  const double handles = static_cast<double>(v.handles->size());
  double repaired = 0;
  uint64_t in = 0, out_bytes = 0, refused_frames = 0, refused_conns = 0, denials = 0, late = 0, dup_notifies = 0,
           idle_closed = 0;
  {
    in = v.owner->counters().bytes_written_in;
    out_bytes = v.owner->counters().bytes_read_out;
    refused_conns = v.admission->counts().refused;
    denials = v.owner->counters().denials;
    repaired = v.repairs->repaired();
    const TcpDataServer::Counts served = v.data_server->counts();
    refused_frames = served.refused_frames;
    late = served.late_slices_dropped;
    dup_notifies = served.duplicate_notifies;
    idle_closed = served.idle_closed;
  }
  std::map<std::pair<std::string, std::string>, double> path_up, path_sent;
  for (const auto& p : peers) {
    std::shared_ptr<DataLinks> l = p->links();
    LinkStats s = l != nullptr ? l->Stats() : LinkStats{};
    if (l != nullptr) {
      for (const auto& [path, conn_up, conn_sent] : l->Connections()) {
        path_up[{p->node(), path}] += conn_up ? 1 : 0;
        path_sent[{p->node(), path}] += static_cast<double>(conn_sent);
      }
    }
    // A node reached both over the configured transport and, as a relay,
    // over TCP: its counters add up.
    up[p->node()] += static_cast<double>(s.connections_up);
    sent[p->node()] += static_cast<double>(s.bytes_sent);
    received[p->node()] += static_cast<double>(s.bytes_received);
    failures[p->node()] += static_cast<double>(s.connection_failures);
    resent[p->node()] += static_cast<double>(s.resent_slices);
    zero_copy[p->node()] += static_cast<double>(s.zero_copy_slices);
    tcp_zc_bytes[p->node()] += static_cast<double>(s.tcp_zero_copy_bytes);
    tcp_zc_completed[p->node()] += static_cast<double>(s.tcp_zero_copy_completed);
    tcp_zc_copied[p->node()] += static_cast<double>(s.tcp_zero_copy_copied);
    tcp_zc_fell_back[p->node()] += static_cast<double>(s.tcp_zero_copy_fell_back);
    local_regs[p->node()] += static_cast<double>(s.local_registrations);
  }
  RenderFamily(&out, "podlink_mesh_connections_up", "gauge", "data connections up, per peer node", up, "peer");
  RenderFamily(&out, "podlink_mesh_sent_bytes_total", "counter", "bytes written to peer nodes", sent, "peer");
  RenderFamily(&out, "podlink_mesh_received_bytes_total", "counter", "bytes read from peer nodes", received, "peer");
  RenderFamily(&out, "podlink_mesh_connection_failures_total", "counter", "data connections that failed", failures,
               "peer");
  RenderFamily(&out, "podlink_mesh_resent_slices_total", "counter",
               "slices sent again over another connection after theirs failed", resent, "peer");
  RenderFamily(&out, "podlink_mesh_zero_copy_slices_total", "counter",
               "verbs: slices sent from or read into a local export directly (no copy through staging)", zero_copy,
               "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_bytes_total", "counter",
               "TCP: bytes of pods' host exports written to peer nodes without a copy (MSG_ZEROCOPY)", tcp_zc_bytes,
               "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_completed_total", "counter",
               "TCP: zero-copy sends the kernel reported done (copied or not)", tcp_zc_completed, "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_copied_total", "counter",
               "TCP: zero-copy sends the kernel copied after all (loopback, veth: the connection then stops asking)",
               tcp_zc_copied, "peer");
  RenderFamily(&out, "podlink_mesh_tcp_zero_copy_fell_back_total", "counter",
               "TCP: sends the kernel would not pin (locked-memory limit, optmem), copied instead", tcp_zc_fell_back,
               "peer");
  RenderFamily(&out, "podlink_mesh_local_registrations", "gauge",
               "verbs: local exports registered with the RDMA device for that, per peer node", local_regs, "peer");
  RenderFamily2(&out, "podlink_mesh_path_connections_up", "gauge",
                "data connections (TCP) or queue pairs (verbs) up, per peer node and path (local->remote address)",
                path_up, "peer", "path");
  RenderFamily2(&out, "podlink_mesh_path_sent_bytes_total", "counter", "bytes written to a peer node, per path",
                path_sent, "peer", "path");
  auto one = [&](const char* name, const char* type, const char* help, double value) {
    RenderFamily(&out, name, type, help, {{"", value}});
  };
  one("podlink_mesh_grants", "gauge", "grants this node gave peer daemons", grants);
  one("podlink_mesh_repaired_connections_total", "counter",
      "data connections dialed again over a path after theirs failed", static_cast<double>(repaired));
  one("podlink_mesh_remote_handles", "gauge", "remote regions this node's pods hold", handles);
  one("podlink_mesh_served_write_bytes_total", "counter", "bytes peers wrote into this node's exports",
      static_cast<double>(in));
  one("podlink_mesh_served_read_bytes_total", "counter", "bytes peers read from this node's exports",
      static_cast<double>(out_bytes));
  one("podlink_mesh_refused_frames_total", "counter", "data connections closed for a malformed frame",
      static_cast<double>(refused_frames));
  one("podlink_mesh_refused_connections_total", "counter",
      "data connections refused (no valid cookie, or over the bound)", static_cast<double>(refused_conns));
  one("podlink_mesh_finished_transfers", "gauge",
      "transfers peers finished or notified in the last minute, kept to drop late copies (bounded per peer)",
      static_cast<double>(v.late_copies->Entries()));
  one("podlink_mesh_idle_connections_closed_total", "counter",
      "data connections closed after mesh.data_idle_seconds without a frame", static_cast<double>(idle_closed));
  one("podlink_mesh_denials_total", "counter", "remote opens refused", static_cast<double>(denials));
  one("podlink_mesh_late_slices_dropped_total", "counter",
      "copies of slices that arrived after their transfer finished (resent elsewhere), dropped",
      static_cast<double>(late));
  one("podlink_mesh_duplicate_notifies_total", "counter", "notifications received again and not delivered twice",
      static_cast<double>(dup_notifies));
  auto counted = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  const RemoteTransfers::Counters& striped = v.transfers->counters();
  one("podlink_mesh_two_hop_routes_total", "counter",
      "second routes through a relay opened for regions of cabled nodes (mesh.two_hop_stripe)",
      counted(striped.two_hop_routes));
  one("podlink_mesh_two_hop_transfers_total", "counter", "transfers striped over the direct links and a two-hop route",
      counted(striped.two_hop_transfers));
  one("podlink_mesh_two_hop_bytes_total", "counter", "bytes such transfers moved over their two-hop route",
      counted(striped.two_hop_bytes));
  one("podlink_mesh_two_hop_failovers_total", "counter",
      "chunks a two-hop route failed, sent again on the direct links", counted(striped.two_hop_failovers));
  one("podlink_mesh_two_hop_fences_total", "counter",
      "two-hop routes the owner fenced before their chunks went again on the direct links",
      counted(striped.two_hop_fences));
  one("podlink_mesh_fenced_grants_total", "counter", "grants given relays that their origin node fenced (FenceRoute)",
      static_cast<double>(held.fenced));
  const uint64_t refused_notifies = v.owner->counters().refused_notifies;
  const RegionOwner::Counters& owned = v.owner->counters();
  const uint64_t relayed = owned.relayed_opens, routed = v.opener->routed_opens(),
                 forwarded = owned.relay_forwarded_bytes;
  const uint64_t staged = v.owner->relay_staging_used();
  const uint64_t restarted_dropped = held.restarted_dropped;
  const uint64_t adverts_held = v.adverts->size(), adverts_refused = v.adverts->refused();
  const uint64_t own_pauses = v.liveness->own_pauses();
  const uint64_t idle_dropped = owned.idle_peer_grants_dropped, gone_dropped = owned.gone_pod_grants_dropped;
  one("podlink_mesh_restarted_peer_grants_dropped_total", "counter",
      "grants dropped because the daemon holding them restarted (a new instance said so)",
      static_cast<double>(restarted_dropped));
  one("podlink_mesh_idle_peer_grants_dropped_total", "counter",
      "grants dropped because the node holding them was silent longer than mesh.grant_idle_seconds",
      static_cast<double>(idle_dropped));
  one("podlink_mesh_gone_pod_grants_dropped_total", "counter",
      "grants dropped because the importing pod is gone (deleted or finished, per the API server)",
      static_cast<double>(gone_dropped));
  one("podlink_mesh_own_pauses_total", "counter",
      "times this daemon did not run for over 0.7 s (starved, stopped); the pause is not counted as importers' silence",
      static_cast<double>(own_pauses));
  one("podlink_mesh_node_adverts", "gauge", "signed node adverts this daemon holds (its own included)",
      static_cast<double>(adverts_held));
  one("podlink_mesh_node_adverts_refused_total", "counter",
      "node adverts refused: malformed, or not signed by the node they name under the mesh CA",
      static_cast<double>(adverts_refused));
  one("podlink_mesh_relayed_opens_total", "counter", "regions this node opened onward for other nodes (as a relay)",
      static_cast<double>(relayed));
  one("podlink_mesh_routed_opens_total", "counter", "regions this node's pods opened through relays",
      static_cast<double>(routed));
  one("podlink_mesh_relay_forwarded_bytes_total", "counter", "bytes this node forwarded as a relay",
      static_cast<double>(forwarded));
  one("podlink_mesh_verbs_fallbacks_total", "counter",
      "opens this node sent over TCP because no RDMA path to the node came up (mesh.verbs_tcp_fallback)",
      static_cast<double>(v.connector->verbs_fallbacks()));
  one("podlink_mesh_grants_over_tcp_total", "counter",
      "grants this node gave over TCP though the importer asked for RDMA (the export could not be registered)",
      static_cast<double>(v.verbs->grants_over_tcp()));
  one("podlink_mesh_grants_staged_total", "counter",
      "grants this node stages through its bounce pools over the importer's queue pairs (export not registered)",
      static_cast<double>(v.verbs->grants_staged()));
  one("podlink_mesh_relay_staged_bytes", "gauge", "bytes of forwarded requests held in this node's relay staging",
      static_cast<double>(staged));
  one("podlink_mesh_sealed_routes_total", "counter",
      "regions this node's pods opened through relays, sealed end to end with their owner",
      static_cast<double>(v.opener->sealed_routes()));
  one("podlink_mesh_sealed_units_total", "counter",
      "operations of importers through relays that verified here (owner) and were carried out",
      static_cast<double>(v.owner->seal_counters().units.load(std::memory_order_relaxed)));
  one("podlink_mesh_sealed_refused_total", "counter",
      "requests or records of sealed routes that did not verify here, or were replays (a relay altered them)",
      static_cast<double>(v.owner->seal_counters().refused.load(std::memory_order_relaxed)));
  one("podlink_mesh_sealed_window_bytes", "gauge",
      "memory of this node's sealed windows (regions opened through relays; mesh.sealed_window_mib)",
      static_cast<double>(v.owner->seal_budget_used()));
  one("podlink_mesh_refused_notifies_total", "counter",
      "notifications from peers not delivered (grant not theirs, export gone)", static_cast<double>(refused_notifies));
  if (const verbs::VerbsNode::ServerCounts served = v.verbs->server_counts(); served.serving) {
    one("podlink_mesh_verbs_served_qps", "gauge", "RC queue pairs this node holds for peer daemons",
        static_cast<double>(served.qps));
    one("podlink_mesh_verbs_registrations", "gauge",
        "exports registered for peers' RDMA access (shared by their grants)",
        static_cast<double>(served.registrations));
    one("podlink_mesh_verbs_notifies_total", "counter", "notifications received by RDMA WRITE WITH IMMEDIATE",
        static_cast<double>(served.notifies));
    one("podlink_mesh_verbs_staged_slices_total", "counter",
        "slices of staged grants copied between an export and a bounce pool for a peer",
        static_cast<double>(served.staged_slices));
    one("podlink_mesh_verbs_staged_refused_total", "counter",
        "staged slices refused (grant not the peer's, export gone, range outside it, bad record)",
        static_cast<double>(served.staged_refused));
    one("podlink_mesh_verbs_staged_late_dropped_total", "counter",
        "copies of staged writes dropped because their transfer had ended (sent again after their queue pair failed)",
        static_cast<double>(served.staged_late_dropped));
    one("podlink_mesh_verbs_staged_done_total", "counter",
        "staged writes sent partly twice whose end the importer had confirmed (DONE records answered)",
        static_cast<double>(served.staged_done));
  }
  if (v.owner->gpu_copies().count() > 0) {
    absl::StrAppend(&out, "# HELP podlink_mesh_gpu_served_copy_seconds copies between a GPU export and a data ",
                    "connection's host buffer (exporting side)\n",
                    "# TYPE podlink_mesh_gpu_served_copy_seconds histogram\n");
    v.owner->gpu_copies().Render("podlink_mesh_gpu_served_copy_seconds", &out);
  }
  return out;
}

}  // namespace podlink::mesh
