// The keys of meta's store (meta/store.cc): big-endian numbers, so RocksDB's byte order is the
// numbers' order, and keys of one dataset, version or file are one range.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/ids.h"

namespace ember::meta {

inline void PutBe32(std::string* s, uint32_t v) {
  for (int i = 3; i >= 0; i--) s->push_back(static_cast<char>(v >> (8 * i)));
}
inline void PutBe64(std::string* s, uint64_t v) {
  for (int i = 7; i >= 0; i--) s->push_back(static_cast<char>(v >> (8 * i)));
}
inline uint64_t GetBe(std::string_view s, size_t off, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | static_cast<uint8_t>(s[off + i]);
  return v;
}

inline std::string VersionPrefix(uint32_t ds, uint32_t ver) {
  std::string k;
  PutBe32(&k, ds);
  PutBe32(&k, ver);
  return k;
}
inline std::string DatasetPrefix(uint32_t ds) {
  std::string k;
  PutBe32(&k, ds);
  return k;
}
inline std::string FileKeyBytes(uint32_t ds, uint32_t ver, uint64_t file) {
  std::string k = VersionPrefix(ds, ver);
  PutBe64(&k, file);
  return k;
}
inline std::string BlockKey(const BlockAddr& a) {
  std::string k = FileKeyBytes(a.dataset_id, a.version, a.file_id);
  PutBe64(&k, a.index);
  return k;
}

}  // namespace ember::meta
