// Parsing and printing of sizes and durations, for flags and the CLI.
//
// Sizes: an integer or decimal number with an optional unit. K/Ki/KiB, M/Mi/MiB, G/Gi/GiB,
// T/Ti/TiB are powers of 1024 (as dd and the kernel use them); KB/MB/GB/TB are powers of 1000;
// B or nothing is bytes. Durations: one or more <number><unit> parts, unit one of
// ms, s, m, h, d (e.g. "90s", "1h30m", "500ms"); a bare number is seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ember {

// Returns: the size in bytes, or InvalidArgument with the offending text.
absl::StatusOr<uint64_t> ParseSize(std::string_view text);

// Returns: the duration, or InvalidArgument with the offending text.
absl::StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text);

// "1.5 GiB", "112.0 KiB", "17 B".
std::string FormatBytes(uint64_t bytes);

// Wall-clock milliseconds since the Unix epoch (what records, pins and events carry).
inline int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ember
