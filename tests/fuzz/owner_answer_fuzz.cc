// Fuzzes the origin's check of the owner's word (daemon/mesh/trust/owner_answer.h,
// CheckOwnerAnswer): what a relay may do to an OpenRegionResponse on its way
// back to the origin. One certificate authority, made once with the openssl
// CLI: node-d (the owner, the destination), node-c (a relay with a valid
// certificate of its own), and rogue-d (another CA's certificate naming
// node-d).
//
// Every input starts from node-d's genuine answer to node-b's claim 42 and
// applies edits until the input ends, each
//   byte op   0 export_id, 1 size, 2 handle_type, 3 owner_namespace,
//             4 owner_name (values from the input), 5 one byte of the signed
//             answer xor-ed, 6 one byte of the signature xor-ed, 7 another
//             certificate (node-c's, rogue-d's, bytes from the input, the
//             genuine one cut short), 8 node-c's signature over the answer as
//             it is now (with node-c's certificate or node-d's), 9 an answer
//             written from the input's fields (owner, origin, nonce, export,
//             size, pod), signed by node-c or left with node-d's signature,
//             10 the signature or the answer emptied, 11 the genuine answer's
//             fields copied back into the response, 12 the seal key (the
//             relay's own, as a man in the middle would put it, or bytes from
//             the input), 13 the window's size
// Checked after each input: the check never crashes and passes only where
// the response says exactly what node-d signed — the signed bytes are node-d's
// own, and every field the importer relies on matches them. The input with no
// edits must pass (the harness refuses nothing by itself).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "daemon/mesh/trust/origin_sign.h"
#include "daemon/mesh/trust/owner_answer.h"
#include "podlink/mesh/v1/mesh.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace pb = podlink::mesh::v1;
using podlink::mesh::CheckOwnerAnswer;
using podlink::mesh::SignOwnerAnswer;
using podlink::mesh::SignWithKey;

namespace {

struct Keys {
  std::string ca, d_key, d_cert, c_key, c_cert, rogue_cert;
};
const Keys* keys = nullptr;
pb::OpenRegionResponse* genuine = nullptr;

void Sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  FUZZ_CHECK(rc == 0, "setup command failed: %s", cmd.c_str());
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Certificates as the mesh's are made (EC P-256, the node's name as a DNS SAN).
void MakeKeys() {
  char tmpl[] = "/tmp/podlink-owner-answer-fuzz-XXXXXX";
  FUZZ_CHECK(::mkdtemp(tmpl) != nullptr, "mkdtemp");
  const std::string dir = tmpl;
  auto ca = [&](const std::string& name) {
    Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=" + name +
       " -keyout " + dir + "/" + name + ".key -out " + dir + "/" + name + ".crt");
  };
  auto issue = [&](const std::string& by, const std::string& name, const std::string& node) {
    std::ofstream(dir + "/" + name + ".cnf") << "subjectAltName=DNS:" << node
                                             << "\nextendedKeyUsage=serverAuth,clientAuth\n";
    Sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + node + " -keyout " + dir +
       "/" + name + ".key -out " + dir + "/" + name + ".csr");
    Sh("openssl x509 -req -in " + dir + "/" + name + ".csr -CA " + dir + "/" + by + ".crt -CAkey " + dir + "/" + by +
       ".key -CAcreateserial -days 2 -extfile " + dir + "/" + name + ".cnf -out " + dir + "/" + name + ".crt");
  };
  ca("ca");
  ca("other-ca");
  issue("ca", "node-d", "node-d");
  issue("ca", "node-c", "node-c");
  issue("other-ca", "rogue-d", "node-d");
  auto* k = new Keys;
  k->ca = Read(dir + "/ca.crt");
  k->d_key = Read(dir + "/node-d.key");
  k->d_cert = Read(dir + "/node-d.crt");
  k->c_key = Read(dir + "/node-c.key");
  k->c_cert = Read(dir + "/node-c.crt");
  k->rogue_cert = Read(dir + "/rogue-d.crt");
  Sh("rm -rf " + dir);
  keys = k;
}

