// The one place where absl::Status becomes an errno for FUSE replies.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace ember::cachefs {

// A status that carries an exact errno (ENOTDIR, EROFS, ...) for the FUSE reply.
absl::Status ErrnoStatus(int err, const std::string& message);

// NotFound -> ENOENT, InvalidArgument -> EINVAL, PermissionDenied -> EACCES,
// ResourceExhausted -> ENOSPC, Unimplemented -> ENOSYS, DeadlineExceeded -> ETIMEDOUT,
// everything else -> EIO; an explicit errno from ErrnoStatus wins.
int ToErrno(const absl::Status& status);

}  // namespace ember::cachefs
