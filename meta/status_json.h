// The JSON shape of a node's status, shared by `ember status --json` and meta's status page
// (/api/status), so both always show the same fields with the same names.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meta/meta.pb.h"

namespace ember::meta {

inline const char* NodeStateName(rpc::Node::State s) {
  return s == rpc::Node::ALIVE ? "alive" : s == rpc::Node::DEAD ? "dead" : "?";
}

inline nlohmann::json NodeJson(const rpc::Node& n) {
  const auto& s = n.stats();
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [k, v] : n.labels()) labels[k] = v;
  return {{"id", n.id()},
          {"address", n.address()},
          {"state", NodeStateName(n.state())},
          {"labels", labels},
          {"gpus", n.gpus()},
          {"capacity_bytes", n.capacity_bytes()},
          {"used_bytes", s.used_bytes()},
          {"resident_blocks", s.resident_blocks()},
          {"hits", s.hits()},
          {"misses", s.misses()},
          {"bytes_from_cache", s.bytes_from_cache()},
          {"bytes_from_peers", s.bytes_from_peers()},
          {"bytes_from_origin", s.bytes_from_origin()},
          {"origin_block_reads", s.origin_block_reads()},
          {"peer_fetches", s.peer_fetches()},
          {"peer_errors", s.peer_errors()},
          {"checksum_failures", s.checksum_failures()},
          {"fuse_binding", s.fuse_binding()},
          {"passthrough", s.passthrough()},
          {"passthrough_opens", s.passthrough_opens()},
          {"daemon_opens", s.daemon_opens()},
          {"passthrough_files_open", s.passthrough_files_open()},
          {"evictions", s.evictions()},
          {"corrupt_blocks", s.checksum_failures()},
          {"verifications", s.verifications()},
          {"foreign_changes", s.foreign_changes()},
          {"repairs", s.repairs()},
          {"corruptions", std::vector<std::string>(s.corruptions().begin(), s.corruptions().end())},
          {"scrub",
           {{"rate", s.scrub_rate()},
            {"passes", s.scrub_passes()},
            {"pass_done", s.scrub_pass_done()},
            {"pass_total", s.scrub_pass_total()},
            {"bytes", s.scrub_bytes()},
            {"last_pass_unix_ms", s.scrub_last_pass_unix_ms()}}},
          {"last_heartbeat_unix_ms", n.last_heartbeat_unix_ms()}};
}

}  // namespace ember::meta