// Reads the input front to back; past its end every read is 0.
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  MakeKeys();
  pb::OriginClaim claim;
  claim.set_origin("node-b");
  claim.set_nonce(42);
  genuine = new pb::OpenRegionResponse;
  genuine->set_grant(99);
  genuine->set_export_id(7);
  genuine->set_size(1 << 20);
  genuine->set_handle_type(1);
  genuine->set_owner_namespace("ml");
  genuine->set_owner_name("kv-0");
  genuine->set_seal_key(std::string(32, 'k'));
  genuine->set_window_bytes(8 << 20);
  FUZZ_CHECK(SignOwnerAnswer("node-d", claim, keys->d_key, keys->d_cert, genuine).ok(), "signing the genuine answer");
  FUZZ_CHECK(CheckOwnerAnswer(keys->ca, "node-d", "node-b", 42, *genuine).ok(), "the genuine answer is refused");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzInput in{data, size};
  pb::OpenRegionResponse resp = *genuine;
  auto at = [&](std::string* s) {
    if (!s->empty()) (*s)[in.Byte() % s->size()] ^= static_cast<char>(in.Byte() | 1);
  };
  for (int edits = 0; in.more() && edits < 16; ++edits) {
    switch (in.Byte() % 14) {
      case 0: resp.set_export_id(in.U64()); break;
      case 1: resp.set_size(in.U64()); break;
      case 2: resp.set_handle_type(static_cast<uint32_t>(in.U64())); break;
      case 3: resp.set_owner_namespace(in.Str(8)); break;
      case 4: resp.set_owner_name(in.Str(8)); break;
      case 5: at(resp.mutable_owner_answer()); break;
      case 6: at(resp.mutable_owner_signature()); break;
      case 7:
        switch (in.Byte() % 4) {
          case 0: resp.set_owner_cert(keys->c_cert); break;
          case 1: resp.set_owner_cert(keys->rogue_cert); break;
          case 2: resp.set_owner_cert(in.Str(64)); break;
          default: resp.set_owner_cert(keys->d_cert.substr(0, in.Byte() % keys->d_cert.size())); break;
        }
        break;
      case 8: {
        auto sig = SignWithKey(keys->c_key, resp.owner_answer());
        if (sig.ok()) resp.set_owner_signature(*sig);
        resp.set_owner_cert((in.Byte() & 1) ? keys->c_cert : keys->d_cert);
        break;
      }
      case 9: {
        pb::OwnerAnswer a;
        const uint8_t pick = in.Byte();
        a.set_owner((pick & 1) ? "node-d" : "node-c");
        a.set_origin((pick & 2) ? "node-b" : in.Str(8));
        a.set_claim_nonce((pick & 4) ? 42 : in.U64());
        a.set_export_id((pick & 8) ? resp.export_id() : in.U64());
        a.set_size((pick & 16) ? resp.size() : in.U64());
        a.set_handle_type(resp.handle_type());
        a.set_owner_namespace((pick & 32) ? resp.owner_namespace() : in.Str(8));
        a.set_owner_name(resp.owner_name());
        a.SerializeToString(resp.mutable_owner_answer());
        if (pick & 64) {
          auto sig = SignWithKey(keys->c_key, resp.owner_answer());
          if (sig.ok()) resp.set_owner_signature(*sig);
          resp.set_owner_cert((pick & 128) ? keys->c_cert : keys->d_cert);
        }
        break;
      }
      case 10:
        if (in.Byte() & 1) {
          resp.clear_owner_signature();
        } else {
          resp.clear_owner_answer();
        }
        break;
      case 12: resp.set_seal_key((in.Byte() & 1) ? std::string(32, 'r') : in.Str(40)); break;
      case 13: resp.set_window_bytes(in.U64()); break;
      default:
        resp.set_seal_key(genuine->seal_key());
        resp.set_window_bytes(genuine->window_bytes());
        resp.set_export_id(genuine->export_id());
        resp.set_size(genuine->size());
        resp.set_handle_type(genuine->handle_type());
        resp.set_owner_namespace(genuine->owner_namespace());
        resp.set_owner_name(genuine->owner_name());
        break;
    }
  }
  const absl::Status st = CheckOwnerAnswer(keys->ca, "node-d", "node-b", 42, resp);
  if (size == 0) FUZZ_CHECK(st.ok(), "the genuine answer is refused: %s", st.ToString().c_str());
  if (st.ok()) {
    FUZZ_CHECK(resp.owner_answer() == genuine->owner_answer(), "passed with signed bytes node-d never signed");
    FUZZ_CHECK(resp.export_id() == genuine->export_id() && resp.size() == genuine->size() &&
                   resp.handle_type() == genuine->handle_type() &&
                   resp.owner_namespace() == genuine->owner_namespace() &&
                   resp.owner_name() == genuine->owner_name() && resp.seal_key() == genuine->seal_key() &&
                   resp.window_bytes() == genuine->window_bytes(),
               "passed with a field node-d did not say (export %llu size %llu type %u pod %s/%s)",
               static_cast<unsigned long long>(resp.export_id()), static_cast<unsigned long long>(resp.size()),
               resp.handle_type(), resp.owner_namespace().c_str(), resp.owner_name().c_str());
  } else {
    FUZZ_CHECK(st.code() == absl::StatusCode::kPermissionDenied, "refused with %s", st.ToString().c_str());
  }
  return 0;
}
