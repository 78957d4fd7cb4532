#include "replay/budget_search.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "replay/engine.hpp"
#include "replay/impl/layer_profile.hpp"
#include "replay/impl/mlp.hpp"
#include "replay/impl/pareto.hpp"
#include "replay/parameters.hpp"
#include "sim/random.hpp"

namespace kvtier::replay {
namespace {

using Budgets = std::vector<std::uint64_t>;

// Search settings that are not options: fixed so that a seed always means the same search.
constexpr std::uint32_t kUniformLevels = 7;     // uniform vectors in the initial design
constexpr std::uint32_t kMinInitial = 8;        // initial design: max(8, N/3) points
constexpr std::uint32_t kPopulation = 20;       // DE population (NSGA-II selection)
constexpr std::uint32_t kBatch = 12;            // candidates replayed per generation
constexpr std::uint32_t kProposalsPerSlot = 4;  // proposals the MLP screens per candidate
constexpr std::uint32_t kProfileProposals = 4;  // profile allocations in each generation's pool
constexpr Eigen::Index kHidden = 16;
constexpr double kInitialSpread = 1.0;  // per-layer spread around a design point's level

double mean_of(std::span<const std::uint64_t> budgets) {
  double total = 0.0;
  for (const std::uint64_t b : budgets) {
    total += static_cast<double>(b);
  }
  return total / static_cast<double>(budgets.size());
}

// Genes x ∈ [0, 1] map to budgets on a log scale, b = floor·(cap/floor)^x: attention recall
// grows roughly with the logarithm of the budget, so equal steps in x are comparable steps in
// recall whether a layer holds 64 tokens or 4096.
class Encoding {
 public:
  explicit Encoding(const BudgetBounds& bounds)
      : bounds_(bounds),
        log_ratio_(std::log(static_cast<double>(bounds.cap) / static_cast<double>(bounds.floor))) {}

  [[nodiscard]] Eigen::VectorXd encode(const Budgets& budgets) const {
    Eigen::VectorXd genes(static_cast<Eigen::Index>(budgets.size()));
    for (std::size_t l = 0; l < budgets.size(); ++l) {
      genes(static_cast<Eigen::Index>(l)) =
          log_ratio_ > 0
              ? std::log(static_cast<double>(budgets[l]) / static_cast<double>(bounds_.floor)) /
                    log_ratio_
              : 0.0;
    }
    return genes;
  }

  [[nodiscard]] Budgets decode(const Eigen::VectorXd& genes) const {
    Budgets budgets(static_cast<std::size_t>(genes.size()));
    for (Eigen::Index l = 0; l < genes.size(); ++l) {
      const double value = static_cast<double>(bounds_.floor) * std::exp(genes(l) * log_ratio_);
      budgets[static_cast<std::size_t>(l)] =
          std::clamp(static_cast<std::uint64_t>(std::llround(value)), bounds_.floor, bounds_.cap);
    }
    return budgets;
  }

 private:
  BudgetBounds bounds_;
  double log_ratio_;
};

// Replays every candidate, on up to `jobs` threads; per-layer recall in candidate order. After
// a failure no new candidate starts, and the failure of the lowest candidate is rethrown.
std::vector<std::vector<double>> evaluate_all(const RecallFunction& recall,
                                              const std::vector<Budgets>& candidates,
                                              unsigned jobs) {
  std::vector<std::vector<double>> results(candidates.size());
  std::vector<std::exception_ptr> errors(candidates.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  const auto work = [&] {
    for (std::size_t i = next++; i < candidates.size() && !failed; i = next++) {
      try {
        results[i] = recall(candidates[i]);
      } catch (...) {
        errors[i] = std::current_exception();
        failed = true;
      }
    }
  };
  const std::size_t threads = std::min<std::size_t>(jobs, candidates.size());
  std::vector<std::thread> workers;
  for (std::size_t t = 1; t < threads; ++t) {
    workers.emplace_back(work);
  }
  work();
  for (auto& worker : workers) {
    worker.join();
  }
  for (const auto& error : errors) {
    if (error) {
      std::rethrow_exception(error);
    }
  }
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (results[i].size() != candidates[i].size()) {
      throw std::logic_error("recall function returned " + std::to_string(results[i].size()) +
                             " layers for a vector of " + std::to_string(candidates[i].size()));
    }
    for (const double value : results[i]) {
      if (!std::isfinite(value)) {
        throw DataError("attention recall is not a number for budgets of mean " +
                        format_double(mean_of(candidates[i])) +
                        ": the traces hold attention that is not finite");
      }
    }
  }
  return results;
}

double mean_recall(const std::vector<double>& layer_recall) {
  return std::accumulate(layer_recall.begin(), layer_recall.end(), 0.0) /
         static_cast<double>(layer_recall.size());
}

// One evaluated point with its genes.
struct Evaluated {
  Eigen::VectorXd genes;
  BudgetPoint point;
};

class Search {
 public:
  Search(std::uint32_t layers, const RecallFunction& recall, const SearchOptions& options)
      : layers_(layers),
        recall_(recall),
        options_(options),
        encoding_(options.bounds),
        random_(options.seed, 0x4445) {}  // stream id "DE"

