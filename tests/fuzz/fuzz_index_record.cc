// Fuzz target: the block cache's index records (cachefs/index_record.h): a damaged RocksDB
// value must be refused, and what decodes must be in bounds and encode back the same.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cachefs/cache/index_record.h"

using namespace ember::cachefs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::string_view key = all.substr(0, std::min<size_t>(24, size));
  std::string_view value = all.substr(key.size());
  auto r = DecodeIndexRecord(key, value);
  if (!r) return 0;
  if (r->length == 0 || r->length > ember::kMaxBlockSize) std::abort();
  if (r->offset + r->length < r->offset) std::abort();
  if (EncodeIndexKey(r->addr) != key) std::abort();
  std::string v = EncodeIndexValue(*r);
  if (v.substr(0, value.size()) != value && value.size() == 28) std::abort();
  return 0;
}
