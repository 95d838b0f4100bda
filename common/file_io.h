// Small file I/O helpers shared by the cache (cachefs/cache/) and the RDMA server
// (transport/rdma/). Thread-safe (no state).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember {

// Reads exactly len bytes at offset (retrying short reads and EINTR). Returns: false on an error
// or EOF.
bool PreadFull(int fd, uint64_t offset, size_t len, char* buf);

}  // namespace ember
