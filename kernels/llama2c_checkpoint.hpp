#pragma once
// llama2.c checkpoints (karpathy/llama2.c, legacy "version 0" export): seven int32 header
// fields, then float32 tensors in a fixed order. The tensors are used in place from the mapping.

#include <filesystem>

#include "kernels/model_weights.hpp"

namespace kvtier::kernels {

// Throws DataError for a truncated file, an inconsistent header or a newer (magic "ak42")
// export, naming the header field or tensor at fault.
[[nodiscard]] ModelWeights load_llama2c_checkpoint(const std::filesystem::path& path);

}  // namespace kvtier::kernels
