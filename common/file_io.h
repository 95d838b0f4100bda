// Small file I/O helpers shared by the cache (cachefs/cache/), the block servers (transport/)
// and meta replicas (meta/replication.cc). Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace ember {

// Reads exactly len bytes at offset (retrying short reads and EINTR). Returns: false on an error
// or EOF.
bool PreadFull(int fd, uint64_t offset, size_t len, char* buf);
// PreadFull through an O_DIRECT fd (offset and buf 4 KiB-aligned, buf with room for len rounded
// up to 4 KiB): the reads are padded to whole pages, so a block that ends where its file does
// reads short past the end, which is accepted. Returns: false on an error (errno says which:
// EINVAL when the file system cannot read this file O_DIRECT) or on EOF before len (errno 0).
bool PreadDirectFull(int fd, uint64_t offset, size_t len, char* buf);
// Writes exactly len bytes at offset (retrying short writes and EINTR). Returns: false on an
// error (errno says which).
bool PwriteFull(int fd, uint64_t offset, const char* buf, size_t len);

// Whether every page of [offset, offset+len) of the file is in the page cache now (the
// cachestat syscall, Linux 6.5+). Returns: nullopt when this kernel cannot tell.
std::optional<bool> PagesCached(int fd, uint64_t offset, size_t len);

// fsync of a file or a directory (its entries) by path. Returns: Ok; Unavailable naming the
// path and the error.
absl::Status SyncPath(const std::string& path);

}  // namespace ember
