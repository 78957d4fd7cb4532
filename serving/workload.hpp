#pragma once
// The requests a run serves: when each arrives and how many prompt and output tokens it has.
// Lengths and Poisson arrivals are drawn from seeded streams (sim::RandomStream), so a seed
// gives the same requests with every compiler and standard library.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "configs/schema/workload.pb.h"
#include "sim/random.hpp"
#include "sim/tick.hpp"

namespace kvtier::serving {

struct RequestSpec {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t output_tokens = 0;
  // Arrival time for open-loop workloads; empty in a closed loop, where a request arrives when
  // an earlier one finishes.
  std::optional<sim::Tick> arrival;
  // The request file's line this request was read from; 0 for generated requests.
  std::uint64_t file_line = 0;
  // The part of its prompt other requests may share (prefix caching): its first `shared_tokens`
  // tokens, in segments of `segment_tokens` named by ids, equal ids at the same place meaning
  // the same content from the prompt's start to the segment's end (Mooncake's hash ids; a
  // generated shared prefix is one segment). Empty: nothing shared.
  std::uint64_t shared_tokens = 0;
  std::uint64_t segment_tokens = 0;
  std::vector<std::uint64_t> segments{};
};

struct Workload {
  std::vector<RequestSpec> requests;  // in arrival order
  // Closed loop: requests kept in flight (the first `concurrency` arrive at time zero).
  std::optional<std::uint32_t> closed_loop_concurrency;
  std::string description;
  // The request file the requests were read from; empty for generated workloads.
  std::string request_file;
};

// Where request `index` of `workload` came from, for errors: "request file F:LINE", or
// "request INDEX" when it was generated.
[[nodiscard]] std::string describe_request(const Workload& workload, std::size_t index);

// Draws one length from a TokenCount distribution.
[[nodiscard]] std::uint64_t sample_tokens(const config::TokenCount& count,
                                          sim::RandomStream& random);

// Builds the request list. Request files are read here; a malformed line is a DataError naming
// the file and line (exit 3).
[[nodiscard]] Workload make_workload(const config::WorkloadSpec& spec, std::uint64_t seed);

// Parses a CSV request file's text (AZURE_CSV, KVTIER_CSV; for tests and for make_workload).
[[nodiscard]] std::vector<RequestSpec> parse_request_file(const std::string& text,
                                                          const std::string& file_name,
                                                          config::RequestFileFormat format,
                                                          double time_scale);

// Parses a Mooncake trace (MOONCAKE_JSONL) whose hash ids cover `hash_block_tokens` prompt
// tokens each. Only whole blocks are shared: a last, partial block's id is ignored, since equal
// ids there may cover prompts of different lengths (Mooncake's published traces do so).
[[nodiscard]] std::vector<RequestSpec> parse_mooncake_trace(const std::string& text,
                                                            const std::string& file_name,
                                                            double time_scale,
                                                            std::uint32_t hash_block_tokens);

}  // namespace kvtier::serving
