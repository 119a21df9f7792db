// OCP FP8 E4M3 (e4m3fn) conversions: every code against a table built here from the format's definition,
// round trips, ties to even, saturation, subnormals, NaN.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "zipage/core/fp8.hpp"

using namespace zipage;

namespace {

// The OCP table, computed independently of fp8.hpp in double precision:
// (-1)^s x 2^(e-7) x (1 + m/8) for e > 0, (-1)^s x 2^-6 x m/8 for e = 0, NaN for e = 15, m = 7.
double ocp_value(int code) {
  const int s = (code >> 7) & 1, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -magnitude : magnitude;
}

std::vector<double> finite_values_ascending() {  // the non-negative finite values, codes 0x00 .. 0x7e
  std::vector<double> v;
  for (int c = 0; c < 0x7f; ++c) v.push_back(ocp_value(c));
  return v;
}

}  // namespace

TEST_CASE("fp8 e4m3: all 256 codes decode to the OCP table") {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = ocp_value(c);
    const float got = fp8_e4m3_to_f32(static_cast<std::uint8_t>(c));
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      CHECK(std::signbit(got) == (c >= 0x80));
      CHECK(fp8_e4m3_is_nan(static_cast<std::uint8_t>(c)));
      ++nans;
      continue;
    }
    CAPTURE(c);
    CHECK(static_cast<double>(got) == want);
    CHECK(std::signbit(got) == (c >= 0x80));  // -0 is 0x80
  }
  CHECK(nans == 2);  // 0x7f and 0xff only: no infinities
  CHECK(fp8_e4m3_to_f32(0x7e) == 448.0f);
  CHECK(fp8_e4m3_to_f32(0xfe) == -448.0f);
  CHECK(fp8_e4m3_to_f32(0x01) == 0x1p-9f);   // smallest subnormal
  CHECK(fp8_e4m3_to_f32(0x07) == 7 * 0x1p-9f);  // largest subnormal
  CHECK(fp8_e4m3_to_f32(0x08) == 0x1p-6f);   // smallest normal
  CHECK(fp8_e4m3_to_f32(0x38) == 1.0f);
}

TEST_CASE("fp8 e4m3: encode(decode(c)) == c for every non-NaN code") {
  for (int c = 0; c < 256; ++c) {
    if (fp8_e4m3_is_nan(static_cast<std::uint8_t>(c))) continue;
    CAPTURE(c);
    CHECK(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<std::uint8_t>(c))) == c);
  }
}

TEST_CASE("fp8 e4m3: midpoints round to the even code, values beside them to the nearer one") {
  const auto v = finite_values_ascending();
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const double lo = v[i], hi = v[i + 1];
    const double mid = (lo + hi) / 2;  // exact in double, and in float (at most 5 significant bits)
    const auto fmid = static_cast<float>(mid);
    REQUIRE(static_cast<double>(fmid) == mid);
    CAPTURE(lo);
    CAPTURE(hi);
    const auto even = static_cast<std::uint8_t>(i % 2 == 0 ? i : i + 1);  // codes are consecutive here
    CHECK(f32_to_fp8_e4m3(fmid) == even);
    CHECK(f32_to_fp8_e4m3(-fmid) == (0x80 | even));
    CHECK(f32_to_fp8_e4m3(std::nextafter(fmid, 0.0f)) == i);
    CHECK(f32_to_fp8_e4m3(std::nextafter(fmid, 1000.0f)) == i + 1);
  }
}

