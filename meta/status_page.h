// The cluster status page meta serves at `/` on --http: one self-contained HTML document (no
// build step, no external resources) that polls /api/status every 2 s and draws nodes, the
// datasets x nodes residency heat map, hit ratio and traffic over the last minutes, prefetches
// and jobs. Every figure carries data-* attributes with the raw number (tests read them).
#pragma once

namespace ember::meta {

const char* StatusPageHtml();

}  // namespace ember::meta
