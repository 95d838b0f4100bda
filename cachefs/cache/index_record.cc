#include "cachefs/cache/index_record.h"

namespace ember::cachefs {
namespace {

void PutBe(std::string* out, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetBe(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

std::string EncodeIndexKey(const BlockAddr& a) {
  std::string k;
  k.reserve(24);
  PutBe(&k, a.dataset_id, 4);
  PutBe(&k, a.version, 4);
  PutBe(&k, a.file_id, 8);
  PutBe(&k, a.index, 8);
  return k;
}

std::string EncodeIndexValue(const IndexRecord& r) {
  std::string v;
  v.reserve(32);
  PutBe(&v, r.checksum, 8);
  PutBe(&v, r.offset, 8);
  PutBe(&v, r.length, 4);
  PutBe(&v, static_cast<uint64_t>(r.pinned_until_ms), 8);
  PutBe(&v, r.segment, 4);
  return v;
}

std::optional<IndexRecord> DecodeIndexRecord(std::string_view key, std::string_view value) {
  if (key.size() != 24 || (value.size() != 20 && value.size() != 28 && value.size() != 32)) {
    return std::nullopt;
  }
  IndexRecord r;
  const char* k = key.data();
  r.addr = BlockAddr{static_cast<uint32_t>(GetBe(k, 4)), static_cast<uint32_t>(GetBe(k + 4, 4)),
                     GetBe(k + 8, 8), GetBe(k + 16, 8)};
  const char* v = value.data();
  r.checksum = GetBe(v, 8);
  r.offset = GetBe(v + 8, 8);
  r.length = static_cast<uint32_t>(GetBe(v + 16, 4));
  if (value.size() >= 28) r.pinned_until_ms = static_cast<int64_t>(GetBe(v + 20, 8));
  if (value.size() == 32) r.segment = static_cast<uint32_t>(GetBe(v + 28, 4));
  if (r.addr.file_id == 0 || r.length == 0 || r.length > kMaxBlockSize) return std::nullopt;
  if (r.segment != 0) {
    // A small file's only block, anywhere in its segment.
    if (r.addr.index != 0 || r.offset > (1ull << 40)) return std::nullopt;
    return r;
  }
  // Blocks sit at index * block size; the last block of a file may be shorter, so the offset
  // must be a multiple of some block size >= length: at least check it cannot overflow and
  // that block 0 sits at 0.
  if (r.offset > (1ull << 62) || (r.addr.index == 0) != (r.offset == 0)) return std::nullopt;
  if (r.addr.index != 0 && r.offset % r.addr.index != 0) return std::nullopt;
  if (r.addr.index != 0 && r.offset / r.addr.index < r.length) return std::nullopt;
  return r;
}

}  // namespace ember::cachefs
