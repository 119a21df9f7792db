// The NCCL communicator (tensor parallelism, issue 15) on the GPUs of this machine: N = 1 always (the
// one-GPU check of the NCCL path), and N = every device when there are several. Skipped (exit 77) where
// no GPU is present.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_buffers.hpp"
#include "zipage/cuda/device.hpp"
#include "zipage/parallel/nccl_communicator.hpp"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

// Every rank fills a device buffer with its own values, all-reduces it twice (bit-identical results, equal
// to the rank-order host sum within fp32 rounding), all-gathers its input, and passes barriers.
void check_group(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  auto group = zipage::parallel::nccl_group(devices);
  std::printf("nccl group of %d (%s)\n", group->size(), std::string(group->comm(0).kind()).c_str());
  const std::size_t count = 4097;
  auto input = [](int r, std::size_t i) { return static_cast<float>(r + 1) * 0.5f + static_cast<float>(i % 97) * 0.25f; };
  std::atomic<int> ok{0};
  group->run([&](int r) {
    auto& comm = static_cast<zipage::parallel::nccl_communicator&>(group->comm(r));
    ZIPAGE_TEST_CUDA_OK(cudaSetDevice(comm.device()));
    std::vector<float> host(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = input(r, i);
    zipage::testing::device_buffer<float> a(host), b(host), gathered(count * static_cast<std::size_t>(n));
    ZIPAGE_TEST_CUDA_OK(cudaDeviceSynchronize());
    comm.all_reduce_sum(a.p, count);
    comm.all_reduce_sum(b.p, count);
    zipage::testing::device_buffer<float> src(host);
    ZIPAGE_TEST_CUDA_OK(cudaDeviceSynchronize());
    comm.all_gather(src.p, gathered.p, count);
    comm.barrier();
    comm.synchronize();
    const auto ra = a.get(), rb = b.get(), rg = gathered.get();
    bool good = std::memcmp(ra.data(), rb.data(), count * sizeof(float)) == 0;
    for (std::size_t i = 0; i < count && good; ++i) {
      float sum = 0.0f;
      for (int s = 0; s < n; ++s) sum += input(s, i);
      good = ra[i] == sum;  // small exact-in-fp32 values: any order gives the same sum
    }
    for (int s = 0; s < n && good; ++s)
      for (std::size_t i = 0; i < count && good; ++i) good = rg[static_cast<std::size_t>(s) * count + i] == input(s, i);
    if (good) ++ok;
  });
  expect(ok == n, "N = " + std::to_string(n) + ": " + std::to_string(ok.load()) + " of " + std::to_string(n) +
                      " ranks saw the right all-reduce / all-gather results");
}

}  // namespace

int main() {
  const int devices = zipage::cuda::device_count();
  if (devices == 0) {
    std::printf("SKIPPED: no CUDA device (%s); the NCCL communicator needs a GPU\n", zipage::cuda::describe_device().c_str());
    return 77;
  }
  std::printf("NCCL %s, %d device(s); device 0: %s\n", zipage::parallel::nccl_version().c_str(), devices,
              zipage::cuda::describe_device(0).c_str());
  try {
    check_group({0});
    if (devices > 1) {
      std::vector<int> all;
      for (int d = 0; d < devices; ++d) all.push_back(d);
      check_group(all);
    }
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  std::printf(failures == 0 ? "PASSED\n" : "%d FAILED\n", failures);
  return failures == 0 ? 0 : 1;
}
