#include "sim/stats_registry.hpp"

#include <sstream>
#include <stdexcept>
#include <utility>

#include "sim/json_writer.hpp"

namespace kvtier::sim {
namespace {

void write_stat(JsonWriter& json, const Counter* counter) {
  json.field("type", "counter");
  json.field("value", counter->value());
}

void write_stat(JsonWriter& json, const TimeWeightedGauge* gauge) {
  json.field("type", "gauge");
  json.field("value", gauge->value());
  json.field("time_average", gauge->time_average());
  json.field("min", gauge->min());
  json.field("max", gauge->max());
}

void write_stat(JsonWriter& json, const LatencyDistribution* distribution) {
  json.field("type", "distribution");
  json.field("count", static_cast<std::uint64_t>(distribution->count()));
  if (distribution->count() == 0) {
    return;
  }
  json.field("min_ps", distribution->min().picoseconds());
  json.field("p50_ps", distribution->percentile(50).picoseconds());
  json.field("p90_ps", distribution->percentile(90).picoseconds());
  json.field("p99_ps", distribution->percentile(99).picoseconds());
  json.field("max_ps", distribution->max().picoseconds());
  json.field("mean_ps", distribution->mean_ps());
}

void write_stat(JsonWriter& json, const TimeSeries* series) {
  json.field("type", "time_series");
  json.field("start_ps", series->start_time().picoseconds());
  json.field("interval_ps", series->interval().picoseconds());
  json.key("values");
  json.begin_array();
  for (const double value : series->values()) {
    json.value(value);
  }
  json.end_array();
}

void write_stat(JsonWriter& json, const std::function<double()>& probe) {
  json.field("type", "value");
  json.field("value", probe());
}

}  // namespace

void StatsRegistry::insert(const std::string& name, Entry entry) {
  if (name.empty()) {
    throw std::invalid_argument("sim::StatsRegistry: a statistic needs a name");
  }
  if (!entries_.emplace(name, std::move(entry)).second) {
    throw std::invalid_argument("sim::StatsRegistry: '" + name + "' is registered twice");
  }
}

void StatsRegistry::add(const std::string& name, const Counter& counter) {
  insert(name, &counter);
}
void StatsRegistry::add(const std::string& name, const TimeWeightedGauge& gauge) {
  insert(name, &gauge);
}
void StatsRegistry::add(const std::string& name, const LatencyDistribution& distribution) {
  insert(name, &distribution);
}
void StatsRegistry::add(const std::string& name, const TimeSeries& series) {
  insert(name, &series);
}
void StatsRegistry::add_value(const std::string& name, std::function<double()> probe) {
  if (!probe) {
    throw std::invalid_argument("sim::StatsRegistry: '" + name + "' has no probe");
  }
  insert(name, std::move(probe));
}

void StatsRegistry::write_json(std::ostream& out) const {
  JsonWriter json(out);
  json.begin_object();
  for (const auto& [name, entry] : entries_) {
    json.key(name);
    json.begin_object();
    std::visit([&json](const auto& stat) { write_stat(json, stat); }, entry);
    json.end_object();
  }
  json.end_object();
}

std::string StatsRegistry::to_json() const {
  std::ostringstream out;
  write_json(out);
  return out.str();
}

}  // namespace kvtier::sim
