#pragma once
// The NCCL implementation of zipage::parallel::communicator (CUDA build with NCCL: the zipage::nccl
// library, src/cuda/nccl_communicator.cpp; this header includes no CUDA or NCCL header).
//
// One process, one thread per GPU: nccl_group(devices) creates every rank's communicator at once with
// ncclCommInitAll and returns a tp_group whose rank r runs on its own thread against devices[r] — the
// same execution model as the in-process CPU group, so the engine, its one scheduler and its page tables
// stay single and nothing crosses a process boundary (docs/tensor-parallel.md says why).
//
// Buffers are device pointers on the rank's GPU. Collectives are enqueued on the rank's stream (each
// call makes the rank's device current on the calling thread first); they complete in stream order, so
// a backend that runs its kernels on the same stream needs no synchronisation. synchronize() waits for
// them; barrier() is a one-float all-reduce followed by synchronize().
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zipage/parallel/communicator.hpp"

namespace zipage::parallel {

class nccl_communicator final : public communicator {
 public:
  struct impl;
  explicit nccl_communicator(std::unique_ptr<impl> p);
  ~nccl_communicator() override;

  [[nodiscard]] int rank() const override;
  [[nodiscard]] int size() const override;
  [[nodiscard]] std::string_view kind() const override { return "nccl"; }
  void all_reduce_sum(float* data, std::size_t count) override;
  void all_gather(const float* send, float* recv, std::size_t count) override;
  void barrier() override;

  [[nodiscard]] int device() const;
  [[nodiscard]] void* stream() const;  // cudaStream_t
  void synchronize();

  // For device tensors of other types (parallel/nccl_collectives.hpp): a bf16 all-reduce (sum), an
  // all-gather of raw bytes, and a strided device copy (cudaMemcpy2DAsync) on the rank's stream.
  void all_reduce_sum_bf16(void* data, std::size_t count);
  void all_gather_bytes(const void* send, void* recv, std::size_t bytes);
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t width_bytes,
               std::size_t rows);

 private:
  std::unique_ptr<impl> impl_;
};

// NCCL's version ("2.27.3"), or why it cannot be used.
[[nodiscard]] std::string nccl_version();

// Communicators over `devices` (rank r on devices[r]) from ncclCommInitAll. `streams[r]` (a cudaStream_t;
// empty or null: a stream the communicator creates on that device) orders rank r's collectives.
[[nodiscard]] std::shared_ptr<tp_group> nccl_group(std::span<const int> devices, std::span<void* const> streams = {});

}  // namespace zipage::parallel
