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

// Parses a request file's text (for tests and for make_workload).
[[nodiscard]] std::vector<RequestSpec> parse_request_file(const std::string& text,
                                                          const std::string& file_name,
                                                          config::RequestFileFormat format,
                                                          double time_scale);

}  // namespace kvtier::serving
