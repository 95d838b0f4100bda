#include "common/units.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace ember {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

absl::Status BadSize(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("invalid size '%s': %s (examples: 4096, 64KiB, 4M, 1.5G)", text, why));
}

absl::Status BadDuration(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("invalid duration '%s': %s (examples: 30s, 5m, 1h30m, 2d)", text, why));
}

// Reads a non-negative decimal number at the front of `s`. Returns false if none.
bool TakeNumber(std::string_view& s, long double& out) {
  size_t i = 0;
  bool digits = false, dot = false;
  long double value = 0, scale = 1;
  for (; i < s.size(); i++) {
    char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      if (dot) {
        scale /= 10;
        value += (c - '0') * scale;
      } else {
        value = value * 10 + (c - '0');
      }
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return false;
  out = value;
  s.remove_prefix(i);
  return true;
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return BadSize(text, "empty");
  long double value;
  if (!TakeNumber(s, value)) return BadSize(text, "must start with a number");
  s = Trim(s);
  std::string unit = Lower(s);
  long double mult;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "ki" || unit == "kib") {
    mult = 1024.0L;
  } else if (unit == "m" || unit == "mi" || unit == "mib") {
    mult = 1024.0L * 1024;
  } else if (unit == "g" || unit == "gi" || unit == "gib") {
    mult = 1024.0L * 1024 * 1024;
  } else if (unit == "t" || unit == "ti" || unit == "tib") {
    mult = 1024.0L * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    mult = 1e3L;
  } else if (unit == "mb") {
    mult = 1e6L;
  } else if (unit == "gb") {
    mult = 1e9L;
  } else if (unit == "tb") {
    mult = 1e12L;
  } else {
    return BadSize(text, absl::StrFormat("unknown unit '%s'", s));
  }
  long double bytes = value * mult;
  if (bytes >= static_cast<long double>(std::numeric_limits<uint64_t>::max())) {
    return BadSize(text, "too large");
  }
  if (bytes != std::floor(bytes)) return BadSize(text, "not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text) {
  std::string_view s = Trim(text);
  if (s.empty()) return BadDuration(text, "empty");
  long double total_ms = 0;
  bool first = true;
  while (!s.empty()) {
    long double value;
    if (!TakeNumber(s, value)) return BadDuration(text, "expected a number");
    size_t i = 0;
    while (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) i++;
    std::string unit = Lower(s.substr(0, i));
    s.remove_prefix(i);
    long double mult;
    if (unit.empty()) {
      if (!first || !s.empty()) return BadDuration(text, "every part needs a unit");
      mult = 1000;
    } else if (unit == "ms") {
      mult = 1;
    } else if (unit == "s") {
      mult = 1000;
    } else if (unit == "m") {
      mult = 60'000;
    } else if (unit == "h") {
      mult = 3'600'000;
    } else if (unit == "d") {
      mult = 86'400'000;
    } else {
      return BadDuration(text, absl::StrFormat("unknown unit '%s'", unit));
    }
    total_ms += value * mult;
    if (total_ms > 1e15L) return BadDuration(text, "too long");
    first = false;
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(total_ms)));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

}  // namespace ember
