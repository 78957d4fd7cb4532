// Loading a sweep, enumerating its points and simulating one point.

#include <google/protobuf/text_format.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "configs/parse.hpp"
#include "configs/validate.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "serving/demand_memo.hpp"
#include "serving/simulation.hpp"
#include "sweep/impl/plan_point.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::sweep {
namespace {

using config::Problem;

constexpr std::string_view kBasePrefix = "base.";

std::string axis_path(int axis) {
  return "axis[" + std::to_string(axis) + "]";
}

std::vector<std::string> policy_labels(const config::RunSpec& run) {
  std::vector<std::string> labels{replay::policy_string(run.policy())};
  for (const config::PolicySpec& other : run.compare()) {
    labels.push_back(replay::policy_string(other));
  }
  return labels;
}

// Names and parameters against the registry; no trace shape is needed for that, so a typo in
// a policy fails the sweep before any point runs rather than every point one by one.
void check_policy(const replay::PolicyRegistry& registry, const config::PolicySpec& policy) {
  const replay::PolicyInfo* info = registry.find(policy.name());
  if (info == nullptr) {
    std::string names;
    for (const auto& known : registry.all()) {
      names += (names.empty() ? "" : ", ") + known.name;
    }
    throw ConfigError("unknown policy '" + policy.name() + "' (policies: " + names + ")");
  }
  (void)replay::PolicyParameters(info->name, info->params, policy);
}

// A policy run twice at one point would give two rows of one name. So the compared policies
// differ from each other and from the policy every point runs (the base's, or each value of a
// policy axis), and a policy axis names each policy once. Policies are compared as written
// (replay::policy_string), as `sim` and `plan` compare them; values that do not parse are
// reported by the policy checks.
void check_distinct_policies(const config::SweepSpec& spec, std::vector<Problem>& problems) {
  std::vector<std::pair<std::string, std::string>> compared;  // policy string, field
  const auto find = [](const auto& list, const std::string& policy) {
    return std::find_if(list.begin(), list.end(),
                        [&](const auto& entry) { return entry.first == policy; });
  };
  for (int i = 0; i < spec.base().compare_size(); ++i) {
    const std::string field = "base.compare[" + std::to_string(i) + "]";
    std::string policy = replay::policy_string(spec.base().compare(i));
    const auto same = find(compared, policy);
    if (same != compared.end()) {
      problems.push_back({field, replay::policy_given_twice(policy, same->second, field)});
      continue;
    }
    compared.emplace_back(std::move(policy), field);
  }
  const auto policy_axis =
      std::find_if(spec.axis().begin(), spec.axis().end(),
                   [](const auto& axis) { return axis.path() == kPolicyAxis; });
  if (policy_axis == spec.axis().end()) {
    const std::string policy = replay::policy_string(spec.base().policy());
    const auto same = find(compared, policy);
    if (same != compared.end()) {
      problems.push_back(
          {same->second, replay::policy_given_twice(policy, "base.policy", same->second)});
    }
    return;
  }
  const std::string axis = axis_path(static_cast<int>(policy_axis - spec.axis().begin()));
  std::vector<std::pair<std::string, std::string>> swept;
  for (int v = 0; v < policy_axis->values_size(); ++v) {
    const std::string field = axis + ".values[" + std::to_string(v) + "]";
    std::string policy;
    try {
      policy = replay::policy_string(replay::parse_policy_string(policy_axis->values(v)));
    } catch (const ConfigError&) {
      continue;
    }
    for (const auto* list : {&swept, &compared}) {
      const auto same = find(*list, policy);
      if (same != list->end()) {
        problems.push_back({field, replay::policy_given_twice(policy, same->second, field)});
      }
    }
    swept.emplace_back(std::move(policy), field);
  }
}

// XXH3-128 of the resolved spec in text format, as 32 hex digits (most significant first).
std::string spec_hash(const config::SweepSpec& spec) {
  std::string text;
  google::protobuf::TextFormat::Printer printer;
  (void)printer.PrintToString(spec, &text);
  const XXH128_hash_t hash = XXH3_128bits(text.data(), text.size());
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  std::string hex;
  for (const unsigned char byte : canonical.digest) {
    std::array<char, 3> digits{};
    (void)std::snprintf(digits.data(), digits.size(), "%02x", byte);
    hex += digits.data();
  }
  return hex;
}

// Axis columns carry the axis path; the policy axis would collide with the `policy` column
// (the canonical policy each row ran), so fixed columns' names get "_axis".
std::string axis_column(const std::string& path) {
  return path == "point" || path == "policy" || path == "error" ? path + "_axis" : path;
}

std::string error_text(const Error& error) {
  constexpr std::string_view kPrefix = "kvtier: error: ";
  std::string text;
  for (std::string line : error.lines()) {
    if (line.rfind(kPrefix, 0) == 0) {
      line.erase(0, kPrefix.size());
    }
    text += (text.empty() ? "" : "; ") + line;
  }
  return text;
}

// The base with the point's values applied, not yet validated.
config::RunSpec apply_point(const Sweep& sweep, std::uint64_t point,
                            const config::ConfigLoader& loader, config::LocationMap& locations) {
  config::RunSpec run = sweep.spec.base();
  const std::vector<std::string> values = point_values(sweep.spec, point);
  std::vector<config::Override> overrides;
  const config::PolicySpec* policy = nullptr;
  config::PolicySpec parsed;
  for (int a = 0; a < sweep.spec.axis_size(); ++a) {
    const std::string& path = sweep.spec.axis(a).path();
    if (path == kPolicyAxis) {
      parsed = replay::parse_policy_string(values[a]);
      policy = &parsed;
    } else {
      overrides.push_back(config::parse_override(path + "=" + values[a]));
    }
  }
  // The base is resolved already: only a point that names another preset needs its presets
  // expanded again, and parsing the preset files for every point is most of its config time.
  const bool names_preset = std::any_of(overrides.begin(), overrides.end(), [](const auto& o) {
    return o.path == "preset" || o.path.ends_with(".preset");
  });
  if (names_preset) {
    loader.apply_and_resolve(run, locations, overrides);
  } else {
    for (const config::Override& override_ : overrides) {
      config::apply_override(run, override_, locations);
    }
  }
  if (policy != nullptr) {
    *run.mutable_policy() = *policy;
  }
  return run;
}

}  // namespace

