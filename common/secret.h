// Secrets and small config files: the cluster token, TLS certificate files.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ember {

// Reads a small file (certificates, keys, tokens; at most 1 MiB) whole.
// Returns: the bytes; NotFound / PermissionDenied / InvalidArgument naming `flag` and the path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& flag);

// The cluster token from a --token-file: the file's content without trailing whitespace.
// An empty path means "no token" and returns "". Returns: InvalidArgument for an empty file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Comparison whose time does not depend on where the inputs differ.
bool TokenEqual(std::string_view a, std::string_view b);

}  // namespace ember
