// End-to-end claims through relays (daemon/mesh/trust/origin_sign.h): a claim
// verifies only with the origin's own certificate from the mesh CA, naming
// the origin, over the exact bytes signed.
#include "daemon/mesh/trust/origin_sign.h"

#include "daemon/mesh/trust/owner_answer.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/test_ca.h"

namespace podlink::mesh {
namespace {

using podlink::testing::ReadFile;
using podlink::testing::Sh;

class OriginSign : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("openssl version") != 0) GTEST_SKIP() << "needs the openssl CLI";
    dir_ = absl::StrCat("/tmp/podlink-origin-sign-", ::getpid());
    Sh("rm -rf " + dir_ + " && mkdir -p " + dir_);
    MakeCa("ca");
    MakeCa("other-ca");
    Issue("ca", "node-a", "DNS:node-a");
    Issue("ca", "node-b", "DNS:node-b");
    Issue("other-ca", "rogue-a", "DNS:node-a");  // names node-a, from another CA
  }
  void TearDown() override { Sh("rm -rf " + dir_); }
  void MakeCa(const std::string& name) {
    ASSERT_EQ(Sh(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                              "-subj /CN=",
                              name, " -keyout ", dir_, "/", name, ".key -out ", dir_, "/", name, ".crt")),
              0);
  }
  void Issue(const std::string& ca, const std::string& name, const std::string& san) {
    std::ofstream(dir_ + "/" + name + ".cnf") << "subjectAltName=" << san
                                              << "\nextendedKeyUsage=serverAuth,clientAuth\n";
    ASSERT_EQ(Sh(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=", name,
                              " -keyout ", dir_, "/", name, ".key -out ", dir_, "/", name, ".csr")),
              0);
    ASSERT_EQ(Sh(absl::StrCat("openssl x509 -req -in ", dir_, "/", name, ".csr -CA ", dir_, "/", ca, ".crt -CAkey ",
                              dir_, "/", ca, ".key -CAcreateserial -days 2 -extfile ", dir_, "/", name,
                              ".cnf -out ", dir_, "/", name, ".crt")),
              0);
  }
  std::string Pem(const std::string& name) { return ReadFile(dir_ + "/" + name); }
  std::string dir_;
};

TEST_F(OriginSign, TheOriginsSignatureVerifies) {
  const std::string claim = "origin node-a wants export 7 of node-d via node-c";
  absl::StatusOr<std::string> sig = SignWithKey(Pem("node-a.key"), claim);
  ASSERT_TRUE(sig.ok()) << sig.status();
  EXPECT_TRUE(VerifyNodeSignature(Pem("ca.crt"), Pem("node-a.crt"), "node-a", claim, *sig).ok());
  absl::StatusOr<std::string> named = CertificateNode(Pem("node-a.crt"));
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, "node-a");
}

TEST_F(OriginSign, EveryForgeryIsRefused) {
  const std::string claim = "origin node-a wants export 7 of node-d via node-c";
  std::string sig = *SignWithKey(Pem("node-a.key"), claim);
  std::string by_b = *SignWithKey(Pem("node-b.key"), claim);
  std::string by_rogue = *SignWithKey(Pem("rogue-a.key"), claim);
  std::string tampered = claim;
  tampered[7] = 'b';
  struct Case {
    const char* what;
    absl::Status st;
  } cases[] = {
      {"bytes changed after signing", VerifyNodeSignature(Pem("ca.crt"), Pem("node-a.crt"), "node-a", tampered, sig)},
      {"node b signs, claims to be a", VerifyNodeSignature(Pem("ca.crt"), Pem("node-a.crt"), "node-a", claim, by_b)},
      {"node b's certificate for origin a",
       VerifyNodeSignature(Pem("ca.crt"), Pem("node-b.crt"), "node-a", claim, by_b)},
      {"a certificate naming a from another CA",
       VerifyNodeSignature(Pem("ca.crt"), Pem("rogue-a.crt"), "node-a", claim, by_rogue)},
      {"no certificate", VerifyNodeSignature(Pem("ca.crt"), "", "node-a", claim, sig)},
      {"garbage certificate", VerifyNodeSignature(Pem("ca.crt"), "-----BEGIN CERTIFICATE-----\nAAAA\n", "node-a",
                                                  claim, sig)},
      {"no signature", VerifyNodeSignature(Pem("ca.crt"), Pem("node-a.crt"), "node-a", claim, "")},
      {"oversized signature",
       VerifyNodeSignature(Pem("ca.crt"), Pem("node-a.crt"), "node-a", claim, std::string(kMaxSignature + 1, 'x'))},
      {"the CA itself as the certificate",
       VerifyNodeSignature(Pem("ca.crt"), Pem("ca.crt"), "ca", claim, *SignWithKey(Pem("ca.key"), claim))},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.st.code(), absl::StatusCode::kPermissionDenied) << c.what << ": " << c.st;
  }
}