Sweep load_sweep(const std::string& path, const config::ConfigLoader& loader,
                 std::span<const config::Override> overrides) {
  return load_sweep_text(config::read_config_file(path), path, loader, overrides);
}

Sweep load_sweep_text(std::string_view text, const std::string& file_name,
                      const config::ConfigLoader& loader,
                      std::span<const config::Override> overrides) {
  Sweep sweep;
  sweep.file = file_name;
  // config::validate checks every `--set` axis value on the base (configs/impl/consistency.cpp
  // leaves the policy axis to this module: policy strings belong to replay/). Its problems and
  // this module's are reported together.
  const config::LocationMap locations = loader.resolve_text(text, file_name, sweep.spec, overrides);
  std::vector<Problem> problems = config::validate(sweep.spec, loader, locations);
  sweep.base_locations = config::LocationMap(file_name);
  for (const auto& [path, position] : locations.entries()) {
    if (path.rfind(kBasePrefix, 0) == 0) {
      sweep.base_locations.set(path.substr(kBasePrefix.size()), position);
    }
  }
  // A base with problems of its own (reported above) would repeat them for every policy value.
  const bool base_valid = config::validate(sweep.spec.base(), loader, sweep.base_locations).empty();

  const config::SweepSpec& spec = sweep.spec;
  const replay::PolicyRegistry registry = replay::builtin_policies();
  auto check = [&](const config::PolicySpec& policy, const std::string& where) {
    try {
      check_policy(registry, policy);
    } catch (const ConfigError& error) {
      problems.push_back({where, error.what()});
    }
  };
  check(spec.base().policy(), "base.policy");
  for (int i = 0; i < spec.base().compare_size(); ++i) {
    check(spec.base().compare(i), "base.compare[" + std::to_string(i) + "]");
  }
  for (int a = 0; a < spec.axis_size(); ++a) {
    const config::SweepAxis& axis = spec.axis(a);
    if (axis.path() != kPolicyAxis) {
      continue;
    }
    for (int v = 0; v < axis.values_size(); ++v) {
      const std::string where = axis_path(a) + ".values[" + std::to_string(v) + "]";
      config::RunSpec point = spec.base();
      try {
        *point.mutable_policy() = replay::parse_policy_string(axis.values(v));
        check_policy(registry, point.policy());
      } catch (const ConfigError& error) {
        problems.push_back({where, "policy axis value '" + axis.values(v) + "': " + error.what()});
        continue;
      }
      if (!base_valid) {
        continue;
      }
      config::LocationMap point_locations = sweep.base_locations;
      if (spec.mode() == config::ZIP) {
        // The policy with the point's other values: a ZIP's values belong together.
        const bool complete =
            std::all_of(spec.axis().begin(), spec.axis().end(),
                        [&](const auto& other) { return v < other.values_size(); });
        if (!complete) {
          continue;  // unequal axes, reported by config::validate
        }
        try {
          point = apply_point(sweep, static_cast<std::uint64_t>(v), loader, point_locations);
        } catch (const Error&) {
          continue;  // a value config::validate reports
        }
        config::RunSpec without_policy = point;
        *without_policy.mutable_policy() = spec.base().policy();
        if (!config::validate(without_policy, loader, point_locations).empty()) {
          continue;  // the point's other values, which config::validate reports
        }
      }
      for (const Problem& problem : config::validate(point, loader, point_locations)) {
        problems.push_back({where, "policy axis value '" + axis.values(v) +
                                       "' makes an invalid run: " + problem.what + " (field " +
                                       problem.path + ")"});
      }
    }
  }
  check_distinct_policies(spec, problems);
  check_sweep_plan(spec, problems);
  // GRID points are numbered in 64 bits: a product of axis lengths past that would wrap.
  const std::string limit = "; a sweep runs at most " + std::to_string(kMaxSweepPoints) +
                            " (split it into several sweeps)";
  // ZIP's points are its first axis's values (the lengths agree, checked above).
  const bool zip = spec.mode() == config::ZIP;
  const int last = zip ? 0 : spec.axis_size() - 1;  // the axis a problem names
  std::uint64_t points = 1;
  bool wrapped = false;
  for (int a = 0; a <= last && a < spec.axis_size() && !wrapped; ++a) {
    wrapped = __builtin_mul_overflow(points, static_cast<std::uint64_t>(spec.axis(a).values_size()),
                                     &points);
    if (wrapped) {
      problems.push_back({axis_path(a) + ".values",
                          "the GRID's axes multiply to more than 2^64 - 1 points" + limit});
    }
  }
  if (!wrapped && spec.axis_size() > 0 && points > kMaxSweepPoints) {
    problems.push_back({axis_path(last) + ".values",
                        std::string(zip ? "the ZIP has " : "the GRID's axes multiply to ") +
                            std::to_string(points) + " points" + limit});
  }
  if (!problems.empty()) {
    throw config::InvalidConfig(problems, locations);
  }
  sweep.hash = spec_hash(spec);
  for (const config::SweepAxis& axis : spec.axis()) {
    sweep.axis_columns.push_back(axis_column(axis.path()));
  }
  return sweep;
}

