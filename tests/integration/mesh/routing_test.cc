// Routing: each pair's own cable, adverts that teach routes beyond the neighbours, and relays for
// nodes without a cable.
#include "common/unique_fd.h"
#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

// The seed's triangle (every pair of nodes its own cable and subnet) plus a
// node D cabled only to C: each daemon reaches each neighbour over the cable
// to it and no other, and a node with no common subnet is refused clearly
// (there is no relay through C yet), never reached over some other network.
TEST_F(Mesh, TriangleUsesEachPairsOwnCableAndRefusesANodeWithoutOne) {
  std::string a = topo_.Node("a"), b = topo_.Node("b"), c = topo_.Node("c"), d = topo_.Node("d");
  auto [ab_a, ab_b] = topo_.Cable(a, b, 1);
  auto [bc_b, bc_c] = topo_.Cable(b, c, 2);
  auto [ac_a, ac_c] = topo_.Cable(a, c, 3);
  auto [cd_c, cd_d] = topo_.Cable(c, d, 4);
  PodCgroup pa(RandomPodUid(), "burstable"), pb(RandomPodUid(), "burstable"), pc(RandomPodUid(), "burstable"),
      pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "a", "job-7") + "," + Rule(pb, "ml", "b", "job-7") + "," +
                     Rule(pc, "ml", "c", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  // Adverts every second; D knows C (mesh.peers), so the two talk over
  // their cable and their adverts name each other.
  const std::string adverts = R"(, "advert_seconds": 1)";
  auto na = StartNode("node-a", a, {ab_a, ac_a}, pods, "", adverts);
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods, "", adverts);
  auto nc = StartNode("node-c", c, {bc_c, ac_c, cd_c}, pods, "", adverts);
  auto nd = StartNode("node-d", d, {cd_d}, pods, "",
                      adverts + R"(, "peers": [{"node": "node-c", "addresses": ["10.77.4.1/30"], "port": 7446}])");
  const uint64_t size = 8 << 20;
  {
    // A to D before A knows any node that reaches D: no common subnet, no
    // relay; refused with both sides' addresses, not routed elsewhere.
    Pod server(*nd, &pd, {"kv-serve", "--size", "65536", "--verify", "1"});
    json s = server.Expect("serving");
    ASSERT_EQ(s["event"], "serving") << s.dump();
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "1"});
    json e = client.Expect("put");
    EXPECT_EQ(e["code"], "FAILED_PRECONDITION") << e.dump();
    EXPECT_NE(e["message"].get<std::string>().find("no direct link reaches node node-d"), std::string::npos) << e.dump();
    EXPECT_NE(e["message"].get<std::string>().find("10.77.4.2/30"), std::string::npos) << e.dump();
    server.Kill(SIGKILL);
  }
  // Every ordered pair of the triangle, each over its own cable only.
  struct Hop {
    Daemon* from;
    const PodCgroup* from_pod;
    std::string ns, on, off;  // the sender's namespace, the cable it must use, the one it must not
    Daemon* to;
    const PodCgroup* to_pod;
  };
  std::vector<Hop> hops = {{na.get(), &pa, a, ab_a, ac_a, nb.get(), &pb}, {na.get(), &pa, a, ac_a, ab_a, nc.get(), &pc},
                           {nb.get(), &pb, b, ab_b, bc_b, na.get(), &pa}, {nb.get(), &pb, b, bc_b, ab_b, nc.get(), &pc},
                           {nc.get(), &pc, c, ac_c, bc_c, na.get(), &pa}, {nc.get(), &pc, c, bc_c, ac_c, nb.get(), &pb}};
  int seed = 70;
  for (const Hop& h : hops) {
    uint64_t on0 = TxBytes(h.ns, h.on), off0 = TxBytes(h.ns, h.off);
    KvAcrossNodes(*h.to, *h.to_pod, *h.from, *h.from_pod, size, ++seed);
    uint64_t on = TxBytes(h.ns, h.on) - on0, off = TxBytes(h.ns, h.off) - off0;
    EXPECT_GE(on, size) << h.on << " carried " << on << " bytes";
    EXPECT_LT(off, size / 16) << h.off << " carried " << off << " bytes of a transfer not meant for it";
  }
  // A has talked to C now (C's Hello said its addresses, D's cable among
  // them), and holds C's and D's adverts, which name each other (a claim of
  // C's alone would not do: routes.h): A to D goes through C, over A's cable
  // to C and C's to D, byte for byte, and D's daemon grants it to node-a's
  // pod as relayed by C.
  ASSERT_TRUE(WaitForNeighbours(*na, "node-d", {"node-c"})) << na->Log();
  ASSERT_TRUE(WaitForNeighbours(*na, "node-c", {"node-d"})) << na->Log();
  uint64_t ac0 = TxBytes(a, ac_a), ab0 = TxBytes(a, ab_a), cd0 = TxBytes(c, cd_c);
  KvAcrossNodes(*nd, pd, *na, pa, size, ++seed);
  EXPECT_GE(TxBytes(a, ac_a) - ac0, size);
  EXPECT_LT(TxBytes(a, ab_a) - ab0, size / 16) << "the route through C does not touch B's cable";
  EXPECT_GE(TxBytes(c, cd_c) - cd0, size);
  EXPECT_NE(na->Log().find("event=mesh_route destination=node-d via=node-c"), std::string::npos) << na->Log();
  EXPECT_NE(nc->Log().find("event=mesh_relay_grant peer=node-a origin=node-a next=node-d"), std::string::npos)
      << nc->Log();
  EXPECT_NE(nd->Log().find("event=mesh_grant peer=node-c pod=ml/a "), std::string::npos) << nd->Log();
  EXPECT_NE(nd->Log().find(" origin=node-a"), std::string::npos) << nd->Log();
}
// A chain A - B - C - D in which each node is told only of its cable
// neighbours (mesh.peers): signed node adverts, traded hop by hop every
// second here, teach A of C and D, and A reaches D's pods through B and C
// (and D A's), byte for byte.
TEST_F(Mesh, NodeAdvertsTeachRoutesBeyondTheNeighbours) {
  std::string a = topo_.Node("a"), b = topo_.Node("b"), c = topo_.Node("c"), d = topo_.Node("d");
  auto [ab_a, ab_b] = topo_.Cable(a, b, 1);
  auto [bc_b, bc_c] = topo_.Cable(b, c, 2);
  auto [cd_c, cd_d] = topo_.Cable(c, d, 3);
  PodCgroup pa(RandomPodUid(), "burstable"), pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "a", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  auto peer = [](const std::string& node, const std::string& address) {
    return absl::StrCat(R"({"node": ")", node, R"(", "addresses": [")", address, R"("], "port": 7446})");
  };
  auto mesh = [](const std::vector<std::string>& peers) {
    return absl::StrCat(R"(, "advert_seconds": 1, "peers": [)", absl::StrJoin(peers, ", "), "]");
  };
  auto na = StartNode("node-a", a, {ab_a}, pods, "", mesh({peer("node-b", "10.77.1.2/30")}));
  auto nb = StartNode("node-b", b, {ab_b, bc_b}, pods, "",
                      mesh({peer("node-a", "10.77.1.1/30"), peer("node-c", "10.77.2.2/30")}));
  auto nc = StartNode("node-c", c, {bc_c, cd_c}, pods, "",
                      mesh({peer("node-b", "10.77.2.1/30"), peer("node-d", "10.77.3.2/30")}));
  auto nd = StartNode("node-d", d, {cd_d}, pods, "", mesh({peer("node-c", "10.77.3.1/30")}));
  ASSERT_TRUE(na->WaitForLog("event=mesh_node_learned node=node-d from=node-b", 20000)) << na->Log();
  ASSERT_TRUE(nd->WaitForLog("event=mesh_node_learned node=node-a from=node-c", 20000)) << nd->Log();
  EXPECT_NE(na->Log().find("event=mesh_node_learned node=node-c from=node-b"), std::string::npos) << na->Log();
  // Each cable between two other nodes counts once both ends' adverts name
  // each other (routes.h): a needs b-c and c-d, d needs c-b and b-a.
  for (Daemon* at : {na.get(), nd.get()}) {
    ASSERT_TRUE(WaitForNeighbours(*at, "node-b", {"node-a", "node-c"})) << at->Log();
    ASSERT_TRUE(WaitForNeighbours(*at, "node-c", {"node-b", "node-d"})) << at->Log();
  }
  ASSERT_TRUE(WaitForNeighbours(*na, "node-d", {"node-c"})) << na->Log();
  ASSERT_TRUE(WaitForNeighbours(*nd, "node-a", {"node-b"})) << nd->Log();
  KvAcrossNodes(*nd, pd, *na, pa, 8 << 20, 91);  // A to D
  KvAcrossNodes(*na, pa, *nd, pd, 8 << 20, 92);  // D to A
  EXPECT_NE(na->Log().find("event=mesh_route destination=node-d via=node-b,node-c"), std::string::npos) << na->Log();
  EXPECT_NE(nd->Log().find("event=mesh_route destination=node-a via=node-c,node-b"), std::string::npos) << nd->Log();
  EXPECT_EQ(nb->Log().find("event=mesh_advert_refused"), std::string::npos) << nb->Log();
  // What operators see on A: every other node, C and D known from their adverts only.
  json links = LinksOf(*na);
  ASSERT_TRUE(links.is_object()) << links.dump();
  std::map<std::string, json> known;
  for (const json& k : links["known_nodes"]) known[k["node"]] = k;
  ASSERT_EQ(known.size(), 3u) << links.dump();
  for (const char* n : {"node-b", "node-c", "node-d"}) {
    EXPECT_GE(known[n]["advert_age_seconds"].get<int64_t>(), 0) << n << ": " << links.dump();
    EXPECT_LE(known[n]["advert_age_seconds"].get<int64_t>(), 10) << n << ": " << links.dump();
  }
  EXPECT_EQ(known["node-d"]["addresses"], json::array({"10.77.3.2/30"})) << links.dump();
  int rc = -1;
  std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("KNOWN NODE"), std::string::npos) << text;
  EXPECT_NE(text.find("10.77.2.2/30,10.77.3.1/30"), std::string::npos) << text;  // node c, both cables
}
// A chain A - C - D: C relays for A and D, which have no cable to each
// other and know C from configuration (mesh.peers). Both directions byte for
// byte; the relayed rate beside the direct one on the same shaped cables
// (reported, not asserted); then C killed mid-transfer fails the transfer
// with UNAVAILABLE within the bound.
TEST_F(Mesh, ARelayCarriesNodesWithoutACableAndItsDeathFailsCleanly) {
  std::string a = topo_.Node("a"), c = topo_.Node("c"), d = topo_.Node("d");
  auto [ac_a, ac_c] = topo_.Cable(a, c, 3);
  auto [cd_c, cd_d] = topo_.Cable(c, d, 4);
  for (const auto& [ns, dev] : std::vector<std::pair<std::string, std::string>>{
           {a, ac_a}, {c, ac_c}, {c, cd_c}, {d, cd_d}}) {
    Shape(ns, dev);
  }
  PodCgroup pa(RandomPodUid(), "burstable"), pc(RandomPodUid(), "burstable"), pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pa, "ml", "a", "job-7") + "," + Rule(pc, "ml", "c", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  const std::string knows_c = R"(, "peers": [{"node": "node-c", "addresses": ["10.77.3.2/30", "10.77.4.1/30"], "port": 7446}])";
  auto na = StartNode("node-a", a, {ac_a}, pods, "", knows_c);
  auto nc = StartNode("node-c", c, {ac_c, cd_c}, pods);
  auto nd = StartNode("node-d", d, {cd_d}, pods, "", knows_c);
  const uint64_t size = 32 << 20;
  KvAcrossNodes(*nd, pd, *na, pa, size, 81);  // A to D
  KvAcrossNodes(*na, pa, *nd, pd, size, 82);  // D to A
  EXPECT_NE(nd->Log().find("event=mesh_route destination=node-a via=node-c"), std::string::npos) << nd->Log();
  // The rates, one shaped cable direct (A to C) and through the relay (A to D).
  auto rate = [&](Daemon& to, const PodCgroup& owner, int seed) -> double {
    Pod server(to, &owner, {"kv-serve", "--size", std::to_string(size), "--verify", std::to_string(seed)});
    json s = server.Expect("serving");
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", std::to_string(seed), "--repeat", "3"});
    json put = client.Expect("put", 60000);
    EXPECT_EQ(put["event"], "put") << put.dump();
    json v = server.Expect("verified", 60000);
    EXPECT_EQ(v["mismatches"], 0) << v.dump();
    return put.value("gbps", 0.0);
  };
  double direct = rate(*nc, pc, 83), relayed = rate(*nd, pd, 84);
  std::printf("RESULT mesh_relay cable=200mbit bytes=%llu direct_gbps=%.4f relayed_gbps=%.4f ratio=%.3f\n",
              static_cast<unsigned long long>(size), direct, relayed, direct > 0 ? relayed / direct : 0.0);
  EXPECT_GT(relayed, 0.0);
  // The relay dies while a 256 MiB write goes through it (about 10 s at the shaped rate).
  Pod server(*nd, &pd, {"kv-serve", "--size", std::to_string(256 << 20), "--verify", "5"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  const size_t grants_before = CountInLog(*nc, "event=mesh_relay_grant ");
  Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "5"});
  ASSERT_TRUE(WaitForCount(*nc, "event=mesh_relay_grant ", grants_before + 1)) << nc->Log();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  {
    // What operators see meanwhile: on A the route to D through C, on C the
    // region it relays.
    json links = LinksOf(*na);
    ASSERT_TRUE(links.is_object()) << links.dump();
    bool via_c = false;
    for (const json& r : links["routes"]) {
      if (r["destination"] == "node-d" && r["via"] == json::array({"node-c"}) && r["remote_handles"] == 1) via_c = true;
    }
    EXPECT_TRUE(via_c) << links.dump();
    links = LinksOf(*nc);
    ASSERT_TRUE(links.is_object()) << links.dump();
    EXPECT_EQ(links["relayed_grants"], 1) << links.dump();
    EXPECT_GT(links["relay_forwarded_bytes"].get<uint64_t>(), 2ull * size) << links.dump();
    int rc = 0;
    std::string text = RunCommand(absl::StrCat(KUBECTL_PODLINK_PATH, " links --socket ", na->dir()), &rc);
    EXPECT_NE(text.find("via node-c"), std::string::npos) << text;
  }
  auto t0 = std::chrono::steady_clock::now();
  ::kill(nc->pid(), SIGKILL);
  json e = client.Expect("put", 30000);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(e["event"], "error") << e.dump();
  EXPECT_EQ(e["code"], "UNAVAILABLE") << e.dump();
  EXPECT_LT(took, std::chrono::seconds(15)) << "the failure took too long to surface";
  EXPECT_EQ(client.Wait(), 1);
  EXPECT_TRUE(na->Alive());
  EXPECT_TRUE(nd->Alive());
}

