// Internal to meta/volumes*.cc: how VolumeCatalog lays a volume out in the store (keys in
// volumes.h) and the checks its changes share. Not a front door.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "meta/meta.pb.h"
#include "meta/store.h"

namespace ember::meta::volume_keys {

inline constexpr uint64_t kDefaultBlockSize = 4ull << 20;
inline constexpr uint32_t kMaxReplicas = 8;
inline constexpr size_t kMaxName = 255;

inline void PutBe(std::string* s, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline uint64_t GetBe(std::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}

inline std::string NameKey(const std::string& name) { return "n/" + name; }
inline std::string VolPrefix(uint32_t vol) {
  std::string k = "d/";
  PutBe(&k, vol, 4);
  return k;
}
inline std::string DirPrefix(uint32_t vol, uint64_t parent) {
  std::string k = VolPrefix(vol) + "e";
  PutBe(&k, parent, 8);
  return k;
}
inline std::string EntryKey(uint32_t vol, uint64_t parent, const std::string& name) {
  return DirPrefix(vol, parent) + name;
}
inline std::string InodeKey(uint32_t vol, uint64_t ino) {
  std::string k = VolPrefix(vol) + "i";
  PutBe(&k, ino, 8);
  return k;
}
inline std::string GarbageKey(uint32_t vol, uint64_t file_id) {
  std::string k = VolPrefix(vol) + "g";
  PutBe(&k, file_id, 8);
  return k;
}
inline std::string InoValue(uint64_t ino) {
  std::string v;
  PutBe(&v, ino, 8);
  return v;
}

inline absl::Status Err(int err, const std::string& message) { return ErrnoStatus(err, message); }

inline absl::Status CheckName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return Err(EINVAL, absl::StrCat("'", name, "' is not a file name"));
  }
  if (name.size() > kMaxName) return Err(ENAMETOOLONG, "name longer than 255 bytes");
  return absl::OkStatus();
}

inline bool IsDir(const rpc::VolumeInode& n) { return n.type() == rpc::FileEntry::DIR; }

inline void Put(MetaStore::VolumeChange* c, uint32_t vol, const rpc::VolumeInode& n) {
  c->put.emplace_back(InodeKey(vol, n.ino()), n.SerializeAsString());
}

// The contents a change leaves behind (unlinked, renamed over, replaced by a commit): their
// holders drop them from their caches by themselves (nothing names them); a copy in the origin
// is recorded here, for a node's uploader to delete there (VolumeStatusResponse.discarded).
// An empty file has no contents id (file_id 0); its copy in the origin is recorded under this
// one (contents ids come from a counter that never gets near it).
inline uint64_t EmptyContentsId(uint64_t ino) { return (uint64_t{1} << 63) | ino; }

inline void Discard(MetaStore::VolumeChange* c, uint32_t vol, const rpc::VolumeInode& n) {
  if (n.state() != rpc::VolumeInode::PERSISTED || n.persisted_path().empty()) return;
  rpc::VolumeInode g;
  g.set_file_id(n.file_id() != 0 ? n.file_id() : EmptyContentsId(n.ino()));
  g.set_size(n.size());
  *g.mutable_holders() = n.holders();
  g.set_state(rpc::VolumeInode::PERSISTED);
  g.set_persisted_path(n.persisted_path());
  g.set_origin_copy(n.origin_copy());
  c->put.emplace_back(GarbageKey(vol, g.file_id()), g.SerializeAsString());
}

inline rpc::VolumeInode::State StateFor(const rpc::Volume& vol, size_t holders) {
  return holders >= vol.replicas() ? rpc::VolumeInode::REPLICATED : rpc::VolumeInode::LOCAL;
}

}  // namespace ember::meta::volume_keys
