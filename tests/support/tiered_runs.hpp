#pragma once
// The quickstart run with a tier block and a tier policy, for tests of the tier-aware simulation.

#include <algorithm>
#include <string>
#include <vector>

#include "configs/schema/run.pb.h"
#include "tests/support/config_fixture.hpp"

namespace kvtier::test {

// The tier block's settings: one layer of lookahead, pinned memory, copy engines, and a
// synthetic reasoning trace.
inline const std::vector<std::string> kTieringSets = {
    "tiering.prefetch_lookahead_layers=1", "tiering.host_allocation=PINNED",
    "tiering.copy_method=COPY_ENGINES", "tiering.synthetic_pattern=reasoning"};

// The quickstart run (512-token prompts, 512 generated tokens) with a tier block, serving `policy`
// (a policy string: "tiered:hbm=0.3,..."), `extra` sets last.
inline config::RunSpec tiered_run(const std::string& policy,
                                  const std::vector<std::string>& extra = {}) {
  // The test's own settings come last, so they win over the defaults here.
  std::vector<std::string> sets = kTieringSets;
  sets.emplace_back("workload.closed_loop.prompt_tokens.fixed_tokens=512");
  sets.emplace_back("workload.closed_loop.output_tokens.fixed_tokens=512");
  sets.insert(sets.end(), extra.begin(), extra.end());
  config::RunSpec run = load_spec<config::RunSpec>(quickstart_run(), sets);
  run.mutable_policy()->Clear();
  // Parameters as a policy string would give them.
  const auto colon = policy.find(':');
  run.mutable_policy()->set_name(policy.substr(0, colon));
  if (colon != std::string::npos) {
    std::size_t begin = colon + 1;
    while (begin < policy.size()) {
      const auto comma = std::min(policy.find(',', begin), policy.size());
      const std::string piece = policy.substr(begin, comma - begin);
      const auto equals = piece.find('=');
      auto* param = run.mutable_policy()->add_param();
      param->set_name(piece.substr(0, equals));
      const std::string value = piece.substr(equals + 1);
      if (value.find_first_not_of("0123456789") == std::string::npos) {
        param->set_integer(std::stoll(value));
      } else if (value.find_first_not_of("0123456789.") == std::string::npos) {
        param->set_number(std::stod(value));
      } else {
        param->set_text(value);
      }
      begin = comma + 1;
    }
  }
  return run;
}

}  // namespace kvtier::test
