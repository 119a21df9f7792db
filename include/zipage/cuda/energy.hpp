#pragma once
// The GPU's energy counter, power and SM clock, read through NVML for benchmarks: whether a run is
// power-capped, and how many joules a kernel or a generated token costs. NVML is loaded at run time
// (libnvidia-ml.so.1, part of the driver), so nothing links against it and a machine without it gets a meter
// whose available() is false. This header includes no CUDA or NVML header.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace zipage::cuda {

struct power_reading {
  double joules = 0;                 // the device's energy counter (since the driver loaded)
  double watts = 0;                  // power draw now (as NVML reports it)
  int sm_mhz = 0;                    // SM clock now
  std::uint64_t clock_reasons = 0;   // NVML's clock-event reasons bitmask (0x4: software power cap)
};

class energy_meter {
 public:
  // The meter of CUDA device `device` (matched to NVML's by PCI bus id).
  explicit energy_meter(int device = 0);
  ~energy_meter();
  energy_meter(const energy_meter&) = delete;
  energy_meter& operator=(const energy_meter&) = delete;

  [[nodiscard]] bool available() const { return impl_ != nullptr; }
  // Why the meter is unavailable ("" when it is available).
  [[nodiscard]] const std::string& why_unavailable() const { return why_; }
  // nullopt when unavailable or when the energy counter could not be read.
  [[nodiscard]] std::optional<power_reading> read() const;
  // The board's enforced power limit in watts (NVML's nvmlDeviceGetEnforcedPowerLimit); nullopt when unavailable.
  [[nodiscard]] std::optional<double> power_limit_watts() const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string why_;
};

// Reads a meter every `period_ms` on a thread of its own from construction until stop() (or destruction), with
// the seconds since construction; summary() then describes any span of that time. For a benchmark's loop or an
// engine run's steady half: its joules, mean power, mean SM clock and whether the power cap held the clock down.
// The meter must outlive the sampler.
class power_sampler {
 public:
  struct sample {
    double t = 0;  // seconds since the sampler started
    power_reading r;
  };
  struct span {
    int samples = 0;
    double seconds = 0, joules = 0;
    double sm_mhz = 0;          // mean of the samples
    double power_capped = 0;    // share of the samples with clock-event reason 0x4 (software power cap)
    [[nodiscard]] double watts() const { return seconds > 0 ? joules / seconds : 0; }
  };

  explicit power_sampler(const energy_meter& meter, int period_ms = 50);
  ~power_sampler();
  power_sampler(const power_sampler&) = delete;
  power_sampler& operator=(const power_sampler&) = delete;

  [[nodiscard]] double now() const;  // seconds since the sampler started
  void stop();
  // The samples in [from, to] (seconds since the start; stop() first or read a span already past): energy is
  // the counter's difference between the first and the last of them. samples == 0 when there are fewer than 2.
  [[nodiscard]] span summary(double from, double to) const;

 private:
  struct state;
  std::unique_ptr<state> s_;
};

// The energy of `work`, a callable that returns once the GPU has finished what it queued (the caller synchronises
// before, so that earlier work is not counted): a sampler reads the meter every period_ms while it runs, and the
// samples' joules are scaled from their span to work's whole wall time (seconds). samples == 0 (nothing measured)
// when the meter is unavailable or fewer than 10 samples fell inside.
template <class F>
power_sampler::span measure_work_energy(const energy_meter& meter, int period_ms, F&& work) {
  if (!meter.available()) return {};
  power_sampler sampler(meter, period_ms);
  const double t0 = sampler.now();
  work();
  const double t1 = sampler.now();
  sampler.stop();
  power_sampler::span e = sampler.summary(t0, t1);
  if (e.samples < 10 || e.seconds <= 0) return {};
  e.joules *= (t1 - t0) / e.seconds;
  e.seconds = t1 - t0;
  return e;
}

}  // namespace zipage::cuda
