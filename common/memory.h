// Handing freed memory back to the system. The `ember` binary allocates with tcmalloc, which
// keeps freed pages for reuse; after a burst that frees much at once (a manifest loaded, a
// prefetch finished, a dataset added) the process's RSS would otherwise stay at the burst's peak.
// Thread-safe (no state).
#pragma once

namespace ember {

// Returns tcmalloc's free pages to the system now; nothing when tcmalloc is not linked in (tests,
// sanitizer builds).
void ReleaseFreeMemory();

}  // namespace ember
