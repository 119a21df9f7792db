#pragma once
#include <cstdint>

namespace zipage {

using token_id = std::int32_t;
using block_id = std::int32_t;
using request_id = std::int64_t;

inline constexpr block_id invalid_block = -1;

}  // namespace zipage
