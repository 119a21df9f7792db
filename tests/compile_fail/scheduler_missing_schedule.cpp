// A scheduler without schedule() (it derives from scheduler_base, which has every other member the engine
// calls): the engine names the step members a scheduler needs and where to get them.
#include "common.hpp"

struct no_schedule_scheduler : zipage::scheduler_base {
  using zipage::scheduler_base::scheduler_base;
};

static_assert(!zipage::scheduler_policy<no_schedule_scheduler>);

[[maybe_unused]] constexpr auto size =
    sizeof(zipage::engine<cf::declared_model<zipage::cpu_backend>, zipage::full_kv, no_schedule_scheduler>);
