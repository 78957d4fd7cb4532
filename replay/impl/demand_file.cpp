// Demand files: HDF5 through the traces module's checked C-API helpers (traces/impl/h5.hpp), so
// that every failure is one line naming the file and the dataset, as for traces.

#include "replay/demand_file.hpp"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "common/errors.hpp"
#include "common/temporary_file.hpp"
#include "traces/impl/h5.hpp"

#ifndef KVTIER_VERSION
#define KVTIER_VERSION "unknown"
#endif

namespace kvtier::replay {
namespace {

namespace h5 = traces::h5;
using h5::Blame;
using h5::Handle;

// Dataset names; the per-record moves in StepLayerRecord order.
constexpr const char* kTierTokens = "/tier_tokens";
constexpr const char* kTierMass = "/tier_mass";
constexpr std::array<const char*, 7> kMoves = {"/promoted",           "/demoted",
                                               "/compressed",         "/evicted",
                                               "/newly_host",         "/promoted_from_compressed",
                                               "/compressed_from_hbm"};

// The start placement (ReplayDemand::start): tokens by tier per layer, and the start's moves per
// layer in kMoves order.
constexpr const char* kStartTierTokens = "/start_tier_tokens";
constexpr const char* kStartMoves = "/start_moves";

// Elements per chunk: large enough for deflate, small enough to keep a partial read cheap.
constexpr std::uint64_t kChunkElements = std::uint64_t{1} << 16;

// The record's field behind each of kMoves.
constexpr std::array<std::uint32_t StepLayerRecord::*, kMoves.size()> kMoveFields = {
    &StepLayerRecord::promoted,           &StepLayerRecord::demoted,
    &StepLayerRecord::compressed,         &StepLayerRecord::evicted,
    &StepLayerRecord::newly_host,         &StepLayerRecord::promoted_from_compressed,
    &StepLayerRecord::compressed_from_hbm};

// The attribute holding CompressedFormat::scale_bytes_per_head_vector.
constexpr const char* kScaleBytes = "compressed_scale_bytes_per_head_vector";
// Version 1 recorded neither the T2 format's scales, nor where promotions and compressions came
// from, nor the start placement, so its copy volumes cannot be derived; it is refused rather
// than read with guesses.
constexpr std::uint64_t kUnsplitMovesVersion = 1;

bool is_hex_digest(const std::string& text) {
  return text.size() == 32 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// --- Writing ------------------------------------------------------------------------------

void write_double_attribute(hid_t object, const char* name, double value,
                            const std::string& where_text) {
  const char* what = "cannot write a number attribute";
  const Handle space =
      h5::checked(H5Screate(H5S_SCALAR), H5Sclose, Blame::kOutput, what, where_text);
  const Handle attribute =
      h5::checked(H5Acreate2(object, name, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose, Blame::kOutput, what, where_text);
  h5::check(H5Awrite(attribute.get(), H5T_NATIVE_DOUBLE, &value), Blame::kOutput, what, where_text);
}

void write_dataset(hid_t file, const char* path, hid_t file_type, hid_t memory_type,
                   std::size_t element_bytes, const std::vector<hsize_t>& dims, const void* data,
                   const std::string& name) {
  const std::string where_text = h5::where(name, path);
  std::uint64_t row_elements = 1;
  for (std::size_t i = 1; i < dims.size(); ++i) {
    row_elements *= dims[i];
  }
  std::vector<hsize_t> chunk = dims;
  chunk[0] = std::clamp<hsize_t>(kChunkElements / row_elements, 1, dims[0]);
  const Handle space =
      h5::checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose,
                  Blame::kOutput, "cannot create a dataspace", where_text);
  const Handle properties = h5::chunked_properties(chunk, 4, element_bytes, where_text);
  const Handle dataset = h5::checked(
      H5Dcreate2(file, path, file_type, space.get(), H5P_DEFAULT, properties.get(), H5P_DEFAULT),
      H5Dclose, Blame::kOutput, "cannot create dataset", where_text);
  h5::check(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
            Blame::kOutput, "cannot write dataset", where_text);
}

// --- Reading ------------------------------------------------------------------------------

double read_double_attribute(hid_t object, const char* name, const std::string& where_text) {
  const std::string what = std::string("unreadable number attribute '") + name + "'";
  if (!h5::has_attribute(object, name)) {
    h5::raise(Blame::kInput, std::string("missing attribute '") + name + "'", where_text);
  }
  const Handle attribute = h5::checked(H5Aopen(object, name, H5P_DEFAULT), H5Aclose, Blame::kInput,
                                       what.c_str(), where_text);
  const Handle type =
      h5::checked(H5Aget_type(attribute.get()), H5Tclose, Blame::kInput, what.c_str(), where_text);
  const Handle space =
      h5::checked(H5Aget_space(attribute.get()), H5Sclose, Blame::kInput, what.c_str(), where_text);
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Sget_simple_extent_npoints(space.get()) != 1) {
    h5::raise(Blame::kInput, std::string("attribute '") + name + "' is not one number", where_text);
  }
  double value = 0.0;
  h5::check(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value), Blame::kInput, what.c_str(),
            where_text);
  return value;
}

// Opens `path`, checks its element class and size and its dimensions, and reads it whole.
template <typename T>
void read_dataset(hid_t file, const char* path, H5T_class_t type_class, hid_t memory_type,
                  const std::vector<hsize_t>& dims, const char* axes, std::vector<T>& out,
                  const std::string& name) {
  const std::string where_text = h5::where(name, path);
  if (!h5::exists(file, path)) {
    h5::raise(Blame::kInput, "missing dataset", where_text);
  }
  const Handle dataset = h5::checked(H5Dopen2(file, path, H5P_DEFAULT), H5Dclose, Blame::kInput,
                                     "cannot open dataset", where_text);
  const Handle type = h5::checked(H5Dget_type(dataset.get()), H5Tclose, Blame::kInput,
                                  "unreadable element type", where_text);
  const bool unsigned_ok = type_class != H5T_INTEGER || H5Tget_sign(type.get()) == H5T_SGN_NONE;
  if (H5Tget_class(type.get()) != type_class || H5Tget_size(type.get()) != sizeof(T) ||
      !unsigned_ok) {
    h5::raise(Blame::kInput,
              type_class == H5T_INTEGER ? "element type is not uint32"
                                        : "element type is not "
                                          "float32",
              where_text);
  }
  if (h5::dimensions(dataset.get(), where_text) != dims) {
    std::string expected;
    for (const hsize_t d : dims) {
      expected += (expected.empty() ? "[" : ", ") + std::to_string(d);
    }
    h5::raise(Blame::kInput, "wrong shape: expected " + expected + "] (" + axes + ")", where_text);
  }
  if (!h5::storage_consistent(dataset.get())) {
    h5::raise(Blame::kInput, "damaged storage layout", where_text);
  }
  std::uint64_t elements = 1;
  for (const hsize_t d : dims) {
    elements *= d;
  }
  out.resize(elements);
  const std::vector<hsize_t> start(dims.size(), 0);
  h5::read_block(dataset.get(), memory_type, start, dims, out.data(), where_text);
}

}  // namespace