  SearchResult run() {
    const std::uint32_t initial =
        std::min(options_.evaluations, std::max(kMinInitial, options_.evaluations / 3));
    // The uniform levels first: the profile seeds are read off their per-layer recall.
    const std::vector<Budgets> uniform = uniform_levels(std::min(initial, kUniformLevels));
    evaluate(uniform, 0);
    std::vector<Budgets> design = profile_seeds(uniform, initial - archive_.size());
    auto shapes = latin_hypercube(initial - archive_.size() - design.size());
    design.insert(design.end(), shapes.begin(), shapes.end());
    evaluate(design, 0);
    std::uint32_t generation = 0;
    while (archive_.size() < options_.evaluations) {
      ++generation;
      const std::size_t slots =
          std::min<std::size_t>(kBatch, options_.evaluations - archive_.size());
      auto candidates = screened_candidates(slots, generation);
      if (candidates.empty()) {
        break;  // nothing new to propose: the space is (nearly) exhausted
      }
      evaluate(candidates, generation);
      result_.generations = generation;
    }
    finish();
    return std::move(result_);
  }

 private:
  // Uniform vectors at `count` levels evenly spaced in genes from the floor to the cap: the
  // baseline, and the front's two ends.
  [[nodiscard]] std::vector<Budgets> uniform_levels(std::uint32_t count) const {
    std::vector<Budgets> levels;
    for (std::uint32_t k = 0; k < count; ++k) {
      const double level = count == 1 ? 0.5 : static_cast<double>(k) / (count - 1);
      levels.push_back(encoding_.decode(Eigen::VectorXd::Constant(layers_, level)));
    }
    return levels;
  }

  // Shapes that split the budget by the layers' measured recall (layer_profile.hpp), at the
  // interior uniform levels (to compare with uniform at exactly its mean) and halfway (in the
  // logarithm) between adjacent levels.
  [[nodiscard]] std::vector<Budgets> profile_seeds(const std::vector<Budgets>& uniform,
                                                   std::size_t room) const {
    if (uniform.size() < 2 || archive_.size() < 2) {
      return {};
    }
    const auto samples = layer_samples();
    std::vector<std::uint64_t> means;
    for (std::size_t k = 0; k + 1 < uniform.size(); ++k) {
      const auto low = static_cast<double>(uniform[k].front());
      const auto high = static_cast<double>(uniform[k + 1].front());
      means.push_back(static_cast<std::uint64_t>(std::llround(std::sqrt(low * high))));
      if (k + 2 < uniform.size()) {
        means.push_back(uniform[k + 1].front());
      }
    }
    std::vector<Budgets> seeds;
    for (const std::uint64_t mean : means) {
      if (seeds.size() < room) {
        seeds.push_back(detail::profile_allocation(samples, mean, options_.bounds));
      }
    }
    return seeds;
  }

