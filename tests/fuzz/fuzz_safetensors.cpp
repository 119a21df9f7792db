// safetensors: the 8-byte header length, the JSON header (dtypes, shapes, data_offsets, __metadata__), the
// tensor table tiling the data section; every loadable tensor converted to fp32 through a checkpoint, every
// F8_E4M3 tensor's codes read.
#include "fuzz_common.hpp"

#include "zipage/safetensors/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  zipage_fuzz::expect_only_zipage_errors([&] {
    auto f = zipage::safetensors::file::from_bytes(zipage_fuzz::bytes(data, size), "fuzz.safetensors");
    for (const auto& t : f.tensors()) {
      zipage_fuzz::require(f.owns(t));
      zipage_fuzz::require(t.nbytes <= size);
    }
    const auto ckpt = zipage::safetensors::checkpoint::from_file(std::move(f));
    for (const auto* t : ckpt.tensors()) {
      zipage_fuzz::require(ckpt.find(t->name) == t);
      zipage_fuzz::expect_only_zipage_errors([&] { (void)ckpt.to_f32(*t); });
      zipage_fuzz::expect_only_zipage_errors([&] {  // FP8 checkpoints' codes: exactly the tensor's bytes
        const auto codes = ckpt.fp8_e4m3_codes(*t);
        zipage_fuzz::require(codes.size() == t->nbytes && codes.size() == static_cast<std::size_t>(t->num_elements()));
      });
    }
  });
  return 0;
}
