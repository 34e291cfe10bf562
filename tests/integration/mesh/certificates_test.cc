// Certificates: an owner whose certificate names another node, and rotation without a restart.
#include "tests/integration/mesh/mesh_fixture.h"

namespace podlink::testing {
namespace {

// The importing daemon checks that the owner's certificate names the node a
// descriptor names, in the TLS handshake (before any call): a descriptor
// that names node-c at node b's address is refused there.
TEST_F(Mesh, AnImporterRefusesAnOwnerWhoseCertificateNamesAnotherNode) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods);
  Pod server(*nb, &pb, {"kv-serve", "--size", "65536", "--verify", "3"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  ASSERT_EQ(WithFields(s["descriptor"], {{6, "node-b"}}), s["descriptor"]) << "the owner's node name is node-b";
  const std::string desc = WithFields(s["descriptor"], {{6, "node-c"}});  // the node name
  ASSERT_FALSE(desc.empty());
  Pod client(*na, &pa, {"kv-put", "--desc", desc, "--seed", "3"});
  json r = client.Next(30000).value_or(json());
  EXPECT_EQ(r["event"], "error") << r.dump();
  EXPECT_NE(client.Wait(), 0);
  std::cerr << "refused with: " << r.dump() << "\n";
  // Refused in the handshake: no Hello answer was ever compared.
  EXPECT_EQ(na->Log().find("not 'node-c'"), std::string::npos) << na->Log();
  EXPECT_EQ(nb->Log().find("event=mesh_grant"), std::string::npos) << nb->Log();
  server.Kill(SIGKILL);
}
// Certificates rotated in place (as cert-manager does to a secret volume)
// take effect without a restart: node b starts with a certificate of
// another CA, which node a refuses; once its files hold one of the mesh's
// CA, node a reaches it, and b reloads its node key for claims too.
TEST_F(Mesh, RotatedCertificatesTakeEffectWithoutARestart) {
  TwoNodes t;
  Join(t);
  [[maybe_unused]] auto& [a, b, da, db, pa, pb, pods] = t;
  TestCa other(dir_ + "/other-ca");
  const std::string bdir = dir_ + "/node-b-certs";
  other.Issue("node-b", bdir, ca_->ca());  // trusts the mesh's CA, presents another's certificate
  auto na = StartNode("node-a", a, {da}, pods);
  auto nb = StartNode("node-b", b, {db}, pods, bdir, R"(, "cert_refresh_seconds": 1)");
  Pod server(*nb, &pb, {"kv-serve", "--size", "65536", "--verify", "4"});
  json s = server.Expect("serving");
  ASSERT_EQ(s["event"], "serving") << s.dump();
  auto put = [&, &pa = pa]() {
    Pod client(*na, &pa, {"kv-put", "--desc", s["descriptor"], "--seed", "4"});
    json r = client.Next(30000).value_or(json());
    client.Wait();
    return r;
  };
  json refused = put();
  EXPECT_EQ(refused["event"], "error") << refused.dump();
  // The rotation: new files renamed into place.
  ca_->Issue("node-b", dir_ + "/node-b-new");
  for (const char* f : {"tls.key", "tls.crt"}) {
    Sh(absl::StrCat("cp ", dir_, "/node-b-new/", f, " ", bdir, "/", f, ".tmp && mv ", bdir, "/", f, ".tmp ", bdir, "/", f));
  }
  EXPECT_TRUE(nb->WaitForLog("event=mesh_certificates_reloaded", 10000)) << nb->Log();
  json ok;
  for (int i = 0; i < 20 && ok["event"] != "put"; ++i) {
    ok = put();
    if (ok["event"] != "put") std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_EQ(ok["event"], "put") << ok.dump() << "\n" << na->Log();
  json v = server.Expect("verified", 30000);
  EXPECT_EQ(v["mismatches"], 0) << v.dump();
  EXPECT_EQ(server.Wait(), 0);
}

}  // namespace
}  // namespace podlink::testing
