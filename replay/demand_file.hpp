#pragma once
// Replay demand files: the per-step, per-layer tier demand of one policy over one trace, in
// HDF5, so that a replay is run once and reused by every hardware point of a sweep
// (docs/REPLAY.md, "Demand files").
//
// Layout "kvtier-replay-demand" version 2 (S steps, L layers, tiers T0..T3):
//   /tier_tokens               uint32  [S][L][4]  tokens in each tier after the policy's step
//   /promoted                  uint32  [S][L]     host (T1/T2) -> HBM
//   /demoted                   uint32  [S][L]     HBM -> T1
//   /compressed                uint32  [S][L]     -> T2
//   /evicted                   uint32  [S][L]     -> T3
//   /newly_host                uint32  [S][L]     tokens that entered T1 (differential prefetch)
//   /promoted_from_compressed  uint32  [S][L]     of /promoted, those from T2
//   /compressed_from_hbm       uint32  [S][L]     of /compressed, those from HBM
//   /tier_mass                 float32 [S][L][4]  the step's attention mass by tier (T3: lost)
//   /start_tier_tokens         uint32  [L][4]     tokens in each tier after Policy::start()
//   /start_moves               uint32  [L][7]     the start's moves, in the order of the seven
//                                                 move datasets above (step 0's include them)
// chunked, shuffled and deflated; root attributes: format, version, trace_hash, trace_file,
// policy, compressed_bits and compressed_scale_bytes_per_head_vector (the CompressedFormat),
// prompt_tokens, steps, layers, first_layer, model, from_topk, producer. Files are written
// under a temporary name and renamed, and carry no timestamps: the same demand gives the same
// bytes. Version 1 files (no scale bytes, no move sources, no start placement) are refused.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "replay/engine.hpp"

namespace kvtier::replay {

inline constexpr std::string_view kDemandFormatName = "kvtier-replay-demand";
inline constexpr std::uint32_t kDemandFormatVersion = 2;

// Where a demand came from. Steps, layers and the compressed format are the ReplayDemand's own.
struct DemandProvenance {
  std::string trace_hash;  // XXH3-128 of the trace file's bytes, 32 lowercase hex digits
  std::string trace_file;  // the trace's file name (no folder), for people
  std::string policy;      // canonical policy string, every parameter ("tiered:hbm=0.5,...")
  std::uint64_t prompt_tokens = 0;
  std::uint32_t first_layer = 0;  // model layer of demand layer 0 (sliced traces)
  std::string model;              // the trace's model name
  bool from_topk = false;         // rows were reconstructed from top-k entries
  std::string producer;           // "kvtier 0.1.0"; filled by write_demand_file when empty

  friend bool operator==(const DemandProvenance&, const DemandProvenance&) = default;
};

struct DemandFile {
  DemandProvenance provenance;
  ReplayDemand demand;
};

// What replay computes changes with policy fixes between releases; the revision, raised with
// every change to a policy's choices, is part of the producer so that a demand cache written
// before such a change is replayed again instead of read. 2: pyramid budgets capped at the
// prompt and summing to L·B; non-finite rows skipped by h2o, tova and dms. 3: a prefill
// compressor's pyramid uniform for a prompt shorter than 2(B − 64), as PyramidKV's code. 4:
// /tier_mass holds shares of each row's total (T3 exactly 0 with nothing evicted).
inline constexpr int kReplayRevision = 4;
// "kvtier 0.1.0, replay 4": the producer recorded in files this build writes.
[[nodiscard]] std::string demand_producer();

// Writes `demand` atomically (FILE.tmp.PID, then renamed). Creates missing parent folders.
// kvtier::Error (exit 1) when the file cannot be written; std::invalid_argument when the
// provenance is incomplete (no hash or policy) or the demand has no step or no layer.
void write_demand_file(const std::filesystem::path& path, const ReplayDemand& demand,
                       const DemandProvenance& provenance);

// Reads and checks a demand file: format and version, every attribute and dataset (presence,
// element type, shape against steps × layers), tokens per step and layer adding up to the
// positions visible at that step (the prompt at the start), finite masses, step 0's moves
// including the start's. A file that fails any check is refused with a
// DataError naming the file and the dataset or attribute (exit 3).
[[nodiscard]] DemandFile read_demand_file(const std::filesystem::path& path);

}  // namespace kvtier::replay