  // Latin-hypercube shapes: each point draws a level (stratified over the points) and every
  // layer an offset around it (stratified per layer), so the design covers all mean budgets
  // rather than clustering at the middle one.
  std::vector<Budgets> latin_hypercube(std::size_t count) {
    if (count == 0) {
      return {};
    }
    const auto strata = [&] {
      std::vector<double> cells(count);
      std::iota(cells.begin(), cells.end(), 0.0);
      for (std::size_t i = cells.size(); i > 1; --i) {  // Fisher–Yates
        std::swap(cells[i - 1], cells[random_.uniform_below(i)]);
      }
      for (double& cell : cells) {
        cell = (cell + random_.uniform_01()) / static_cast<double>(count);
      }
      return cells;
    };
    const std::vector<double> levels = strata();
    std::vector<std::vector<double>> offsets(layers_);
    for (auto& layer : offsets) {
      layer = strata();
    }
    std::vector<Budgets> shapes;
    for (std::size_t j = 0; j < count; ++j) {
      Eigen::VectorXd genes(layers_);
      for (std::uint32_t l = 0; l < layers_; ++l) {
        genes(l) = std::clamp(levels[j] + kInitialSpread * (offsets[l][j] - 0.5), 0.0, 1.0);
      }
      shapes.push_back(encoding_.decode(genes));
    }
    return shapes;
  }

  // Replays the candidates whose budget vectors are new, in order.
  void evaluate(const std::vector<Budgets>& proposed, std::uint32_t generation) {
    std::vector<Budgets> candidates;
    for (const Budgets& budgets : proposed) {
      if (seen_.insert(budgets).second) {
        candidates.push_back(budgets);
      }
    }
    auto recalls = evaluate_all(recall_, candidates, options_.jobs);
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      Evaluated entry{encoding_.encode(candidates[i]), {}};
      entry.point.mean_budget = mean_of(candidates[i]);
      entry.point.recall = mean_recall(recalls[i]);
      entry.point.layer_recall = std::move(recalls[i]);
      entry.point.budgets = std::move(candidates[i]);
      entry.point.evaluation = static_cast<std::uint32_t>(archive_.size() + 1);
      entry.point.generation = generation;
      archive_.push_back(std::move(entry));
    }
    // NSGA-II environmental selection over everything evaluated: the DE population.
    population_ = detail::select_best(objectives(), kPopulation);
  }

  [[nodiscard]] std::vector<detail::Objectives> objectives() const {
    std::vector<detail::Objectives> points;
    points.reserve(archive_.size());
    for (const auto& entry : archive_) {
      points.push_back({entry.point.mean_budget, entry.point.recall});
    }
    return points;
  }

  // The candidates of one generation: a third of the slots (up to kProfileProposals) take
  // profile allocations (layer_profile.hpp, from every layer sample so far) at means drawn
  // log-uniformly over the bounds; the rest take DE proposals screened by the classifier.
  // DE/rand/1/bin runs over the population with F and CR drawn per proposal (dithering: a low
  // CR moves few layers, which suits budgets whose effects add up layer by layer; a high one
  // moves whole shapes); kProposalsPerSlot proposals per slot, of which the MLP keeps those it
  // rates most likely to reach a good Pareto rank.
  std::vector<Budgets> screened_candidates(std::size_t slots, std::uint32_t generation) {
    std::vector<Budgets> chosen;
    std::set<Budgets> proposed;
    const auto fresh = [&](const Budgets& budgets) {
      return seen_.count(budgets) == 0 && proposed.insert(budgets).second;
    };
    const auto samples = layer_samples();
    const double log_ratio = std::log(static_cast<double>(options_.bounds.cap) /
                                      static_cast<double>(options_.bounds.floor));
    const std::size_t profiles = std::min<std::size_t>(kProfileProposals, slots / 3);
    for (std::size_t k = 0; k < profiles; ++k) {
      const double x =
          (static_cast<double>(k) + random_.uniform_01()) / static_cast<double>(profiles);
      const auto mean = std::clamp(
          static_cast<std::uint64_t>(
              std::llround(static_cast<double>(options_.bounds.floor) * std::exp(x * log_ratio))),
          options_.bounds.floor, options_.bounds.cap);
      Budgets budgets = detail::profile_allocation(samples, mean, options_.bounds);
      if (fresh(budgets)) {
        chosen.push_back(std::move(budgets));
      }
    }
    const std::size_t open = slots - chosen.size();
    const std::size_t wanted = open * kProposalsPerSlot;
    std::vector<Budgets> pool;
    // Duplicates (of evaluated points or of each other) are drawn again, a bounded number of
    // times, so a search that has run out of new vectors ends instead of looping.
    for (std::size_t attempt = 0; pool.size() < wanted && attempt < 20 * wanted; ++attempt) {
      Budgets budgets = encoding_.decode(de_proposal(pool.size()));
      if (fresh(budgets)) {
        pool.push_back(std::move(budgets));
      }
    }
    result_.proposals += pool.size();
    const Eigen::VectorXd scores = options_.screening && pool.size() > open
                                       ? classifier_scores(pool, generation)
                                       : Eigen::VectorXd::Zero(pool.size());
    std::vector<std::size_t> order(pool.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return scores(a) > scores(b); });
    for (std::size_t k = 0; k < std::min(open, pool.size()); ++k) {
      chosen.push_back(std::move(pool[order[k]]));
    }
    return chosen;
  }

