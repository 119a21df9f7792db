#pragma once
// tensor_parallel_llama<cuda_backend> over NCCL (CUDA build with NCCL; link zipage::nccl): how the CUDA
// backend's tensors go through an nccl_communicator. Includes no CUDA header.
//
// First version, correct before fast: the backend's stream is synchronised before each collective and the
// communicator's stream after it, so the two streams need not be the same. The logits' all-gather goes
// through a device scratch and one strided copy per rank (cudaMemcpy2DAsync); at N = 1 it is a copy.
// What remains (docs/tensor-parallel.md): NCCL on the backend's own stream without the synchronisations,
// rank threads making their device current, graphs captured per rank.
#include <vector>

#include "zipage/backend/cuda/cuda_backend.hpp"
#include "zipage/models/llama_tp.hpp"
#include "zipage/parallel/nccl_communicator.hpp"

namespace zipage {

template <>
struct tp_collectives<cuda_backend> {
  static parallel::nccl_communicator& nccl(parallel::communicator& comm) {
    auto* n = dynamic_cast<parallel::nccl_communicator*>(&comm);
    check(n != nullptr, "tensor parallel: cuda_backend ranks need NCCL communicators (parallel::nccl_group), got a ",
          comm.kind(), " one");
    return *n;
  }

  static void all_reduce(const cuda_backend& b, parallel::communicator& comm, cuda_tensor& t) {
    auto& c = nccl(comm);
    b.synchronize();
    if (t.dtype() == cuda_dtype::bf16) c.all_reduce_sum_bf16(t.data(), static_cast<std::size_t>(t.size()));
    else c.all_reduce_sum(static_cast<float*>(t.data()), static_cast<std::size_t>(t.size()));
    c.synchronize();
  }

  static void gather_vocab(const cuda_backend& b, parallel::communicator& comm, const parallel::tp_layout& layout,
                           const cuda_tensor& local, std::vector<float>& scratch, cuda_tensor& out) {
    auto& c = nccl(comm);
    const int rows = local.rows();
    if (layout.size == 1) {  // the shard is the whole vocabulary
      out = local;
      return;
    }
    // Device tensors of the right shapes (uploaded zeros: this path has not run on several GPUs yet).
    const auto n = static_cast<std::size_t>(layout.size);
    scratch.assign(n * static_cast<std::size_t>(local.size()), 0.0f);
    cuda_tensor gathered = b.from_host(scratch, static_cast<int>(n) * rows, layout.vocab_per_rank);
    scratch.assign(static_cast<std::size_t>(rows) * static_cast<std::size_t>(layout.vocab_size), 0.0f);
    out = b.from_host(scratch, rows, layout.vocab_size);
    check(gathered.dtype() == local.dtype() && out.dtype() == local.dtype(), "tensor parallel: logits dtypes differ");
    b.synchronize();
    c.all_gather_bytes(local.data(), gathered.data(), local.bytes());
    const std::size_t eb = dtype_bytes(local.dtype());
    for (int s = 0; s < layout.size; ++s) {
      const auto* src = static_cast<const char*>(gathered.data()) +
                        static_cast<std::size_t>(s) * static_cast<std::size_t>(rows) * static_cast<std::size_t>(layout.vocab_per_rank) * eb;
      auto* dst = static_cast<char*>(out.data()) + static_cast<std::size_t>(layout.vocab_begin(s)) * eb;
      c.copy_2d(dst, static_cast<std::size_t>(layout.vocab_size) * eb, src,
                static_cast<std::size_t>(layout.vocab_per_rank) * eb, static_cast<std::size_t>(layout.vocab_count(s)) * eb,
                static_cast<std::size_t>(rows));
    }
    c.synchronize();
  }
};

}  // namespace zipage
