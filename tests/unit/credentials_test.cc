// This node's certificate files (daemon/mesh/control/credentials.h), without an engine or gRPC: the first read
// names what is wrong; a rotation is taken once the refresh is due; a half-written set or a key that does not
// match its certificate keeps the pair that works.
#include "daemon/mesh/control/credentials.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

int Sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Credentials : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Sh("openssl version") != 0) GTEST_SKIP() << "needs the openssl CLI";
    dir_ = absl::StrCat("/tmp/podlink-credentials-", ::getpid());
    ASSERT_EQ(Sh("rm -rf " + dir_ + " && mkdir -p " + dir_ + "/node " + dir_ + "/next"), 0);
    ASSERT_EQ(Sh(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                              "-subj /CN=ca -keyout ",
                              dir_, "/ca.key -out ", dir_, "/ca.crt")),
              0);
    Issue(dir_ + "/node");
    Issue(dir_ + "/next");  // what a rotation brings
  }
  void TearDown() override { Sh("rm -rf " + dir_); }
  void Issue(const std::string& out) {
    std::ofstream(out + "/ext.cnf") << "subjectAltName=DNS:node-a\nextendedKeyUsage=serverAuth,clientAuth\n";
    ASSERT_EQ(Sh(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=node-a",
                              " -keyout ", out, "/tls.key -out ", out, "/tls.csr")),
              0);
    ASSERT_EQ(Sh(absl::StrCat("openssl x509 -req -in ", out, "/tls.csr -CA ", dir_, "/ca.crt -CAkey ", dir_,
                              "/ca.key -CAcreateserial -days 2 -extfile ", out, "/ext.cnf -out ", out, "/tls.crt")),
              0);
    ASSERT_EQ(Sh(absl::StrCat("cp ", dir_, "/ca.crt ", out, "/ca.crt")), 0);
  }
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
  EXPECT_EQ(eager.Current().cert, Read(node() + "/tls.crt"));
  EXPECT_EQ(eager.Current().key, Read(node() + "/tls.key"));
  EXPECT_EQ(eager.Current().ca, Read(dir_ + "/ca.crt"));
  EXPECT_FALSE(eager.Refresh()) << "nothing changed";

  const std::string old_cert = Read(node() + "/tls.crt");
  ASSERT_EQ(Sh(absl::StrCat("cp ", next(), "/tls.crt ", next(), "/tls.key ", node(), "/")), 0);
  EXPECT_FALSE(patient.Refresh()) << "not due for an hour";
  EXPECT_EQ(patient.Current().cert, old_cert);
  EXPECT_TRUE(eager.Refresh());
  EXPECT_EQ(eager.Current().cert, Read(next() + "/tls.crt"));
  EXPECT_EQ(eager.Current().key, Read(next() + "/tls.key"));
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
  EXPECT_EQ(c.Current().cert, Read(next() + "/tls.crt"));
}

}  // namespace
}  // namespace podlink::mesh
