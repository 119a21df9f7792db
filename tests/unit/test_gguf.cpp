// Tests for the GGUF reader and writer: the bundled model, writer->reader round trips, and a
// catalogue of corrupt files that must each fail with a zipage::error naming the problem.
#include <doctest/doctest.h>

#include "test_support.hpp"

#include <zipage/gguf/gguf.hpp>
#include <zipage/gguf/writer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

namespace gg = zipage::gguf;
namespace fs = std::filesystem;
using bytes = std::vector<std::byte>;

namespace {

using zipage::testing::contains;
using zipage::testing::error_of;
using zipage::testing::temp_dir;

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

gg::file parse(bytes b) { return gg::file::from_bytes(std::move(b), "test.gguf"); }

std::string parse_error(bytes b) {
  return error_of([&] { parse(std::move(b)); });
}

// Overwrites the bytes at `at` with x (for patching one field of a valid file).
template <class T>
void poke(bytes& b, std::size_t at, T x) {
  std::memcpy(b.data() + at, &x, sizeof(T));
}

// A small valid file with metadata of every shape (scalars, strings, arrays, nested arrays)
// and two tensors.
gg::writer small_writer() {
  gg::writer w;
  w.set("general.architecture", "llama");
  w.set("llama.block_count", 2u);
  w.set("general.flag", true);
  w.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "bc", ""});
  w.set("tokenizer.ggml.scores", std::vector<float>{0.5f, -1.0f, 2.0f});
  w.set("bools", gg::value::array_of(std::vector<bool>{true, false}));
  w.set("nested", gg::value::array_of_arrays({gg::value::array_of(std::vector<std::int64_t>{-1}),
                                              gg::value::array_of(std::vector<std::string>{"s"})}));
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  w.add_tensor("a", {3, 2}, gg::tensor_type::f32, values);
  w.add_tensor("b", {2}, gg::tensor_type::f16, std::span(values).first(2));
  return w;
}

// One hand-written tensor info; each corruption test breaks one field of an otherwise valid file.
struct raw_tensor {
  std::string name = "w";
  std::vector<std::uint64_t> dims = {4};
  std::uint32_t type = 0;  // F32
  std::uint64_t offset = 0;
};

void put_header(gg::encoder& e, std::uint64_t tensors, std::uint64_t kvs,
                std::uint32_t version = 3) {
  e.put_bytes(std::as_bytes(std::span("GGUF", 4)));
  e.put<std::uint32_t>(version).put<std::uint64_t>(tensors).put<std::uint64_t>(kvs);
}

void put_tensor_info(gg::encoder& e, const raw_tensor& t) {
  e.put_string(t.name).put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
  for (std::uint64_t d : t.dims) e.put<std::uint64_t>(d);
  e.put<std::uint32_t>(t.type).put<std::uint64_t>(t.offset);
}

// v3 file: no metadata, the given tensor infos, padding to 32, then data_bytes zero bytes.
bytes craft_tensors(const std::vector<raw_tensor>& tensors, std::size_t data_bytes = 16) {
  gg::encoder e;
  put_header(e, tensors.size(), 0);
  for (const auto& t : tensors) put_tensor_info(e, t);
  e.pad_to(32);
  e.bytes().resize(e.size() + data_bytes);
  return e.take();
}

// v3 file with no tensors and `count` metadata entries written by `body`.
bytes craft_kvs(std::uint64_t count, const std::function<void(gg::encoder&)>& body) {
  gg::encoder e;
  put_header(e, 0, count);
  body(e);
  return e.take();
}

