#include "replay/placement.hpp"

#include <stdexcept>
#include <string>

namespace kvtier::replay {

void LayerPlacement::append() {
  tiers_.push_back(Tier::kHbm);
  resident_mask_.push_back(1.0F);
  hbm_mask_.push_back(1.0F);
  compressed_mask_.push_back(0.0F);
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
  compressed_mask_[token] = to == Tier::kCompressed ? 1.0F : 0.0F;
  switch (to) {
    case Tier::kHbm:
      ++moves_.promoted;
      moves_.promoted_from_compressed += from == Tier::kCompressed ? 1 : 0;
      break;
    case Tier::kHost:
      ++moves_.newly_host;
      moves_.demoted += from == Tier::kHbm ? 1 : 0;
      break;
    case Tier::kCompressed:
      ++moves_.compressed;
      moves_.compressed_from_hbm += from == Tier::kHbm ? 1 : 0;
      break;
    case Tier::kEvicted: ++moves_.evicted; break;
  }
}

}  // namespace kvtier::replay
