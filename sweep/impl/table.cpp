// The result table: point files, the union of metric columns, CSV and JSON.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>

#include "common/errors.hpp"
#include "common/text_output.hpp"
#include "sweep/sweep.hpp"

namespace kvtier::sweep {
namespace {

// Columns every row has, before and after the axis values.
constexpr std::string_view kPointColumn = "point";
constexpr std::string_view kPolicyColumn = "policy";
constexpr std::string_view kErrorColumn = "error";

// RFC 4180: quoted when it holds a comma, a quote or a line break; quotes doubled.
void append_field(std::string& line, std::string_view field) {
  if (field.find_first_of(",\"\r\n") == std::string_view::npos) {
    line += field;
    return;
  }
  line += '"';
  for (const char c : field) {
    line += c;
    if (c == '"') {
      line += '"';
    }
  }
  line += '"';
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i > 0) {
      line += ',';
    }
    append_field(line, fields[i]);
  }
  line += '\n';
  return line;
}

// The records of an RFC 4180 text; false when a quoted field is not closed or the text does
// not end with a line break (a truncated file).
bool parse_csv(std::string_view text, std::vector<std::vector<std::string>>& records) {
  std::vector<std::string> record;
  std::string field;
  bool quoted = false;
  bool after_quote = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
          after_quote = true;
        }
      } else {
        field += c;
      }
      continue;
    }
    if (c == '"' && field.empty() && !after_quote) {
      quoted = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
      after_quote = false;
    } else if (c == '\n') {
      record.push_back(std::move(field));
      field.clear();
      after_quote = false;
      records.push_back(std::move(record));
      record.clear();
    } else if (c != '\r') {
      if (after_quote) {
        return false;  // text after a closing quote
      }
      field += c;
    }
  }
  return !quoted && field.empty() && record.empty();
}

// Merges `names` into `order`, each new name placed after the name that precedes it in
// `names`: rows that lack a metric (nvlink_utilisation at TP 1) still give the simulator's
// order, whatever row comes first.
void merge_names(std::vector<std::string>& order, const std::vector<std::string>& names) {
  std::size_t position = 0;
  for (const std::string& name : names) {
    const auto found = std::find(order.begin(), order.end(), name);
    if (found != order.end()) {
      position = static_cast<std::size_t>(found - order.begin()) + 1;
    } else {
      order.insert(order.begin() + static_cast<std::ptrdiff_t>(position), name);
      ++position;
    }
  }
}

std::vector<std::string> metric_names(const Row& row) {
  std::vector<std::string> names;
  names.reserve(row.metrics.size());
  for (const auto& metric : row.metrics) {
    names.push_back(metric.first);
  }
  return names;
}

std::vector<std::string> leading_columns(std::span<const std::string> axis_columns) {
  std::vector<std::string> columns{std::string(kPointColumn)};
  columns.insert(columns.end(), axis_columns.begin(), axis_columns.end());
  columns.emplace_back(kPolicyColumn);
  columns.emplace_back(kErrorColumn);
  return columns;
}

// The cells of `row` under `metric_columns`; empty where the row has no such metric.
std::vector<std::string> row_fields(const Row& row,
                                    const std::vector<std::string>& metric_columns) {
  std::vector<std::string> fields{std::to_string(row.point)};
  fields.insert(fields.end(), row.axis_values.begin(), row.axis_values.end());
  fields.push_back(row.policy);
  fields.push_back(row.error);
  std::size_t next = 0;  // metrics are in column order: a forward scan finds each
  for (const std::string& column : metric_columns) {
    std::string cell;
    for (std::size_t i = next; i < row.metrics.size(); ++i) {
      if (row.metrics[i].first == column) {
        cell = row.metrics[i].second;
        next = i + 1;
        break;
      }
    }
    fields.push_back(std::move(cell));
  }
  return fields;
}

std::string json_number(const std::string& text) {
  double value = 0.0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  // JSON has no NaN or infinity.
  return result.ec == std::errc() && std::isfinite(value) ? text : "null";
}

}  // namespace

std::vector<std::string> ResultTable::columns() const {
  std::vector<std::string> all = leading_columns(axis_columns);
  all.insert(all.end(), metric_columns.begin(), metric_columns.end());
  return all;
}

