// Bad input found by a probe of malformed files and flags (issue 13): a FIFO given as a model, config or
// tokenizer file is refused instead of blocking forever; a model and a tokenizer whose vocabularies
// disagree are refused at load instead of failing a batch halfway. Misused library options are refused
// before anything runs, naming the field.
#include <doctest/doctest.h>

#include "test_support.hpp"

#include <zipage/backend/cuda/cuda_backend.hpp>
#include <zipage/backend/cuda/fp8_gemm.hpp>
#include <zipage/gguf/gguf.hpp>
#include <zipage/models/hf_config.hpp>
#include <zipage/models/hf_loader.hpp>
#include <zipage/models/llama.hpp>
#include <zipage/safetensors/safetensors.hpp>
#include <zipage/tokenizer/bpe_tokenizer.hpp>
#include <zipage/tokenizer/spm_tokenizer.hpp>
#include <zipage/tokenizer/vocab_check.hpp>

#include <algorithm>
#include <chrono>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <map>
#include <future>
#include <set>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::temp_dir;

namespace {

// Runs `open` on a thread and returns its error. If it is still blocked after 10 s (the bug: open(2) on a
// FIFO waits for a writer), opens the FIFO for writing so it returns, and reports the hang.
std::string error_without_hanging(const fs::path& fifo, std::function<void()> open) {
  auto result = std::async(std::launch::async, [&] { return error_of(open); });
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
    const int fd = ::open(fifo.c_str(), O_WRONLY);  // releases the blocked reader (it then sees EOF)
    if (fd >= 0) ::close(fd);
    (void)result.get();
    return "<blocked on the FIFO>";
  }
  return result.get();
}

fs::path make_fifo(const fs::path& path) {
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  return path;
}

}  // namespace

TEST_CASE("a FIFO as a model, checkpoint, config or tokenizer file is refused, not waited on") {
  temp_dir dir("zipage_fifo");
  const auto gguf = make_fifo(dir.path / "model.gguf");
  CHECK(contains(error_without_hanging(gguf, [&] { (void)zipage::gguf::file::open(gguf); }),
                 "cannot open GGUF file '" + gguf.string() + "': not a regular file"));

  const auto st = make_fifo(dir.path / "model.safetensors");
  CHECK(contains(error_without_hanging(st, [&] { (void)zipage::safetensors::checkpoint::open(dir.path); }),
                 "cannot open safetensors file '" + st.string() + "': not a regular file"));

  const auto cfg = make_fifo(dir.path / "config.json");
  CHECK(contains(error_without_hanging(cfg, [&] { (void)zipage::load_hf_config(dir.path); }),
                 "'" + cfg.string() + "': not a regular file"));

  const auto tok = make_fifo(dir.path / "tokenizer.json");
  CHECK(contains(error_without_hanging(tok, [&] { (void)zipage::bpe_tokenizer::from_dir(dir.path); }),
                 "'" + tok.string() + "': not a regular file"));
}

TEST_CASE("a model vocabulary and its tokenizer's must agree at load") {
  // The bundled stories260K: 512 rows and 512 pieces.
  const auto file = zipage::gguf::file::open(ZIPAGE_TEST_MODEL);
  const auto spm = zipage::spm_tokenizer::from_gguf(file);
  auto c = zipage::llama_config_from_gguf(file);
  CHECK(error_of([&] { zipage::check_vocabulary_pair(c, spm); }) == "<no error>");
  // A model that can sample ids the SentencePiece tokenizer cannot decode (the batch used to abort at the
  // first one with "decode: token id out of range").
  c.vocab_size = 600;
  CHECK(contains(error_of([&] { zipage::check_vocabulary_pair(c, spm, "m.gguf", "m.gguf tokens"); }),
                 "the model (m.gguf) has a vocabulary of 600 but its tokenizer (m.gguf tokens) defines only 512 tokens: "
                 "ids 512..599 could be generated and not decoded"));
  // A tokenizer larger than the model: prompts could hold ids the model has no embedding row for.
  c.vocab_size = 500;
  CHECK(contains(error_of([&] { zipage::check_vocabulary_pair(c, spm); }),
                 "the tokenizer (tokenizer) defines 512 tokens but the model (model) has a vocabulary of 500"));

  // Byte-level BPE: a model padded past the tokenizer (Qwen3: 151936 rows, 151669 tokens) is fine, those
  // ids decode to nothing; a tokenizer larger than the model is not.
  const auto qwen3 = zipage::bpe_tokenizer::from_dir(fs::path(ZIPAGE_TEST_DATA_DIR) / "qwen3");
  c.vocab_size = 151936;
  CHECK(error_of([&] { zipage::check_vocabulary_pair(c, qwen3); }) == "<no error>");
  c.vocab_size = 151000;
  CHECK(contains(error_of([&] { zipage::check_vocabulary_pair(c, qwen3); }),
                 "defines 151669 tokens but the model (model) has a vocabulary of 151000"));
}

