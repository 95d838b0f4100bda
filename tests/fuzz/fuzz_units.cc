// Fuzz target: size and duration parsing (every --cache-size, --pin, --lease ... flag).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/units.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto s = ember::ParseSize(text);
  if (s.ok())
    (void)ember::FormatBytes(*s);
  else if (s.status().message().empty())
    std::abort();  // errors always say what is wrong
  auto d = ember::ParseDuration(text);
  if (d.ok() && d->count() < 0) std::abort();
  if (!d.ok() && d.status().message().empty()) std::abort();
  return 0;
}
