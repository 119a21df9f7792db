// Smoke test of the CUDA library from host code: skipped (exit 77, reported as skipped by ctest) where
// no GPU is present. Also the energy meter (NVML, loaded at run time): on a GPU machine it must read a
// counter that grows while a sampler runs, a clock and a power draw.
#include <chrono>
#include <cstdio>
#include <thread>

#include "zipage/cuda/device.hpp"
#include "zipage/cuda/energy.hpp"

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
  failures += !ok;
}

void check_energy_meter() {
  const zipage::cuda::energy_meter meter(0);
  expect(meter.available(), "energy_meter(0) is available (NVML: libnvidia-ml.so.1)");
  if (!meter.available()) {
    std::printf("  why: %s\n", meter.why_unavailable().c_str());
    return;
  }
  const auto a = meter.read();
  expect(a.has_value() && a->sm_mhz > 0 && a->watts > 0, "a reading has an SM clock and a power draw");
  const auto limit = meter.power_limit_watts();
  if (limit) std::printf("  power limit %.0f W\n", *limit);
  expect(limit.has_value() && *limit > 50 && *limit < 5000, "the board's power limit is readable and believable");
  zipage::cuda::power_sampler sampler(meter, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  sampler.stop();
  const auto all = sampler.summary(0, sampler.now());
  std::printf("  %d samples over %.3f s: %.3f J, %.1f W, SM %.0f MHz, %.0f%% power-capped\n", all.samples, all.seconds,
              all.joules, all.watts(), all.sm_mhz, 100 * all.power_capped);
  expect(all.samples >= 10 && all.seconds > 0.2, "the sampler read the meter every 10 ms for 300 ms");
  expect(all.joules > 0 && all.watts() < 5000, "the energy counter grows, at a believable power");
  expect(sampler.summary(1e6, 2e6).samples == 0, "a span with no samples is empty");
}

}  // namespace

int main() {
  const int n = zipage::cuda::device_count();
  if (n == 0) {
    const zipage::cuda::energy_meter meter(0);
    std::printf("SKIPPED: no CUDA device (%s); energy meter: %s\n", zipage::cuda::describe_device().c_str(),
                meter.available() ? "available?" : meter.why_unavailable().c_str());
    return meter.available() ? 1 : 77;  // a meter without a device would be a bug
  }
  const std::string d = zipage::cuda::describe_device(0);
  std::printf("device 0: %s\n", d.c_str());
  expect(d.find("sm_") != std::string::npos, "describe_device names the architecture");
  check_energy_meter();
  return failures == 0 ? 0 : 1;
}
