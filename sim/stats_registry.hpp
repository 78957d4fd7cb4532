#pragma once
// Names statistics for dumping. The registry holds pointers to stats objects owned elsewhere
// (the owners update them directly); it is consulted only when writing a report, never on a hot
// path. Output is one JSON object keyed by name in sorted order, so a dump depends only on the
// names and values, not on the order things were registered.
//
// JSON shapes (times in integer picoseconds):
//   counter       {"type":"counter","value":N}
//   gauge         {"type":"gauge","value":x,"time_average":x,"min":x,"max":x}
//   distribution  {"type":"distribution","count":N,"min_ps":..,"p50_ps":..,"p90_ps":..,
//                  "p99_ps":..,"max_ps":..,"mean_ps":x}   (count only when empty)
//   time series   {"type":"time_series","start_ps":..,"interval_ps":..,"values":[...]}
//   value         {"type":"value","value":x}   (a probe evaluated at dump time)

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <variant>

#include "sim/stats.hpp"
#include "sim/time_series.hpp"

namespace kvtier::sim {

class StatsRegistry {
 public:
  // Each name may be registered once (std::invalid_argument otherwise). The registered object
  // must outlive every dump.
  void add(const std::string& name, const Counter& counter);
  void add(const std::string& name, const TimeWeightedGauge& gauge);
  void add(const std::string& name, const LatencyDistribution& distribution);
  void add(const std::string& name, const TimeSeries& series);
  void add_value(const std::string& name, std::function<double()> probe);

  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

  void write_json(std::ostream& out) const;
  [[nodiscard]] std::string to_json() const;

 private:
  using Entry = std::variant<const Counter*, const TimeWeightedGauge*, const LatencyDistribution*,
                             const TimeSeries*, std::function<double()>>;
  void insert(const std::string& name, Entry entry);

  std::map<std::string, Entry> entries_;
};

}  // namespace kvtier::sim
