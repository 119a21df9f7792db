// Tests for the safetensors reader and writer: writer->reader round trips (F32/F16/BF16, metadata,
// scalars, empty tensors), a catalogue of corrupt headers that must each fail with a zipage::error naming
// the file and the problem, truncated and bit-flipped files (never a crash), and sharded checkpoints.
#include <doctest/doctest.h>

#include "test_support.hpp"

#include <zipage/safetensors/safetensors.hpp>
#include <zipage/safetensors/writer.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace st = zipage::safetensors;
namespace fs = std::filesystem;
using bytes = std::vector<std::byte>;

namespace {

using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::temp_dir;




std::vector<float> iota_values(std::size_t n, float scale = 0.25f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i) - static_cast<float>(n) / 2.0f) * scale;
  return v;
}

// Raw bytes of n little-endian floats.
bytes f32_bytes(std::size_t n) {
  const auto v = iota_values(n);
  bytes b(n * 4);
  if (n > 0) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

st::file parse(bytes b) { return st::file::from_bytes(std::move(b), "test.safetensors"); }

// A file whose header is `header` (a JSON text) followed by `data_bytes` bytes of data.
std::string header_error(const std::string& header, std::size_t data_bytes) {
  return error_of([&] { parse(st::writer::encode(header, f32_bytes(data_bytes / 4))); });
}

}  // namespace

TEST_CASE("safetensors: writer -> reader round trip with F32, F16 and BF16") {
  st::writer w;
  const auto a = iota_values(6);
  const auto b = iota_values(12, 0.5f);
  const auto c = iota_values(4, 1.0f);
  w.add("a", {2, 3}, a);
  w.add("b.weight", {3, 4}, b, st::dtype::f16);
  w.add("c", {4}, c, st::dtype::bf16);
  w.add("scalar", {}, std::vector<float>{3.5f});
  w.add("empty", {0, 5}, std::vector<float>{});
  w.set_metadata("format", "pt");
  const auto f = parse(w.bytes());

  CHECK(f.tensors().size() == 5);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.data_offset() % 8 == 0);  // header padded to a multiple of 8
  const auto& ta = f.tensor("a");
  CHECK(ta.type == st::dtype::f32);
  CHECK(ta.shape == std::vector<std::int64_t>{2, 3});
  CHECK(ta.nbytes == 24);
  CHECK(*ta.file == "test.safetensors");
  CHECK(f.to_f32(ta) == a);
  // Every value here is exactly representable in half and bfloat16.
  CHECK(f.to_f32(f.tensor("b.weight")) == b);
  CHECK(f.to_f32(f.tensor("c")) == c);
  CHECK(f.tensor("b.weight").nbytes == 24);
  CHECK(f.to_f32(f.tensor("scalar")) == std::vector<float>{3.5f});
  CHECK(f.tensor("scalar").num_elements() == 1);
  CHECK(f.to_f32(f.tensor("empty")).empty());
  CHECK(f.find("missing") == nullptr);
  CHECK(contains(error_of([&] { (void)f.tensor("missing.weight"); }), "test.safetensors: no tensor named 'missing.weight'"));

  // to_f32 into a span, and refusing a span of the wrong size.
  std::vector<float> out(6);
  f.to_f32(ta, out);
  CHECK(out == a);
  std::vector<float> small(5);
  CHECK(contains(error_of([&] { f.to_f32(ta, small); }), "5 output floats for 6 elements"));
}

TEST_CASE("safetensors: rounding of F16/BF16 and reading from a file on disk") {
  temp_dir dir;
  st::writer w;
  const std::vector<float> v{1.0f / 3.0f, -2.5e-3f, 65504.0f, 1e-8f};
  w.add("h", {4}, v, st::dtype::f16);
  w.add("b", {2, 2}, v, st::dtype::bf16);
  w.write(dir.path / "x.safetensors");
  const auto f = st::file::open(dir.path / "x.safetensors");
  CHECK(f.name() == (dir.path / "x.safetensors").string());
  const auto h = f.to_f32(f.tensor("h"));
  const auto b = f.to_f32(f.tensor("b"));
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(h[i] == doctest::Approx(v[i]).epsilon(1e-3));
    CHECK(b[i] == doctest::Approx(v[i]).epsilon(1e-2));
  }
  CHECK(h[3] == 0.0f);  // below half's smallest subnormal
  CHECK(b[3] == doctest::Approx(1e-8f).epsilon(1e-2));
}