std::uint64_t point_count(const config::SweepSpec& spec) {
  if (spec.axis_size() == 0) {
    return 0;
  }
  if (spec.mode() == config::ZIP) {
    return static_cast<std::uint64_t>(spec.axis(0).values_size());
  }
  std::uint64_t count = 1;
  for (const config::SweepAxis& axis : spec.axis()) {
    count *= static_cast<std::uint64_t>(axis.values_size());
  }
  return count;
}

std::vector<std::uint32_t> point_coordinates(const config::SweepSpec& spec, std::uint64_t point) {
  const std::uint64_t count = point_count(spec);
  if (point >= count) {
    throw std::out_of_range("sweep point " + std::to_string(point) + " of " +
                            std::to_string(count));
  }
  std::vector<std::uint32_t> coordinates(static_cast<std::size_t>(spec.axis_size()), 0);
  if (spec.mode() == config::ZIP) {
    std::fill(coordinates.begin(), coordinates.end(), static_cast<std::uint32_t>(point));
    return coordinates;
  }
  for (int a = spec.axis_size() - 1; a >= 0; --a) {
    const auto length = static_cast<std::uint64_t>(spec.axis(a).values_size());
    coordinates[static_cast<std::size_t>(a)] = static_cast<std::uint32_t>(point % length);
    point /= length;
  }
  return coordinates;
}

