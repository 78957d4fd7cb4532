#include "traces/validate.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/text_output.hpp"
#include "traces/impl/structure.hpp"

namespace kvtier::traces {
namespace {

// Collects problems, listing the first few of each kind in each dataset and counting the rest.
class ProblemLog {
 public:
  ProblemLog(ValidationReport& report, std::uint32_t max_listed)
      : report_(report), max_listed_(max_listed) {}

  void add(const std::string& dataset, const char* kind, std::string what, std::string where) {
    std::uint32_t& seen = seen_[dataset + '\n' + kind];
    ++seen;
    if (seen <= max_listed_) {
      report_.problems.push_back({std::move(what), std::move(where)});
    } else {
      ++report_.unlisted_problems;
    }
  }

 private:
  ValidationReport& report_;
  std::uint32_t max_listed_;
  std::map<std::string, std::uint32_t> seen_;
};

class ContentValidator {
 public:
  ContentValidator(const OpenTrace& trace, const ValidationOptions& options,
                   ValidationReport& report)
      : trace_(trace),
        shape_(trace.shape),
        options_(options),
        report_(report),
        log_(report, options.max_listed_per_kind) {}

  void run(const TraceDatasets& datasets) {
    if (datasets.tokens.valid()) {
      check_tokens(datasets.tokens.get());
    }
    for (std::uint32_t i = 0; i < shape_.layers.count; ++i) {
      const std::uint32_t layer = shape_.layers.first + i;
      const LayerDatasets& layer_sets = datasets.layers[i];
      if (layer_sets.mean.valid()) {
        check_dense(layer_sets.mean.get(), mean_path(layer), 1);
      }
      if (layer_sets.heads.valid()) {
        check_dense(layer_sets.heads.get(), heads_path(layer), shape_.heads);
      }
      if (layer_sets.topk_indices.valid() && layer_sets.topk_weights.valid() &&
          layer_sets.topk_residual.valid()) {
        check_topk(layer_sets, layer);
      }
      if (layer_sets.prefill.valid()) {
        check_prefill(layer_sets.prefill.get(), layer);
      }
    }
    if (datasets.key_norms.valid()) {
      check_key_norms(datasets.key_norms.get());
    }
  }

 private:
  std::string at(const std::string& dataset, const std::string& detail) const {
    return h5::where(trace_.file_name, dataset) + ", " + detail;
  }

  // Reads into `out`; an unreadable block is itself the problem (damaged chunk).
  bool read(hid_t dataset, const std::string& path, std::span<const hsize_t> start,
            std::span<const hsize_t> count, std::vector<float>& out) {
    try {
      read_weight_block(trace_, dataset, start, count, out, scratch_,
                        h5::where(trace_.file_name, path));
      return true;
    } catch (const DataError& error) {
      log_.add(path, "read", error.what(), error.where());
      return false;
    }
  }

  // One probability row: finite, non-negative, summing to 1 within tolerance.
  void check_distribution(std::span<const float> row, std::uint64_t length, const std::string& path,
                          const std::string& detail) {
    double sum = 0.0;
    bool finite = true;
    bool negative = false;
    for (const float w : row) {
      finite = finite && std::isfinite(w);
      negative = negative || w < 0.0F;
      sum += w;
    }
    ++report_.rows_checked;
    if (!finite) {
      log_.add(path, "nonfinite", "NaN or infinite weight in row", at(path, detail));
      return;
    }
    if (negative) {
      log_.add(path, "negative", "negative weight in row", at(path, detail));
    }
    const double tolerance = row_sum_tolerance(shape_.weight_type, length);
    if (std::fabs(sum - 1.0) > tolerance) {
      log_.add(path, "sum",
               "row sums to " + format_double(sum) + ", not 1 (tolerance " +
                   format_double(tolerance) + ")",
               at(path, detail));
    }
  }

