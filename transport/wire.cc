#include "transport/wire.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/socket_util.h"

namespace ember::transport {
namespace {

class Writer {
 public:
  explicit Writer(FrameType type) {
    U32(kMagic);
    U16(kVersion);
    U16(static_cast<uint16_t>(type));
  }
  void U16(uint16_t v) { Put(v, 2); }
  void U32(uint32_t v) { Put(v, 4); }
  void U64(uint64_t v) { Put(v, 8); }
  void Bytes(const uint8_t* p, size_t n) { out_.append(reinterpret_cast<const char*>(p), n); }
  std::string Take() { return std::move(out_); }

 private:
  void Put(uint64_t v, int n) {
    for (int i = 0; i < n; i++) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view in, FrameType type, size_t size) : in_(in) {
    ok_ = in.size() == size && U32() == kMagic && U16() == kVersion &&
          U16() == static_cast<uint16_t>(type);
  }
  bool ok() const { return ok_; }
  uint16_t U16() { return static_cast<uint16_t>(Get(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Get(4)); }
  uint64_t U64() { return Get(8); }
  void Bytes(uint8_t* p, size_t n) {
    if (pos_ + n > in_.size()) {
      ok_ = false;
      return;
    }
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }

 private:
  uint64_t Get(int n) {
    if (pos_ + n > in_.size()) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

bool KnownStatus(uint32_t s) { return s <= static_cast<uint32_t>(WireStatus::kUnsupported); }

}  // namespace

const char* WireStatusName(WireStatus s) {
  switch (s) {
    case WireStatus::kOk:
      return "ok";
    case WireStatus::kNotFound:
      return "not found";
    case WireStatus::kBadRequest:
      return "bad request";
    case WireStatus::kUnauthorized:
      return "unauthorized";
    case WireStatus::kBusy:
      return "busy";
    case WireStatus::kInternal:
      return "internal error";
    case WireStatus::kUnsupported:
      return "unsupported";
  }
  return "unknown";
}

Request MakeRequest(uint64_t request_id, const BlockAddr& addr, uint64_t offset, uint32_t length) {
  Request q;
  q.request_id = request_id;
  q.addr = addr;
  q.id = MakeBlockId(addr);
  q.offset = offset;
  q.length = length;
  return q;
}

std::string EncodeHello(const Hello& h) {
  Writer w(FrameType::kHello);
  w.U32(h.flags);
  w.Bytes(h.nonce.data(), h.nonce.size());
  return w.Take();
}

std::optional<Hello> DecodeHello(std::string_view f) {
  Reader r(f, FrameType::kHello, kHelloSize);
  if (!r.ok()) return std::nullopt;
  Hello h;
  h.flags = r.U32();
  r.Bytes(h.nonce.data(), h.nonce.size());
  if (!r.ok()) return std::nullopt;
  return h;
}

std::string EncodeAuth(const Auth& a) {
  Writer w(FrameType::kAuth);
  w.Bytes(a.mac.data(), a.mac.size());
  return w.Take();
}

std::optional<Auth> DecodeAuth(std::string_view f) {
  Reader r(f, FrameType::kAuth, kAuthSize);
  if (!r.ok()) return std::nullopt;
  Auth a;
  r.Bytes(a.mac.data(), a.mac.size());
  if (!r.ok()) return std::nullopt;
  return a;
}

std::string EncodeAuthReply(const AuthReply& a) {
  Writer w(FrameType::kAuthReply);
  w.U32(static_cast<uint32_t>(a.status));
  return w.Take();
}

std::optional<AuthReply> DecodeAuthReply(std::string_view f) {
  Reader r(f, FrameType::kAuthReply, kAuthReplySize);
  if (!r.ok()) return std::nullopt;
  uint32_t s = r.U32();
  if (!r.ok() || !KnownStatus(s)) return std::nullopt;
  return AuthReply{static_cast<WireStatus>(s)};
}

std::string EncodeRequest(const Request& q) {
  Writer w(FrameType::kRequest);
  w.U64(q.request_id);
  w.U32(q.addr.dataset_id);
  w.U32(q.addr.version);
  w.U64(q.addr.file_id);
  w.U64(q.addr.index);
  w.U64(q.id.hi);
  w.U64(q.id.lo);
  w.U64(q.offset);
  w.U32(q.length);
  w.U64(q.remote_addr);
  w.U32(q.rkey);
  return w.Take();
}

std::optional<Request> DecodeRequest(std::string_view f) {
  Reader r(f, FrameType::kRequest, kRequestSize);
  if (!r.ok()) return std::nullopt;
  Request q;
  q.request_id = r.U64();
  q.addr.dataset_id = r.U32();
  q.addr.version = r.U32();
  q.addr.file_id = r.U64();
  q.addr.index = r.U64();
  q.id.hi = r.U64();
  q.id.lo = r.U64();
  q.offset = r.U64();
  q.length = r.U32();
  q.remote_addr = r.U64();
  q.rkey = r.U32();
  if (!r.ok() || q.length > kMaxLength || q.offset > kMaxLength ||
      q.offset + q.length > kMaxLength || !(q.id == MakeBlockId(q.addr))) {
    return std::nullopt;
  }
  return q;
}

std::string EncodeResponse(const Response& p) {
  Writer w(FrameType::kResponse);
  w.U32(static_cast<uint32_t>(p.status));
  w.U64(p.request_id);
  w.U64(p.block_checksum);
  w.U32(p.block_length);
  w.U32(p.length);
  return w.Take();
}

std::optional<Response> DecodeResponse(std::string_view f) {
  Reader r(f, FrameType::kResponse, kResponseSize);
  if (!r.ok()) return std::nullopt;
  Response p;
  uint32_t s = r.U32();
  p.request_id = r.U64();
  p.block_checksum = r.U64();
  p.block_length = r.U32();
  p.length = r.U32();
  if (!r.ok() || !KnownStatus(s) || p.length > kMaxLength || p.block_length > kMaxLength) {
    return std::nullopt;
  }
  p.status = static_cast<WireStatus>(s);
  return p;
}

std::string EncodeCall(const Call& c) {
  Writer w(FrameType::kCall);
  w.U64(c.request_id);
  w.U32(c.length);
  return w.Take();
}

std::optional<Call> DecodeCall(std::string_view f) {
  Reader r(f, FrameType::kCall, kCallSize);
  if (!r.ok()) return std::nullopt;
  Call c;
  c.request_id = r.U64();
  c.length = r.U32();
  if (!r.ok() || c.length > kMaxCallLength) return std::nullopt;
  return c;
}

size_t ClientFrameSize(std::string_view header) {
  if (header.size() < kHeaderSize) return 0;
  auto u = [&](size_t off, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(header[off + i])) << (8 * i);
    return v;
  };
  if (u(0, 4) != kMagic || u(4, 2) != kVersion) return 0;
  switch (static_cast<FrameType>(u(6, 2))) {
    case FrameType::kAuth:
      return kAuthSize;
    case FrameType::kRequest:
      return kRequestSize;
    case FrameType::kQpInfo:
      return kQpInfoSize;
    case FrameType::kCall:
      return kCallSize;
    default:
      return 0;
  }
}

std::string EncodeQpInfo(const QpInfo& q) {
  Writer w(FrameType::kQpInfo);
  w.U32(q.qp_num);
  w.U16(q.lid);
  w.Bytes(q.gid.data(), q.gid.size());
  w.U32(q.psn);
  w.U64(q.addr);
  w.U32(q.rkey);
  w.U32((q.mtu & 0xff) | ((q.link & 0xff) << 8));
  return w.Take();
}

std::optional<QpInfo> DecodeQpInfo(std::string_view f) {
  Reader r(f, FrameType::kQpInfo, kQpInfoSize);
  if (!r.ok()) return std::nullopt;
  QpInfo q;
  q.qp_num = r.U32();
  q.lid = r.U16();
  r.Bytes(q.gid.data(), q.gid.size());
  q.psn = r.U32();
  q.addr = r.U64();
  q.rkey = r.U32();
  const uint32_t mtu_link = r.U32();
  q.mtu = mtu_link & 0xff;
  q.link = (mtu_link >> 8) & 0xff;
  // PSNs and QP numbers are 24-bit: anything above is a malformed frame, not something to mask
  // (found by fuzz_wire; the input is kept in tests/fuzz/corpus/wire).
  if (!r.ok() || q.qp_num == 0 || q.qp_num > 0xffffff || q.psn > 0xffffff || q.mtu < 1 ||
      q.mtu > 5 || q.link > 2 || (mtu_link >> 16) != 0) {
    return std::nullopt;
  }
  return q;
}

std::array<uint8_t, 32> TokenMac(std::string_view token, const std::array<uint8_t, 32>& nonce) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), nonce.data(), nonce.size(),
       out.data(), &len);
  return out;
}