std::vector<std::string> point_values(const config::SweepSpec& spec, std::uint64_t point) {
  const std::vector<std::uint32_t> coordinates = point_coordinates(spec, point);
  std::vector<std::string> values;
  values.reserve(coordinates.size());
  for (int a = 0; a < spec.axis_size(); ++a) {
    values.push_back(
        spec.axis(a).values(static_cast<int>(coordinates[static_cast<std::size_t>(a)])));
  }
  return values;
}

config::RunSpec point_run(const Sweep& sweep, std::uint64_t point,
                          const config::ConfigLoader& loader,
                          const std::filesystem::path& demand_cache) {
  config::LocationMap locations = sweep.base_locations;
  config::RunSpec run = apply_point(sweep, point, loader, locations);
  if (const auto problems = config::validate(run, loader, locations); !problems.empty()) {
    throw config::InvalidConfig(problems, locations);
  }
  config::resolve_run_paths(run, sweep.file.string());
  // mutable_tiering() would add an (invalid, empty) block to a run that has none.
  if (run.has_tiering()) {
    config::TieringSpec& tiering = *run.mutable_tiering();
    if (!tiering.has_demand_cache_directory() && !demand_cache.empty()) {
      tiering.set_demand_cache_directory(demand_cache.string());
    }
  }
  return run;
}

std::vector<Row> simulate_point(const Sweep& sweep, std::uint64_t point,
                                const config::ConfigLoader& loader, serving::DemandMemo& memo,
                                const std::filesystem::path& demand_cache) {
  const std::vector<std::string> values = point_values(sweep.spec, point);
  std::vector<std::string> labels = policy_labels(sweep.spec.base());
  for (int a = 0; a < sweep.spec.axis_size(); ++a) {
    if (sweep.spec.axis(a).path() == kPolicyAxis) {
      labels.front() = values[static_cast<std::size_t>(a)];
    }
  }
  std::vector<Row> rows;
  try {
    const config::RunSpec run = point_run(sweep, point, loader, demand_cache);
    labels = policy_labels(run);
    if (sweep.spec.has_plan()) {
      return plan_rows(sweep.spec.plan(), run, point, values, memo);
    }
    for (const serving::SimulationReport& report : serving::simulate_all(run, &memo)) {
      if (!report.does_not_fit.empty()) {  // this policy only: the others of the point ran
        rows.push_back(Row{point, values, report.policy, report.does_not_fit, {}});
        continue;
      }
      Row row{point, values, report.policy, {}, {}};
      row.metrics.reserve(report.metrics.size());
      for (const serving::Metric& metric : report.metrics) {
        // A figure the policy has no value for (host recodes not timed) is left out: an empty
        // cell, NaN in results.h5.
        if (!std::isnan(metric.value)) {
          row.metrics.emplace_back(metric.name, format_double(metric.value));
        }
      }
      rows.push_back(std::move(row));
    }
  } catch (const ConfigError& error) {
    // Combinations that do not fit are findings of a what-if grid, not failures of it.
    rows.clear();
    const std::string text = error_text(error);
    for (const std::string& label : labels) {
      rows.push_back(Row{point, values, label, text, {}});
    }
  }
  return rows;
}

}  // namespace kvtier::sweep
