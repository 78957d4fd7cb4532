#include "serving/workload.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "common/text_output.hpp"

namespace kvtier::serving {
namespace {

// Stream ids, so that adding a stream never shifts another's numbers.
constexpr std::uint64_t kPromptStream = 1;
constexpr std::uint64_t kOutputStream = 2;
constexpr std::uint64_t kArrivalStream = 3;
constexpr std::uint64_t kPrefixStream = 4;

// Standard normal by Box–Muller from two uniforms (written out for reproducibility).
double standard_normal(sim::RandomStream& random) {
  const double u1 = 1.0 - random.uniform_01();  // (0, 1]
  const double u2 = random.uniform_01();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::vector<std::string_view> split(std::string_view line, char separator) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t end = line.find(separator, start);
    fields.push_back(line.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) {
      return fields;
    }
    start = end + 1;
  }
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t' || text.front() == '"')) {
    text.remove_prefix(1);
  }
  while (!text.empty() &&
         (text.back() == ' ' || text.back() == '\t' || text.back() == '\r' || text.back() == '"')) {
    text.remove_suffix(1);
  }
  return text;
}

// Seconds from an Azure trace TIMESTAMP ("2023-11-16 18:15:46.6805900") relative to `origin`.
std::optional<double> azure_seconds(std::string_view timestamp) {
  // Date part is ignored beyond the day: traces span at most a few days, so days*86400 + time.
  if (timestamp.size() < 19 || timestamp[4] != '-' || timestamp[10] != ' ') {
    return std::nullopt;
  }
  auto number = [&](size_t at, size_t length) -> std::optional<int> {
    int value = 0;
    const auto [end, error] =
        std::from_chars(timestamp.data() + at, timestamp.data() + at + length, value);
    if (error != std::errc{} || end != timestamp.data() + at + length) {
      return std::nullopt;
    }
    return value;
  };
  const auto day = number(8, 2);
  const auto hour = number(11, 2);
  const auto minute = number(14, 2);
  const auto second = number(17, 2);
  if (!day || !hour || !minute || !second) {
    return std::nullopt;
  }
  double fraction = 0.0;
  if (timestamp.size() > 19) {
    if (timestamp[19] != '.') {
      return std::nullopt;
    }
    const std::string digits(timestamp.substr(19));
    fraction = std::strtod(digits.c_str(), nullptr);
  }
  return *day * 86400.0 + *hour * 3600.0 + *minute * 60.0 + *second + fraction;
}

std::optional<std::uint64_t> parse_count(std::string_view text) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

// An arrival `seconds` into the file, replayed at `time_scale`; nullopt when it lies beyond the
// simulator's clock.
std::optional<sim::Tick> arrival_at(double seconds, double time_scale) {
  try {
    return sim::from_seconds(seconds * time_scale, sim::Rounding::kNearest);
  } catch (const std::overflow_error&) {
    return std::nullopt;
  }
}

std::string beyond_clock(double seconds, double time_scale) {
  return "arrival " + format_double(seconds) + " s (times time_scale " + format_double(time_scale) +
         ") is beyond the simulator's 106 days";
}

// Draws each request's shared prefix (workload.shared_prefix) and puts it before its prompt.
void add_shared_prefixes(const config::SharedPrefix& prefix, std::uint64_t seed,
                         std::vector<RequestSpec>& requests) {
  // The cumulative popularity of prefixes 0..g, summed in one order so that a seed draws the
  // same prefixes everywhere.
  std::vector<double> cumulative(prefix.groups());
  double total = 0.0;
  for (std::uint32_t g = 0; g < prefix.groups(); ++g) {
    total += std::pow(static_cast<double>(g) + 1.0, -prefix.zipf_exponent());
    cumulative[g] = total;
  }
  sim::RandomStream draws(seed, kPrefixStream);
  for (RequestSpec& request : requests) {
    const double u = draws.uniform_01() * total;
    const auto group = static_cast<std::uint64_t>(std::min<std::ptrdiff_t>(
        std::upper_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin(),
        static_cast<std::ptrdiff_t>(prefix.groups()) - 1));
    request.prompt_tokens += prefix.tokens();
    request.shared_tokens = prefix.tokens();
    request.segment_tokens = prefix.tokens();
    request.segments = {group};
  }
}

}  // namespace