bool MacEqual(const std::array<uint8_t, 32>& a, const std::array<uint8_t, 32>& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff |= a[i] ^ b[i];
  return diff == 0;
}

std::array<uint8_t, 32> RandomNonce() {
  std::array<uint8_t, 32> n{};
  RAND_bytes(n.data(), static_cast<int>(n.size()));
  return n;
}

absl::Status ClientHandshake(int fd, const std::string& peer, std::string_view token,
                             uint32_t* hello_flags) {
  std::string hf(kHelloSize, '\0');
  absl::Status s = ReadFull(fd, hf.data(), hf.size());
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", s.message()));
  auto hello = DecodeHello(hf);
  if (!hello) return absl::DataLossError(absl::StrCat("peer ", peer, ": bad hello"));
  if (hello_flags != nullptr) *hello_flags = hello->flags;
  Auth auth;
  auth.mac = TokenMac(token, hello->nonce);
  std::string af = EncodeAuth(auth);
  s = WriteFull(fd, af.data(), af.size());
  std::string rf(kAuthReplySize, '\0');
  if (s.ok()) s = ReadFull(fd, rf.data(), rf.size());
  if (!s.ok()) return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", s.message()));
  auto reply = DecodeAuthReply(rf);
  if (!reply) return absl::DataLossError(absl::StrCat("peer ", peer, ": bad auth reply"));
  if (reply->status == WireStatus::kUnauthorized) {
    return absl::PermissionDeniedError(
        absl::StrCat("peer ", peer, ": unauthorized (cluster token refused)"));
  }
  if (reply->status != WireStatus::kOk) {
    return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", WireStatusName(reply->status)));
  }
  return absl::OkStatus();
}

absl::Status FromWire(WireStatus s, const std::string& peer) {
  std::string msg = absl::StrCat("peer ", peer, ": ", WireStatusName(s));
  switch (s) {
    case WireStatus::kOk:
      return absl::OkStatus();
    case WireStatus::kNotFound:
      return absl::NotFoundError(msg);
    case WireStatus::kUnauthorized:
      return absl::PermissionDeniedError(msg + " (cluster token refused)");
    case WireStatus::kBadRequest:
      return absl::InvalidArgumentError(msg);
    case WireStatus::kBusy:
    case WireStatus::kInternal:
    case WireStatus::kUnsupported:
      return absl::UnavailableError(msg);
  }
  return absl::UnavailableError(msg);
}

}  // namespace ember::transport