TEST_CASE("safetensors: non-float dtypes open, but only F32/F16/BF16 convert") {
  st::writer w;
  w.add_raw("ids", "I64", {2}, bytes(16));
  w.add_raw("mask", "BOOL", {3}, bytes(3));
  w.add("x", {1}, std::vector<float>{1.0f});
  const auto f = parse(w.bytes());
  CHECK(f.tensor("ids").type == st::dtype::i64);
  CHECK(contains(error_of([&] { (void)f.to_f32(f.tensor("ids")); }),
                 "test.safetensors: tensor 'ids' has dtype I64, which zipage cannot load (supported: F32, F16, BF16)"));
  CHECK(contains(error_of([&] { (void)f.to_f32(f.tensor("mask")); }), "dtype BOOL"));
}

TEST_CASE("safetensors: a tensor_info of another file is refused") {
  st::writer w;
  w.add("x", {2}, std::vector<float>{1.0f, 2.0f});
  const auto f1 = parse(w.bytes());
  const auto f2 = parse(w.bytes());
  CHECK(contains(error_of([&] { (void)f1.to_f32(f2.tensor("x")); }), "does not point into this file's data"));
}

TEST_CASE("safetensors: file-level corruption") {
  CHECK(contains(error_of([] { parse(bytes(5)); }), "test.safetensors: 5 bytes is too small"));
  CHECK(contains(error_of([] { parse(bytes{}); }), "0 bytes is too small"));
  // Header length past the end of the file.
  bytes b = st::writer::encode("{}", {});
  const std::uint64_t huge = 1000;
  std::memcpy(b.data(), &huge, 8);
  CHECK(contains(error_of([&] { parse(b); }), "header length 1000 runs past the end of the file (16 bytes)"));
  const std::uint64_t giant = ~std::uint64_t{0};
  std::memcpy(b.data(), &giant, 8);
  CHECK(contains(error_of([&] { parse(b); }), "runs past the end of the file"));
  CHECK(contains(error_of([] { parse(st::writer::encode("{", {}, false)); }), "header length 1 is too small"));
  // Over the format's 100 MB header limit (the file is that large, so this is the limit speaking).
  bytes big(8 + 100'000'001, std::byte{' '});
  const std::uint64_t n = 100'000'001;
  std::memcpy(big.data(), &n, 8);
  CHECK(contains(error_of([&] { parse(big); }), "exceeds the limit of 100000000 bytes"));
  // Missing files and directories.
  CHECK(contains(error_of([] { (void)st::file::open("/nonexistent/zipage.safetensors"); }),
                 "cannot open safetensors file '/nonexistent/zipage.safetensors'"));
  temp_dir dir;
  CHECK(contains(error_of([&] { (void)st::file::open(dir.path); }), "it is a directory"));
}

TEST_CASE("safetensors: JSON-level corruption") {
  CHECK(contains(header_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", 4),
                 "test.safetensors header: invalid JSON"));
  CHECK(contains(header_error("[1, 2]", 0), "the header must be a JSON object, got array"));
  CHECK(contains(header_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                              R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                              8),
                 "duplicate key 'a'"));
  std::string deep(200, '[');
  CHECK(contains(header_error(R"({"__metadata__": )" + deep, 0), "nested more than 64 levels deep"));
  CHECK(contains(header_error("{\"a\xff\": 1}", 0), "invalid JSON"));  // not UTF-8
}

