#include "common/secret.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace ember {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    int err = errno;
    std::string what = absl::StrCat(flag, " ", path, ": ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  std::string data;
  char buf[64 << 10];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    data.append(buf, static_cast<size_t>(in.gcount()));
    if (data.size() > (1u << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": larger than 1 MiB"));
    }
  }
  return data;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) return std::string();
  auto data = ReadSmallFile(path, "--token-file");
  if (!data.ok()) return data.status();
  std::string token = std::move(*data);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, " is empty"));
  return token;
}

bool TokenEqual(std::string_view a, std::string_view b) {
  // Always walk the expected length so timing reveals neither the position of a difference
  // nor (beyond the length itself) the content.
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); i++) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace ember