std::uint64_t sample_tokens(const config::TokenCount& count, sim::RandomStream& random) {
  switch (count.kind_case()) {
    case config::TokenCount::kFixedTokens: return count.fixed_tokens();
    case config::TokenCount::kUniform: {
      const auto& uniform = count.uniform();
      return uniform.min_tokens() +
             random.uniform_below(uniform.max_tokens() - uniform.min_tokens() + 1);
    }
    case config::TokenCount::kLognormal: {
      const auto& lognormal = count.lognormal();
      const double value =
          lognormal.median_tokens() * std::exp(lognormal.sigma() * standard_normal(random));
      const double clamped =
          std::clamp(std::round(value), static_cast<double>(lognormal.min_tokens()),
                     static_cast<double>(lognormal.max_tokens()));
      return static_cast<std::uint64_t>(clamped);
    }
    case config::TokenCount::KIND_NOT_SET: break;
  }
  throw ConfigError("token count has no distribution");
}

std::vector<RequestSpec> parse_request_file(const std::string& text, const std::string& file_name,
                                            config::RequestFileFormat format, double time_scale) {
  if (format != config::AZURE_CSV && format != config::KVTIER_CSV) {
    throw std::invalid_argument("parse_request_file reads the CSV formats only");
  }
  std::vector<RequestSpec> requests;
  std::istringstream lines(text);
  std::string line;
  std::uint64_t number = 0;
  std::optional<double> origin;
  double previous = -1.0;
  bool header_seen = false;
  auto fail = [&](const std::string& what) -> void {
    throw DataError(what, file_name + ":" + std::to_string(number));
  };
  while (std::getline(lines, line)) {
    ++number;
    const std::string_view content = trim(line);
    if (content.empty() || content.front() == '#') {
      continue;
    }
    const auto fields = split(content, ',');
    if (!header_seen) {
      // The first line names the columns.
      header_seen = true;
      const bool azure = format == config::AZURE_CSV;
      const std::string expected = azure ? "TIMESTAMP,ContextTokens,GeneratedTokens"
                                         : "arrival_s,prompt_tokens,output_tokens";
      if (fields.size() != 3 || trim(fields[0]) != (azure ? "TIMESTAMP" : "arrival_s")) {
        fail("expected the header '" + expected + "'");
      }
      continue;
    }
    if (fields.size() != 3) {
      fail("expected 3 comma-separated fields, found " + std::to_string(fields.size()));
    }
    double seconds = 0.0;
    if (format == config::AZURE_CSV) {
      const auto parsed = azure_seconds(trim(fields[0]));
      if (!parsed) {
        fail("TIMESTAMP '" + std::string(trim(fields[0])) +
             "' is not 'YYYY-MM-DD hh:mm:ss[.fraction]'");
      }
      if (!origin) {
        origin = *parsed;
      }
      seconds = *parsed - *origin;
    } else {
      const std::string value(trim(fields[0]));
      char* end = nullptr;
      seconds = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(seconds) ||
          seconds < 0) {
        fail("arrival_s '" + value + "' is not a non-negative number of seconds");
      }
    }
    if (seconds < previous) {
      fail("arrival times must not decrease");
    }
    previous = seconds;
    const auto prompt = parse_count(trim(fields[1]));
    const auto output = parse_count(trim(fields[2]));
    if (!prompt || *prompt == 0) {
      fail("prompt token count '" + std::string(trim(fields[1])) + "' is not a positive integer");
    }
    if (!output || *output == 0) {
      fail("output token count '" + std::string(trim(fields[2])) + "' is not a positive integer");
    }
    const std::optional<sim::Tick> arrival = arrival_at(seconds, time_scale);
    if (!arrival) {
      fail(beyond_clock(seconds, time_scale));
    }
    requests.push_back(RequestSpec{*prompt, *output, *arrival, number});
  }
  if (requests.empty()) {
    throw DataError("request file has no requests", file_name);
  }
  return requests;
}

