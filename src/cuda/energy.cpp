// energy_meter: NVML through dlopen (include/zipage/cuda/energy.hpp says why).
#include "zipage/cuda/energy.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace zipage::cuda {

namespace {
// The few NVML entry points used, with their C signatures (nvmlReturn_t is an int enum, 0 = success;
// nvmlDevice_t an opaque pointer).
using nvml_device = void*;
using init_fn = int (*)();
using by_pci_fn = int (*)(const char*, nvml_device*);
using energy_fn = int (*)(nvml_device, unsigned long long*);  // millijoules
using power_fn = int (*)(nvml_device, unsigned int*);         // milliwatts
using clock_fn = int (*)(nvml_device, int, unsigned int*);    // type 1 = NVML_CLOCK_SM; MHz
using reasons_fn = int (*)(nvml_device, unsigned long long*);
}  // namespace

struct energy_meter::impl {
  void* lib = nullptr;
  nvml_device dev = nullptr;
  energy_fn energy = nullptr;
  power_fn power = nullptr;
  clock_fn clock = nullptr;
  reasons_fn reasons = nullptr;
  power_fn limit = nullptr;
  ~impl() {
    if (lib) dlclose(lib);  // nvmlShutdown is not called: other users of NVML in the process keep their handles
  }
};

energy_meter::energy_meter(int device) {
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    cudaGetLastError();
    why_ = "no CUDA device " + std::to_string(device);
    return;
  }
  auto m = std::make_unique<impl>();
  m->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!m->lib) {
    why_ = "libnvidia-ml.so.1 not found";
    return;
  }
  auto sym = [&](const char* name) { return dlsym(m->lib, name); };
  const auto init = reinterpret_cast<init_fn>(sym("nvmlInit_v2"));
  const auto by_pci = reinterpret_cast<by_pci_fn>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  m->energy = reinterpret_cast<energy_fn>(sym("nvmlDeviceGetTotalEnergyConsumption"));
  m->power = reinterpret_cast<power_fn>(sym("nvmlDeviceGetPowerUsage"));
  m->clock = reinterpret_cast<clock_fn>(sym("nvmlDeviceGetClockInfo"));
  m->reasons = reinterpret_cast<reasons_fn>(sym("nvmlDeviceGetCurrentClocksEventReasons"));
  if (!m->reasons) m->reasons = reinterpret_cast<reasons_fn>(sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
  m->limit = reinterpret_cast<power_fn>(sym("nvmlDeviceGetEnforcedPowerLimit"));
  if (!init || !by_pci || !m->energy) {
    why_ = "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or nvmlDeviceGetTotalEnergyConsumption";
    return;
  }
  if (init() != 0) {
    why_ = "nvmlInit_v2 failed";
    return;
  }
  if (by_pci(bus, &m->dev) != 0) {
    why_ = std::string("NVML has no device at PCI bus ") + bus;
    return;
  }
  unsigned long long mj = 0;
  if (m->energy(m->dev, &mj) != 0) {
    why_ = std::string("the energy counter of ") + bus + " cannot be read";
    return;
  }
  impl_ = std::move(m);
}

energy_meter::~energy_meter() = default;

std::optional<power_reading> energy_meter::read() const {
  if (!impl_) return std::nullopt;
  unsigned long long mj = 0;
  if (impl_->energy(impl_->dev, &mj) != 0) return std::nullopt;
  power_reading r;
  r.joules = static_cast<double>(mj) * 1e-3;
  unsigned int mw = 0, mhz = 0;
  if (impl_->power && impl_->power(impl_->dev, &mw) == 0) r.watts = mw * 1e-3;
  if (impl_->clock && impl_->clock(impl_->dev, 1, &mhz) == 0) r.sm_mhz = static_cast<int>(mhz);
  unsigned long long reasons = 0;
  if (impl_->reasons && impl_->reasons(impl_->dev, &reasons) == 0) r.clock_reasons = reasons;
  return r;
}

std::optional<double> energy_meter::power_limit_watts() const {
  unsigned int mw = 0;
  if (!impl_ || !impl_->limit || impl_->limit(impl_->dev, &mw) != 0 || mw == 0) return std::nullopt;
  return mw * 1e-3;
}

// ---- power_sampler

struct power_sampler::state {
  const energy_meter& meter;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::atomic<bool> running{true};
  mutable std::mutex mu;
  std::vector<sample> samples;
  std::thread thread;

  explicit state(const energy_meter& m) : meter(m) {}
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  void take() {
    if (const auto r = meter.read()) {
      const std::lock_guard lock(mu);
      samples.push_back({now(), *r});
    }
  }
};

power_sampler::power_sampler(const energy_meter& meter, int period_ms) : s_(std::make_unique<state>(meter)) {
  if (!meter.available()) return;
  s_->take();
  s_->thread = std::thread([st = s_.get(), period = std::chrono::milliseconds(period_ms > 0 ? period_ms : 50)] {
    while (st->running.load()) {
      std::this_thread::sleep_for(period);
      st->take();
    }
  });
}

power_sampler::~power_sampler() { stop(); }

double power_sampler::now() const { return s_->now(); }

void power_sampler::stop() {
  if (!s_->running.exchange(false)) return;
  if (s_->thread.joinable()) s_->thread.join();
  s_->take();
}

power_sampler::span power_sampler::summary(double from, double to) const {
  const std::lock_guard lock(s_->mu);
  span out;
  const sample* first = nullptr;
  const sample* last = nullptr;
  double mhz = 0;
  int capped = 0, n = 0;
  for (const sample& x : s_->samples) {
    if (x.t < from || x.t > to) continue;
    if (!first) first = &x;
    last = &x;
    mhz += x.r.sm_mhz;
    capped += (x.r.clock_reasons & 0x4) != 0;
    ++n;
  }
  if (n < 2) return out;
  out.samples = n;
  out.seconds = last->t - first->t;
  out.joules = last->r.joules - first->r.joules;
  out.sm_mhz = mhz / n;
  out.power_capped = static_cast<double>(capped) / n;
  return out;
}

}  // namespace zipage::cuda
