#include "common/http_server.h"

#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/metrics.h"
#include "common/secret.h"

namespace ember {

absl::StatusOr<std::vector<std::string>> HttpAccess::ParsePaths(const std::string& csv) {
  std::vector<std::string> out;
  for (absl::string_view p : absl::StrSplit(csv, ',', absl::SkipWhitespace())) {
    std::string path(absl::StripAsciiWhitespace(p));
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is not a path (e.g. /healthz,/metrics)"));
    }
    out.push_back(std::move(path));
  }
  return out;
}

bool HttpAccess::Allows(const std::string& path, const std::string& authorization) const {
  if (token.empty()) return true;
  for (const std::string& open : open_paths) {
    if (path == open || (open.back() == '/' && path.rfind(open, 0) == 0)) return true;
  }
  return TokenEqual(authorization, absl::StrCat("Bearer ", token));
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& listen, const std::string& flag,
    const std::function<void(httplib::Server&)>& routes, const HttpAccess& access,
    const HttpTls& tls) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", listen, "' must be HOST:PORT"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": HTTPS needs both a certificate and its key"));
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->host_ = listen.substr(0, colon);
  if (tls.cert_file.empty()) {
    s->server_ = std::make_unique<httplib::Server>();
  } else {
    auto ssl = std::make_unique<httplib::SSLServer>(tls.cert_file.c_str(), tls.key_file.c_str());
    if (!ssl->is_valid()) {
      return absl::FailedPreconditionError(
          absl::StrCat(flag, ": cannot serve HTTPS with certificate ", tls.cert_file, " and key ",
                       tls.key_file, " (missing, unreadable, not PEM, or not a pair)"));
    }
    s->server_ = std::move(ssl);
  }
  s->server_->set_pre_routing_handler(
      [access](const httplib::Request& req, httplib::Response& res) {
        if (access.Allows(req.path, req.get_header_value("Authorization"))) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content(req.has_header("Authorization")
                            ? "the cluster token was refused\n"
                            : "this endpoint requires the cluster token: Authorization: Bearer "
                              "TOKEN\n",
                        "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      });
  s->server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  s->server_->Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics::Global().Render(), "text/plain; version=0.0.4");
  });
  if (routes) routes(*s->server_);
  s->port_ = port == 0 ? s->server_->bind_to_any_port(s->host_)
                       : (s->server_->bind_to_port(s->host_, port) ? port : -1);
  if (s->port_ <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(flag, " ", listen, ": cannot listen there"));
  }
  httplib::Server* server = s->server_.get();
  s->thread_ = std::thread([server] { server->listen_after_bind(); });
  return s;
}

void HttpServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace ember
