// Opening the block cache: the index is loaded into memory, blocks whose bytes are gone are
// forgotten, and a capacity smaller than last time evicts down to it.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cachefs/cache/block_cache.h"
#include "common/units.h"

namespace ember::cachefs {

BlockCache::BlockCache(const Options& options)
    : options_(options),
      files_(options.dir, options.direct_writes),
      policy_(std::max<uint64_t>(1, options.capacity_bytes / options.expected_block_size)) {}

BlockCache::~BlockCache() = default;

absl::StatusOr<std::unique_ptr<BlockCache>> BlockCache::Open(const Options& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.dir + "/blocks", ec);
  std::string probe = options.dir + "/.write-probe";
  int fd = ec ? -1 : open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cache dir '", options.dir, "' is not writable: ", ec ? ec.message() : strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());

  std::unique_ptr<BlockCache> cache(new BlockCache(options));
  auto index = BlockIndex::Open(options.dir);
  if (!index.ok()) return index.status();
  cache->index_ = std::move(*index);
  {
    absl::MutexLock lock(&cache->mu_);
    size_t forgotten = cache->LoadIndex();
    if (forgotten > 0) {
      spdlog::warn(
          "cache: forgot {} index records that were damaged or whose cache files were missing or "
          "short",
          forgotten);
    }
    cache->ShrinkToCapacity();
    cache->RemoveDeadSegments();
    spdlog::info("cache: {} resident blocks, {} of {} bytes used, in {}", cache->blocks_.size(),
                 cache->used_, options.capacity_bytes, options.dir);
  }
  return cache;
}

size_t BlockCache::LoadIndex() {
  // Forget blocks whose file is gone, or too short to hold them (each file is looked at once).
  std::map<std::string, uint64_t> file_sizes;  // path -> size; missing files count as 0
  return index_->Load([&](const IndexRecord& rec) {
    mu_.AssertHeld();  // called back from within Load, under the caller's lock
    const BlockAddr a = rec.addr;
    const std::string path = files_.FilePath(a, rec.segment);
    auto size = file_sizes.find(path);
    if (size == file_sizes.end()) {
      struct stat st;
      size = file_sizes.emplace(path, stat(path.c_str(), &st) == 0 ? st.st_size : 0).first;
    }
    if (size->second < rec.offset + rec.length) return false;
    Entry e;
    e.checksum = rec.checksum;
    e.offset = rec.offset;
    e.length = rec.length;
    e.pinned_until_ms = rec.pinned_until_ms;
    e.segment = rec.segment;
    if (e.segment != 0) segment_objects_[e.segment]++;
    e.generation = NewGenerationLocked();
    used_ += e.length;
    auto [node, inserted] = blocks_.emplace(a, e);
    // Loaded in key order; all start as the least recent, in that order.
    Node* n = &*node;
    n->second.lru_prev = lru_back_;
    (lru_back_ != nullptr ? lru_back_->second.lru_next : lru_front_) = n;
    lru_back_ = n;
    return true;
  });
}

void BlockCache::RemoveDeadSegments() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(options_.dir + "/segments", ec)) {
    uint32_t n = 0;
    if (absl::SimpleAtoi(e.path().filename().string(), &n) && !segment_objects_.contains(n)) {
      std::filesystem::remove(e.path(), ec);  // nothing in it is in the index
    }
  }
}

void BlockCache::ShrinkToCapacity() {
  const int64_t now_ms = NowUnixMs();
  std::vector<BlockAddr> victims;
  uint64_t used = used_;
  for (Node* n = lru_back_; n != nullptr && used > options_.capacity_bytes;
       n = n->second.lru_prev) {
    if (n->second.pinned_until_ms > now_ms) continue;
    victims.push_back(n->first);
    used -= n->second.length;
  }
  for (const auto& v : victims) RemoveLocked(blocks_.find(v), true);
  added_.clear();
  removed_.clear();
}

}  // namespace ember::cachefs