ResultTable make_table(std::string name, std::string spec_hash,
                       std::vector<std::string> axis_columns, std::vector<Row> rows) {
  ResultTable table;
  table.name = std::move(name);
  table.spec_hash = std::move(spec_hash);
  table.kvtier_version = kvtier_version();
  table.axis_columns = std::move(axis_columns);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.point < b.point; });
  // Rows of one sweep mostly report the same metrics: merge only when they change.
  std::vector<std::string> previous;
  for (const Row& row : rows) {
    std::vector<std::string> names = metric_names(row);
    if (names != previous) {
      merge_names(table.metric_columns, names);
      previous = std::move(names);
    }
  }
  table.rows = std::move(rows);
  return table;
}

std::string results_csv(const ResultTable& table) {
  std::string csv = csv_line(table.columns());
  for (const Row& row : table.rows) {
    csv += csv_line(row_fields(row, table.metric_columns));
  }
  return csv;
}

std::string results_json(const ResultTable& table) {
  std::string json = "{\"schema\": " + json_escape(kSchema) +
                     ", \"name\": " + json_escape(table.name) +
                     ", \"kvtier_version\": " + json_escape(table.kvtier_version) +
                     ", \"spec_hash\": " + json_escape(table.spec_hash) + ",\n \"columns\": [";
  const std::vector<std::string> columns = table.columns();
  for (std::size_t i = 0; i < columns.size(); ++i) {
    json += (i == 0 ? "" : ", ") + json_escape(columns[i]);
  }
  json += "],\n \"rows\": [";
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    const Row& row = table.rows[r];
    json += std::string(r == 0 ? "" : ",") + "\n  {\"point\": " + std::to_string(row.point) +
            ", \"axes\": {";
    for (std::size_t a = 0; a < row.axis_values.size() && a < table.axis_columns.size(); ++a) {
      json += (a == 0 ? "" : ", ") + json_escape(table.axis_columns[a]) + ": " +
              json_escape(row.axis_values[a]);
    }
    json += "}, \"policy\": " + json_escape(row.policy) +
            ", \"error\": " + (row.error.empty() ? "null" : json_escape(row.error)) +
            ",\n   \"metrics\": {";
    for (std::size_t m = 0; m < row.metrics.size(); ++m) {
      json += (m == 0 ? "" : ", ") + json_escape(row.metrics[m].first) + ": " +
              json_number(row.metrics[m].second);
    }
    json += "}}";
  }
  json += "]}\n";
  return json;
}

std::string point_file_csv(std::span<const Row> rows, std::span<const std::string> axis_columns) {
  std::vector<std::string> metrics;
  for (const Row& row : rows) {
    merge_names(metrics, metric_names(row));
  }
  std::vector<std::string> header = leading_columns(axis_columns);
  header.insert(header.end(), metrics.begin(), metrics.end());
  std::string csv = csv_line(header);
  for (const Row& row : rows) {
    csv += csv_line(row_fields(row, metrics));
  }
  return csv;
}

std::vector<Row> read_point_file(const std::filesystem::path& path,
                                 std::span<const std::string> axis_columns) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError("cannot open point file", name);
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::vector<std::string>> records;
  if (!parse_csv(text, records) || records.size() < 2) {
    throw DataError("not a whole point file (truncated or damaged CSV)", name);
  }
  const std::vector<std::string> leading = leading_columns(axis_columns);
  const std::vector<std::string>& header = records.front();
  if (header.size() < leading.size() ||
      !std::equal(leading.begin(), leading.end(), header.begin())) {
    throw DataError("point file columns differ from the sweep's axes", name);
  }
  const std::size_t axes = axis_columns.size();
  std::vector<Row> rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    const std::vector<std::string>& record = records[r];
    if (record.size() != header.size()) {
      throw DataError("line " + std::to_string(r + 1) + " has " + std::to_string(record.size()) +
                          " fields, the header " + std::to_string(header.size()),
                      name);
    }
    Row row;
    const std::string& point = record[0];
    const auto parsed = std::from_chars(point.data(), point.data() + point.size(), row.point);
    if (parsed.ec != std::errc() || parsed.ptr != point.data() + point.size()) {
      throw DataError("line " + std::to_string(r + 1) + ": point '" + point + "' is not an index",
                      name);
    }
    row.axis_values.assign(record.begin() + 1,
                           record.begin() + 1 + static_cast<std::ptrdiff_t>(axes));
    row.policy = record[1 + axes];
    row.error = record[2 + axes];
    for (std::size_t m = leading.size(); m < header.size(); ++m) {
      if (!record[m].empty()) {
        row.metrics.emplace_back(header[m], record[m]);
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace kvtier::sweep
