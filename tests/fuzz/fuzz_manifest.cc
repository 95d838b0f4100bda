// Fuzz target: the node's on-disk manifest and dataset-list copies (cachefs/manifest_cache.h),
// which a damaged disk or another process could corrupt. Whatever decodes must be well formed:
// every path resolvable, and encoding it again must decode to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cachefs/manifest_cache.h"

using namespace ember::cachefs;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto v = DecodeManifest(bytes);
  if (v.ok()) {
    for (uint64_t id = 1; id <= (*v)->size(); id++) {
      std::string path = (*v)->PathOf(id);
      if (path.find("..") == 0) std::abort();  // a path never climbs out of the dataset
    }
    std::string again = EncodeManifest(**v);
    auto w = DecodeManifest(again);
    if (!w.ok() || EncodeManifest(**w) != again) std::abort();
  }
  auto l = DecodeDatasetList(bytes);
  if (l.ok()) {
    auto again = DecodeDatasetList(EncodeDatasetList(*l));
    if (!again.ok() || again->size() != l->size()) std::abort();
  }
  return 0;
}
