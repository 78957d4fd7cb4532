#include "replay/placement.hpp"

#include <stdexcept>
#include <string>

#include "replay/attention.hpp"

namespace kvtier::replay {

void LayerPlacement::append() {
  tiers_.push_back(Tier::kHbm);
  resident_mask_.push_back(1.0F);
  hbm_mask_.push_back(1.0F);
  ++counts_[static_cast<std::size_t>(Tier::kHbm)];
}

void LayerPlacement::move(std::uint64_t token, Tier to) {
  const Tier from = tiers_.at(token);
  if (from == to) {
    return;
  }
  if (from == Tier::kEvicted) {
    throw std::logic_error("token " + std::to_string(token) + " was evicted and cannot return");
  }
  --counts_[static_cast<std::size_t>(from)];
  ++counts_[static_cast<std::size_t>(to)];
  tiers_[token] = to;
  resident_mask_[token] = to == Tier::kEvicted ? 0.0F : 1.0F;
  hbm_mask_[token] = to == Tier::kHbm ? 1.0F : 0.0F;
  switch (to) {
    case Tier::kHbm: ++moves_.promoted; break;
    case Tier::kHost:
      ++moves_.newly_host;
      moves_.demoted += from == Tier::kHbm ? 1 : 0;
      break;
    case Tier::kCompressed: ++moves_.compressed; break;
    case Tier::kEvicted: ++moves_.evicted; break;
  }
}

InMemoryAttention::InMemoryAttention(std::uint32_t layers, std::uint64_t prompt_tokens,
                                     std::vector<std::vector<std::vector<float>>> rows)
    : layers_(layers), prompt_tokens_(prompt_tokens), rows_(std::move(rows)) {
  for (std::size_t step = 0; step < rows_.size(); ++step) {
    if (rows_[step].size() != layers_) {
      throw std::invalid_argument("step " + std::to_string(step) + " has " +
                                  std::to_string(rows_[step].size()) + " layers, expected " +
                                  std::to_string(layers_));
    }
    for (const auto& row : rows_[step]) {
      if (row.size() != prompt_tokens_ + step + 1) {
        throw std::invalid_argument("step " + std::to_string(step) + " row has " +
                                    std::to_string(row.size()) + " entries, expected " +
                                    std::to_string(prompt_tokens_ + step + 1));
      }
    }
  }
}

void InMemoryAttention::read_step(std::uint64_t step, std::vector<std::vector<float>>& rows) {
  rows = rows_.at(step);
}

}  // namespace kvtier::replay