// cuda_backend_options::validate runs in the backend's constructor before any CUDA call, so it is checked
// here, on any machine: every wrong field is named, the defaults pass.
TEST_CASE("cuda_backend_options: a wrong field is named before the backend touches a device") {
  using zipage::cuda_backend_options;
  using zipage::cuda_dtype;
  CHECK_NOTHROW(cuda_backend_options{}.validate());
  const auto error_with = [](auto edit) {
    cuda_backend_options o;
    edit(o);
    return error_of([&] { o.validate(); });
  };
  CHECK(contains(error_with([](auto& o) { o.dtype = cuda_dtype::e4m3; }), "cuda_backend_options::dtype"));
  CHECK(contains(error_with([](auto& o) { o.kv_dtype = static_cast<zipage::kv_cache_dtype>(9); }),
                 "cuda_backend_options::kv_dtype"));
  CHECK(contains(error_with([](auto& o) { o.weight_dtype = static_cast<zipage::weight_dtype>(9); }),
                 "cuda_backend_options::weight_dtype"));
  CHECK(contains(error_with([](auto& o) {
                   o.dtype = cuda_dtype::f32;
                   o.weight_dtype = zipage::weight_dtype::fp8_e4m3;
                 }),
                 "weight_dtype fp8_e4m3 needs dtype bf16"));
  CHECK(contains(error_with([](auto& o) { o.device = -1; }), "cuda_backend_options::device"));
  CHECK(contains(error_with([](auto& o) { o.batch_invariant = true; }), "cuda_backend_options::batch_invariant"));
  CHECK(contains(error_with([](auto& o) { o.max_graph_batch = 0; }), "cuda_backend_options::max_graph_batch"));
  CHECK(contains(error_with([](auto& o) { o.max_graphs = 0; }), "cuda_backend_options::max_graphs"));
  CHECK(contains(error_with([](auto& o) { o.overlap_min_batch = -2; }), "cuda_backend_options::overlap_min_batch"));
  CHECK(contains(error_with([](auto& o) { o.overlap_gemm_sms = -1; }), "cuda_backend_options::overlap_gemm_sms"));
  CHECK(contains(error_with([](auto& o) { o.fp8_decode_kernel = zipage::cuda::fp8_decode_kernel::swapped; }),
                 "cuda_backend_options::fp8_decode_kernel swapped is a decode kernel for an FP8 KV cache"));
  CHECK(contains(error_with([](auto& o) { o.fp8_decode_kernel = static_cast<zipage::cuda::fp8_decode_kernel>(7); }),
                 "cuda_backend_options::fp8_decode_kernel: not a cuda::fp8_decode_kernel (7)"));
  CHECK(contains(error_with([](auto& o) { o.prefill_kernel = static_cast<zipage::cuda::prefill_kernel>(9); }),
                 "cuda_backend_options::prefill_kernel"));
  CHECK(contains(error_with([](auto& o) {
                   o.prefill_kernel = zipage::cuda::prefill_kernel::wgmma;
                   o.kv_dtype = zipage::kv_cache_dtype::fp8_e4m3;
                 }),
                 "prefill_kernel wgmma reads bf16 K/V"));
  CHECK(contains(error_with([](auto& o) {
                   o.prefill_kernel = zipage::cuda::prefill_kernel::wgmma;
                   o.dtype = cuda_dtype::f32;
                 }),
                 "prefill_kernel wgmma reads bf16 K/V: it needs dtype bf16"));
  // What the library's own users set stays valid.
  CHECK(error_with([](auto& o) {
          o.dtype = cuda_dtype::f32;
          o.batch_invariant = true;
          o.cuda_graphs = false;
          o.overlap_min_batch = 256;
          o.overlap_gemm_sms = 88;
          o.prefill_kernel = zipage::cuda::prefill_kernel::mma_sync;
        }) == "<no error>");
  CHECK(error_with([](auto& o) {
          o.kv_dtype = zipage::kv_cache_dtype::fp8_e4m3;
          o.fp8_decode_kernel = zipage::cuda::fp8_decode_kernel::swapped;
        }) == "<no error>");
  // split_kv on a bf16 cache names the kernel bf16 runs anyway.
  CHECK(error_with([](auto& o) { o.fp8_decode_kernel = zipage::cuda::fp8_decode_kernel::split_kv; }) == "<no error>");
  // Whether the device runs wgmma is the constructor's question, not validate()'s.
  CHECK(error_with([](auto& o) { o.prefill_kernel = zipage::cuda::prefill_kernel::wgmma; }) == "<no error>");
}