  // Every evaluated point's (budget, recall) pair of each layer.
  [[nodiscard]] std::vector<std::vector<detail::RecallSample>> layer_samples() const {
    std::vector<std::vector<detail::RecallSample>> samples(layers_);
    for (const auto& entry : archive_) {
      for (std::uint32_t l = 0; l < layers_; ++l) {
        samples[l].push_back(
            {static_cast<double>(entry.point.budgets[l]), entry.point.layer_recall[l]});
      }
    }
    return samples;
  }

  Eigen::VectorXd de_proposal(std::size_t index) {
    const std::size_t size = population_.size();
    const Eigen::VectorXd& target = archive_[population_[index % size]].genes;
    if (size < 4) {
      // Too few points for a difference vector: a random perturbation of the target.
      Eigen::VectorXd genes = target;
      for (Eigen::Index l = 0; l < genes.size(); ++l) {
        genes(l) = std::clamp(genes(l) + 0.2 * (random_.uniform_01() - 0.5), 0.0, 1.0);
      }
      return genes;
    }
    std::size_t picks[3];
    for (std::size_t k = 0; k < 3; ++k) {
      bool fresh = false;
      while (!fresh) {
        picks[k] = random_.uniform_below(size);
        fresh = picks[k] != index % size;
        for (std::size_t j = 0; j < k; ++j) {
          fresh = fresh && picks[j] != picks[k];
        }
      }
    }
    const Eigen::VectorXd& a = archive_[population_[picks[0]]].genes;
    const Eigen::VectorXd& b = archive_[population_[picks[1]]].genes;
    const Eigen::VectorXd& c = archive_[population_[picks[2]]].genes;
    const double weight = 0.3 + 0.6 * random_.uniform_01();
    const double crossover = 0.1 + 0.8 * random_.uniform_01();
    const auto forced = static_cast<Eigen::Index>(random_.uniform_below(layers_));
    Eigen::VectorXd genes = target;
    for (Eigen::Index l = 0; l < genes.size(); ++l) {
      if (l == forced || random_.uniform_01() < crossover) {
        genes(l) = std::clamp(a(l) + weight * (b(l) - c(l)), 0.0, 1.0);
      }
    }
    return genes;
  }