TEST_CASE("safetensors: every tensor field is validated") {
  auto entry = [](const std::string& body) { return R"({"t": )" + body + "}"; };
  CHECK(contains(header_error(entry("[]"), 0), "tensor 't' must be an object, got array"));
  CHECK(contains(header_error(entry(R"({"shape": [1], "data_offsets": [0, 4]})"), 4), "tensor 't': missing field 'dtype'"));
  CHECK(contains(header_error(entry(R"({"dtype": 3, "shape": [1], "data_offsets": [0, 4]})"), 4),
                 "dtype must be a string, got number"));
  CHECK(contains(header_error(entry(R"({"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]})"), 4),
                 "tensor 't': unknown dtype 'Q4'"));
  CHECK(contains(header_error(entry(R"({"dtype": "F4", "shape": [2], "data_offsets": [0, 1]})"), 4),
                 "dtype F4 (sub-byte) is not supported"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "data_offsets": [0, 4]})"), 4), "missing field 'shape'"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": 1, "data_offsets": [0, 4]})"), 4),
                 "shape must be an array, got number"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})"), 4),
                 "field 'shape[0]' = -1 is out of range"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]})"), 4),
                 "field 'shape[0]' must be an integer, got 1.5"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]})"), 4),
                 "shape has 9 dimensions (at most 8)"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 4]})"), 4),
                 "has too many elements"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1]})"), 4), "missing field 'data_offsets'"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0]})"), 4),
                 "data_offsets must be [begin, end], got [0]"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]})"), 4),
                 "field 'data_offsets[1]' must be an integer, got string"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [8, 4]})"), 8),
                 "data_offsets [8, 4] end before they begin"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 8]})"), 4),
                 "data_offsets [0, 8] run past the data section of 4 bytes"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]})"), 4),
                 "hold 4 bytes, but shape [2] of F32 needs 8"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": 1})"), 4),
                 "tensor 't': unknown field 'extra'"));
  CHECK(contains(header_error(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]})"), 4),
                 "data_offsets[1]' = 18446744073709551615 is out of range"));
  CHECK(contains(header_error(R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4), "empty tensor name"));
  CHECK(contains(header_error(R"({"__metadata__": [1]})", 0), "__metadata__ must be an object of strings, got array"));
  CHECK(contains(header_error(R"({"__metadata__": {"k": 1}})", 0), "__metadata__ entry 'k' must be a string, got number"));
}

TEST_CASE("safetensors: tensors must tile the data section") {
  const std::string a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  CHECK(contains(header_error("{" + a + R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
                 "tensor 'b' (bytes [4, 12)) overlaps tensor 'a'"));
  CHECK(contains(header_error("{" + a + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})", 16),
                 "bytes [8, 12) of the data section belong to no tensor"));
  CHECK(contains(header_error("{" + a + "}", 12), "the data section has 4 bytes after the last tensor"));
  CHECK(contains(header_error("{}", 4), "4 bytes after the last tensor"));
  // Empty tensors may sit anywhere on a boundary.
  CHECK(parse(st::writer::encode("{" + a + R"(, "e": {"dtype": "BF16", "shape": [0], "data_offsets": [8, 8]}})",
                                 f32_bytes(2)))
            .tensors()
            .size() == 2);
  CHECK(parse(st::writer::encode("{}", {})).tensors().empty());
}

TEST_CASE("safetensors: truncated and bit-flipped files fail cleanly, never crash") {
  st::writer w;
  w.add("model.embed_tokens.weight", {4, 3}, iota_values(12), st::dtype::bf16);
  w.add("model.norm.weight", {3}, iota_values(3));
  w.set_metadata("format", "pt");
  const bytes good = w.bytes();
  REQUIRE(parse(good).tensors().size() == 2);
  int errors = 0;
  for (std::size_t len = 0; len < good.size(); ++len) {
    const std::string msg = error_of([&] { parse(bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len))); });
    CHECK_MESSAGE(contains(msg, "test.safetensors"), "prefix of ", len, " bytes: ", msg);
    ++errors;
  }
  CHECK(errors == static_cast<int>(good.size()));
  // Every byte of the header and its length, replaced by a few values: an error or a valid file.
  const std::uint64_t header_end = parse(good).data_offset();
  for (std::size_t at = 0; at < header_end; ++at) {
    for (unsigned v : {0x00u, 0x22u, 0x30u, 0x5Bu, 0x7Du, 0xFFu}) {
      bytes b = good;
      b[at] = static_cast<std::byte>(v);
      try {
        const auto f = parse(b);
        for (const auto& t : f.tensors())
          if (st::is_loadable(t.type)) (void)f.to_f32(t);
      } catch (const zipage::error& e) {
        CHECK_MESSAGE(contains(e.what(), "test.safetensors"), e.what());
      }
    }
  }
}

