#pragma once
// Library errors in a tool's terms: the engine_config fields a flag sets are named by that flag
// ("engine_config::num_blocks" reads "--num-blocks"), so a command-line user sees what to change. Each tool has
// its own flags, so each passes its own table; a field the tool has no flag for is reworded by a longer entry
// (listed first) rather than left pointing at a library field the user cannot set.
#include <cstring>
#include <span>
#include <string>
#include <utility>

namespace zipage_cli {

using flag_term = std::pair<const char*, const char*>;  // library wording, the tool's wording

// zipage-generate's and zipage-serve's flags (engine_cli.hpp's add_engine_flags).
inline constexpr flag_term engine_flag_terms[] = {
    {"set engine_config::allow_beyond_context", "add --allow-beyond-context"},  // a switch is added, not set
    {"engine_config::allow_beyond_context", "--allow-beyond-context"},
    {"engine_config::max_batched_tokens", "--max-batched-tokens"},
    {"engine_config::num_query_slots", "--query-slots"},
    {"engine_config::budget_tokens", "--budget"},
    {"engine_config::max_num_seqs", "--max-num-seqs"},
    {"engine_config::block_size", "--block-size"},
    {"engine_config::num_blocks", "--num-blocks"},
    {"engine_config::window", "--window"},
    {"engine_config::kv_cache_bytes", "--kv-cache-mib"}};

// `message` with every library wording of `terms` replaced by the tool's, in the table's order.
inline std::string in_flag_terms(std::string message, std::span<const flag_term> terms = engine_flag_terms) {
  for (const auto& [field, flag] : terms) {
    const std::size_t field_size = std::strlen(field), flag_size = std::strlen(flag);
    for (std::size_t at = message.find(field); at != std::string::npos; at = message.find(field, at + flag_size))
      message.replace(at, field_size, flag);
  }
  return message;
}

}  // namespace zipage_cli
