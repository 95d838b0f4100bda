#include "common/http_server.h"

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ember {

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& listen, const std::string& flag,
    const std::function<void(httplib::Server&)>& routes) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " '", listen, "' must be HOST:PORT"));
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->host_ = listen.substr(0, colon);
  s->server_ = std::make_unique<httplib::Server>();
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