TEST_CASE("fp8 e4m3: every fp32 between two codes goes to the nearer one (dense sweep)") {
  // Every 97th fp32 bit pattern from 0 to 480, and its negation: the result is a nearest code (ties to
  // even are checked above), and saturates at and above 448.
  const auto v = finite_values_ascending();
  int checked = 0, wrong = 0;
  for (std::uint32_t bits = 0; bits <= std::bit_cast<std::uint32_t>(480.0f); bits += 97, ++checked) {
    const float x = std::bit_cast<float>(bits);
    const std::uint8_t c = f32_to_fp8_e4m3(x);
    bool ok = c <= 0x7e && f32_to_fp8_e4m3(-x) == (0x80 | c);
    if (ok && x >= 448.0f) {
      ok = c == 0x7e;
    } else if (ok) {
      const double err = std::abs(v[c] - x);
      ok = (c == 0 || err <= std::abs(v[c - 1] - x)) && (c == 0x7e || err <= std::abs(v[c + 1] - x));
    }
    if (!ok && wrong++ < 5) MESSAGE("x = ", x, " -> code ", int(c));
  }
  CHECK(checked > 10000000);
  CHECK(wrong == 0);
}

TEST_CASE("fp8 e4m3: saturation, infinities, NaN, zeros, subnormals") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  CHECK(f32_to_fp8_e4m3(448.0f) == 0x7e);
  CHECK(f32_to_fp8_e4m3(463.99f) == 0x7e);  // below the would-be midpoint to 480
  CHECK(f32_to_fp8_e4m3(464.0f) == 0x7e);   // saturates rather than becoming NaN
  CHECK(f32_to_fp8_e4m3(1e30f) == 0x7e);
  CHECK(f32_to_fp8_e4m3(-1e30f) == 0xfe);
  CHECK(f32_to_fp8_e4m3(std::numeric_limits<float>::max()) == 0x7e);
  CHECK(f32_to_fp8_e4m3(inf) == 0x7e);
  CHECK(f32_to_fp8_e4m3(-inf) == 0xfe);
  CHECK(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()) == 0x7f);
  CHECK(f32_to_fp8_e4m3(-std::numeric_limits<float>::quiet_NaN()) == 0xff);
  CHECK(f32_to_fp8_e4m3(std::bit_cast<float>(0x7f800001u)) == 0x7f);  // a signalling NaN
  CHECK(std::isnan(fp8_e4m3_round(std::numeric_limits<float>::quiet_NaN())));
  CHECK(f32_to_fp8_e4m3(0.0f) == 0x00);
  CHECK(f32_to_fp8_e4m3(-0.0f) == 0x80);
  // Subnormals: multiples of 2^-9 up to 7 x 2^-9; the boundaries round to even.
  CHECK(f32_to_fp8_e4m3(0x1p-10f) == 0x00);          // half the smallest subnormal: tie to 0
  CHECK(f32_to_fp8_e4m3(-0x1p-10f) == 0x80);
  CHECK(f32_to_fp8_e4m3(std::nextafter(0x1p-10f, 1.0f)) == 0x01);
  CHECK(f32_to_fp8_e4m3(1.5f * 0x1p-9f) == 0x02);    // tie between 1 and 2: to 2
  CHECK(f32_to_fp8_e4m3(2.5f * 0x1p-9f) == 0x02);    // tie between 2 and 3: to 2
  CHECK(f32_to_fp8_e4m3(7.5f * 0x1p-9f) == 0x08);    // tie between 7 x 2^-9 and 2^-6: to the normal 0x08
  CHECK(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()) == 0x00);
  CHECK(f32_to_fp8_e4m3(std::numeric_limits<float>::min()) == 0x00);
  // Normals: 1 + 1/16 is a tie between 1 (0x38, even) and 1.125 (0x39).
  CHECK(f32_to_fp8_e4m3(1.0625f) == 0x38);
  CHECK(f32_to_fp8_e4m3(1.1875f) == 0x3a);  // tie between 1.125 (odd) and 1.25: to 1.25
  CHECK(f32_to_fp8_e4m3(1.9375f) == 0x40);  // tie between 1.875 (0x3f, odd) and 2.0: carries the exponent
  CHECK(f32_to_fp8_e4m3(432.0f) == 0x7e);   // tie between 416 (0x7d, odd) and 448
  CHECK(f32_to_fp8_e4m3(-3.0f) == 0xc4);
}