// The route hijack of issue 34, against real daemons: nodes a - b and a - d
// cabled, the test process a node "node-t" with a valid certificate and a
// cable to b. node-t's correctly signed advert lists its own address twice,
// two addresses in the a - d subnet where it has no cable, and node-d as its
// neighbour. Node b still routes to d through a, whose cable d's advert
// confirms; before, the claimed width drew b's route to d through node-t.
TEST_F(Mesh, AnAdvertWithBorrowedAddressesDrawsNoRoute) {
  std::string a = topo_.Node("a"), b = topo_.Node("b"), d = topo_.Node("d");
  auto [ab_a, ab_b] = topo_.Cable(a, b, 1);
  auto [ad_a, ad_d] = topo_.Cable(a, d, 2);
  const std::string b_addr = topo_.HostCable(b, 9);
  const std::string t_addr = b_addr.substr(0, b_addr.rfind('.') + 1) + "37/30";
  PodCgroup pb(RandomPodUid(), "burstable"), pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pb, "ml", "b", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  auto peer = [](const std::string& node, const std::string& address) {
    return absl::StrCat(R"(, "advert_seconds": 1, "peers": [{"node": ")", node, R"(", "addresses": [")", address,
                        R"("], "port": 7446}])");
  };
  auto na = StartNode("node-a", a, {ab_a, ad_a}, pods, "", peer("node-d", "10.77.2.2/30"));
  // b's mesh uses its cable to the test process too: node-t is its neighbour.
  auto nb = StartNode("node-b", b, {ab_b, topo_.tag() + "h9n"}, pods, "", peer("node-a", "10.77.1.1/30"));
  auto nd = StartNode("node-d", d, {ad_d}, pods, "", peer("node-a", "10.77.2.1/30"));
  // b holds d's advert naming a (and a's naming d).
  ASSERT_TRUE(nb->WaitForLog("event=mesh_node_neighbours node=node-d neighbours=\"node-a\"", 20000)) << nb->Log();
  // node-t's advert, signed with its own key.
  ca_->Issue("node-t", dir_ + "/node-t");
  pb::AdvertEntry e;
  e.mutable_node()->set_node("node-t");
  for (const char* addr : {"", "", "10.77.2.3/30", "10.77.2.1/30"}) {
    e.mutable_node()->add_addresses(*addr != 0 ? std::string(addr) : t_addr);
  }
  e.mutable_node()->set_port(7446);
  e.add_neighbours("node-d");
  e.add_neighbours("node-b");
  e.set_issued_unix_seconds(absl::ToUnixSeconds(absl::Now()));
  pb::NodeAdvert advert;
  e.SerializeToString(advert.mutable_entry());
  absl::StatusOr<std::string> sig = mesh::SignWithKey(ReadFile(dir_ + "/node-t/tls.key"), advert.entry());
  ASSERT_TRUE(sig.ok()) << sig.status();
  advert.set_signature(*sig);
  advert.set_cert(ReadFile(dir_ + "/node-t/tls.crt"));
  {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ReadFile(ca_->ca());
    tls.pem_private_key = ReadFile(dir_ + "/node-t/tls.key");
    tls.pem_cert_chain = ReadFile(dir_ + "/node-t/tls.crt");
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("node-b");
    auto stub = pb::Mesh::NewStub(grpc::CreateCustomChannel(b_addr + ":7446", grpc::SslCredentials(tls), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::HelloRequest req;
    req.set_version("test");
    req.set_instance(99);
    *req.add_adverts() = advert;
    pb::HelloResponse resp;
    grpc::Status st = stub->Hello(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  ASSERT_TRUE(nb->WaitForLog("event=mesh_node_learned node=node-t from=node-t")) << nb->Log();
  // b's pod writes d's export: through a, byte for byte; never through node-t.
  KvAcrossNodes(*nd, pd, *nb, pb, 1 << 20, 31);
  EXPECT_NE(nb->Log().find("event=mesh_route destination=node-d via=node-a"), std::string::npos) << nb->Log();
  EXPECT_EQ(nb->Log().find("via=node-t"), std::string::npos) << nb->Log();
}

// A relay that answers in the owner's place. The test process runs node-t,
// a daemon of its own with a valid certificate: its control service answers
// Hello and OpenLink as a relay would, and OpenRegion itself (a grant of its
// own, the export and size the pod asked for), and its data port takes
// connections and never answers. Node b's operator configured node-t as
// cabled to node d, so b routes d's region through it. The origin checks
// that the answer is the destination's, signed with its key and bound to
// its claim: the open fails at once (before, it succeeded and every write
// went to node-t).
class FakeRelay final : public pb::Mesh::Service {
 public:
  FakeRelay(std::string address, uint64_t size) : address_(std::move(address)), size_(size) {}
  grpc::Status Hello(grpc::ServerContext*, const pb::HelloRequest*, pb::HelloResponse* resp) override {
    resp->set_node_name("node-t");
    resp->set_version("fake");
    resp->set_instance(4711);
    resp->set_data_port(7447);
    resp->add_addresses(address_);
    resp->set_control_port(7446);
    return grpc::Status::OK;
  }
  grpc::Status OpenLink(grpc::ServerContext*, const pb::OpenLinkRequest* req, pb::OpenLinkResponse* resp) override {
    for (uint32_t i = 0; i < req->connections(); ++i) resp->add_cookies(std::string(32, static_cast<char>('a' + i)));
    resp->set_data_port(7447);
    resp->set_instance(4711);
    return grpc::Status::OK;
  }
  grpc::Status OpenRegion(grpc::ServerContext*, const pb::OpenRegionRequest* req,
                          pb::OpenRegionResponse* resp) override {
    ++opens;
    pb::OriginClaim claim;
    claim.ParseFromString(req->route().claim());
    resp->set_grant(99);
    resp->set_export_id(claim.export_id());
    resp->set_size(size_);
    resp->set_handle_type(3);
    resp->set_owner_namespace("ml");
    resp->set_owner_name("d");
    resp->set_instance(4711);
    return grpc::Status::OK;
  }
  grpc::Status CloseRegion(grpc::ServerContext*, const pb::CloseRegionRequest*, pb::CloseRegionResponse*) override {
    return grpc::Status::OK;
  }
  std::atomic<int> opens{0};

 private:
  std::string address_;
  uint64_t size_;
};

TEST_F(Mesh, ARelayCannotAnswerInTheOwnersPlace) {
  std::string a = topo_.Node("a"), b = topo_.Node("b"), d = topo_.Node("d");
  auto [ad_a, ad_d] = topo_.Cable(a, d, 2);  // node a runs no daemon: the cable gives d its address
  const std::string b_addr = topo_.HostCable(b, 9);
  const std::string t_ip = b_addr.substr(0, b_addr.rfind('.') + 1) + "37";
  PodCgroup pb(RandomPodUid(), "burstable"), pd(RandomPodUid(), "burstable");
  std::string pods = Rule(pb, "ml", "b", "job-7") + "," + Rule(pd, "ml", "d", "job-7");
  ca_->Issue("node-t", dir_ + "/node-t");
  // node-t: the control service on its end of the cable, and a data port
  // that holds every connection.
  FakeRelay relay(t_ip + "/30", 1 << 20);
  grpc::SslServerCredentialsOptions tls(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  tls.pem_root_certs = ReadFile(ca_->ca());
  tls.pem_key_cert_pairs.push_back({ReadFile(dir_ + "/node-t/tls.key"), ReadFile(dir_ + "/node-t/tls.crt")});
  grpc::ServerBuilder builder;
  builder.AddListeningPort(t_ip + ":7446", grpc::SslServerCredentials(tls));
  builder.RegisterService(&relay);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  podlink::UniqueFd data(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(7447);
  ::inet_pton(AF_INET, t_ip.c_str(), &sa.sin_addr);
  int one = 1;
  ::setsockopt(data.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ASSERT_EQ(::bind(data.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(data.get(), 64), 0);  // connections wait in the backlog, never answered
  auto nb = StartNode("node-b", b, {topo_.tag() + "h9n"}, pods, "",
                      absl::StrCat(R"(, "peers": [{"node": "node-t", "addresses": [")", t_ip,
                                   R"(/30", "10.77.2.1/30"], "port": 7446}])"));
  auto nd = StartNode("node-d", d, {ad_d}, pods);
  Pod owner(*nd, &pd, {"kv-serve", "--size", std::to_string(1 << 20), "--verify", "5"});
  json s = owner.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  Pod client(*nb, &pb, {"kv-put", "--desc", s["descriptor"], "--seed", "5"});
  json put = client.Expect("put", 20000);
  EXPECT_EQ(put["code"], "PERMISSION_DENIED") << put.dump() << "\n" << nb->Log();
  EXPECT_NE(put.value("message", std::string()).find("is not node node-d's: it is not signed"), std::string::npos)
      << put.dump();
  EXPECT_GE(relay.opens.load(), 1) << "the route did not go through node-t: " << nb->Log();
  EXPECT_NE(nb->Log().find("event=mesh_route_refused destination=node-d via=node-t"), std::string::npos)
      << nb->Log();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace podlink::testing
