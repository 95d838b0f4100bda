#include "cachefs/manifest_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/ids.h"
#include "common/status.h"

namespace ember::cachefs {
namespace {

constexpr std::string_view kManifestMagic("EMBMAN01", 8);
constexpr std::string_view kListMagic("EMBDSL01", 8);

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(std::string_view* in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    uint8_t b = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

template <typename Msg>
void PutMessage(std::string* out, const Msg& m) {
  std::string bytes = m.SerializeAsString();
  PutVarint(out, bytes.size());
  out->append(bytes);
}

template <typename Msg>
bool GetMessage(std::string_view* in, Msg* m) {
  uint64_t len;
  if (!GetVarint(in, &len) || len > in->size()) return false;
  bool ok = m->ParseFromArray(in->data(), static_cast<int>(len));
  in->remove_prefix(len);
  return ok;
}

std::string Seal(std::string_view magic, std::string payload) {
  std::string out(magic);
  out.append(payload);
  uint64_t sum = XXH3_64bits(out.data(), out.size());
  for (int i = 0; i < 8; i++) out.push_back(static_cast<char>(sum >> (8 * i)));
  return out;
}

// The payload between magic and checksum, or DataLoss.
absl::StatusOr<std::string_view> Unseal(std::string_view magic, std::string_view bytes,
                                        const char* what) {
  if (bytes.size() < magic.size() + 8 || bytes.substr(0, magic.size()) != magic) {
    return absl::DataLossError(absl::StrCat(what, ": not an Ember file (bad magic or too short)"));
  }
  uint64_t sum = 0;
  for (int i = 0; i < 8; i++) {
    sum |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[bytes.size() - 8 + i])) << (8 * i);
  }
  if (XXH3_64bits(bytes.data(), bytes.size() - 8) != sum) {
    return absl::DataLossError(absl::StrCat(what, ": checksum mismatch (damaged)"));
  }
  return bytes.substr(magic.size(), bytes.size() - magic.size() - 8);
}

}  // namespace

std::string EncodeManifest(const DatasetView& v) {
  rpc::Dataset ds;
  ds.set_name(v.name);
  ds.set_id(v.dataset_id);
  ds.set_origin(v.origin);
  ds.set_block_size(v.block_size);
  ds.set_latest_version(v.version);
  auto* info = ds.add_versions();
  info->set_version(v.version);
  info->set_max_file_id(v.size());
  std::string payload;
  PutMessage(&payload, ds);
  rpc::FileEntry e;
  for (size_t i = 0; i < v.size(); i++) {
    const FsNode n = *v.Get(i + 1);
    e.Clear();
    e.set_file_id(i + 1);
    e.set_parent_id(n.parent);
    e.set_name(std::string(n.name));
    e.set_type(static_cast<rpc::FileEntry::Type>(n.type));
    e.set_size(n.size);
    e.set_mode(n.mode);
    e.set_uid(n.uid);
    e.set_gid(n.gid);
    e.set_mtime_ns(n.mtime_ns);
    e.set_link_target(std::string(n.link_target));
    e.set_etag(std::string(n.etag));
    PutMessage(&payload, e);
  }
  return Seal(kManifestMagic, std::move(payload));
}

absl::StatusOr<std::shared_ptr<DatasetView>> DecodeManifest(std::string_view bytes) {
  ASSIGN_OR_RETURN(std::string_view in, Unseal(kManifestMagic, bytes, "manifest copy"));
  rpc::Dataset ds;
  if (!GetMessage(&in, &ds) || ds.versions_size() != 1) {
    return absl::DataLossError("manifest copy: bad header");
  }
  auto v = std::make_shared<DatasetView>();
  v->name = ds.name();
  v->dataset_id = ds.id();
  v->version = ds.versions(0).version();
  v->origin = ds.origin();
  v->block_size = ds.block_size();
  if (v->block_size < kMinBlockSize || v->block_size > kMaxBlockSize) {
    return absl::DataLossError("manifest copy: bad block size");
  }
  rpc::FileEntry e;
  while (!in.empty()) {
    if (!GetMessage(&in, &e)) return absl::DataLossError("manifest copy: bad entry");
    if (!v->Append(e)) return absl::DataLossError("manifest copy: entries out of shape");
  }
  if (v->size() == 0) {
    return absl::DataLossError("manifest copy: no root directory");
  }
  v->Finish();
  return v;
}

