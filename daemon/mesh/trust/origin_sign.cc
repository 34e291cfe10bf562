#include "daemon/mesh/trust/origin_sign.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace podlink::mesh {
namespace {

struct Free {
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(STACK_OF(X509) * p) const { sk_X509_pop_free(p, X509_free); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
};
template <typename T>
using Ptr = std::unique_ptr<T, Free>;


Ptr<BIO> MemBio(absl::string_view text) {
  return Ptr<BIO>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// Every certificate of a PEM bundle, in order.
std::vector<Ptr<X509>> ReadCerts(absl::string_view pem) {
  std::vector<Ptr<X509>> out;
  Ptr<BIO> bio = MemBio(pem);
  if (bio == nullptr) return out;
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(c);
  ERR_clear_error();  // the end of the bundle reads as an error
  return out;
}

absl::StatusOr<std::string> NodeOf(X509* cert) {
  Ptr<GENERAL_NAMES> names(
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr)));
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
      const GENERAL_NAME* n = sk_GENERAL_NAME_value(names.get(), i);
      if (n->type != GEN_DNS) continue;
      const ASN1_IA5STRING* s = n->d.dNSName;
      return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), ASN1_STRING_length(s));
    }
  }
  X509_NAME* subject = X509_get_subject_name(cert);
  int at = subject == nullptr ? -1 : X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at < 0) return absl::PermissionDeniedError("the certificate names no node (no DNS name, no common name)");
  const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(cn)), ASN1_STRING_length(cn));
}

}  // namespace

std::string OpenSslError() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> SignWithKey(const std::string& key_pem, absl::string_view data) {
  Ptr<BIO> bio = MemBio(key_pem);
  Ptr<EVP_PKEY> key(bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return absl::FailedPreconditionError(absl::StrCat("the node key does not load: ", OpenSslError()));
  Ptr<EVP_MD_CTX> ctx(EVP_MD_CTX_new());
  size_t len = 0;
  if (ctx == nullptr || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1) {
    return absl::InternalError(absl::StrCat("signing failed: ", OpenSslError()));
  }
  std::string sig(len, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1) {
    return absl::InternalError(absl::StrCat("signing failed: ", OpenSslError()));
  }
  sig.resize(len);
  return sig;
}

bool KeyMatchesCertificate(const std::string& key_pem, absl::string_view cert_pem) {
  std::vector<Ptr<X509>> certs = ReadCerts(cert_pem);
  Ptr<BIO> bio = MemBio(key_pem);
  Ptr<EVP_PKEY> key(bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  const bool ok = !certs.empty() && key != nullptr && X509_check_private_key(certs.front().get(), key.get()) == 1;
  ERR_clear_error();
  return ok;
}

absl::StatusOr<std::string> CertificateNode(absl::string_view cert_pem) {
  std::vector<Ptr<X509>> certs = ReadCerts(cert_pem);
  if (certs.empty()) return absl::PermissionDeniedError("no certificate in the PEM text");
  return NodeOf(certs.front().get());
}

absl::Status VerifyNodeSignature(const std::string& ca_pem, absl::string_view cert_pem, const std::string& node,
                                 absl::string_view data, absl::string_view signature) {
  if (cert_pem.size() > kMaxCertPem || signature.empty() || signature.size() > kMaxSignature) {
    return absl::PermissionDeniedError("the origin's certificate or signature is missing or too large");
  }
  std::vector<Ptr<X509>> chain = ReadCerts(cert_pem);
  if (chain.empty()) return absl::PermissionDeniedError("the origin sent no certificate");
  Ptr<X509_STORE> store(X509_STORE_new());
  if (store == nullptr) return absl::ResourceExhaustedError("out of memory");
  std::vector<Ptr<X509>> cas = ReadCerts(ca_pem);
  for (const auto& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  Ptr<STACK_OF(X509)> untrusted(sk_X509_new_null());
  for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(untrusted.get(), chain[i].get());
  Ptr<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  bool ok = ctx != nullptr && X509_STORE_CTX_init(ctx.get(), store.get(), chain.front().get(), untrusted.get()) == 1 &&
            X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT) == 1 && X509_verify_cert(ctx.get()) == 1;
  // The stack only borrowed the intermediates.
  while (sk_X509_num(untrusted.get()) > 0) sk_X509_pop(untrusted.get());
  if (!ok) {
    int err = ctx == nullptr ? X509_V_ERR_OUT_OF_MEM : X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::PermissionDeniedError(
        absl::StrCat("the origin's certificate is not from the mesh CA: ", X509_verify_cert_error_string(err)));
  }
  if (X509_check_ca(chain.front().get()) != 0) {
    return absl::PermissionDeniedError("a CA certificate does not name a node");
  }
  absl::StatusOr<std::string> named = NodeOf(chain.front().get());
  if (!named.ok()) return named.status();
  if (*named != node) {
    return absl::PermissionDeniedError(
        absl::StrCat("the origin's certificate names node '", *named, "', not '", node, "'"));
  }
  EVP_PKEY* key = X509_get0_pubkey(chain.front().get());
  Ptr<EVP_MD_CTX> md(EVP_MD_CTX_new());
  if (key == nullptr || md == nullptr || EVP_DigestVerifyInit(md.get(), nullptr, EVP_sha256(), nullptr, key) != 1 ||
      EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                       reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1) {
    ERR_clear_error();
    return absl::PermissionDeniedError(absl::StrCat("the claim's signature does not verify with node ", node, "'s key"));
  }
  return absl::OkStatus();
}

}  // namespace podlink::mesh
