#pragma once
// Turning configs and their derived quantities into rows for tables and JSON.

#include <google/protobuf/message.h>

#include <ostream>
#include <string>
#include <vector>

namespace kvtier::app {

// One reported value. `json` is its JSON form (a number or a quoted string).
struct Row {
  std::string name;
  std::string text;
  std::string json;
  std::string unit;
};

// Every present field of a resolved config, flattened to "path value unit".
[[nodiscard]] std::vector<Row> spec_rows(const google::protobuf::Message& message);

// Quantities computed from a resolved config of the given kind ("model", "gpu", "run", ...);
// empty for kinds without any.
[[nodiscard]] std::vector<Row> derived_rows(const google::protobuf::Message& message);

Row integer_row(std::string name, uint64_t value, std::string unit);
Row number_row(std::string name, double value, std::string unit, int decimals);
Row text_row(std::string name, std::string value, std::string unit = {});

// Values are right-aligned when `numeric` (derived quantities), left-aligned otherwise.
void print_rows(std::ostream& out, const std::vector<Row>& rows, const std::string& first_header,
                bool numeric);
// {"name": value, ...}
[[nodiscard]] std::string rows_json(const std::vector<Row>& rows);
// A resolved message as JSON with the schema's field names.
[[nodiscard]] std::string message_json(const google::protobuf::Message& message);

}  // namespace kvtier::app
