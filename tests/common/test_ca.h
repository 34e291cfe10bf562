// What the tests that need certificates share: a shell command, a file read
// whole, and a CA issuing node certificates with the openssl CLI (the mesh's
// scenario tests, tests/integration/mesh/; the certificate files' unit test).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace podlink::testing {

// Runs `cmd` with its output discarded; its exit status (-1: it did not exit).
inline int Sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A CA and node certificates (SAN DNS:<node>), made with the openssl CLI.
class TestCa {
 public:
  explicit TestCa(const std::string& dir) : dir_(dir) {
    Sh("mkdir -p " + dir_);
    EXPECT_EQ(Sh(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 ",
                              "-subj /CN=podlink-test-mesh-ca -keyout ", dir_, "/ca.key -out ", dir_, "/ca.crt")),
              0)
        << "openssl is needed for the mesh tests";
  }
  // Writes ca.crt, tls.crt and tls.key for `node` into `out` (what a
  // daemon's mesh.cert_dir holds); `trust` is the CA bundle the node trusts;
  // `san` replaces the subject alternative name (e.g. "IP:10.1.2.3").
  void Issue(const std::string& node, const std::string& out, const std::string& trust = "",
             const std::string& san = "") const {
    Sh("mkdir -p " + out);
    std::string ext = out + "/ext.cnf";
    std::ofstream(ext) << "subjectAltName=" << (san.empty() ? "DNS:" + node : san)
                       << "\nextendedKeyUsage=serverAuth,clientAuth\n";
    EXPECT_EQ(Sh(absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=", node,
                              " -keyout ", out, "/tls.key -out ", out, "/tls.csr")),
              0);
    EXPECT_EQ(Sh(absl::StrCat("openssl x509 -req -in ", out, "/tls.csr -CA ", dir_, "/ca.crt -CAkey ", dir_,
                              "/ca.key -CAcreateserial -days 2 -extfile ", ext, " -out ", out, "/tls.crt")),
              0);
    Sh(absl::StrCat("cp ", trust.empty() ? dir_ + "/ca.crt" : trust, " ", out, "/ca.crt"));
  }
  std::string ca() const { return dir_ + "/ca.crt"; }

 private:
  std::string dir_;
};

}  // namespace podlink::testing
