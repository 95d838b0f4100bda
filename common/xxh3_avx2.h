// XXH3-64 compiled for AVX2 (common/xxh3_avx2.c); call only when the CPU has AVX2. Callers use
// BlockChecksum / BlockChecksummer (common/ids.h), which choose it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
uint64_t EmberXxh3Avx2(const void* data, size_t len);
void* EmberXxh3Avx2New(void);  // a reset state, or NULL
void EmberXxh3Avx2Update(void* state, const void* data, size_t len);
uint64_t EmberXxh3Avx2Digest(const void* state);
void EmberXxh3Avx2Free(void* state);
#ifdef __cplusplus
}
#endif
