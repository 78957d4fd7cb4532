#include "serving/router.hpp"

#include <string>

#include "common/errors.hpp"
#include "sim/random.hpp"

namespace kvtier::serving {
namespace {

// The stream a prefix's engine is drawn from, seeded by the prefix's segment id: the same
// prefix goes to the same engine in every run, whatever the seed.
constexpr std::uint64_t kPrefixHashStream = 0x9e7a11ce;

class RoundRobin final : public Router {
 public:
  std::size_t route(std::uint32_t, std::span<const ServingEngine* const> engines) override {
    return next_++ % engines.size();
  }

 private:
  std::size_t next_ = 0;
};

class LeastOutstanding final : public Router {
 public:
  std::size_t route(std::uint32_t, std::span<const ServingEngine* const> engines) override {
    std::size_t best = 0;
    for (std::size_t e = 1; e < engines.size(); ++e) {
      if (engines[e]->outstanding_requests() < engines[best]->outstanding_requests()) {
        best = e;
      }
    }
    return best;
  }
};

class PrefixHash final : public Router {
 public:
  explicit PrefixHash(const Workload& workload) : workload_(workload) {}
  std::size_t route(std::uint32_t request, std::span<const ServingEngine* const> engines) override {
    const RequestSpec& spec = workload_.requests[request];
    if (spec.shared_tokens == 0 || spec.segments.empty()) {
      return others_.route(request, engines);
    }
    return static_cast<std::size_t>(
        sim::RandomStream(spec.segments.front(), kPrefixHashStream).uniform_below(engines.size()));
  }

 private:
  const Workload& workload_;
  RoundRobin others_;
};

class KvAware final : public Router {
 public:
  KvAware(const Workload& workload, double overlap_weight, std::uint32_t block_tokens)
      : workload_(workload), overlap_weight_(overlap_weight), block_tokens_(block_tokens) {}
  std::size_t route(std::uint32_t request, std::span<const ServingEngine* const> engines) override {
    const std::uint64_t prompt_blocks =
        (workload_.requests[request].prompt_tokens + block_tokens_ - 1) / block_tokens_;
    std::size_t best = 0;
    double best_cost = 0.0;
    for (std::size_t e = 0; e < engines.size(); ++e) {
      const std::uint64_t to_prefill = prompt_blocks - engines[e]->cached_prefix_blocks(request);
      const double cost = overlap_weight_ * static_cast<double>(to_prefill) +
                          static_cast<double>(engines[e]->active_blocks() + prompt_blocks);
      if (e == 0 || cost < best_cost) {
        best = e;
        best_cost = cost;
      }
    }
    return best;
  }

 private:
  const Workload& workload_;
  double overlap_weight_;
  std::uint64_t block_tokens_;
};

}  // namespace

std::unique_ptr<Router> make_router(const config::ClusterSpec& cluster, const Workload& workload,
                                    std::uint32_t block_tokens) {
  switch (cluster.routing()) {
    case config::ROUND_ROBIN: return std::make_unique<RoundRobin>();
    case config::LEAST_OUTSTANDING: return std::make_unique<LeastOutstanding>();
    case config::PREFIX_HASH: return std::make_unique<PrefixHash>(workload);
    case config::KV_AWARE:
      // Checked with the config (configs/impl/consistency.cpp); a run built in code is held to
      // it here.
      if (!cluster.has_kv_overlap_weight()) {
        throw ConfigError("KV_AWARE routing needs kv_overlap_weight",
                          "field cluster.kv_overlap_weight");
      }
      if (block_tokens == 0) {
        throw ConfigError("KV_AWARE routing counts KV blocks: set memory.kv_block_tokens",
                          "field cluster.routing");
      }
      return std::make_unique<KvAware>(workload, cluster.kv_overlap_weight(), block_tokens);
    default:
      throw ConfigError(
          "cluster.routing is not set: choose ROUND_ROBIN, LEAST_OUTSTANDING, "
          "PREFIX_HASH or KV_AWARE",
          "field cluster.routing");
  }
}

}  // namespace kvtier::serving
