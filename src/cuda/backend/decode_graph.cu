// zipage::cuda_backend (backend/cuda/cuda_backend.hpp): CUDA graphs for decode steps — bucketed batch sizes, the
// record pass, replay, capture or in-place update (see cuda_backend.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <utility>

#include "context.cuh"

namespace zipage {

// ---------------------------------------------------------------------------------------------------
// CUDA graphs for decode steps

int cuda_backend::decode_graph_batch(int num_seqs) const {
  const auto& o = ctx_->opts;
  if (!o.cuda_graphs || num_seqs <= 0 || num_seqs > o.max_graph_batch) return 0;
  const int step = num_seqs <= 16 ? 0 : num_seqs <= 256 ? 16 : num_seqs <= 512 ? 32 : 64;
  const int padded = step == 0 ? static_cast<int>(std::bit_ceil(static_cast<unsigned>(num_seqs)))
                               : (num_seqs + step - 1) / step * step;
  return std::min(padded, std::max(o.max_graph_batch, num_seqs));
}

const cuda_tensor& cuda_backend::run_decode_graph(int batch, const std::function<const cuda_tensor&()>& forward) const {
  context& c = use(ctx_);
  auto& g = c.graph;
  using cuda_detail::graph_phase;
  check(g.phase == graph_phase::off, "run_decode_graph: called from inside a forward pass");
  // Eager steps compare their metadata with the uploader's last copy; the graph passes point the step
  // state elsewhere, so that copy may no longer be what the step state uses.
  c.meta_up.invalidate();
  c.attention_pending.fill(false);  // a forward that threw may have left one set
  struct reset_phase {
    cuda_detail::graph_state& g;
    ~reset_phase() { g.phase = graph_phase::off; }
  } reset{g};

  // Record: the forward's host side only (stage inputs, size outputs, sign the launches). A pass that had
  // to move the device arena signed stale pointers, so it runs again.
  const cuda_tensor* logits = nullptr;
  for (int pass = 0; pass < 2; ++pass) {
    g.begin(graph_phase::record, c.stream);
    logits = &forward();
    if (!g.arena_moved) break;
  }
  const std::uint64_t signature = g.signature;
  const std::pair<int, int> key{batch, g.kv_bucket};
  g.record_layout = g.layout;
  g.phase = graph_phase::off;
  if (g.used) ZIPAGE_CUDA_CHECK(cudaMemcpyAsync(g.dev, g.host.p, g.used, cudaMemcpyHostToDevice, c.stream));
  ZIPAGE_CUDA_CHECK(cudaEventRecord(g.copied, c.stream));

  auto it = g.graphs.find(key);
  if (it != g.graphs.end() && it->second.signature == signature) {
    ZIPAGE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, c.stream));
    c.count([&](cuda_backend_counters& k) { ++k.graph_replays; });
    return *logits;
  }

  // Capture the same forward (it launches this time) and instantiate it, or update the key's old graph.
  const auto t0 = cuda_detail::clock::now();
  g.begin(graph_phase::capture, c.stream);
  cudaGraph_t graph = nullptr;
  ZIPAGE_CUDA_CHECK(cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeThreadLocal));
  try {
    forward();
  } catch (...) {
    cudaStreamEndCapture(c.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  ZIPAGE_CUDA_CHECK(cudaStreamEndCapture(c.stream, &graph));
  g.phase = graph_phase::off;
  struct graph_guard {
    cudaGraph_t g;
    ~graph_guard() { cudaGraphDestroy(g); }
  } guard{graph};
  check(g.signature == signature, "cuda graphs: the capture pass launched other kernels than the record pass");
  bool updated = false;
  if (it != g.graphs.end()) {
    cudaGraphExecUpdateResultInfo info{};
    updated = cudaGraphExecUpdate(it->second.exec, graph, &info) == cudaSuccess;
    if (!updated) {
      cudaGetLastError();  // clear the failed update's error
      cudaGraphExecDestroy(it->second.exec);
      g.graphs.erase(it);
    }
  }
  if (!updated) {
    if (static_cast<int>(g.graphs.size()) >= std::max(1, c.opts.max_graphs)) g.clear();
    cudaGraphExec_t exec = nullptr;
    ZIPAGE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    it = g.graphs.emplace(key, cuda_detail::graph_entry{exec, signature}).first;
  }
  it->second.signature = signature;
  ZIPAGE_CUDA_CHECK(cudaGraphLaunch(it->second.exec, c.stream));
  const double secs = cuda_detail::seconds_since(t0);
  c.count([&](cuda_backend_counters& k) {
    ++k.graph_captures;
    k.graph_updates += updated ? 1 : 0;
    k.graph_capture_seconds += secs;
  });
  return *logits;
}

}  // namespace zipage
