// The one place where absl::Status becomes an errno for FUSE replies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/status.h"

namespace ember::cachefs {

// A status that carries an exact errno (ENOTDIR, EROFS, ...) for the FUSE reply.
using ::ember::ErrnoStatus;

// NotFound -> ENOENT, InvalidArgument -> EINVAL, PermissionDenied -> EACCES,
// ResourceExhausted -> ENOSPC, Unimplemented -> ENOSYS, DeadlineExceeded -> ETIMEDOUT,
// everything else -> EIO; an explicit errno from ErrnoStatus wins.
int ToErrno(const absl::Status& status);

// NotFound for a name that is certainly absent: its directory was read and it is not there.
// Only such answers may be cached by the kernel as negative entries; any other NotFound (an
// inode the agent could not resolve just now) is answered uncached, so the next lookup asks again.
absl::Status AbsentEntry(const std::string& message);
bool IsAbsentEntry(const absl::Status& status);

// How long the kernel keeps a negative entry for an absent name below the root (manifests never
// change; the root's names do, so they are not kept).
inline constexpr uint32_t kAbsentEntryTimeoutS = 3600;

// The errno for a failed lookup that is not a kept absence; an unresolved NotFound is logged with
// its reason (the reader sees ENOENT, and the next lookup asks again).
int LookupErrno(std::string_view name, const absl::Status& status);

}  // namespace ember::cachefs
