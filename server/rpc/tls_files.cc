#include "rpc/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "posenc/status_macros.h"

namespace posenc::server {
namespace {

// PEM files of certificates and keys are a few KiB; a larger file is not one.
constexpr int64_t kMaxPemBytes = int64_t{1} << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

// OpenSSL's reason for the last failure, and its error queue cleared.
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no PEM block of the expected kind";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

absl::StatusOr<std::string> ReadPemFile(absl::string_view flag, const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  const auto not_a_pem_file = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' must be a regular PEM file of at most 1 MiB"));
  };
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxPemBytes) return not_a_pem_file();
  // Read at most one byte past the cap: the file may have been replaced
  // since stat() (a certificate rotated by a swap), and is not trusted to
  // have kept its size.
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(kMaxPemBytes) + 1, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.bad() || !in.is_open()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  bytes.resize(static_cast<size_t>(in.gcount()));
  if (bytes.size() > static_cast<size_t>(kMaxPemBytes)) return not_a_pem_file();
  return bytes;
}

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The certificates of a PEM bundle, in order; at least one.
absl::StatusOr<std::vector<Cert>> ParseCertificates(absl::string_view flag,
                                                    const std::string& pem) {
  Bio bio = MemoryBio(pem);
  std::vector<Cert> certs;
  while (true) {
    Cert c(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (c == nullptr) break;
    certs.push_back(std::move(c));
  }
  ERR_clear_error();  // the loop ends on "no start line"
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": no PEM certificate (-----BEGIN CERTIFICATE-----) could be read"));
  }
  return certs;
}

}  // namespace

absl::StatusOr<TlsOptions> LoadTlsFiles(const TlsFiles& f) {
  TlsOptions tls;
  if (f.cert.empty() && f.key.empty() && f.client_ca.empty()) return tls;
  if (f.cert.empty() || f.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.cert.empty() ? "--tls_cert" : "--tls_key",
        " is required: TLS needs --tls_cert and "
        "--tls_key together",
        f.client_ca.empty() ? "" : " (--tls_client_ca asks for mutual TLS, which is TLS too)"));
  }
  POSENC_ASSIGN_OR_RETURN(tls.cert_pem, ReadPemFile("--tls_cert", f.cert));
  POSENC_ASSIGN_OR_RETURN(tls.key_pem, ReadPemFile("--tls_key", f.key));
  POSENC_ASSIGN_OR_RETURN(std::vector<Cert> chain, ParseCertificates("--tls_cert", tls.cert_pem));

  Bio key_bio = MemoryBio(tls.key_pem);
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key: '", f.key, "' holds no readable unencrypted PEM private key (",
                     OpenSslError(), ")"));
  }
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: '", f.key, "' does not match the certificate in --tls_cert '", f.cert, "'"));
  }
  if (!f.client_ca.empty()) {
    POSENC_ASSIGN_OR_RETURN(tls.client_ca_pem, ReadPemFile("--tls_client_ca", f.client_ca));
    POSENC_RETURN_IF_ERROR(ParseCertificates("--tls_client_ca", tls.client_ca_pem).status());
  }
  return tls;
}

}  // namespace posenc::server