// Reads every metadata value and tensor of a file that parsed, to prove it is self-consistent.
void touch_everything(const gg::file& f) {
  for (const auto& key : f.keys()) CHECK_FALSE(f.find(key)->to_string().empty());
  for (const auto& t : f.tensors()) {
    CHECK(f.to_f32(t).size() == static_cast<std::size_t>(t.num_elements()));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The bundled model
// ---------------------------------------------------------------------------------------------

TEST_CASE("gguf: bundled stories260K model") {
  gg::file f = gg::file::open(ZIPAGE_TEST_MODEL);
  CHECK(contains(f.name(), "stories260K.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);  // no general.alignment key: the default
  CHECK_FALSE(f.has("general.alignment"));

  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_string("tokenizer.ggml.model") == "llama");
  CHECK(f.get_int("llama.block_count") == 5);
  CHECK(f.get_int("llama.embedding_length") == 64);
  CHECK(f.get_int("llama.feed_forward_length") == 172);
  CHECK(f.get_int("llama.context_length") == 2048);
  CHECK(f.get_int("llama.attention.head_count") == 8);
  CHECK(f.get_int("llama.attention.head_count_kv") == 4);
  CHECK(f.get_int("llama.rope.dimension_count") == 8);
  CHECK(f.get_int("tokenizer.ggml.bos_token_id") == 1);
  CHECK(f.get_int("tokenizer.ggml.eos_token_id") == 2);
  CHECK(f.get_int("tokenizer.ggml.seperator_token_id") == 4294967295);  // uint32 max, kept exact
  CHECK(f.find("llama.block_count")->type() == gg::value_type::uint32);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon") ==
        doctest::Approx(1e-5).epsilon(1e-6));
  CHECK(f.get_float("llama.rope.freq_base", 10000.0) == 10000.0);  // absent: fallback
  CHECK(f.keys().size() == 19);
  CHECK(f.keys().front() == "tokenizer.ggml.tokens");

  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  REQUIRE(tokens.size() == 512);
  CHECK(tokens[0] == "<unk>");
  CHECK(tokens[1] == "<s>");
  CHECK(tokens[2] == "</s>");
  CHECK(tokens[3] == "<0x00>");
  CHECK(f.get_float_array("tokenizer.ggml.scores").size() == 512);
  const auto token_types = f.get_int_array("tokenizer.ggml.token_type");
  REQUIRE(token_types.size() == 512);
  CHECK(token_types[0] == 2);  // unknown
  CHECK(token_types[1] == 3);  // control
  CHECK(token_types[3] == 6);  // byte

  // 1 embedding + 1 norm + 1 output + 5 blocks x 9 tensors.
  REQUIRE(f.tensors().size() == 48);
  const gg::tensor_info& embd = f.tensor("token_embd.weight");
  CHECK(embd.type == gg::tensor_type::f32);
  CHECK(embd.dims == std::vector<std::int64_t>{64, 512});
  CHECK(embd.num_elements() == 64 * 512);
  CHECK(embd.nbytes == 64 * 512 * 4);
  CHECK(embd.offset == 0);
  CHECK(f.tensor("output_norm.weight").dims == std::vector<std::int64_t>{64});
  CHECK(f.tensor("blk.0.attn_k.weight").dims == std::vector<std::int64_t>{64, 32});
  CHECK(f.tensor("blk.4.ffn_down.weight").dims == std::vector<std::int64_t>{172, 64});
  CHECK(f.find_tensor("blk.5.attn_q.weight") == nullptr);
  // Header ends at byte 14152, so the data section starts at the next multiple of 32, and the
  // last tensor (blk.4.ffn_norm.weight, 64 floats) ends exactly at the end of the file.
  CHECK(f.data_offset() == 14176);
  const auto& last = f.tensors().back();
  CHECK(last.name == "blk.4.ffn_norm.weight");
  CHECK(f.data_offset() + last.offset + last.nbytes == f.size_bytes());
  CHECK(f.size_bytes() == 1185376);

  const std::vector<float> e = f.to_f32(embd);
  REQUIRE(e.size() == 64 * 512);
  bool all_finite = true, any_nonzero = false;
  for (float x : e) {
    all_finite = all_finite && std::isfinite(x);
    any_nonzero = any_nonzero || x != 0.0f;
  }
  CHECK(all_finite);
  CHECK(any_nonzero);
  CHECK(std::memcmp(e.data(), embd.data, embd.nbytes) == 0);  // f32 is copied verbatim
  for (const auto& t : f.tensors()) {
    const auto xs = f.to_f32(t);
    INFO("tensor ", t.name);
    CHECK(std::all_of(xs.begin(), xs.end(), [](float x) { return std::isfinite(x); }));
  }

  // Moving the file keeps tensor pointers valid (the mapping does not move).
  const std::byte* data = embd.data;
  gg::file moved = std::move(f);
  CHECK(moved.tensor("token_embd.weight").data == data);
  CHECK(moved.to_f32(moved.tensor("token_embd.weight")) == e);
}

TEST_CASE("gguf: file is move-only") {
  static_assert(!std::is_copy_constructible_v<gg::file>);
  static_assert(!std::is_copy_assignable_v<gg::file>);
  static_assert(std::is_nothrow_move_constructible_v<gg::file>);
  static_assert(std::is_nothrow_move_assignable_v<gg::file>);
}

// ---------------------------------------------------------------------------------------------
// Half-precision conversions
// ---------------------------------------------------------------------------------------------

TEST_CASE("gguf: fp16 conversions") {
  CHECK(gg::fp16_to_f32(0x3c00) == 1.0f);
  CHECK(gg::fp16_to_f32(0xc000) == -2.0f);
  CHECK(gg::fp16_to_f32(0x7bff) == 65504.0f);
  CHECK(gg::fp16_to_f32(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(gg::fp16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(gg::fp16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(gg::fp16_to_f32(0x8000) == 0.0f);
  CHECK(std::signbit(gg::fp16_to_f32(0x8000)));
  CHECK(gg::fp16_to_f32(0x7c00) == std::numeric_limits<float>::infinity());
  CHECK(gg::fp16_to_f32(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(gg::fp16_to_f32(0x7e00)));
  CHECK(std::isnan(gg::fp16_to_f32(0x7c01)));  // signalling-NaN pattern is still NaN

  // Every half value survives fp16 -> fp32 -> fp16 bit-exactly (NaNs stay NaN).
  int mismatches = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = gg::fp16_to_f32(static_cast<std::uint16_t>(h));
    const std::uint16_t back = gg::f32_to_fp16(f);
    if (std::isnan(f)) {
      mismatches += std::isnan(gg::fp16_to_f32(back)) ? 0 : 1;
    } else {
      mismatches += back == h ? 0 : 1;
    }
  }
  CHECK(mismatches == 0);

  // Round to nearest, ties to even.
  CHECK(gg::f32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie -> even (down)
  CHECK(gg::f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie -> even (up)
  CHECK(gg::f32_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01);
  CHECK(gg::f32_to_fp16(65519.0f) == 0x7bff);
  CHECK(gg::f32_to_fp16(65520.0f) == 0x7c00);  // halfway to 2^16 rounds to inf
  CHECK(gg::f32_to_fp16(-1e10f) == 0xfc00);
  CHECK(gg::f32_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24 -> 0
  CHECK(gg::f32_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(gg::f32_to_fp16(std::ldexp(1.0f, -30)) == 0x0000);
  CHECK(gg::f32_to_fp16(-std::ldexp(1.0f, -30)) == 0x8000);
  CHECK(gg::f32_to_fp16(std::ldexp(1023.5f, -24)) == 0x0400);  // carries into the smallest normal
  CHECK(gg::f32_to_fp16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(std::isnan(gg::fp16_to_f32(gg::f32_to_fp16(std::nanf("")))));
}

TEST_CASE("gguf: bf16 conversions") {
  CHECK(gg::bf16_to_f32(0x3f80) == 1.0f);
  CHECK(gg::bf16_to_f32(0xc040) == -3.0f);
  CHECK(gg::bf16_to_f32(0x7f80) == std::numeric_limits<float>::infinity());
  CHECK(gg::bf16_to_f32(0x0001) == std::bit_cast<float>(0x00010000u));  // subnormal
  CHECK(std::isnan(gg::bf16_to_f32(0x7fc0)));
  CHECK(gg::f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie -> even (down)
  CHECK(gg::f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie -> even (up)
  CHECK(gg::f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
  CHECK(gg::f32_to_bf16(-0.0f) == 0x8000);
  CHECK(std::isnan(gg::bf16_to_f32(gg::f32_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low 16 bits must not become inf.
  CHECK(std::isnan(gg::bf16_to_f32(gg::f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  int mismatches = 0;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = gg::bf16_to_f32(static_cast<std::uint16_t>(b));
    if (!std::isnan(f)) mismatches += gg::f32_to_bf16(f) == b ? 0 : 1;
  }
  CHECK(mismatches == 0);
}

// ---------------------------------------------------------------------------------------------
// Writer -> reader round trips
// ---------------------------------------------------------------------------------------------

namespace {
// Special values followed by pseudo-random values spread over many magnitudes.
std::vector<float> test_values(std::size_t n) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,  -0.0f,    1.0f,   -1.0f,  0.1f, 65504.0f, -65504.0f,
                          1e-5f, 3e-8f,    1e5f,   inf,    -inf, std::nanf(""), 1e30f};
  std::uint32_t state = 12345;
  while (v.size() < n) {
    state = state * 1664525u + 1013904223u;
    const float mantissa = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;  // [-0.5, 0.5)
    const int exponent = static_cast<int>((state >> 3) % 41) - 25;                // 2^-25 .. 2^15
    v.push_back(std::ldexp(mantissa, exponent));
  }
  v.resize(n);
  return v;
}

// Checks `got` against `want` after storage as `type` (round to nearest: half-ulp error).
void check_precision(gg::tensor_type type, float want, float got) {
  INFO("type ", gg::tensor_type_name(type), ", want ", want, ", got ", got);
  if (std::isnan(want)) {
    CHECK(std::isnan(got));
    return;
  }
  if (type == gg::tensor_type::f32) {
    CHECK(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want));
    return;
  }
  CHECK(std::signbit(got) == std::signbit(want));
  if (std::isinf(want)) {
    CHECK(got == want);
  } else if (type == gg::tensor_type::f16 && std::fabs(want) >= 65520.0f) {
    CHECK(std::isinf(got));  // beyond the fp16 range
  } else if (type == gg::tensor_type::f16) {
    // Unit roundoff 2^-11, or half the subnormal spacing 2^-25 near zero.
    CHECK(std::fabs(got - want) <= std::max(std::fabs(want) * 0x1p-11f, 0x1p-25f));
  } else {
    CHECK(std::fabs(got - want) <= std::fabs(want) * 0x1p-8f);  // bf16: unit roundoff 2^-8
  }
}
}  // namespace

TEST_CASE("gguf: f32 / f16 / bf16 tensors round-trip through writer and reader, v2 and v3") {
  const std::vector<float> values = test_values(48);
  for (std::uint32_t version : {2u, 3u}) {
    gg::writer w;
    w.add_tensor("f32", {4, 3, 2, 2}, gg::tensor_type::f32, values);
    w.add_tensor("f16", {48}, gg::tensor_type::f16, values);
    w.add_tensor("bf16", {6, 8}, gg::tensor_type::bf16, values);
    const gg::file f = parse(w.bytes(version));
    CHECK(f.version() == version);
    REQUIRE(f.tensors().size() == 3);
    CHECK(f.tensors()[0].name == "f32");  // file order is insertion order
    CHECK(f.tensor("f32").dims == std::vector<std::int64_t>{4, 3, 2, 2});
    CHECK(f.tensor("f16").nbytes == 96);
    CHECK(f.tensor("bf16").dims == std::vector<std::int64_t>{6, 8});
    for (const auto& t : f.tensors()) {
      const std::vector<float> got = f.to_f32(t);
      REQUIRE(got.size() == values.size());
      for (std::size_t i = 0; i < values.size(); ++i) check_precision(t.type, values[i], got[i]);
    }
  }
}

TEST_CASE("gguf: metadata of every type round-trips, v2 and v3") {
  const std::int64_t big_negative = -(std::int64_t{1} << 62);
  const std::uint64_t above_int64 = (std::uint64_t{1} << 63) + 5;
  for (std::uint32_t version : {2u, 3u}) {
    gg::writer w;
    w.set("u8", gg::value::of(std::uint8_t{200}));
    w.set("i8", gg::value::of(std::int8_t{-100}));
    w.set("u16", gg::value::of(std::uint16_t{60000}));
    w.set("i16", gg::value::of(std::int16_t{-30000}));
    w.set("u32", 4000000000u);
    w.set("i32", -2000000000);
    w.set("u64", above_int64);
    w.set("i64", big_negative);
    w.set("f32", 1.5f);
    w.set("f64", 1e-300);
    w.set("yes", true);
    w.set("no", false);
    w.set("str", "h\xc3\xa9llo");
    w.set("empty_str", std::string_view());
    w.set("strs", std::vector<std::string>{"x", "", "yz"});
    w.set("floats", std::vector<float>{1.25f, -2.0f});
    w.set("ints", std::vector<std::int32_t>{-1, 0, 7});
    w.set("u8s", gg::value::array_of(std::vector<std::uint8_t>{1, 255}));
    w.set("i16s", gg::value::array_of(std::vector<std::int16_t>{-5, 5}));
    w.set("u64s", gg::value::array_of(std::vector<std::uint64_t>{0, 1ull << 40}));
    w.set("f64s", gg::value::array_of(std::vector<double>{0.25, -8.0}));
    w.set("bools", gg::value::array_of(std::vector<bool>{true, false, true}));
    w.set("empty", gg::value::array_of(std::vector<std::int32_t>{}));
    w.set("nested", gg::value::array_of_arrays(
                        {gg::value::array_of(std::vector<std::int32_t>{1, 2}),
                         gg::value::array_of(std::vector<std::string>{"deep"}),
                         gg::value::array_of_arrays({})}));
    w.set("replaced", 1);
    w.set("replaced", "second");  // replaces the value, keeps the position

    const gg::file f = parse(w.bytes(version));
    CHECK(f.version() == version);
    CHECK(f.keys().size() == 25);
    CHECK(f.keys()[0] == "u8");
    CHECK(f.keys()[24] == "replaced");
    CHECK(f.get_string("replaced") == "second");

    CHECK(f.find("u8")->type() == gg::value_type::uint8);
    CHECK(f.get_int("u8") == 200);
    CHECK(f.get_int("i8") == -100);
    CHECK(f.get_int("u16") == 60000);
    CHECK(f.get_int("i16") == -30000);
    CHECK(f.get_int("u32") == 4000000000);
    CHECK(f.find("i32")->type() == gg::value_type::int32);
    CHECK(f.get_int("i32") == -2000000000);
    CHECK(f.find("u64")->as_uint() == above_int64);
    CHECK(contains(error_of([&] { f.get_int("u64"); }), "does not fit in int64"));
    CHECK(f.get_int("i64") == big_negative);
    CHECK(f.find("f32")->type() == gg::value_type::float32);
    CHECK(f.get_float("f32") == 1.5);
    CHECK(f.find("f64")->type() == gg::value_type::float64);
    CHECK(f.get_float("f64") == 1e-300);
    CHECK(f.get_float("i32") == -2e9);  // integers are numbers too
    CHECK(f.get_bool("yes", false) == true);
    CHECK(f.get_bool("no", true) == false);
    CHECK(f.get_bool("missing", true) == true);
    CHECK(f.get_string("str") == "h\xc3\xa9llo");
    CHECK(f.get_string("empty_str").empty());
    CHECK(f.get_string_array("strs") == std::vector<std::string>{"x", "", "yz"});
    CHECK(f.get_float_array("floats") == std::vector<float>{1.25f, -2.0f});
    CHECK(f.get_int_array("ints") == std::vector<std::int64_t>{-1, 0, 7});
    CHECK(f.find("ints")->element_type() == gg::value_type::int32);
    CHECK(f.get_int_array("u8s") == std::vector<std::int64_t>{1, 255});
    CHECK(f.get_int_array("i16s") == std::vector<std::int64_t>{-5, 5});
    CHECK(f.get_int_array("u64s") == std::vector<std::int64_t>{0, std::int64_t{1} << 40});
    CHECK(f.get_float_array("f64s") == std::vector<float>{0.25f, -8.0f});
    CHECK(f.get_float_array("ints") == std::vector<float>{-1.0f, 0.0f, 7.0f});
    const gg::value& bools = *f.find("bools");
    CHECK(bools.element_type() == gg::value_type::boolean);
    REQUIRE(bools.size() == 3);
    CHECK(bools.at(0).as_bool() == true);
    CHECK(bools.at(1).as_bool() == false);
    CHECK(f.find("empty")->size() == 0);
    CHECK(f.get_int_array("empty").empty());

    const gg::value& nested = *f.find("nested");
    CHECK(nested.type_name() == "array[array]");
    REQUIRE(nested.size() == 3);
    CHECK(nested.arrays()[0].to_int_array() == std::vector<std::int64_t>{1, 2});
    CHECK(nested.at(1).strings() == std::vector<std::string>{"deep"});
    CHECK(nested.at(2).element_type() == gg::value_type::array);
    CHECK(nested.at(2).size() == 0);
    CHECK(nested.to_string() == "[[1, 2], [\"deep\"], []]");
  }
}

TEST_CASE("gguf: general.alignment places the data section and every tensor") {
  const std::vector<float> values = test_values(7);
  for (std::uint32_t alignment : {1u, 2u, 8u, 64u, 256u}) {
    INFO("alignment ", alignment);
    gg::writer w;
    w.set_alignment(alignment);
    w.add_tensor("x", {3}, gg::tensor_type::f16, std::span(values).first(3));  // 6 bytes: odd sizes
    w.add_tensor("y", {7}, gg::tensor_type::f32, values);
    w.add_tensor("z", {1}, gg::tensor_type::bf16, std::span(values).first(1));
    const gg::file f = parse(w.bytes());
    CHECK(f.alignment() == alignment);
    CHECK(f.data_offset() % alignment == 0);
    const auto& ts = f.tensors();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      CHECK(ts[i].offset % alignment == 0);
      CHECK(ts[i].data - ts[0].data == static_cast<std::ptrdiff_t>(ts[i].offset - ts[0].offset));
      if (i > 0) CHECK(ts[i].offset >= ts[i - 1].offset + ts[i - 1].nbytes);  // no overlap
    }
    const auto y = f.to_f32(f.tensor("y"));
    for (std::size_t i = 0; i < values.size(); ++i) {
      check_precision(gg::tensor_type::f32, values[i], y[i]);
    }
  }
  // With alignment 1 an f16 tensor can start at an odd address; reads must still work.
  gg::writer w;
  w.set_alignment(1);
  const float one = 1.0f, half = 0.5f;
  w.add_tensor("odd", {1}, gg::tensor_type::bf16, std::span(&one, 1));
  w.add_tensor("f16", {1}, gg::tensor_type::f16, std::span(&half, 1));
  const gg::file f = parse(w.bytes());
  CHECK(f.data_offset() % 2 == 1);  // so "f16" starts at an odd offset
  CHECK(f.tensor("f16").offset == 2);
  CHECK(f.to_f32(f.tensor("f16")) == std::vector<float>{0.5f});
}

TEST_CASE("gguf: writer::write and file::open round trip") {
  temp_dir dir;
  const fs::path path = dir.path / "tiny.gguf";
  small_writer().write(path, 2);
  const gg::file f = gg::file::open(path);
  CHECK(f.name() == path.string());
  CHECK(f.version() == 2);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"a", "bc", ""});
  CHECK(f.to_f32(f.tensor("a")) == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(f.to_f32(f.tensor("b")) == std::vector<float>{1, 2});

  const std::string bad_dir = (dir.path / "no_such_dir" / "x.gguf").string();
  CHECK(contains(error_of([&] { small_writer().write(bad_dir); }), bad_dir));
}

TEST_CASE("gguf: writer rejects invalid input") {
  gg::writer w;
  const std::vector<float> v(6, 1.0f);
  CHECK(contains(error_of([&] { w.add_tensor("t", {4}, gg::tensor_type::f32, v); }),
                 "6 values but its dims hold 4"));
  CHECK(contains(error_of([&] { w.add_tensor("t", {}, gg::tensor_type::f32, v); }), "1 to 4 dims"));
  CHECK(contains(error_of([&] { w.add_tensor("t", {6, 0}, gg::tensor_type::f32, v); }),
                 "dimension 0"));
  CHECK(contains(error_of([&] { w.add_tensor("", {6}, gg::tensor_type::f32, v); }),
                 "empty tensor name"));
  w.add_tensor("t", {6}, gg::tensor_type::f32, v);
  CHECK(contains(error_of([&] { w.add_tensor("t", {6}, gg::tensor_type::f16, v); }),
                 "duplicate tensor 't'"));
  CHECK(contains(error_of([&] { w.set_alignment(3); }), "power of two"));
  CHECK(contains(error_of([&] { w.bytes(1); }), "not 1"));
  CHECK(
      contains(error_of([&] { gg::value::array_of_arrays({gg::value::of(1)}); }), "not an array"));
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: each must throw a zipage::error naming the file and the problem
// ---------------------------------------------------------------------------------------------

TEST_CASE("gguf: hand-crafted baselines parse") {
  // The corruption tests below change one field of these; make sure the unbroken ones are valid.
  const gg::file f = parse(craft_tensors({raw_tensor{}}));
  CHECK(f.tensor("w").nbytes == 16);
  CHECK(f.to_f32(f.tensor("w")) == std::vector<float>(4, 0.0f));
  const gg::file g =
      parse(craft_kvs(1, [](gg::encoder& e) { e.put_string("k").put_value(gg::value::of(7)); }));
  CHECK(g.get_int("k") == 7);
  CHECK(parse(craft_kvs(0, [](gg::encoder&) {})).keys().empty());
}

TEST_CASE("gguf: bad magic and unsupported versions") {
  const bytes good = small_writer().bytes();
  bytes b = good;
  b[3] = std::byte{'X'};
  std::string msg = parse_error(b);
  CHECK(contains(msg, "test.gguf"));
  CHECK(contains(msg, "not a GGUF file (magic is 'GGUX'"));
  CHECK(contains(parse_error(bytes(2, std::byte{'G'})), "too small"));
  CHECK(contains(parse_error({}), "too small"));

  b = good;
  poke<std::uint32_t>(b, 4, 1);
  msg = parse_error(b);
  CHECK(contains(msg, "test.gguf"));
  CHECK(contains(msg, "version 1 is not supported"));
  poke<std::uint32_t>(b, 4, 99);
  CHECK(contains(parse_error(b), "unsupported GGUF version 99"));
  poke<std::uint32_t>(b, 4, 0);
  CHECK(contains(parse_error(b), "unsupported GGUF version 0"));
  poke<std::uint32_t>(b, 4, 0x03000000);
  CHECK(contains(parse_error(b), "big-endian"));
}

TEST_CASE("gguf: every truncation of a valid file is rejected") {
  const bytes good = small_writer().bytes();
  REQUIRE_NOTHROW(parse(good));
  int rejected = 0;
  for (std::size_t length = 0; length < good.size(); ++length) {
    const std::string msg =
        parse_error(bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(length)));
    INFO("prefix length ", length, ": ", msg);
    CHECK(contains(msg, "test.gguf: "));
    rejected += contains(msg, "test.gguf: ") ? 1 : 0;
  }
  CHECK(rejected == static_cast<int>(good.size()));
}

TEST_CASE("gguf: single-byte corruptions either parse consistently or throw zipage::error") {
  const bytes good = small_writer().bytes();
  int parsed = 0, rejected = 0;
  for (std::size_t at = 0; at < good.size(); ++at) {
    for (std::uint8_t replacement : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      bytes b = good;
      b[at] = std::byte{replacement};
      try {
        const gg::file f = parse(std::move(b));
        touch_everything(f);
        ++parsed;
      } catch (const zipage::error& e) {
        REQUIRE(contains(e.what(), "test.gguf"));
        ++rejected;
      }
    }
  }
  CHECK(parsed > 0);    // e.g. changes inside string contents or tensor data
  CHECK(rejected > 0);  // e.g. changes to counts, lengths and types
}

TEST_CASE("gguf: random multi-byte corruptions either parse consistently or throw zipage::error") {
  const bytes good = small_writer().bytes();
  std::uint64_t state = 0x9e3779b97f4a7c15ull;  // fixed seed: failures are reproducible
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    bytes b = good;
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int i = 0; i < edits; ++i) b[next() % b.size()] = static_cast<std::byte>(next());
    if (next() % 4 == 0) b.resize(next() % b.size());  // sometimes truncate as well
    try {
      touch_everything(parse(std::move(b)));
    } catch (const zipage::error& e) {
      REQUIRE(contains(e.what(), "test.gguf"));
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("gguf: impossible counts and lengths are rejected before allocating") {
  // Tensor and metadata counts, followed by `extra` zero bytes.
  auto header_only = [](std::uint64_t tensors, std::uint64_t kvs, std::size_t extra) {
    gg::encoder e;
    put_header(e, tensors, kvs);
    e.bytes().resize(e.size() + extra);
    return e.take();
  };
  CHECK(contains(parse_error(header_only(0, u64_max / 2, 100)), "cannot fit"));
  CHECK(contains(parse_error(header_only(u64_max, 0, 100)), "claims 18446744073709551615 tensors"));
  // 400 tensor infos (>= 13200 bytes) or 1000 entries (>= 14000 bytes) fit alone, not together.
  CHECK(contains(
      parse_error(header_only(400, 1000, 20000)),
      "claims 400 tensors and 1000 metadata entries, which cannot fit in the 20000 bytes"));

  // A key length beyond the file.
  std::string msg = parse_error(craft_kvs(1, [](gg::encoder& b) {
    b.put<std::uint64_t>(u64_max).put<std::uint64_t>(0).put<std::uint64_t>(0);
  }));
  CHECK(contains(msg, "metadata entry 0: key at offset 24 claims 18446744073709551615 bytes"));
  // A string value length beyond the file.
  msg = parse_error(craft_kvs(1, [](gg::encoder& b) {
    b.put_string("s").put<std::uint32_t>(8).put<std::uint64_t>(1ull << 40).put_string("padding");
  }));
  CHECK(contains(msg, "metadata 's': string value"));
  CHECK(contains(msg, "claims 1099511627776 bytes"));
  // Array lengths beyond the file, for scalar, string and nested-array elements.
  for (std::uint32_t element : {4u, 8u, 9u, 10u}) {
    msg = parse_error(craft_kvs(1, [&](gg::encoder& b) {
      b.put_string("arr").put<std::uint32_t>(9).put<std::uint32_t>(element);
      b.put<std::uint64_t>(u64_max / 2).put_string("some more bytes");
    }));
    CHECK(contains(msg, "metadata 'arr': array of 9223372036854775807"));
    CHECK(contains(msg, "cannot fit"));
  }
  // An array length that fits a count check for 1-byte elements but not the actual bytes.
  msg = parse_error(craft_kvs(1, [](gg::encoder& b) {
    b.put_string("arr").put<std::uint32_t>(9).put<std::uint32_t>(0).put<std::uint64_t>(10);
    b.put<std::uint32_t>(0);
  }));
  CHECK(contains(msg, "cannot fit in the 4 bytes left"));
}

TEST_CASE("gguf: invalid metadata is rejected") {
  auto kv = [](std::string key, std::uint32_t type,
               const std::function<void(gg::encoder&)>& payload) {
    return craft_kvs(1, [&](gg::encoder& e) {
      e.put_string(key).put<std::uint32_t>(type);
      payload(e);
    });
  };
  CHECK(contains(parse_error(kv("k", 13, [](gg::encoder& e) { e.put<std::uint32_t>(0); })),
                 "metadata 'k': invalid value type 13"));
  CHECK(contains(parse_error(kv("k", 0xffffffff, [](gg::encoder& e) { e.put<std::uint32_t>(0); })),
                 "invalid value type 4294967295"));
  CHECK(contains(parse_error(kv("k", 9, [](gg::encoder& e) {
                   e.put<std::uint32_t>(99).put<std::uint64_t>(0);
                 })),
                 "invalid array element type 99"));
  CHECK(contains(parse_error(kv("flag", 7, [](gg::encoder& e) { e.put<std::uint8_t>(2); })),
                 "metadata 'flag': bool value 2 is neither 0 nor 1"));
  CHECK(contains(
      parse_error(kv(
          "flags", 9,
          [](gg::encoder& e) {
            e.put<std::uint32_t>(7).put<std::uint64_t>(2).put<std::uint8_t>(1).put<std::uint8_t>(9);
          })),
      "bool value 9"));
  CHECK(contains(parse_error(kv("", 4, [](gg::encoder& e) { e.put<std::uint32_t>(0); })),
                 "empty key"));
  CHECK(contains(parse_error(kv("k", 4, [](gg::encoder& e) { e.put<std::uint16_t>(0); })),
                 "unexpected end of file"));

  // Duplicate keys.
  const std::string msg = parse_error(craft_kvs(2, [](gg::encoder& e) {
    e.put_string("dup").put_value(gg::value::of(1));
    e.put_string("dup").put_value(gg::value::of(2));
  }));
  CHECK(contains(msg, "test.gguf: metadata 'dup': duplicate key"));
}

TEST_CASE("gguf: array nesting depth is limited") {
  auto nested = [](int depth) {
    gg::value v = gg::value::array_of(std::vector<std::int32_t>{42});
    for (int i = 1; i < depth; ++i) v = gg::value::array_of_arrays({v});
    gg::writer w;
    w.set("deep", v);
    return w.bytes();
  };
  const gg::file f = parse(nested(8));
  const gg::value* v = f.find("deep");
  for (int i = 1; i < 8; ++i) v = &v->arrays().at(0);
  CHECK(v->to_int_array() == std::vector<std::int64_t>{42});
  CHECK(contains(parse_error(nested(9)), "metadata 'deep': arrays nested more than 8 deep"));
  CHECK(contains(parse_error(nested(200)), "nested"));
}

TEST_CASE("gguf: general.alignment must be a power of two integer") {
  for (std::uint32_t bad : {0u, 3u, 48u}) {
    const std::string msg = parse_error(craft_kvs(1, [&](gg::encoder& e) {
      e.put_string("general.alignment").put_value(gg::value::of(bad));
    }));
    CHECK(contains(msg, "general.alignment"));
    CHECK(contains(msg, "power of two"));
  }
  CHECK(contains(parse_error(craft_kvs(1, [](gg::encoder& e) {
                   e.put_string("general.alignment").put_value(gg::value::of("32"));
                 })),
                 "must be an integer, not string"));
}

TEST_CASE("gguf: invalid tensor infos are rejected") {
  auto tensor_error = [](raw_tensor t, std::size_t data_bytes = 16) {
    return parse_error(craft_tensors({std::move(t)}, data_bytes));
  };
  // Data outside the file.
  // Header: 24 bytes + tensor info 8 + 19 + 4 + 8 + 4 + 8 = 75, so data starts at 96.
  std::string msg = tensor_error({.name = "blk.0.attn_q.weight", .offset = 32});
  CHECK(contains(msg,
                 "test.gguf: tensor 'blk.0.attn_q.weight': data [offset 32, 16 bytes] runs past "
                 "the end of the file (data section starts at 96, file size 112)"));
  CHECK(contains(tensor_error({}, 15), "runs past the end"));  // one byte short
  CHECK(contains(tensor_error({.offset = u64_max - 31}), "runs past the end"));  // no wrap-around
  CHECK(contains(tensor_error({.dims = {1 << 20, 1 << 20}}), "runs past the end"));
  // Alignment, type, dims.
  CHECK(contains(tensor_error({.offset = 4}), "tensor 'w': data offset 4 is not a multiple of the "
                                               "alignment (32)"));
  CHECK(contains(tensor_error({.type = 16}), "tensor 'w': type IQ2_XXS (16) is not supported"));
  CHECK(contains(tensor_error({.type = 19}), "IQ1_S (19)"));
  CHECK(contains(tensor_error({.type = 15}), "Q8_K (15)"));  // ggml's scratch type, never in a model
  // Quantised rows are whole blocks.
  CHECK(contains(tensor_error({.type = 12}),
                 "tensor 'w': type Q4_K stores rows in blocks of 256 values, but its rows (dimension 0) are 4 long"));
  CHECK(contains(tensor_error({.dims = {48}, .type = 8}), "type Q8_0 stores rows in blocks of 32 values"));
  CHECK(contains(tensor_error({.dims = {32}, .type = 8}), "runs past the end"));  // 34 bytes, 16 in the file
  CHECK_NOTHROW(parse(craft_tensors({raw_tensor{.dims = {32, 2}, .type = 2}}, 36)));  // two Q4_0 blocks
  CHECK(contains(tensor_error({.type = 28}), "F64 (28)"));
  CHECK(contains(tensor_error({.type = 1000}), "unknown (1000)"));
  CHECK(contains(tensor_error({.dims = {0}}), "tensor 'w': dimension 0 is 0 (must be positive)"));
  CHECK(contains(tensor_error({.dims = {4, 0}}), "dimension 1 is 0"));
  CHECK(contains(tensor_error({.dims = {u64_max}}), "dimension 0 is -1"));
  CHECK(contains(tensor_error({.dims = {}}), "has 0 dimensions (must be 1 to 4)"));
  CHECK(contains(tensor_error({.dims = {1, 1, 1, 1, 1}}), "has 5 dimensions"));
  CHECK(contains(tensor_error({.dims = {1ull << 32, 1ull << 32}}),
                 "element count of dims {4294967296, 4294967296} overflows"));
  CHECK(contains(tensor_error({.dims = {1ull << 31, 1ull << 31}}),
                 "byte size of 4611686018427387904 elements x 4 bytes overflows"));
  CHECK(contains(tensor_error({.dims = {1ull << 35, 1ull << 27}, .type = 12}), "runs past the end"));
  CHECK(contains(tensor_error({.name = ""}), "tensor info 0: empty tensor name"));
  msg = tensor_error({.name = std::string(200, 'n'), .type = 16});
  // Long names are cut in messages.
  CHECK(contains(msg, "tensor '" + std::string(96, 'n') + "...': type IQ2_XXS"));

  // Duplicate names; two tensors that are otherwise valid.
  msg = parse_error(
      craft_tensors({raw_tensor{.name = "dup"}, raw_tensor{.name = "dup", .offset = 32}}, 64));
  CHECK(contains(msg, "test.gguf: tensor 'dup': duplicate tensor name"));
  CHECK_NOTHROW(
      parse(craft_tensors({raw_tensor{.name = "a"}, raw_tensor{.name = "b", .offset = 32}}, 64)));
}

TEST_CASE("gguf: getters report missing keys, wrong types and missing tensors") {
  const gg::file f = parse(small_writer().bytes());
  std::string msg = error_of([&] { f.get_string("no.such.key"); });
  CHECK(contains(msg, "test.gguf: missing metadata key 'no.such.key'"));
  CHECK(contains(error_of([&] { f.get_int("absent"); }), "'absent'"));
  CHECK(contains(error_of([&] { f.get_float("absent"); }), "'absent'"));
  CHECK(contains(error_of([&] { f.get_string_array("absent"); }), "'absent'"));
  CHECK(contains(error_of([&] { f.get_float_array("absent"); }), "'absent'"));
  CHECK(contains(error_of([&] { f.get_int_array("absent"); }), "'absent'"));
  CHECK(f.get_int("absent", -3) == -3);
  CHECK(f.find("absent") == nullptr);
  CHECK_FALSE(f.has("absent"));

  msg = error_of([&] { f.get_int("general.architecture"); });
  CHECK(contains(msg, "test.gguf: metadata 'general.architecture' is string, expected an integer"));
  CHECK(contains(error_of([&] { f.get_int("general.architecture", 0); }), "expected an integer"));
  CHECK(contains(error_of([&] { f.get_string("llama.block_count"); }),
                 "is uint32, expected a string"));
  CHECK(contains(error_of([&] { f.get_float("general.architecture"); }), "expected a number"));
  CHECK(
      contains(error_of([&] { f.get_float("general.flag", 1.0); }), "is bool, expected a number"));
  CHECK(contains(error_of([&] { f.get_bool("llama.block_count", false); }),
                 "is uint32, expected a bool"));
  CHECK(contains(error_of([&] { f.get_int("general.flag"); }), "is bool"));
  CHECK(contains(error_of([&] { f.get_string_array("tokenizer.ggml.scores"); }),
                 "is array[float32], expected an array of strings"));
  CHECK(contains(error_of([&] { f.get_float_array("tokenizer.ggml.tokens"); }),
                 "is array[string], expected an array of numbers"));
  CHECK(contains(error_of([&] { f.get_int_array("tokenizer.ggml.scores"); }),
                 "expected an array of integers"));
  CHECK(contains(error_of([&] { f.get_int_array("llama.block_count"); }), "is uint32"));

  msg = error_of([&] { f.tensor("blk.9.attn_q.weight"); });
  CHECK(contains(msg, "test.gguf: missing tensor 'blk.9.attn_q.weight'"));

  // A tensor_info from another file is refused rather than read.
  const gg::file other = parse(small_writer().bytes());
  CHECK(contains(error_of([&] { f.to_f32(other.tensor("a")); }), "does not point into this file"));
  gg::tensor_info forged = f.tensor("a");
  forged.nbytes += 1000;
  CHECK(contains(error_of([&] { f.to_f32(forged); }), "does not point into this file"));
}

TEST_CASE("gguf: file::open reports unusable paths") {
  temp_dir dir;
  const fs::path missing = dir.path / "missing.gguf";
  std::string msg = error_of([&] { gg::file::open(missing); });
  CHECK(contains(msg, missing.string()));
  CHECK(contains(msg, "No such file or directory"));

  msg = error_of([&] { gg::file::open(dir.path); });
  CHECK(contains(msg, dir.path.string()));
  CHECK(contains(msg, "is a directory"));

  const fs::path empty = dir.path / "empty.gguf";
  std::ofstream(empty).close();
  msg = error_of([&] { gg::file::open(empty); });
  CHECK(contains(msg, empty.string()));
  CHECK(contains(msg, "too small"));

  const fs::path text = dir.path / "model.txt";
  std::ofstream(text) << "this is not a model file";
  CHECK(contains(error_of([&] { gg::file::open(text); }), "not a GGUF file"));
}