std::string demand_producer() {
  return std::string("kvtier ") + KVTIER_VERSION + ", replay " + std::to_string(kReplayRevision);
}

void write_demand_file(const std::filesystem::path& path, const ReplayDemand& demand,
                       const DemandProvenance& provenance) {
  if (!is_hex_digest(provenance.trace_hash) || provenance.policy.empty()) {
    throw std::invalid_argument("demand file provenance needs the trace hash and the policy");
  }
  if (demand.steps() == 0 || demand.layers() == 0) {
    throw std::invalid_argument("a demand file needs at least one step and one layer");
  }
  h5::silence_library_errors();
  const std::string name = path.string();
  std::error_code ignored;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), ignored);
  }
  TemporaryFile temporary(path);
  {
    const char* what = "cannot create the demand file";
    Handle file = h5::create_file(temporary.path().string(), what, name);
    const std::string root_where = name + ", root attributes";
    {
      const Handle root = h5::checked(H5Oopen(file.get(), "/", H5P_DEFAULT), H5Oclose,
                                      Blame::kOutput, "cannot open the root group", name);
      const hid_t id = root.get();
      h5::write_string_attribute(id, "format", kDemandFormatName, root_where);
      h5::write_uint_attribute(id, "version", kDemandFormatVersion, root_where);
      h5::write_string_attribute(id, "trace_hash", provenance.trace_hash, root_where);
      h5::write_string_attribute(id, "trace_file", provenance.trace_file, root_where);
      h5::write_string_attribute(id, "policy", provenance.policy, root_where);
      write_double_attribute(id, "compressed_bits", demand.compressed_format().code_bits,
                             root_where);
      h5::write_uint_attribute(id, kScaleBytes,
                               demand.compressed_format().scale_bytes_per_head_vector, root_where);
      h5::write_uint_attribute(id, "prompt_tokens", provenance.prompt_tokens, root_where);
      h5::write_uint_attribute(id, "steps", demand.steps(), root_where);
      h5::write_uint_attribute(id, "layers", demand.layers(), root_where);
      h5::write_uint_attribute(id, "first_layer", provenance.first_layer, root_where);
      h5::write_string_attribute(id, "model", provenance.model, root_where);
      h5::write_uint_attribute(id, "from_topk", provenance.from_topk ? 1 : 0, root_where);
      h5::write_string_attribute(
          id, "producer", provenance.producer.empty() ? demand_producer() : provenance.producer,
          root_where);
    }
    const std::uint64_t records = demand.steps() * demand.layers();
    std::vector<std::uint32_t> tokens(records * kTierCount);
    std::vector<float> mass(records * kTierCount);
    std::array<std::vector<std::uint32_t>, kMoves.size()> moves;
    for (auto& values : moves) {
      values.resize(records);
    }
    for (std::uint64_t step = 0; step < demand.steps(); ++step) {
      for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
        const StepLayerRecord& record = demand.at(step, layer);
        const std::uint64_t i = step * demand.layers() + layer;
        std::copy(record.tokens.begin(), record.tokens.end(), tokens.begin() + i * kTierCount);
        std::copy(record.mass.begin(), record.mass.end(), mass.begin() + i * kTierCount);
        for (std::size_t m = 0; m < kMoves.size(); ++m) {
          moves[m][i] = record.*kMoveFields[m];
        }
      }
    }
    const std::vector<hsize_t> tier_dims = {demand.steps(), demand.layers(), kTierCount};
    const std::vector<hsize_t> move_dims = {demand.steps(), demand.layers()};
    write_dataset(file.get(), kTierTokens, H5T_STD_U32LE, H5T_NATIVE_UINT32, 4, tier_dims,
                  tokens.data(), name);
    for (std::size_t m = 0; m < kMoves.size(); ++m) {
      write_dataset(file.get(), kMoves[m], H5T_STD_U32LE, H5T_NATIVE_UINT32, 4, move_dims,
                    moves[m].data(), name);
    }
    write_dataset(file.get(), kTierMass, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 4, tier_dims,
                  mass.data(), name);
    std::vector<std::uint32_t> start_tokens(std::size_t{demand.layers()} * kTierCount);
    std::vector<std::uint32_t> start_moves(std::size_t{demand.layers()} * kMoves.size());
    for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
      const StepLayerRecord& record = demand.start(layer);
      std::copy(record.tokens.begin(), record.tokens.end(),
                start_tokens.begin() + std::ptrdiff_t{layer} * kTierCount);
      for (std::size_t m = 0; m < kMoves.size(); ++m) {
        start_moves[layer * kMoves.size() + m] = record.*kMoveFields[m];
      }
    }
    write_dataset(file.get(), kStartTierTokens, H5T_STD_U32LE, H5T_NATIVE_UINT32, 4,
                  {demand.layers(), kTierCount}, start_tokens.data(), name);
    write_dataset(file.get(), kStartMoves, H5T_STD_U32LE, H5T_NATIVE_UINT32, 4,
                  {demand.layers(), kMoves.size()}, start_moves.data(), name);
    if (!file.reset()) {
      h5::raise(Blame::kOutput, "cannot close the demand file (disk full?)", name);
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary.path(), temporary.target(), error);
  if (error) {
    h5::raise(Blame::kOutput, "cannot move the demand file into place: " + error.message(), name);
  }
  temporary.release();
}