// The FP8 decode kernel a launch runs (host rule, no device): automatic takes the swapped-operand kernel only where
// it fits and either the split-KV plan has one split or the swapped grid makes kSwappedDecodeMinWaves full waves (so
// a small batch over long contexts keeps the split-KV kernel's parallelism); a requested swapped kernel runs
// wherever it fits; split_kv always runs split-KV.
TEST_CASE("resolve_fp8_decode_kernel: swapped where it fits and the batch fills the GPU without splits") {
  using zipage::cuda::fp8_decode_kernel;
  using zipage::cuda::kSwappedDecodeMinWaves;
  using zipage::cuda::resolve_fp8_decode_kernel;
  constexpr double few = kSwappedDecodeMinWaves / 2, many = kSwappedDecodeMinWaves;
  for (const double waves : {0.0, few, many})
    CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::automatic, true, 1, waves) == fp8_decode_kernel::swapped);
  for (const int splits : {2, 3, 64}) {
    CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::automatic, true, splits, few) == fp8_decode_kernel::split_kv);
    CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::automatic, true, splits, many) == fp8_decode_kernel::swapped);
    CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::swapped, true, splits, few) == fp8_decode_kernel::swapped);
    CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::swapped_e4m3_qk, true, splits, few) ==
          fp8_decode_kernel::swapped_e4m3_qk);
  }
  for (const int splits : {1, 2})
    for (const double waves : {few, many}) {
      CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::automatic, false, splits, waves) == fp8_decode_kernel::split_kv);
      CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::swapped, false, splits, waves) == fp8_decode_kernel::split_kv);
      CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::swapped_e4m3_qk, false, splits, waves) ==
            fp8_decode_kernel::split_kv);
      for (const bool fits : {false, true})
        CHECK(resolve_fp8_decode_kernel(fp8_decode_kernel::split_kv, fits, splits, waves) == fp8_decode_kernel::split_kv);
    }
  CHECK(contains(error_of([] { (void)resolve_fp8_decode_kernel(static_cast<fp8_decode_kernel>(5), true, 1, 0.0); }),
                 "not a cuda::fp8_decode_kernel (5)"));
  std::set<std::string> names;
  for (const fp8_decode_kernel k : zipage::cuda::all_fp8_decode_kernels) {
    CHECK(zipage::cuda::is_fp8_decode_kernel(k));
    names.insert(zipage::cuda::to_string(k));
  }
  CHECK(names.size() == std::size(zipage::cuda::all_fp8_decode_kernels));
  CHECK_FALSE(zipage::cuda::is_fp8_decode_kernel(static_cast<fp8_decode_kernel>(4)));
  CHECK(zipage::cuda::is_swapped(fp8_decode_kernel::swapped));
  CHECK(zipage::cuda::is_swapped(fp8_decode_kernel::swapped_e4m3_qk));
  CHECK_FALSE(zipage::cuda::is_swapped(fp8_decode_kernel::split_kv));
  CHECK_FALSE(zipage::cuda::is_swapped(fp8_decode_kernel::automatic));
}

