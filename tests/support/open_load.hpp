#pragma once
// Driving an engine with an open workload in tests (test_scheduler_soak, test_config_sweep): requests arrive
// over time and some are cancelled at a planned later step, wherever they are then.
#include <cstdlib>
#include <map>
#include <utility>

#include "zipage/core/types.hpp"

namespace zipage::testing {

// A size such a test takes from the environment (its default when the variable is unset or empty).
inline long env_or(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : fallback;
}

// Cancels the requests planned for `step` that are still in flight, runs the step, and calls settle(id) for
// every request that left the engine in it (cancelled or finished). settle may erase from in_flight.
template <class Engine, class InFlight, class Settle>
void cancel_due_and_step(Engine& eng, std::multimap<long, request_id>& cancel_at, long step, const InFlight& in_flight,
                         Settle&& settle) {
  for (auto [it, end] = cancel_at.equal_range(step); it != end; ++it)
    if (in_flight.count(it->second) != 0 && eng.cancel(it->second)) settle(it->second);
  cancel_at.erase(step);
  for (const auto& ev : eng.step())
    if (ev.finished) settle(ev.id);
}

}  // namespace zipage::testing
