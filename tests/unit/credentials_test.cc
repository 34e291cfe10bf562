// This node's certificate files (daemon/mesh/control/credentials.h), without an engine or gRPC: the first read
// names what is wrong; a rotation is taken once the refresh is due; a half-written set or a key that does not
// match its certificate keeps the pair that works.
#include "daemon/mesh/control/credentials.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/common/test_ca.h"

namespace podlink::mesh {
namespace {

using podlink::testing::ReadFile;
using podlink::testing::Sh;
using podlink::testing::TestCa;

class Credentials : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("openssl version") != 0) GTEST_SKIP() << "needs the openssl CLI";
    dir_ = absl::StrCat("/tmp/podlink-credentials-", ::getpid());
    ASSERT_EQ(Sh("rm -rf " + dir_), 0);
    TestCa ca(dir_ + "/ca");
    ca.Issue("node-a", node());
    ca.Issue("node-a", next());  // what a rotation brings
  }
  void TearDown() override { Sh("rm -rf " + dir_); }
  std::string node() const { return dir_ + "/node"; }
  std::string next() const { return dir_ + "/next"; }
  std::string dir_;
};

TEST_F(Credentials, TheFirstReadNamesTheFileThatIsMissingOrNotPem) {
  NodeCredentials missing(dir_ + "/nowhere", absl::ZeroDuration());
  absl::Status st = missing.Load();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("nowhere/ca.crt"), std::string::npos) << st;
  EXPECT_NE(st.message().find("mesh.cert_dir needs ca.crt, tls.crt, tls.key"), std::string::npos) << st;

  std::ofstream(node() + "/tls.key") << "not a key";
  st = NodeCredentials(node(), absl::ZeroDuration()).Load();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("tls.key is not PEM"), std::string::npos) << st;
}

TEST_F(Credentials, ARotationIsTakenOnceTheRefreshIsDue) {
  NodeCredentials eager(node(), absl::ZeroDuration()), patient(node(), absl::Hours(1));
  ASSERT_TRUE(eager.Load().ok());
  ASSERT_TRUE(patient.Load().ok());
  EXPECT_EQ(eager.Current().cert, ReadFile(node() + "/tls.crt"));
  EXPECT_EQ(eager.Current().key, ReadFile(node() + "/tls.key"));
  EXPECT_EQ(eager.Current().ca, ReadFile(node() + "/ca.crt"));
  EXPECT_FALSE(eager.Refresh()) << "nothing changed";

  const std::string old_cert = ReadFile(node() + "/tls.crt");
  ASSERT_EQ(Sh(absl::StrCat("cp ", next(), "/tls.crt ", next(), "/tls.key ", node(), "/")), 0);
  EXPECT_FALSE(patient.Refresh()) << "not due for an hour";
  EXPECT_EQ(patient.Current().cert, old_cert);
  EXPECT_TRUE(eager.Refresh());
  EXPECT_EQ(eager.Current().cert, ReadFile(next() + "/tls.crt"));
  EXPECT_EQ(eager.Current().key, ReadFile(next() + "/tls.key"));
}

TEST_F(Credentials, AHalfWrittenSetOrAKeyOfAnotherCertificateKeepsThePairThatWorks) {
  NodeCredentials c(node(), absl::ZeroDuration());
  ASSERT_TRUE(c.Load().ok());
  const NodeCredentials::Pems before = c.Current();

  // The new certificate is written, its key not yet: the pair does not match.
  ASSERT_EQ(Sh(absl::StrCat("cp ", next(), "/tls.crt ", node(), "/tls.crt")), 0);
  EXPECT_FALSE(c.Refresh());
  EXPECT_EQ(c.Current().cert, before.cert);
  EXPECT_EQ(c.Current().key, before.key);

  // The key is gone for a moment (a secret's files swapped).
  ASSERT_EQ(Sh(absl::StrCat("rm ", node(), "/tls.key")), 0);
  EXPECT_FALSE(c.Refresh());
  EXPECT_EQ(c.Current().key, before.key);

  // A key that is no key.
  std::ofstream(node() + "/tls.key") << "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
  EXPECT_FALSE(c.Refresh());
  EXPECT_EQ(c.Current().key, before.key);

  // Both written: taken.
  ASSERT_EQ(Sh(absl::StrCat("cp ", next(), "/tls.key ", node(), "/tls.key")), 0);
  EXPECT_TRUE(c.Refresh());
  EXPECT_EQ(c.Current().cert, ReadFile(next() + "/tls.crt"));
}

}  // namespace
}  // namespace podlink::mesh
