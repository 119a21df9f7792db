// zipage::prebuilt: the model loader on the CPU backend (GGUF files and Hugging Face checkpoints), compiled once.
#include "instantiate.hpp"

namespace zipage {
template loaded_model<cpu_backend> load_model<cpu_backend>(const std::filesystem::path&, const cpu_backend&);
}
