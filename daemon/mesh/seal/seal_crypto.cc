#include "daemon/mesh/seal/seal_crypto.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <climits>

#include "absl/strings/str_cat.h"
#include "daemon/mesh/trust/origin_sign.h"

namespace podlink::mesh::seal {
namespace {

struct CtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
template <typename T>
using Ptr = std::unique_ptr<T, CtxFree>;

const unsigned char* U(const void* p) { return static_cast<const unsigned char*>(p); }

}  // namespace

void EphemeralKey::Free::operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }

EphemeralKey::~EphemeralKey() = default;

absl::StatusOr<EphemeralKey> EphemeralKey::Generate() {
  Ptr<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* raw = nullptr;
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw) != 1) {
    return absl::InternalError(absl::StrCat("X25519 key generation failed: ", OpenSslError()));
  }
  EphemeralKey k;
  k.key_.reset(raw);
  k.public_key_.resize(kPublicKeyBytes);
  size_t len = kPublicKeyBytes;
  if (EVP_PKEY_get_raw_public_key(raw, reinterpret_cast<unsigned char*>(k.public_key_.data()), &len) != 1 ||
      len != kPublicKeyBytes) {
    return absl::InternalError(absl::StrCat("X25519 public key: ", OpenSslError()));
  }
  return k;
}

absl::StatusOr<Key> EphemeralKey::Agree(absl::string_view peer_public) const {
  if (peer_public.size() != kPublicKeyBytes) {
    return absl::PermissionDeniedError(absl::StrCat("a seal key is ", kPublicKeyBytes, " bytes, not ",
                                                    peer_public.size()));
  }
  Ptr<EVP_PKEY> peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, U(peer_public.data()), kPublicKeyBytes));
  Ptr<EVP_PKEY_CTX> ctx(peer == nullptr ? nullptr : EVP_PKEY_CTX_new(key_.get(), nullptr));
  Key secret{};
  size_t len = secret.size();
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) != 1 || EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(ctx.get(), secret.data(), &len) != 1 || len != secret.size()) {
    ERR_clear_error();
    return absl::PermissionDeniedError("the peer's seal key does not agree (not an X25519 key of full order)");
  }
  uint8_t any = 0;
  for (uint8_t b : secret) any |= b;
  if (any == 0) return absl::PermissionDeniedError("the peer's seal key is of small order");
  return secret;
}

absl::StatusOr<SealKeys> DeriveSealKeys(const Key& shared, uint64_t claim_nonce, absl::string_view origin,
                                        absl::string_view owner, absl::string_view origin_public,
                                        absl::string_view owner_public) {
  unsigned char salt[8];
  for (int i = 0; i < 8; ++i) salt[i] = static_cast<unsigned char>(claim_nonce >> (8 * i));
  // Names are length-prefixed, so no two pairs of names make the same info.
  std::string info = "podlink mesh seal v1";
  for (absl::string_view part : {origin, owner, origin_public, owner_public}) {
    info.push_back(static_cast<char>(part.size() & 0xff));
    info.push_back(static_cast<char>((part.size() >> 8) & 0xff));
    info.append(part.data(), part.size());
  }
  Ptr<EVP_PKEY_CTX> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  unsigned char out[2 * kKeyBytes];
  size_t len = sizeof(out);
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), salt, sizeof(salt)) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), shared.data(), static_cast<int>(shared.size())) != 1 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), U(info.data()), static_cast<int>(info.size())) != 1 ||
      EVP_PKEY_derive(ctx.get(), out, &len) != 1 || len != sizeof(out)) {
    return absl::InternalError(absl::StrCat("HKDF failed: ", OpenSslError()));
  }
  SealKeys keys;
  std::copy(out, out + kKeyBytes, keys.to_owner.begin());
  std::copy(out + kKeyBytes, out + 2 * kKeyBytes, keys.to_importer.begin());
  return keys;
}

std::array<uint8_t, kNonceBytes> Nonce(uint64_t seq, uint32_t index) {
  std::array<uint8_t, kNonceBytes> n{};
  for (int i = 0; i < 8; ++i) n[i] = static_cast<uint8_t>(seq >> (8 * i));
  for (int i = 0; i < 4; ++i) n[8 + i] = static_cast<uint8_t>(index >> (8 * i));
  return n;
}

namespace {

absl::Status Gcm(bool seal, const Key& key, const std::array<uint8_t, kNonceBytes>& nonce, absl::string_view aad,
                 const void* in, void* out, size_t n, Tag* tag) {
  if (n > static_cast<size_t>(INT_MAX) || aad.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError("a sealed record is at most 2 GiB");
  }
  Ptr<EVP_CIPHER_CTX> ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  auto init = seal ? EVP_EncryptInit_ex : EVP_DecryptInit_ex;
  auto update = seal ? EVP_EncryptUpdate : EVP_DecryptUpdate;
  if (ctx == nullptr || init(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nonce.data()) != 1 ||
      (!aad.empty() && update(ctx.get(), nullptr, &len, U(aad.data()), static_cast<int>(aad.size())) != 1) ||
      (n > 0 && update(ctx.get(), static_cast<unsigned char*>(out), &len, U(in), static_cast<int>(n)) != 1)) {
    return absl::InternalError(absl::StrCat("AES-GCM failed: ", OpenSslError()));
  }
  unsigned char rest[16];
  if (seal) {
    if (EVP_EncryptFinal_ex(ctx.get(), rest, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag->data()) != 1) {
      return absl::InternalError(absl::StrCat("AES-GCM failed: ", OpenSslError()));
    }
    return absl::OkStatus();
  }
  if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag->data()) != 1) {
    return absl::InternalError(absl::StrCat("AES-GCM failed: ", OpenSslError()));
  }
  if (EVP_DecryptFinal_ex(ctx.get(), rest, &len) != 1) {
    ERR_clear_error();
    return absl::DataLossError("a sealed record does not verify (altered on the way)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GcmSeal(const Key& key, const std::array<uint8_t, kNonceBytes>& nonce, absl::string_view aad,
                     const void* in, void* out, size_t n, Tag* tag) {
  return Gcm(true, key, nonce, aad, in, out, n, tag);
}

absl::Status GcmOpen(const Key& key, const std::array<uint8_t, kNonceBytes>& nonce, absl::string_view aad,
                     const void* in, void* out, size_t n, const Tag& tag) {
  Tag t = tag;
  return Gcm(false, key, nonce, aad, in, out, n, &t);
}

}  // namespace podlink::mesh::seal