// The FP8 GEMM a linear() runs (host rule, no device): automatic runs gemm_sm90 up to kSm90Fp8GemmMaxRows tokens where
// it takes the shape, cuBLASLt's above and elsewhere; a requested sm90 runs wherever it takes the shape; and the
// plan: equal splits of 64-token tiles (about one CTA per multiprocessor, at least two k-groups per split, none from
// many tiles on) and stream-K over 128-token tiles, each covering every tile's k-groups once.
TEST_CASE("resolve_fp8_gemm_kernel and plan_gemm_sm90: which FP8 GEMM runs, and how its CTAs share the work") {
  using zipage::cuda::fp8_gemm_kernel;
  using zipage::cuda::kSm90Fp8GemmMaxRows;
  using zipage::cuda::resolve_fp8_gemm_kernel;
  for (const int rows : {1, 7, kSm90Fp8GemmMaxRows}) {
    CHECK(resolve_fp8_gemm_kernel(fp8_gemm_kernel::automatic, rows, true) == fp8_gemm_kernel::sm90);
    CHECK(resolve_fp8_gemm_kernel(fp8_gemm_kernel::automatic, rows, false) == fp8_gemm_kernel::cublaslt);
  }
  for (const int rows : {kSm90Fp8GemmMaxRows + 1, 662, 4096}) {
    CHECK(resolve_fp8_gemm_kernel(fp8_gemm_kernel::automatic, rows, true) == fp8_gemm_kernel::cublaslt);
    CHECK(resolve_fp8_gemm_kernel(fp8_gemm_kernel::sm90, rows, true) == fp8_gemm_kernel::sm90);
    CHECK(resolve_fp8_gemm_kernel(fp8_gemm_kernel::sm90, rows, false) == fp8_gemm_kernel::cublaslt);
    CHECK(resolve_fp8_gemm_kernel(fp8_gemm_kernel::cublaslt, rows, true) == fp8_gemm_kernel::cublaslt);
  }
  CHECK(contains(error_of([] { (void)resolve_fp8_gemm_kernel(static_cast<fp8_gemm_kernel>(7), 1, true); }),
                 "not a cuda::fp8_gemm_kernel (7)"));
  std::set<std::string> names;
  for (const fp8_gemm_kernel k : zipage::cuda::all_fp8_gemm_kernels) {
    CHECK(zipage::cuda::is_fp8_gemm_kernel(k));
    names.insert(zipage::cuda::to_string(k));
  }
  CHECK(names.size() == std::size(zipage::cuda::all_fp8_gemm_kernels));
  CHECK_FALSE(zipage::cuda::is_fp8_gemm_kernel(static_cast<fp8_gemm_kernel>(3)));

  namespace f = zipage::cuda::fp8;
  constexpr std::size_t kWorkspace = std::size_t{32} << 20;  // the backend's default gemm_workspace_bytes
  // Equal splits of 64-token tiles (the plan's count: CTAs per tile), on 132 multiprocessors (the H200): a
  // 4096-wide output at 8 tokens is 32 tiles -> 4 splits; 6144 wide 48 -> 2; a 24576-wide one 192 tiles -> none;
  // a 64-token batch the same as 8 (one 64-row tile); K of 2 groups -> 1 split.
  const auto splits = [&](int m, int n, int k, int requested, int tile_rows = 0, std::size_t ws = std::size_t{32} << 20) {
    const f::gemm_sm90_plan p = f::plan_gemm_sm90(m, n, k, requested, tile_rows, 132, ws);
    return p.dp_tiles == p.tiles ? 1 : p.ctas / p.tiles;
  };
  CHECK(splits(8, 4096, 4096, 0) == 4);
  CHECK(splits(64, 4096, 12288, 0) == 4);
  CHECK(splits(8, 6144, 4096, 0) == 2);
  CHECK(splits(8, 24576, 4096, 0) == 1);
  CHECK(splits(128, 4096, 4096, 0, 64) == 2);
  CHECK(splits(8, 128, 256, 0) == 1);      // 2 groups: at least 2 per split
  CHECK(splits(8, 128, 1024, 0) == 4);     // 8 groups, 1 tile: at most groups / 2
  CHECK(splits(8, 4096, 1024, 16) == 8);   // a request: at most one split per group
  CHECK(splits(8, 4096, 4096, 3) == 3);
  CHECK(splits(65536, 4096, 4096, 0, 64) == 1);  // past gemm_sm90_max_split_tiles
  CHECK(splits(8, 4096, 4096, 0, 0, 0) == 1);    // no workspace: no split
  CHECK(splits(8, 4096, 4096, 0, 0, std::size_t{3} * 32 * 2 * 64 * 128 * 4) == 3);  // lowered to the workspace
  CHECK(f::plan_gemm_sm90(8, 4096, 4096, 4, 0, 132, kWorkspace).workspace_bytes() == std::size_t{2} * 32 * 4 * 64 * 128 * 4);
  CHECK(f::plan_gemm_sm90(8, 4096, 4096, 1, 0, 132, kWorkspace).workspace_bytes() == 0);

  // Automatic tile height: 64 tokens up to 128, then 128 (equal splits for both; none from 132 tiles on).
  CHECK(f::plan_gemm_sm90(128, 4096, 4096, 0, 0, 132, kWorkspace).tile_rows == 64);
  const f::gemm_sm90_plan o705_auto = f::plan_gemm_sm90(705, 4096, 4096, 0, 0, 132, kWorkspace);
  CHECK(o705_auto.tile_rows == 128);
  CHECK(o705_auto.dp_tiles == o705_auto.tiles);
  // Stream-K (asked for): one CTA per multiprocessor at 128-token tiles; the last round and the one before shared
  // where the rounds are not whole. o (4096 x 4096) at 705 tokens: 6 x 32 = 192 tiles, all shared.
  const f::gemm_sm90_plan o705 = f::plan_gemm_sm90(705, 4096, 4096, f::gemm_sm90_stream_k, 0, 132, kWorkspace);
  CHECK(o705.tile_rows == 128);
  CHECK(o705.tiles == 192);
  CHECK(o705.ctas == 132);
  CHECK(o705.dp_tiles == 0);
  // gate|up (24576 x 4096) at 705: 1,152 tiles = 8 rounds + 96; 7 rounds whole, the last 228 tiles shared.
  const f::gemm_sm90_plan gu705 = f::plan_gemm_sm90(705, 24576, 4096, f::gemm_sm90_stream_k, 0, 132, kWorkspace);
  CHECK(gu705.dp_tiles == 7 * 132);
  CHECK(gu705.tiles - gu705.dp_tiles == 228);
  // Whole rounds, an explicit 1, or no workspace: whole tiles only.
  for (const f::gemm_sm90_plan& p : {f::plan_gemm_sm90(1024, 4096, 4096, f::gemm_sm90_stream_k, 0, 128, kWorkspace),
                                     f::plan_gemm_sm90(705, 4096, 4096, 1, 0, 132, kWorkspace),
                                     f::plan_gemm_sm90(705, 4096, 4096, 0, 0, 132, 0)}) {
    CHECK(p.dp_tiles == p.tiles);
    CHECK(p.workspace_bytes() == 0);
  }

  // Every plan covers every (tile, k-group) once; whole pieces are whole tiles; a shared tile's contributors are
  // first_cta..last_cta, each with the slot the reduction reads (slot(c, u)), every slot used once; automatic plans fit
  // the workspace; no more shared tiles than counters.
  int plans = 0;
  for (const int sms : {132, 7, 1})
    for (const int m : {1, 64, 65, 300, 705, 2048})
      for (const int n : {128, 4096, 24576})
        for (const int k : {128, 256, 4096, 12288})
          for (const int requested : {0, 1, 3, f::gemm_sm90_stream_k})
            for (const int tile_rows : {0, 64, 128}) {
              const f::gemm_sm90_plan p = f::plan_gemm_sm90(m, n, k, requested, tile_rows, sms, kWorkspace);
              CAPTURE(sms);
              CAPTURE(m);
              CAPTURE(n);
              CAPTURE(k);
              CAPTURE(requested);
              CAPTURE(tile_rows);
              REQUIRE(p.ctas >= 1);
              REQUIRE(p.tiles == (f::padded_rows(m) + p.tile_rows - 1) / p.tile_rows * (n / 128));
              if (requested == 0 || requested == 1) REQUIRE(p.workspace_bytes() <= kWorkspace);  // explicit: not lowered
              REQUIRE(p.tiles - p.dp_tiles <= f::gemm_sm90_max_split_tiles);
              std::vector<int> covered(static_cast<std::size_t>(p.tiles) * p.groups, 0);
              std::map<int, std::vector<std::pair<int, int>>> shared;  // tile -> (cta, slot)
              std::set<int> slots;
              for (int c = 0; c < p.ctas; ++c) {
                f::gemm_sm90_plan::piece q;
                for (auto at = p.start(c); p.next(c, at, q);) {
                  REQUIRE((q.tile >= 0 && q.tile < p.tiles && 0 <= q.g0 && q.g0 < q.g1 && q.g1 <= p.groups));
                  for (int g = q.g0; g < q.g1; ++g) ++covered[static_cast<std::size_t>(q.tile) * p.groups + g];
                  if (q.slot < 0) {
                    REQUIRE((q.g0 == 0 && q.g1 == p.groups));
                  } else {
                    REQUIRE(q.tile >= p.dp_tiles);
                    REQUIRE((q.slot >= 0 && q.slot < 2 * p.ctas && slots.insert(q.slot).second));
                    shared[q.tile].emplace_back(c, q.slot);
                  }
                }
              }
              REQUIRE(std::all_of(covered.begin(), covered.end(), [](int v) { return v == 1; }));
              for (const auto& [tile, parts] : shared) {
                const int u = tile - p.dp_tiles;
                REQUIRE(static_cast<int>(parts.size()) == p.last_cta(u) - p.first_cta(u) + 1);
                for (std::size_t j = 0; j < parts.size(); ++j) {
                  REQUIRE(parts[j].first == p.first_cta(u) + static_cast<int>(j));
                  REQUIRE(parts[j].second == p.slot(parts[j].first, u));
                }
              }
              ++plans;
            }
  CHECK(plans == 3 * 6 * 3 * 4 * 4 * 3);
}

