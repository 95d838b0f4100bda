#include "common/ids.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/xxh3_avx2.h"

namespace ember {
namespace {

void PutLe64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

std::string BlockId::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

BlockId MakeBlockId(const BlockAddr& addr) {
  // Fixed little-endian packing, so ids are the same on every host.
  uint8_t buf[24];
  PutLe64(buf, (static_cast<uint64_t>(addr.dataset_id) << 32) | addr.version);
  PutLe64(buf + 8, addr.file_id);
  PutLe64(buf + 16, addr.index);
  XXH128_hash_t h = XXH3_128bits(buf, sizeof(buf));
  return BlockId{h.high64, h.low64};
}

namespace {
// Whether the AVX2 build of XXH3 (common/xxh3_avx2.c) can run here.
const bool kAvx2 = __builtin_cpu_supports("avx2");
}  // namespace

uint64_t BlockChecksum(const void* data, size_t len) {
  return kAvx2 ? EmberXxh3Avx2(data, len) : XXH3_64bits(data, len);
}

BlockChecksummer::BlockChecksummer() {
  if (kAvx2) {
    state_ = EmberXxh3Avx2New();
  } else {
    state_ = XXH3_createState();
    if (state_ != nullptr) XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
  }
  if (state_ == nullptr) throw std::bad_alloc();
}

BlockChecksummer::~BlockChecksummer() {
  if (kAvx2) {
    EmberXxh3Avx2Free(state_);
  } else {
    XXH3_freeState(static_cast<XXH3_state_t*>(state_));
  }
}

void BlockChecksummer::Update(const void* data, size_t len) {
  if (kAvx2) {
    EmberXxh3Avx2Update(state_, data, len);
  } else {
    XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, len);
  }
}

uint64_t BlockChecksummer::Digest() const {
  return kAvx2 ? EmberXxh3Avx2Digest(state_)
               : XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

absl::Status ValidateDatasetName(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("dataset name must be 1-64 characters, got %d", name.size()));
  }
  if (name[0] == '.' || name[0] == '-') {
    return absl::InvalidArgumentError(
        absl::StrFormat("dataset name '%s' must not start with '.' or '-'", name));
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "dataset name '%s' has '%c'; allowed are letters, digits, '.', '_' and '-'", name, c));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockSize(uint64_t block_size) {
  if (block_size < kMinBlockSize || block_size > kMaxBlockSize ||
      (block_size & (block_size - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "block size %d must be a power of two between 64 KiB and 64 MiB", block_size));
  }
  return absl::OkStatus();
}

int ComparePaths(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; i++) {
    unsigned char ca = a[i] == '/' ? 0 : static_cast<unsigned char>(a[i]);
    unsigned char cb = b[i] == '/' ? 0 : static_cast<unsigned char>(b[i]);
    if (ca != cb) return ca < cb ? -1 : 1;
  }
  if (a.size() == b.size()) return 0;
  return a.size() < b.size() ? -1 : 1;
}

}  // namespace ember
