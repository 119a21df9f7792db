// zipage::parallel::nccl_communicator (parallel/nccl_communicator.hpp): NCCL collectives, one rank per GPU
// of this process.
#include "zipage/parallel/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <utility>

#include "zipage/core/error.hpp"

namespace zipage::parallel {

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  check(e == cudaSuccess, "nccl communicator: ", what, ": ", cudaGetErrorString(e));
}
void nccl_ok(ncclResult_t r, const char* what) {
  check(r == ncclSuccess, "nccl communicator: ", what, ": ", ncclGetErrorString(r));
}

}  // namespace

struct nccl_communicator::impl {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  float* one = nullptr;  // barrier scratch

  ~impl() {
    if (comm == nullptr) return;
    cudaSetDevice(device);
    if (stream) cudaStreamSynchronize(stream);
    ncclCommDestroy(comm);
    if (one) cudaFree(one);
    if (owns_stream && stream) cudaStreamDestroy(stream);
  }
  void use_device() const { cuda_ok(cudaSetDevice(device), "cudaSetDevice"); }
};

nccl_communicator::nccl_communicator(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
nccl_communicator::~nccl_communicator() = default;

int nccl_communicator::rank() const { return impl_->rank; }
int nccl_communicator::size() const { return impl_->size; }
int nccl_communicator::device() const { return impl_->device; }
void* nccl_communicator::stream() const { return impl_->stream; }

void nccl_communicator::all_reduce_sum(float* data, std::size_t count) {
  impl_->use_device();
  nccl_ok(ncclAllReduce(data, data, count, ncclFloat32, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce");
}

void nccl_communicator::all_gather(const float* send, float* recv, std::size_t count) {
  impl_->use_device();
  nccl_ok(ncclAllGather(send, recv, count, ncclFloat32, impl_->comm, impl_->stream), "ncclAllGather");
}

void nccl_communicator::all_reduce_sum_bf16(void* data, std::size_t count) {
  impl_->use_device();
  nccl_ok(ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, impl_->comm, impl_->stream), "ncclAllReduce (bf16)");
}

void nccl_communicator::all_gather_bytes(const void* send, void* recv, std::size_t bytes) {
  impl_->use_device();
  nccl_ok(ncclAllGather(send, recv, bytes, ncclInt8, impl_->comm, impl_->stream), "ncclAllGather (bytes)");
}

void nccl_communicator::copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                                std::size_t width_bytes, std::size_t rows) {
  if (width_bytes == 0 || rows == 0) return;
  impl_->use_device();
  cuda_ok(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width_bytes, rows, cudaMemcpyDeviceToDevice, impl_->stream),
          "cudaMemcpy2DAsync");
}

void nccl_communicator::barrier() {
  impl_->use_device();
  nccl_ok(ncclAllReduce(impl_->one, impl_->one, 1, ncclFloat32, ncclSum, impl_->comm, impl_->stream), "barrier");
  synchronize();
}

void nccl_communicator::synchronize() {
  impl_->use_device();
  cuda_ok(cudaStreamSynchronize(impl_->stream), "cudaStreamSynchronize");
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unavailable";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::shared_ptr<tp_group> nccl_group(std::span<const int> devices, std::span<void* const> streams) {
  const int n = static_cast<int>(devices.size());
  check(n >= 1, "nccl communicator: no devices");
  check(streams.empty() || static_cast<int>(streams.size()) == n, "nccl communicator: ", streams.size(),
        " streams for ", n, " devices");
  int count = 0;
  cuda_ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (int d : devices) check(d >= 0 && d < count, "nccl communicator: device ", d, " of ", count);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  nccl_ok(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<communicator>> out;
  for (int r = 0; r < n; ++r) {
    auto p = std::make_unique<nccl_communicator::impl>();
    p->comm = comms[static_cast<std::size_t>(r)];
    p->rank = r;
    p->size = n;
    p->device = devices[static_cast<std::size_t>(r)];
    p->use_device();
    if (!streams.empty() && streams[static_cast<std::size_t>(r)] != nullptr) {
      p->stream = static_cast<cudaStream_t>(streams[static_cast<std::size_t>(r)]);
    } else {
      cuda_ok(cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking), "cudaStreamCreate");
      p->owns_stream = true;
    }
    cuda_ok(cudaMalloc(&p->one, sizeof(float)), "cudaMalloc");
    // legacy stream: the barrier's scratch, whose value no one reads (the all-reduce only synchronises the ranks)
    cuda_ok(cudaMemset(p->one, 0, sizeof(float)), "cudaMemset");
    int rank = -1;
    nccl_ok(ncclCommUserRank(p->comm, &rank), "ncclCommUserRank");
    check(rank == r, "nccl communicator: communicator ", r, " reports rank ", rank);
    out.push_back(std::make_unique<nccl_communicator>(std::move(p)));
  }
  // NCCL has no portable way to wake a rank blocked in a collective short of ncclCommAbort, which would
  // end the communicators for good: a failing rank's exception is rethrown once every rank has returned.
  return std::make_shared<tp_group>(std::move(out));
}

}  // namespace zipage::parallel