// The prefill kernel a launch runs (host rule, no device): automatic runs wgmma on bf16 K/V at head_dim 128 where
// the device has it and mma.sync otherwise; mma_sync always runs mma.sync; a requested wgmma runs only where it
// fits, and otherwise the error says which condition is missing.
TEST_CASE("resolve_prefill_kernel: the prefill kernel that runs, or why a wgmma kernel cannot") {
  using zipage::cuda::prefill_kernel;
  using zipage::cuda::resolve_prefill_kernel;
  CHECK(resolve_prefill_kernel(prefill_kernel::automatic, 128, false, true) == prefill_kernel::wgmma);
  CHECK(resolve_prefill_kernel(prefill_kernel::automatic, 128, false, false) == prefill_kernel::mma_sync);
  for (const bool available : {false, true}) {
    CHECK(resolve_prefill_kernel(prefill_kernel::automatic, 128, true, available) == prefill_kernel::mma_sync);
    CHECK(resolve_prefill_kernel(prefill_kernel::automatic, 64, false, available) == prefill_kernel::mma_sync);
    CHECK(resolve_prefill_kernel(prefill_kernel::automatic, 64, true, available) == prefill_kernel::mma_sync);
    CHECK(resolve_prefill_kernel(prefill_kernel::mma_sync, 128, false, available) == prefill_kernel::mma_sync);
  }
  CHECK(resolve_prefill_kernel(prefill_kernel::wgmma, 128, false, true) == prefill_kernel::wgmma);
  CHECK(contains(error_of([] { (void)resolve_prefill_kernel(prefill_kernel::wgmma, 128, true, true); }),
                 "prefill kernel wgmma reads bf16 K/V"));
  CHECK(contains(error_of([] { (void)resolve_prefill_kernel(prefill_kernel::wgmma, 64, false, true); }),
                 "prefill kernel wgmma needs head_dim 128, not 64"));
  CHECK(contains(error_of([] { (void)resolve_prefill_kernel(prefill_kernel::wgmma, 128, false, false); }),
                 "prefill kernel wgmma needs an sm_90a build"));
  // The one list of kernels: every name distinct, wgmma every concrete kernel but mma_sync, nothing else.
  std::set<std::string> names;
  for (const prefill_kernel k : zipage::cuda::all_prefill_kernels) {
    CHECK(zipage::cuda::is_prefill_kernel(k));
    CHECK(zipage::cuda::is_wgmma(k) == (k != prefill_kernel::automatic && k != prefill_kernel::mma_sync));
    names.insert(zipage::cuda::to_string(k));
  }
  CHECK(names.size() == std::size(zipage::cuda::all_prefill_kernels));
  CHECK_FALSE(zipage::cuda::is_prefill_kernel(static_cast<prefill_kernel>(7)));
  CHECK_FALSE(zipage::cuda::is_wgmma(static_cast<prefill_kernel>(7)));
  CHECK(contains(error_of([] { (void)resolve_prefill_kernel(static_cast<prefill_kernel>(7), 128, false, true); }),
                 "not a cuda::prefill_kernel"));
}