std::vector<RequestSpec> parse_mooncake_trace(const std::string& text, const std::string& file_name,
                                              double time_scale, std::uint32_t hash_block_tokens) {
  std::vector<RequestSpec> requests;
  std::istringstream lines(text);
  std::string line;
  std::uint64_t number = 0;
  double previous = -1.0;
  auto fail = [&](const std::string& what) -> void {
    throw DataError(what, file_name + ":" + std::to_string(number));
  };
  // A JSON integer in [minimum, 2^63): hash ids are kept below the ids of requests' own blocks
  // (serving/prefix_cache.hpp).
  auto count = [&](const nlohmann::json& value, const std::string& what,
                   std::uint64_t minimum) -> std::uint64_t {
    if (!value.is_number_integer() ||
        (value.is_number_unsigned() ? value.get<std::uint64_t>() >= (1ULL << 63)
                                    : value.get<std::int64_t>() < 0) ||
        value.get<std::uint64_t>() < minimum) {
      fail(what + " " + value.dump() + " is not an integer from " + std::to_string(minimum) +
           " to 2^63 - 1");
    }
    return value.get<std::uint64_t>();
  };
  while (std::getline(lines, line)) {
    ++number;
    const std::string_view content = trim(line);
    if (content.empty()) {
      continue;
    }
    const nlohmann::json request = nlohmann::json::parse(content, nullptr, false);
    if (request.is_discarded() || !request.is_object()) {
      fail("expected a JSON object on one line");
    }
    for (const char* field : {"timestamp", "input_length", "output_length", "hash_ids"}) {
      if (!request.contains(field)) {
        fail(std::string("no \"") + field + "\"");
      }
    }
    const nlohmann::json& timestamp = request["timestamp"];
    const double milliseconds = timestamp.is_number() ? timestamp.get<double>() : -1.0;
    if (!timestamp.is_number() || !std::isfinite(milliseconds) || milliseconds < 0) {
      fail("timestamp " + timestamp.dump() + " is not a non-negative number of milliseconds");
    }
    const double seconds = milliseconds / 1e3;
    if (seconds < previous) {
      fail("timestamps must not decrease");
    }
    previous = seconds;
    RequestSpec spec;
    spec.prompt_tokens = count(request["input_length"], "input_length", 1);
    spec.output_tokens = count(request["output_length"], "output_length", 1);
    const nlohmann::json& ids = request["hash_ids"];
    const std::uint64_t blocks = (spec.prompt_tokens + hash_block_tokens - 1) / hash_block_tokens;
    if (!ids.is_array() || ids.size() != blocks) {
      fail("input_length " + std::to_string(spec.prompt_tokens) + " needs " +
           std::to_string(blocks) + " hash_ids of " + std::to_string(hash_block_tokens) +
           " tokens (request_file.hash_block_tokens), found " +
           (ids.is_array() ? std::to_string(ids.size()) : "no array"));
    }
    const std::uint64_t whole = spec.prompt_tokens / hash_block_tokens;
    for (std::uint64_t b = 0; b < blocks; ++b) {
      const std::uint64_t id = count(ids[b], "hash id", 0);
      if (b < whole) {
        spec.segments.push_back(id);
      }
    }
    spec.segment_tokens = hash_block_tokens;
    spec.shared_tokens = whole * hash_block_tokens;
    const std::optional<sim::Tick> arrival = arrival_at(seconds, time_scale);
    if (!arrival) {
      fail(beyond_clock(seconds, time_scale));
    }
    spec.arrival = *arrival;
    spec.file_line = number;
    requests.push_back(std::move(spec));
  }
  if (requests.empty()) {
    throw DataError("request file has no requests", file_name);
  }
  return requests;
}

