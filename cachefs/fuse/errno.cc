#include "cachefs/fuse/errno.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/cord.h"

namespace ember::cachefs {
namespace {
constexpr char kErrnoPayload[] = "ember.errno";
}

absl::Status ErrnoStatus(int err, const std::string& message) {
  absl::Status s(absl::StatusCode::kUnknown, message);
  s.SetPayload(kErrnoPayload, absl::Cord(std::to_string(err)));
  return s;
}

int ToErrno(const absl::Status& status) {
  if (status.ok()) return 0;
  if (auto p = status.GetPayload(kErrnoPayload)) return std::atoi(std::string(*p).c_str());
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return ENOENT;
    case absl::StatusCode::kInvalidArgument:
      return EINVAL;
    case absl::StatusCode::kPermissionDenied:
      return EACCES;
    case absl::StatusCode::kResourceExhausted:
      return ENOSPC;
    case absl::StatusCode::kUnimplemented:
      return ENOSYS;
    case absl::StatusCode::kDeadlineExceeded:
      return ETIMEDOUT;
    default:
      return EIO;
  }
}

}  // namespace ember::cachefs
