#include "cachefs/fuse/errno.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/cord.h"

namespace ember::cachefs {
namespace {
constexpr char kAbsentPayload[] = "ember.absent";
}  // namespace

absl::Status AbsentEntry(const std::string& message) {
  absl::Status s = absl::NotFoundError(message);
  s.SetPayload(kAbsentPayload, absl::Cord("1"));
  return s;
}

bool IsAbsentEntry(const absl::Status& status) {
  return absl::IsNotFound(status) && status.GetPayload(kAbsentPayload).has_value();
}

int LookupErrno(std::string_view name, const absl::Status& status) {
  if (absl::IsNotFound(status) && !IsAbsentEntry(status)) {
    spdlog::warn("fuse: lookup of '{}' found no entry without reading its directory: {}", name,
                 std::string(status.message()));
  }
  return ToErrno(status);
}

int ToErrno(const absl::Status& status) {
  if (status.ok()) return 0;
  if (int err = CarriedErrno(status); err != 0) return err;
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
