#pragma once
// One request's compression as a value: what a backend needs to score, select and compact it on the
// device (pages, lengths, query slot), with no pointer into the engine's request state.
#include <span>
#include <string>
#include <vector>

#include "zipage/core/types.hpp"

namespace zipage {

struct device_compression_job {
  std::span<const block_id> pages;  // the request's block table (unchanged while it compresses)
  int kv_len = 0;                   // physical tokens cached
  int slot = -1;                    // its query slot (window queries)
  bool first_compression = true;    // never compressed before: no score history
};

// One request's compression as the compression worker holds it: values copied from the request when the
// scheduler plans the compression, so nothing on the worker's thread points into engine-owned state (a
// request may be cancelled, or the engine destroyed, while its job is queued).
struct compression_request {
  request_id id = 0;
  std::vector<block_id> pages;  // its block table, unchanged until the compaction lands
  int kv_len = 0;               // physical tokens cached
  int slot = -1;                // its query slot (window queries)
  bool first_compression = true;

  [[nodiscard]] device_compression_job device_job() const { return {pages, kv_len, slot, first_compression}; }
};

// What came of a compression_request: the request's new physical length, or why it failed.
struct finished_compression {
  request_id id = 0;
  int new_len = 0;
  std::string error;  // non-empty when the policy failed; the request is then finished with an error
};

}  // namespace zipage
