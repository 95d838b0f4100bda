/* XXH3-64 built for AVX2 (this file alone is compiled with -mavx2): common/ids.cc calls it when
 * the CPU has AVX2 (Debian's libxxhash is built for SSE2 only: 17 GB/s against 49 GB/s on a
 * 4 MiB block here). Same results as the library's: XXH3's output does not depend on the
 * vector code. C, and xxhash.h alone: no inline C++ shared with code built without AVX2. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/xxh3_avx2.h"

uint64_t EmberXxh3Avx2(const void* data, size_t len) { return XXH3_64bits(data, len); }

void* EmberXxh3Avx2New(void) {
  XXH3_state_t* s = XXH3_createState();
  if (s != NULL) XXH3_64bits_reset(s);
  return s;
}

void EmberXxh3Avx2Update(void* state, const void* data, size_t len) {
  XXH3_64bits_update((XXH3_state_t*)state, data, len);
}

uint64_t EmberXxh3Avx2Digest(const void* state) {
  return XXH3_64bits_digest((const XXH3_state_t*)state);
}

void EmberXxh3Avx2Free(void* state) { XXH3_freeState((XXH3_state_t*)state); }