TEST_F(OriginSign, AKeyThatDoesNotLoadSaysSo) {
  absl::StatusOr<std::string> sig = SignWithKey("not a key", "x");
  EXPECT_EQ(sig.status().code(), absl::StatusCode::kFailedPrecondition) << sig.status();
}

// The owner's answer to a routed open (owner_answer.h): it holds only as
// the destination's, to this origin's claim, saying what the answer says.
TEST_F(OriginSign, TheOwnersAnswerHoldsOnlyAsTheDestinationsToThisClaim) {
  podlink::mesh::v1::OriginClaim claim;
  claim.set_origin("node-a");
  claim.set_nonce(42);
  podlink::mesh::v1::OpenRegionResponse resp;
  resp.set_grant(7);
  resp.set_export_id(3);
  resp.set_size(1 << 20);
  resp.set_handle_type(3);
  resp.set_owner_namespace("ml");
  resp.set_owner_name("decode-0");
  ASSERT_TRUE(SignOwnerAnswer("node-b", claim, Pem("node-b.key"), Pem("node-b.crt"), &resp).ok());
  const std::string ca = Pem("ca.crt");
  EXPECT_TRUE(CheckOwnerAnswer(ca, "node-b", "node-a", 42, resp).ok());
  // A relay may change the grant it hands on (its own) and nothing else.
  auto with = [&](auto change) {
    podlink::mesh::v1::OpenRegionResponse r = resp;
    change(r);
    return CheckOwnerAnswer(ca, "node-b", "node-a", 42, r);
  };
  EXPECT_TRUE(with([](auto& r) { r.set_grant(99); }).ok());
  struct Case {
    const char* what;
    absl::Status st;
  };
  const Case cases[] = {
      {"unsigned", with([](auto& r) { r.clear_owner_answer(); r.clear_owner_signature(); })},
      {"another size", with([](auto& r) { r.set_size(1 << 30); })},
      {"another export", with([](auto& r) { r.set_export_id(4); })},
      {"another owning pod", with([](auto& r) { r.set_owner_name("other"); })},
      {"the answer changed after signing", with([](auto& r) { r.mutable_owner_answer()->back() ^= 1; })},
      {"signed by another node", with([&](auto& r) {
         r.set_owner_signature(*SignWithKey(Pem("node-a.key"), r.owner_answer()));
         r.set_owner_cert(Pem("node-a.crt"));
       })},
      {"another CA", with([&](auto& r) {
         r.set_owner_signature(*SignWithKey(Pem("rogue-a.key"), r.owner_answer()));
         r.set_owner_cert(Pem("rogue-a.crt"));
       })},
      {"oversized", with([](auto& r) { r.set_owner_cert(std::string(kMaxCertPem + 1, 'x')); })},
      {"another claim", CheckOwnerAnswer(ca, "node-b", "node-a", 43, resp)},
      {"another origin", CheckOwnerAnswer(ca, "node-b", "node-c", 42, resp)},
      {"another destination", CheckOwnerAnswer(ca, "node-a", "node-a", 42, resp)},
  };
  for (const Case& c : cases) {
    EXPECT_TRUE(absl::IsPermissionDenied(c.st)) << c.what << ": " << c.st;
  }
}

}  // namespace
}  // namespace podlink::mesh
