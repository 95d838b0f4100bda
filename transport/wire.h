// The peer block protocol's frames (version 1), shared by the TCP and RDMA transports.
//
// A connection starts with a challenge: the server sends Hello (a random nonce), the client
// answers Auth with HMAC-SHA256(cluster token, nonce), the server replies AuthReply. Then the
// client sends Requests and reads one Response per request, each followed by `length` payload
// bytes (TCP) or preceded by an RDMA WRITE into the client's buffer (RDMA). All integers are
// little-endian; every frame starts with kMagic. Decoding checks magic, version, type and bounds;
// a frame that fails any check is refused and the connection closed.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/ids.h"

namespace ember::transport {

inline constexpr uint32_t kMagic = 0x31424d45;  // "EMB1"
inline constexpr uint16_t kVersion = 1;
inline constexpr uint32_t kMaxLength = 64u << 20;  // largest block

enum class FrameType : uint16_t {
  kHello = 1,
  kAuth = 2,
  kAuthReply = 3,
  kRequest = 4,
  kResponse = 5,
  kQpInfo = 6,
  kCall = 7,  // a node-to-node call (BlockSource::Call); its payload follows the frame
};

// Every frame starts with magic (4), version (2) and type (2).
inline constexpr size_t kHeaderSize = 8;
// The full size of a client->server frame of this header, or 0 for an unknown or bad header.
size_t ClientFrameSize(std::string_view header);

enum class WireStatus : uint32_t {
  kOk = 0,
  kNotFound = 1,      // block not resident on the server
  kBadRequest = 2,    // malformed, bad bounds, id mismatch
  kUnauthorized = 3,  // missing or wrong token
  kBusy = 4,          // server at its connection or load limit
  kInternal = 5,
  kUnsupported = 6,  // e.g. RDMA asked of a server without a device
};
const char* WireStatusName(WireStatus s);
// A Response's status as the client reports it: NotFound, PermissionDenied, InvalidArgument,
// Unavailable (busy, internal, unsupported); Ok for kOk. The message names the peer.
absl::Status FromWire(WireStatus s, const std::string& peer);

inline constexpr uint32_t kHelloRdma = 1;  // Hello.flags: the server answers RDMA queue pairs
struct Hello {
  std::array<uint8_t, 32> nonce{};
  uint32_t flags = 0;  // kHelloRdma
};
inline constexpr size_t kHelloSize = 4 + 2 + 2 + 4 + 32;

struct Auth {
  std::array<uint8_t, 32> mac{};
};
inline constexpr size_t kAuthSize = 4 + 2 + 2 + 32;

struct AuthReply {
  WireStatus status = WireStatus::kOk;
};
inline constexpr size_t kAuthReplySize = 4 + 2 + 2 + 4;

struct Request {
  uint64_t request_id = 0;
  BlockAddr addr;
  BlockId id;           // must equal MakeBlockId(addr)
  uint64_t offset = 0;  // within the block
  uint32_t length = 0;  // bytes wanted
  // RDMA only: where the server writes the bytes.
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
};
inline constexpr size_t kRequestSize = 4 + 2 + 2 + 8 + 4 + 4 + 8 + 8 + 16 + 8 + 4 + 8 + 4;

struct Response {
  WireStatus status = WireStatus::kOk;
  uint64_t request_id = 0;
  uint64_t block_checksum = 0;  // the server's checksum of the whole block
  uint32_t block_length = 0;    // the whole block's length
  uint32_t length = 0;          // payload bytes that follow
};
inline constexpr size_t kResponseSize = 4 + 2 + 2 + 4 + 8 + 8 + 4 + 4;

// A call: `length` payload bytes follow the frame; the answer is a Response whose `length`
// payload bytes follow it (block fields 0).
inline constexpr uint32_t kMaxCallLength = 1u << 20;
struct Call {
  uint64_t request_id = 0;
  uint32_t length = 0;
};
inline constexpr size_t kCallSize = 4 + 2 + 2 + 8 + 4;
std::string EncodeCall(const Call& c);
// nullopt for a bad frame or a length over kMaxCallLength.
std::optional<Call> DecodeCall(std::string_view frame);

// A request for [offset, offset+length) of a block, its id filled in.
Request MakeRequest(uint64_t request_id, const BlockAddr& addr, uint64_t offset, uint32_t length);

std::string EncodeHello(const Hello& h);
std::string EncodeAuth(const Auth& a);
std::string EncodeAuthReply(const AuthReply& r);
std::string EncodeRequest(const Request& r);
std::string EncodeResponse(const Response& r);

// Each returns nullopt for a frame of the wrong size, magic, version or type, or out-of-range
// fields (a request's length over kMaxLength, offset + length overflowing, id mismatch).
std::optional<Hello> DecodeHello(std::string_view frame);
std::optional<Auth> DecodeAuth(std::string_view frame);
std::optional<AuthReply> DecodeAuthReply(std::string_view frame);
std::optional<Request> DecodeRequest(std::string_view frame);
std::optional<Response> DecodeResponse(std::string_view frame);

// RDMA queue pair parameters, exchanged over the TCP channel to connect an RC queue pair.
struct QpInfo {
  uint32_t qp_num = 0;
  uint16_t lid = 0;
  std::array<uint8_t, 16> gid{};
  uint32_t psn = 0;
  uint64_t addr = 0;  // the sender's registered buffer
  uint32_t rkey = 0;
  uint32_t mtu = 0;   // enum ibv_mtu
  uint32_t link = 0;  // the sender's link layer (transport/rdma/verbs.h LinkLayer: 1 IB, 2 RoCE)
};
// mtu and link share one 32-bit word on the wire (mtu in bits 0-7, link in 8-15), so the frame
// keeps the size older agents send and expect: a mixed cluster falls back to TCP, never waits.
inline constexpr size_t kQpInfoSize = 8 + 4 + 2 + 16 + 4 + 8 + 4 + 4;
std::string EncodeQpInfo(const QpInfo& q);
std::optional<QpInfo> DecodeQpInfo(std::string_view frame);

// HMAC-SHA256(token, nonce): what a client proves it knows the cluster token with.
std::array<uint8_t, 32> TokenMac(std::string_view token, const std::array<uint8_t, 32>& nonce);
// Constant-time comparison.
bool MacEqual(const std::array<uint8_t, 32>& a, const std::array<uint8_t, 32>& b);
std::array<uint8_t, 32> RandomNonce();

// The client side of the challenge on a connected socket: reads Hello, answers Auth, reads
// AuthReply; `hello_flags` (if given) gets the server's Hello flags.
// Returns: Ok; PermissionDenied (token refused); Unavailable; DataLoss (bad frame).
absl::Status ClientHandshake(int fd, const std::string& peer, std::string_view token,
                             uint32_t* hello_flags = nullptr);

}  // namespace ember::transport
