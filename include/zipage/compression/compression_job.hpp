#pragma once
// One request's compression as a value: what a backend needs to score, select and compact it on the
// device (pages, lengths, query slot), with no pointer into the engine's request state.
#include <span>

#include "zipage/core/types.hpp"

namespace zipage {

struct device_compression_job {
  std::span<const block_id> pages;  // the request's block table (unchanged while it compresses)
  int kv_len = 0;                   // physical tokens cached
  int slot = -1;                    // its query slot (window queries)
  bool first_compression = true;    // never compressed before: no score history
};

}  // namespace zipage