  // P(good Pareto rank) of each proposal, from an MLP trained on the points evaluated so far.
  // A point is labelled good when its non-dominated sorting depth is among the best third of
  // the archive's (ties included).
  Eigen::VectorXd classifier_scores(const std::vector<Budgets>& proposals,
                                    std::uint32_t generation) const {
    const auto ranks = detail::pareto_ranks(objectives());
    std::vector<std::uint32_t> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    const std::uint32_t threshold = sorted[(sorted.size() - 1) / 3];
    Eigen::MatrixXd features(static_cast<Eigen::Index>(archive_.size()), layers_);
    Eigen::VectorXd labels(features.rows());
    for (std::size_t i = 0; i < archive_.size(); ++i) {
      // Centred genes: tanh units start in their linear range.
      features.row(static_cast<Eigen::Index>(i)) = archive_[i].genes.transpose().array() - 0.5;
      labels(static_cast<Eigen::Index>(i)) = ranks[i] <= threshold ? 1.0 : 0.0;
    }
    Eigen::MatrixXd candidates(static_cast<Eigen::Index>(proposals.size()), layers_);
    for (std::size_t i = 0; i < proposals.size(); ++i) {
      candidates.row(static_cast<Eigen::Index>(i)) =
          encoding_.encode(proposals[i]).transpose().array() - 0.5;
    }
    if (labels.minCoeff() == labels.maxCoeff()) {
      return Eigen::VectorXd::Zero(candidates.rows());  // nothing to learn: DE order decides
    }
    detail::MlpClassifier classifier(layers_, kHidden, options_.seed * 1000003 + generation);
    classifier.train(features, labels);
    return classifier.predict(candidates);
  }

  void finish() {
    const auto points = objectives();
    for (const std::size_t i : detail::pareto_front(points)) {
      result_.front.push_back(archive_[i].point);
    }
    for (auto& entry : archive_) {
      result_.evaluated.push_back(std::move(entry.point));
    }
    std::vector<detail::Objectives> front;
    for (const auto& point : result_.front) {
      front.push_back({point.mean_budget, point.recall});
    }
    if (options_.winner_max_mean == 0) {
      result_.winner = detail::knee_point(front);
      result_.winner_rule =
          "knee of the front (farthest above the chord between its ends, both axes scaled to "
          "[0, 1])";
      return;
    }
    bool found = false;
    for (std::size_t k = 0; k < front.size(); ++k) {
      if (front[k].mean_budget <= static_cast<double>(options_.winner_max_mean) &&
          (!found || front[k].recall > front[result_.winner].recall)) {
        result_.winner = k;
        found = true;
      }
    }
    if (!found) {
      throw ConfigError("no evaluated budget vector has a mean of at most " +
                        std::to_string(options_.winner_max_mean) + " tokens");
    }
    result_.winner_rule =
        "best recall at a mean budget of at most " + std::to_string(options_.winner_max_mean);
  }

  std::uint32_t layers_;
  const RecallFunction& recall_;
  SearchOptions options_;
  Encoding encoding_;
  sim::RandomStream random_;
  std::vector<Evaluated> archive_;
  std::vector<std::size_t> population_;  // indices into archive_
  std::set<Budgets> seen_;
  SearchResult result_;
};

std::string joined(std::span<const std::uint64_t> budgets) {
  std::string text;
  for (const std::uint64_t b : budgets) {
    text += (text.empty() ? "" : "/") + std::to_string(b);
  }
  return text;
}

}  // namespace

std::string explicit_budget_policy(const std::string& base,
                                   std::span<const std::uint64_t> budgets) {
  if (budgets.empty()) {
    throw std::invalid_argument("explicit_budget_policy: no layers");
  }
  const std::string separator = base.find(':') == std::string::npos ? ":" : ",";
  const bool uniform = std::all_of(budgets.begin(), budgets.end(),
                                   [&](std::uint64_t b) { return b == budgets.front(); });
  if (uniform) {
    // allocation named: a policy whose default allocation is not uniform (pyramidkv) would
    // otherwise replay its own allocation under the uniform vector's name.
    return base + separator + "allocation=uniform,budget=" + std::to_string(budgets.front());
  }
  // `budget` is left out: the registry sets it to the mean of the list.
  return base + separator + "allocation=explicit,budgets=" + joined(budgets);
}

