#include "common/memory.h"

// gperftools' C API (gperftools/malloc_extension_c.h), weak: absent unless tcmalloc is linked.
extern "C" void MallocExtension_ReleaseFreeMemory() __attribute__((weak));

namespace ember {

void ReleaseFreeMemory() {
  if (MallocExtension_ReleaseFreeMemory != nullptr) MallocExtension_ReleaseFreeMemory();
}

}  // namespace ember