TEST_CASE("safetensors: sharded checkpoint with an index") {
  temp_dir dir;
  st::writer s1, s2;
  s1.add("model.embed_tokens.weight", {2, 2}, std::vector<float>{1, 2, 3, 4});
  s1.add("model.norm.weight", {2}, std::vector<float>{5, 6});
  s2.add("lm_head.weight", {2, 2}, std::vector<float>{7, 8, 9, 10}, st::dtype::bf16);
  s1.write(dir.path / "model-00001-of-00002.safetensors");
  s2.write(dir.path / "model-00002-of-00002.safetensors");
  auto write_index = [&](const std::string& text) {
    std::ofstream(dir.path / "model.safetensors.index.json") << text;
  };
  write_index(R"({"metadata": {"total_size": 40}, "weight_map": {
      "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
      "model.norm.weight": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})");

  const auto ckpt = st::checkpoint::open(dir.path);
  CHECK(ckpt.files().size() == 2);
  CHECK(ckpt.size() == 3);
  CHECK(ckpt.tensors().size() == 3);
  CHECK(ckpt.tensors().front()->name == "lm_head.weight");  // sorted by name
  CHECK(ckpt.to_f32(ckpt.tensor("lm_head.weight")) == std::vector<float>{7, 8, 9, 10});
  CHECK(ckpt.to_f32(ckpt.tensor("model.norm.weight")) == std::vector<float>{5, 6});
  CHECK(contains(*ckpt.tensor("lm_head.weight").file, "model-00002-of-00002.safetensors"));
  CHECK(contains(error_of([&] { (void)ckpt.tensor("nope"); }), "(+1 more shards): no tensor named 'nope'"));
  // The index can be named directly too, and a single shard opened as a checkpoint of its own.
  CHECK(st::checkpoint::open(dir.path / "model.safetensors.index.json").size() == 3);
  const auto one = st::checkpoint::open(dir.path / "model-00001-of-00002.safetensors");
  CHECK(one.size() == 2);
  CHECK(contains(error_of([&] { (void)one.to_f32(ckpt.tensor("model.norm.weight")); }),
                 "does not belong to this checkpoint"));

  write_index(R"({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }),
                 "weight_map puts tensor 'model.norm.weight' in "));
  write_index(R"({"weight_map": {"x": "missing.safetensors"}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "cannot open safetensors file"));
  write_index(R"({"weight_map": {"x": "../model-00001-of-00002.safetensors"}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "is not a file name in the index's directory"));
  write_index(R"({"weight_map": {"x": "/etc/passwd"}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "is not a file name in the index's directory"));
  write_index(R"({"weight_map": {"x": 3}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "weight_map['x'] must be a file name, got number"));
  write_index(R"({"weight_map": []})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "weight_map must be an object, got array"));
  write_index(R"({"metadata": {}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "missing field 'weight_map'"));
  write_index(R"({"weight_map": {}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "weight_map is empty"));
  write_index("{not json");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "model.safetensors.index.json: invalid JSON"));

  // A tensor in two shards.
  st::writer s3;
  s3.add("model.norm.weight", {2}, std::vector<float>{0, 0});
  s3.write(dir.path / "dup.safetensors");
  write_index(R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                                 "x": "dup.safetensors"}})");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }), "tensor 'model.norm.weight' is in both"));

  fs::remove(dir.path / "model.safetensors.index.json");
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path); }),
                 "holds neither model.safetensors.index.json nor model.safetensors"));
  s1.write(dir.path / "model.safetensors");
  CHECK(st::checkpoint::open(dir.path).size() == 2);
  CHECK(contains(error_of([&] { (void)st::checkpoint::open(dir.path / "none"); }), "no such file or directory"));
}