std::string EncodeDatasetList(const std::vector<rpc::Dataset>& datasets) {
  rpc::ListDatasetsResponse list;
  for (const auto& d : datasets) *list.add_datasets() = d;
  return Seal(kListMagic, list.SerializeAsString());
}

absl::StatusOr<std::vector<rpc::Dataset>> DecodeDatasetList(std::string_view bytes) {
  ASSIGN_OR_RETURN(std::string_view in, Unseal(kListMagic, bytes, "dataset list copy"));
  rpc::ListDatasetsResponse list;
  if (!list.ParseFromArray(in.data(), static_cast<int>(in.size()))) {
    return absl::DataLossError("dataset list copy: unparsable");
  }
  return std::vector<rpc::Dataset>(list.datasets().begin(), list.datasets().end());
}

ManifestCache::ManifestCache(std::string dir) : dir_(std::move(dir)) {
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
  }
}

absl::Status ManifestCache::WriteAtomically(const std::string& name, const std::string& bytes) {
  if (dir_.empty()) return absl::OkStatus();
  std::string path = absl::StrCat(dir_, "/", name), tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(tmp, ": ", strerror(errno)));
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err == 0 && fsync(fd) != 0) err = errno;
  close(fd);
  if (err == 0 && rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ManifestCache::Read(const std::string& name) {
  if (dir_.empty()) return absl::NotFoundError("no manifest cache");
  std::string path = absl::StrCat(dir_, "/", name);
  // One read of the whole file (a 1M-entry manifest is ~60 MB; a stream iterator took a
  // noticeable part of a prefetch's start going byte by byte).
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no copy"));
    return absl::UnavailableError(absl::StrCat(path, ": ", strerror(errno)));
  }
  struct stat st;
  std::string bytes;
  errno = 0;  // PreadFull meeting the end early leaves it as it was
  bool read = fstat(fd, &st) == 0;
  if (read) {
    bytes.resize(static_cast<size_t>(st.st_size));
    read = PreadFull(fd, 0, bytes.size(), bytes.data());
  }
  const int err = errno;
  close(fd);
  if (!read) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot read: ", err != 0 ? strerror(err) : "shorter than it was"));
  }
  return bytes;
}

std::string ManifestCache::ManifestName(uint32_t dataset_id, uint32_t version) {
  return absl::StrCat(dataset_id, "-", version, ".manifest");
}

absl::Status ManifestCache::SaveManifest(const DatasetView& view) {
  return WriteAtomically(ManifestName(view.dataset_id, view.version), EncodeManifest(view));
}

bool ManifestCache::HasManifest(uint32_t dataset_id, uint32_t version) {
  if (dir_.empty()) return false;
  struct stat st;
  return stat(absl::StrCat(dir_, "/", ManifestName(dataset_id, version)).c_str(), &st) == 0;
}

absl::StatusOr<std::shared_ptr<DatasetView>> ManifestCache::LoadManifest(uint32_t dataset_id,
                                                                         uint32_t version) {
  std::string name = ManifestName(dataset_id, version);
  ASSIGN_OR_RETURN(std::string bytes, Read(name));
  auto v = DecodeManifest(bytes);
  if (v.ok() && ((*v)->dataset_id != dataset_id || (*v)->version != version)) {
    v = absl::DataLossError("manifest copy: names another dataset version");
  }
  if (!v.ok()) {
    unlink(absl::StrCat(dir_, "/", name).c_str());
    return absl::DataLossError(absl::StrCat(dir_, "/", name, ": ", v.status().message()));
  }
  return v;
}

absl::Status ManifestCache::SaveDatasets(const std::vector<rpc::Dataset>& datasets) {
  return WriteAtomically("datasets", EncodeDatasetList(datasets));
}

absl::StatusOr<std::vector<rpc::Dataset>> ManifestCache::LoadDatasets() {
  ASSIGN_OR_RETURN(std::string bytes, Read("datasets"));
  return DecodeDatasetList(bytes);
}

}  // namespace ember::cachefs
