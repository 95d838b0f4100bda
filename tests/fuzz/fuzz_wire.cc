// Fuzz target: the peer wire protocol's frame decoders (what a hostile peer controls).
// The first byte picks the frame kind; a frame that decodes must encode back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "transport/wire.h"

using namespace ember::transport;

template <typename Decode, typename Encode>
void RoundTrip(std::string_view frame, Decode decode, Encode encode) {
  auto v = decode(frame);
  if (v && encode(*v) != frame) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view frame(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 7) {
    case 0:
      RoundTrip(frame, DecodeHello, EncodeHello);
      break;
    case 1:
      RoundTrip(frame, DecodeAuth, EncodeAuth);
      break;
    case 2:
      RoundTrip(frame, DecodeAuthReply, EncodeAuthReply);
      break;
    case 3: {
      auto r = DecodeRequest(frame);
      if (r) {
        if (EncodeRequest(*r) != frame) std::abort();
        // A decoded request is in bounds: its range fits a block and its id matches.
        if (r->length > kMaxLength || r->offset + r->length < r->offset) std::abort();
      }
      break;
    }
    case 4:
      RoundTrip(frame, DecodeResponse, EncodeResponse);
      break;
    case 5:
      RoundTrip(frame, DecodeQpInfo, EncodeQpInfo);
      break;
    case 6: {
      size_t n = ClientFrameSize(frame.substr(0, kHeaderSize));
      if (n != 0 && n < kHeaderSize) std::abort();
      break;
    }
  }
  return 0;
}