  void check_dense(hid_t dataset, const std::string& path, std::uint32_t lanes) {
    std::vector<float> values;
    const std::uint64_t budget = std::max<std::uint64_t>(1, options_.block_elements / lanes);
    for (const StepRange block : plan_step_blocks(shape_, {0, shape_.steps}, budget)) {
      const std::uint64_t first = shape_.row_offset(block.first);
      const std::uint64_t width = shape_.row_offset(block.end()) - first;
      const hsize_t start_1d[1] = {first};
      const hsize_t count_1d[1] = {width};
      const hsize_t start_2d[2] = {0, first};
      const hsize_t count_2d[2] = {lanes, width};
      const bool ok = lanes == 1 ? read(dataset, path, start_1d, count_1d, values)
                                 : read(dataset, path, start_2d, count_2d, values);
      if (!ok) {
        continue;
      }
      for (std::uint32_t lane = 0; lane < lanes; ++lane) {
        for (std::uint32_t step = block.first; step < block.end(); ++step) {
          const std::uint64_t begin = lane * width + shape_.row_offset(step) - first;
          const std::uint64_t length = shape_.row_length(step);
          const std::string detail =
              "step " + std::to_string(step) + (lanes > 1 ? ", head " + std::to_string(lane) : "");
          check_distribution({values.data() + begin, length}, length, path, detail);
        }
      }
    }
  }

  void check_topk(const LayerDatasets& sets, std::uint32_t layer) {
    const std::uint32_t k = shape_.top_k;
    const std::uint32_t rows_per_block =
        static_cast<std::uint32_t>(std::max<std::uint64_t>(1, options_.block_elements / k));
    const std::string path = topk_weights_path(layer);
    std::vector<std::int32_t> indices;
    std::vector<float> weights;
    std::vector<float> residual;
    std::vector<std::int32_t> sorted;
    for (std::uint32_t first = 0; first < shape_.steps; first += rows_per_block) {
      const std::uint32_t count = std::min(rows_per_block, shape_.steps - first);
      const hsize_t start[2] = {first, 0};
      const hsize_t size[2] = {count, k};
      indices.resize(static_cast<std::size_t>(count) * k);
      residual.resize(count);
      try {
        h5::read_block(sets.topk_indices.get(), H5T_NATIVE_INT32, start, size, indices.data(),
                       h5::where(trace_.file_name, topk_indices_path(layer)));
        h5::read_1d(sets.topk_residual.get(), H5T_NATIVE_FLOAT, first, count, residual.data(),
                    h5::where(trace_.file_name, topk_residual_path(layer)));
      } catch (const DataError& error) {
        log_.add(path, "read", error.what(), error.where());
        continue;
      }
      if (!read(sets.topk_weights.get(), path, start, size, weights)) {
        continue;
      }
      for (std::uint32_t i = 0; i < count; ++i) {
        const std::uint32_t step = first + i;
        const std::uint64_t length = shape_.row_length(step);
        const std::uint64_t valid = std::min<std::uint64_t>(k, length);
        const std::string detail = "step " + std::to_string(step);
        const std::int32_t* row_indices = indices.data() + static_cast<std::size_t>(i) * k;
        const float* row_weights = weights.data() + static_cast<std::size_t>(i) * k;
        sorted.assign(row_indices, row_indices + valid);
        bool indices_ok = std::all_of(sorted.begin(), sorted.end(), [&](std::int32_t index) {
          return index >= 0 && static_cast<std::uint64_t>(index) < length;
        });
        for (std::uint64_t j = valid; j < k; ++j) {
          indices_ok = indices_ok && row_indices[j] == kTopKPadIndex && row_weights[j] == 0.0F;
        }
        std::sort(sorted.begin(), sorted.end());
        indices_ok = indices_ok && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
        if (!indices_ok) {
          log_.add(path, "indices",
                   "top-k indices must be " + std::to_string(valid) +
                       " distinct positions inside the row, then padding (-1, weight 0)",
                   at(topk_indices_path(layer), detail));
        }
        std::vector<float> row(row_weights, row_weights + k);
        row.push_back(residual[i]);
        check_distribution(row, length, path, detail + " (weights + residual)");
      }
    }
  }

