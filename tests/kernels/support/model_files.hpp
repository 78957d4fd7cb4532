#pragma once
// Test helpers: the stories260K fixture's location, temporary folders, and writers for small
// Hugging Face model directories (config.json + safetensors) built from the fixture or from
// seeded random weights.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "configs/schema/model.pb.h"
#include "kernels/engine.hpp"
#include "kernels/model_weights.hpp"
#include "kernels/tensor.hpp"
#include "tests/support/fixtures.hpp"

namespace kvtier::kernels::testing {

// The stories260K fixture's folder (tests/support/fixtures.hpp; never copied into the repository).
using ::kvtier::test::stories_dir;
// The fixture's checkpoint, loaded once per test program and shared.
[[nodiscard]] std::shared_ptr<const ModelWeights> stories_model();
// `text` encoded with the fixture's tokenizer as a prompt (BOS first).
[[nodiscard]] std::vector<std::int32_t> stories_prompt(const std::string& text);

// The largest difference between the logits of `batched` after one prefill of `prompt` and those
// of `stepwise` after decoding it token by token (both engines fresh, of the same weights).
[[nodiscard]] float prefill_decode_gap(Engine& batched, Engine& stepwise,
                                       std::span<const std::int32_t> prompt);

// A fresh folder under the system temporary folder, removed with everything in it at scope end.
class TempDir {
 public:
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&&) = delete;
  TempDir& operator=(TempDir&&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct TensorToWrite {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<TensorToWrite>& tensors);

// The config.json text of a spec ("LlamaForCausalLM" and so on).
[[nodiscard]] std::string hf_config_text(const config::ModelSpec& spec);

// Writes `model` as a Hugging Face Llama directory: config.json and its weights in `dtype`, in
// `shards` files (with model.safetensors.index.json when more than one). Interleaved-RoPE
// checkpoints get their q/k rows permuted as transformers' conversion script does.
void export_hf_model(const ModelWeights& model, const std::filesystem::path& directory,
                     TensorDtype dtype, int shards);

// Seeded random weights shaped by `spec` (biases and q/k norms as the spec says), as a
// Hugging Face directory.
void write_random_hf_model(const config::ModelSpec& spec, const std::filesystem::path& directory,
                           std::uint64_t seed);

// A small spec of the given architecture with random-model-friendly sizes.
[[nodiscard]] config::ModelSpec small_spec(config::Architecture architecture);

}  // namespace kvtier::kernels::testing