DemandFile read_demand_file(const std::filesystem::path& path) {
  h5::silence_library_errors();
  const std::string name = path.string();
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw DataError("no such demand file", name);
  }
  if (H5Fis_hdf5(name.c_str()) <= 0) {
    throw DataError("not an HDF5 file", name);
  }
  const Handle file(H5Fopen(name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) {
    throw DataError("cannot open the HDF5 file (truncated or damaged)", name);
  }
  const std::string root_where = name + ", root attributes";
  const Handle root = h5::checked(H5Oopen(file.get(), "/", H5P_DEFAULT), H5Oclose, Blame::kInput,
                                  "cannot open the root group", name);
  const hid_t id = root.get();
  if (!h5::has_attribute(id, "format") ||
      h5::read_string_attribute(id, "format", root_where) != kDemandFormatName) {
    throw DataError("not a replay demand file (root attribute format is not '" +
                        std::string(kDemandFormatName) + "')",
                    root_where);
  }
  const std::uint64_t version = h5::read_uint_attribute(id, "version", root_where);
  if (version == kUnsplitMovesVersion) {
    throw DataError(
        "demand file version 1 lacks the T2 scale bytes, the sources of promotions and "
        "compressions and the start placement (this kvtier reads version " +
            std::to_string(kDemandFormatVersion) + "): replay the trace again",
        root_where);
  }
  if (version != kDemandFormatVersion) {
    throw DataError("demand file version " + std::to_string(version) + " (this kvtier reads " +
                        std::to_string(kDemandFormatVersion) + ")",
                    root_where);
  }
  DemandProvenance provenance;
  provenance.trace_hash = h5::read_string_attribute(id, "trace_hash", root_where);
  if (!is_hex_digest(provenance.trace_hash)) {
    throw DataError("attribute 'trace_hash' is not 32 lowercase hex digits", root_where);
  }
  provenance.trace_file = h5::read_string_attribute(id, "trace_file", root_where);
  provenance.policy = h5::read_string_attribute(id, "policy", root_where);
  if (provenance.policy.empty()) {
    throw DataError("attribute 'policy' is empty", root_where);
  }
  const double bits = read_double_attribute(id, "compressed_bits", root_where);
  if (!std::isfinite(bits) || bits <= 0.0 || bits > 64.0) {
    throw DataError("attribute 'compressed_bits' is outside (0, 64]", root_where);
  }
  const std::uint64_t scale_bytes = h5::read_uint_attribute(id, kScaleBytes, root_where);
  if (scale_bytes > std::numeric_limits<std::uint32_t>::max()) {
    throw DataError(std::string("attribute '") + kScaleBytes + "' does not fit in 32 bits",
                    root_where);
  }
  provenance.prompt_tokens = h5::read_uint_attribute(id, "prompt_tokens", root_where);
  const std::uint64_t steps = h5::read_uint_attribute(id, "steps", root_where);
  const std::uint64_t layers = h5::read_uint_attribute(id, "layers", root_where);
  const std::uint64_t first_layer = h5::read_uint_attribute(id, "first_layer", root_where);
  // Bounds that keep every product below 2^63 and every count inside its type.
  constexpr std::uint64_t kMaxPositions = std::uint64_t{1} << 31;
  if (steps == 0 || layers == 0 || layers > 65536 || first_layer > 65536 || steps > kMaxPositions ||
      provenance.prompt_tokens > kMaxPositions) {
    throw DataError("attributes steps, layers, first_layer or prompt_tokens out of range",
                    root_where);
  }
  provenance.first_layer = static_cast<std::uint32_t>(first_layer);
  provenance.model = h5::read_string_attribute(id, "model", root_where);
  const std::uint64_t from_topk = h5::read_uint_attribute(id, "from_topk", root_where);
  if (from_topk > 1) {
    throw DataError("attribute 'from_topk' is not 0 or 1", root_where);
  }
  provenance.from_topk = from_topk == 1;
  provenance.producer = h5::read_string_attribute(id, "producer", root_where);

  const std::vector<hsize_t> tier_dims = {steps, layers, kTierCount};
  const std::vector<hsize_t> move_dims = {steps, layers};
  std::vector<std::uint32_t> tokens;
  std::vector<float> mass;
  constexpr const char* kStepAxes = "steps, layers, tiers";
  read_dataset(file.get(), kTierTokens, H5T_INTEGER, H5T_NATIVE_UINT32, tier_dims, kStepAxes,
               tokens, name);
  read_dataset(file.get(), kTierMass, H5T_FLOAT, H5T_NATIVE_FLOAT, tier_dims, kStepAxes, mass,
               name);
  std::array<std::vector<std::uint32_t>, kMoves.size()> moves;
  for (std::size_t m = 0; m < kMoves.size(); ++m) {
    read_dataset(file.get(), kMoves[m], H5T_INTEGER, H5T_NATIVE_UINT32, move_dims, "steps, layers",
                 moves[m], name);
  }
  std::vector<std::uint32_t> start_tokens;
  std::vector<std::uint32_t> start_moves;
  read_dataset(file.get(), kStartTierTokens, H5T_INTEGER, H5T_NATIVE_UINT32, {layers, kTierCount},
               "layers, tiers", start_tokens, name);
  read_dataset(file.get(), kStartMoves, H5T_INTEGER, H5T_NATIVE_UINT32, {layers, kMoves.size()},
               "layers, moves", start_moves, name);

  ReplayDemand demand(static_cast<std::uint32_t>(layers), steps);
  demand.set_compressed_format({bits, static_cast<std::uint32_t>(scale_bytes)});
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    StepLayerRecord& start = demand.start(layer);
    std::uint64_t held = 0;
    for (std::size_t tier = 0; tier < kTierCount; ++tier) {
      start.tokens[tier] = start_tokens[layer * kTierCount + tier];
      held += start.tokens[tier];
    }
    if (held != provenance.prompt_tokens) {
      throw DataError("tokens by tier add up to " + std::to_string(held) + " at layer " +
                          std::to_string(layer) + ", expected the prompt's " +
                          std::to_string(provenance.prompt_tokens),
                      h5::where(name, kStartTierTokens));
    }
    for (std::size_t m = 0; m < kMoves.size(); ++m) {
      start.*kMoveFields[m] = start_moves[layer * kMoves.size() + m];
    }
    if (start.promoted_from_compressed > start.promoted ||
        start.compressed_from_hbm > start.compressed) {
      throw DataError(
          "promoted_from_compressed or compressed_from_hbm exceeds its total (promoted, "
          "compressed) at layer " +
              std::to_string(layer),
          h5::where(name, kStartMoves));
    }
  }
  for (std::uint64_t step = 0; step < steps; ++step) {
    // Every token of a layer is in exactly one tier, evicted ones included.
    const std::uint64_t visible = provenance.prompt_tokens + step + 1;
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      const std::uint64_t i = step * layers + layer;
      StepLayerRecord& record = demand.at(step, layer);
      std::uint64_t held = 0;
      for (std::size_t tier = 0; tier < kTierCount; ++tier) {
        record.tokens[tier] = tokens[i * kTierCount + tier];
        record.mass[tier] = mass[i * kTierCount + tier];
        held += record.tokens[tier];
        if (!std::isfinite(record.mass[tier])) {
          throw DataError("attention mass is not finite at step " + std::to_string(step) +
                              ", layer " + std::to_string(layer),
                          h5::where(name, kTierMass));
        }
      }
      if (held != visible) {
        throw DataError("tokens by tier add up to " + std::to_string(held) + " at step " +
                            std::to_string(step) + ", layer " + std::to_string(layer) +
                            ", expected prompt + step + 1 = " + std::to_string(visible),
                        h5::where(name, kTierTokens));
      }
      for (std::size_t m = 0; m < kMoves.size(); ++m) {
        record.*kMoveFields[m] = moves[m][i];
      }
      if (record.promoted_from_compressed > record.promoted ||
          record.compressed_from_hbm > record.compressed) {
        throw DataError(
            "promoted_from_compressed or compressed_from_hbm exceeds its total "
            "(promoted, compressed) at step " +
                std::to_string(step) + ", layer " + std::to_string(layer),
            name);
      }
      // Step 0's moves include the start's.
      if (step == 0) {
        const StepLayerRecord& start = demand.start(layer);
        for (std::size_t m = 0; m < kMoves.size(); ++m) {
          if (start.*kMoveFields[m] > record.*kMoveFields[m]) {
            throw DataError("the start's moves exceed step 0's, which include them, at layer " +
                                std::to_string(layer),
                            h5::where(name, kStartMoves));
          }
        }
      }
    }
  }
  return {std::move(provenance), std::move(demand)};
}

}  // namespace kvtier::replay