  void check_prefill(hid_t dataset, std::uint32_t layer) {
    const std::string path = prefill_path(layer);
    const std::uint32_t window = shape_.prefill_window;
    const std::uint32_t prompt = shape_.prompt_tokens;
    std::vector<float> values;
    for (std::uint32_t head = 0; head < shape_.heads; ++head) {
      const hsize_t start[3] = {head, 0, 0};
      const hsize_t count[3] = {1, window, prompt};
      if (!read(dataset, path, start, count, values)) {
        continue;
      }
      for (std::uint32_t query = 0; query < window; ++query) {
        const std::uint64_t position = prompt - window + query;
        const float* row = values.data() + static_cast<std::size_t>(query) * prompt;
        const std::string detail =
            "head " + std::to_string(head) + ", query " + std::to_string(query);
        check_distribution({row, position + 1}, position + 1, path, detail);
        if (!std::all_of(row + position + 1, row + prompt, [](float w) { return w == 0.0F; })) {
          log_.add(path, "causal", "weight on a position after the query (must be 0)",
                   at(path, detail));
        }
      }
    }
  }

  void check_key_norms(hid_t dataset) {
    const std::string path(kKeyNormsPath);
    std::vector<float> norms(static_cast<std::size_t>(shape_.kv_heads) * shape_.tokens());
    for (std::uint32_t i = 0; i < shape_.layers.count; ++i) {
      const hsize_t start[3] = {i, 0, 0};
      const hsize_t count[3] = {1, shape_.kv_heads, shape_.tokens()};
      try {
        h5::read_block(dataset, H5T_NATIVE_FLOAT, start, count, norms.data(),
                       h5::where(trace_.file_name, path));
      } catch (const DataError& error) {
        log_.add(path, "read", error.what(), error.where());
        continue;
      }
      const auto bad = std::find_if(norms.begin(), norms.end(),
                                    [](float n) { return !std::isfinite(n) || n < 0.0F; });
      if (bad != norms.end()) {
        const auto index = static_cast<std::uint64_t>(bad - norms.begin());
        log_.add(path, "norm", "key norm is negative, NaN or infinite",
                 at(path, "layer " + std::to_string(shape_.layers.first + i) + ", KV head " +
                              std::to_string(index / shape_.tokens()) + ", position " +
                              std::to_string(index % shape_.tokens())));
      }
    }
  }

  void check_tokens(hid_t dataset) {
    const std::string path(kTokensPath);
    std::vector<std::int32_t> tokens(shape_.tokens());
    try {
      h5::read_1d(dataset, H5T_NATIVE_INT32, 0, tokens.size(), tokens.data(),
                  h5::where(trace_.file_name, path));
    } catch (const DataError& error) {
      log_.add(path, "read", error.what(), error.where());
      return;
    }
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || static_cast<std::uint32_t>(tokens[i]) >= shape_.vocab_size) {
        log_.add(path, "vocab",
                 "token " + std::to_string(tokens[i]) + " is outside the vocabulary (0.." +
                     std::to_string(shape_.vocab_size - 1) + ")",
                 at(path, "position " + std::to_string(i)));
      }
    }
  }

  const OpenTrace& trace_;
  const TraceShape& shape_;
  const ValidationOptions& options_;
  ValidationReport& report_;
  ProblemLog log_;
  std::vector<std::uint16_t> scratch_;
};

}  // namespace

ValidationReport validate_trace(const std::filesystem::path& path,
                                const ValidationOptions& options) {
  ValidationReport report;
  OpenTrace trace;
  try {
    trace = open_trace(path.string());
  } catch (const DataError& error) {
    report.problems.push_back({error.what(), error.where()});
    return report;
  }
  const TraceDatasets datasets = open_datasets(trace, 1U << 20, report.problems);
  ContentValidator(trace, options, report).run(datasets);
  return report;
}

InvalidTrace::InvalidTrace(const ValidationReport& report)
    : DataError(report.problems.empty() ? "invalid trace" : report.problems.front().what,
                report.problems.empty() ? "" : report.problems.front().where) {
  for (const TraceProblem& problem : report.problems) {
    lines_.push_back(format_error_line(problem.what, problem.where));
  }
  if (report.unlisted_problems > 0) {
    lines_.push_back(format_error_line(
        std::to_string(report.unlisted_problems) + " more problems like those above not listed",
        ""));
  }
}

std::vector<std::string> InvalidTrace::lines() const {
  return lines_;
}

}  // namespace kvtier::traces
