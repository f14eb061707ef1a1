// Loading the server's TLS material from the files its flags name, checked
// before the server starts: a missing, unreadable or malformed certificate,
// key or CA refuses start-up with a message naming the flag, instead of
// serving plaintext or failing later as "address in use?".
#ifndef POSENC_SERVER_RPC_TLS_FILES_H_
#define POSENC_SERVER_RPC_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace posenc::server {

// TLS for the gRPC port: PEM contents. An empty cert serves plaintext; a
// client CA requires and verifies client certificates (mutual TLS).
struct TlsOptions {
  std::string cert_pem;
  std::string key_pem;
  std::string client_ca_pem;
};

struct TlsFiles {
  std::string cert;       // --tls_cert: PEM certificate chain, leaf first
  std::string key;        // --tls_key: PEM private key of the leaf
  std::string client_ca;  // --tls_client_ca: PEM CA bundle (mutual TLS)
};

// Plaintext (empty TlsOptions) when no file is named. Otherwise cert and key
// are both required, and a client CA needs them too; each file must be a
// readable regular file of at most 1 MiB holding what its flag says (the
// key matching the certificate). INVALID_ARGUMENT naming the flag otherwise.
[[nodiscard]] absl::StatusOr<TlsOptions> LoadTlsFiles(const TlsFiles& files);

}  // namespace posenc::server

#endif  // POSENC_SERVER_RPC_TLS_FILES_H_