void check_base_policy(const PolicyRegistry& registry, const std::string& base) {
  const config::PolicySpec spec = parse_policy_string(base);
  const PolicyInfo* info = registry.find(spec.name());
  if (info == nullptr) {
    throw ConfigError("unknown base policy '" + spec.name() + "'");
  }
  const bool per_layer = std::any_of(info->params.begin(), info->params.end(),
                                     [](const ParamSpec& p) { return p.name == "budgets"; });
  if (!per_layer) {
    throw ConfigError("policy " + spec.name() +
                      " takes no per-layer budgets: the search needs a budgeted policy (h2o, "
                      "snapkv, pyramidkv, adakv, knorm)");
  }
  for (const auto& param : spec.param()) {
    if (param.name() == "budget" || param.name() == "allocation" || param.name() == "budgets") {
      throw ConfigError("the base policy sets '" + param.name() +
                        "': the search chooses the budgets itself");
    }
  }
}

ReplayRecall::ReplayRecall(const PolicyRegistry& registry, std::string base,
                           std::vector<SourceFactory> sources)
    : registry_(&registry), base_(std::move(base)), sources_(std::move(sources)) {
  if (sources_.empty()) {
    throw ConfigError("the budget search needs at least one trace");
  }
}

std::vector<double> ReplayRecall::operator()(std::span<const std::uint64_t> budgets) const {
  const config::PolicySpec spec = parse_policy_string(explicit_budget_policy(base_, budgets));
  std::vector<double> layer_recall(budgets.size(), 0.0);
  for (const auto& open : sources_) {
    const std::unique_ptr<AttentionSource> source = open();
    if (source->layers() != budgets.size()) {
      throw ConfigError(source->name() + " has " + std::to_string(source->layers()) +
                        " layers, the budget vector " + std::to_string(budgets.size()));
    }
    const auto policy =
        registry_->create(spec, {source->layers(), source->prompt_tokens(), source->steps()});
    const ReplayDemand demand = replay(*source, *policy);
    for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
      // Kept mass as ReplayDemand::summary() counts it (1 − T3's share), per layer over steps.
      double kept = 0.0;
      for (std::uint64_t step = 0; step < demand.steps(); ++step) {
        kept += demand.at(step, layer).kept_share();
      }
      layer_recall[layer] += kept / static_cast<double>(std::max<std::uint64_t>(demand.steps(), 1));
    }
  }
  for (double& value : layer_recall) {
    value /= static_cast<double>(sources_.size());
  }
  return layer_recall;
}

SearchResult search_budgets(std::uint32_t layers, const RecallFunction& recall,
                            const SearchOptions& options) {
  check_budget_bounds(options.bounds);
  if (layers == 0) {
    throw ConfigError("the budget search needs at least one layer");
  }
  if (options.evaluations == 0) {
    throw ConfigError("the budget search needs at least one evaluation");
  }
  if (options.jobs == 0) {
    throw ConfigError("the budget search needs at least one job");
  }
  if (options.winner_max_mean != 0 && options.winner_max_mean < options.bounds.floor) {
    throw ConfigError("the winner's mean budget limit " + std::to_string(options.winner_max_mean) +
                      " is below the floor " + std::to_string(options.bounds.floor));
  }
  return Search(layers, recall, options).run();
}

std::vector<UniformComparison> compare_with_uniform(const RecallFunction& recall,
                                                    std::span<const std::uint64_t> winner,
                                                    std::span<const std::uint64_t> target_means,
                                                    const BudgetBounds& bounds, unsigned jobs) {
  if (jobs == 0) {
    throw ConfigError("the comparison needs at least one job");
  }
  std::vector<UniformComparison> comparisons;
  std::vector<Budgets> candidates;
  for (const std::uint64_t target : target_means) {
    UniformComparison comparison;
    comparison.target_mean = target;
    comparison.budgets = rescale_budgets(winner, target, bounds);
    candidates.push_back(comparison.budgets);
    candidates.emplace_back(winner.size(), target);
    comparisons.push_back(std::move(comparison));
  }
  const auto recalls = evaluate_all(recall, candidates, jobs);
  for (std::size_t k = 0; k < comparisons.size(); ++k) {
    comparisons[k].searched_recall = mean_recall(recalls[2 * k]);
    comparisons[k].uniform_recall = mean_recall(recalls[2 * k + 1]);
  }
  return comparisons;
}

}  // namespace kvtier::replay