std::string describe_request(const Workload& workload, std::size_t index) {
  const RequestSpec& spec = workload.requests.at(index);
  if (workload.request_file.empty() || spec.file_line == 0) {
    return "request " + std::to_string(index);
  }
  return "the request at " + workload.request_file + ":" + std::to_string(spec.file_line);
}

Workload make_workload(const config::WorkloadSpec& spec, std::uint64_t seed) {
  Workload workload;
  sim::RandomStream prompts(seed, kPromptStream);
  sim::RandomStream outputs(seed, kOutputStream);
  switch (spec.kind_case()) {
    case config::WorkloadSpec::kClosedLoop: {
      const auto& loop = spec.closed_loop();
      for (std::uint32_t i = 0; i < loop.num_requests(); ++i) {
        const std::uint64_t prompt = sample_tokens(loop.prompt_tokens(), prompts);
        workload.requests.push_back(
            RequestSpec{prompt, sample_tokens(loop.output_tokens(), outputs), std::nullopt});
      }
      workload.closed_loop_concurrency = loop.concurrency();
      workload.description = "closed loop, " + std::to_string(loop.concurrency()) + " in flight, " +
                             std::to_string(loop.num_requests()) + " requests";
      break;
    }
    case config::WorkloadSpec::kPoisson: {
      const auto& poisson = spec.poisson();
      sim::RandomStream arrivals(seed, kArrivalStream);
      double seconds = 0.0;
      for (std::uint32_t i = 0; i < poisson.num_requests(); ++i) {
        seconds += -std::log(1.0 - arrivals.uniform_01()) / poisson.rate_per_s();
        const std::uint64_t prompt = sample_tokens(poisson.prompt_tokens(), prompts);
        workload.requests.push_back(
            RequestSpec{prompt, sample_tokens(poisson.output_tokens(), outputs),
                        sim::from_seconds(seconds, sim::Rounding::kNearest)});
      }
      workload.description = "Poisson arrivals at " + std::to_string(poisson.rate_per_s()) +
                             "/s, " + std::to_string(poisson.num_requests()) + " requests";
      break;
    }
    case config::WorkloadSpec::kRequestFile: {
      const auto& file = spec.request_file();
      const InputText input = read_input_file(file.path(), kRequestFileLimitBytes);
      if (input.status == InputText::Status::kTooLarge) {
        throw DataError("larger than " + input_limit_text(kRequestFileLimitBytes) +
                            ": split the request file, or keep its first requests",
                        file.path());
      }
      if (input.status != InputText::Status::kRead) {
        throw DataError("cannot open request file", file.path());
      }
      workload.requests =
          file.format() == config::MOONCAKE_JSONL
              ? parse_mooncake_trace(input.text, file.path(), file.time_scale(),
                                     file.hash_block_tokens())
              : parse_request_file(input.text, file.path(), file.format(), file.time_scale());
      if (file.has_max_requests() && workload.requests.size() > file.max_requests()) {
        workload.requests.resize(file.max_requests());
      }
      workload.request_file = file.path();
      workload.description = "request file " + file.path() + ", " +
                             std::to_string(workload.requests.size()) + " requests";
      break;
    }
    case config::WorkloadSpec::KIND_NOT_SET: throw ConfigError("workload has no kind");
  }
  if (spec.has_shared_prefix()) {
    // Generated workloads only (configs/impl/consistency.cpp).
    add_shared_prefixes(spec.shared_prefix(), seed, workload.requests);
    workload.description += ", each after one of " + std::to_string(spec.shared_prefix().groups()) +
                            " shared " + std::to_string(spec.shared_prefix().tokens()) +
                            "-token prefixes";
  }
  return workload;
}

}  // namespace kvtier::serving
