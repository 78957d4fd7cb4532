#include "sim/json_writer.hpp"

#include <cmath>
#include <stdexcept>

#include "common/text_output.hpp"

namespace kvtier::sim {

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_element_.empty()) {
    if (has_element_.back()) {
      out_ << ',';
    }
    has_element_.back() = true;
  }
}

void JsonWriter::begin_object() {
  before_value();
  out_ << '{';
  has_element_.push_back(false);
}

void JsonWriter::end_object() {
  if (has_element_.empty() || after_key_) {
    throw std::logic_error("sim::JsonWriter: unbalanced end_object");
  }
  has_element_.pop_back();
  out_ << '}';
}

void JsonWriter::begin_array() {
  before_value();
  out_ << '[';
  has_element_.push_back(false);
}

void JsonWriter::end_array() {
  if (has_element_.empty() || after_key_) {
    throw std::logic_error("sim::JsonWriter: unbalanced end_array");
  }
  has_element_.pop_back();
  out_ << ']';
}

void JsonWriter::key(std::string_view name) {
  if (after_key_) {
    throw std::logic_error("sim::JsonWriter: two keys in a row");
  }
  before_value();
  out_ << json_escape(name) << ':';
  after_key_ = true;
}

void JsonWriter::value(std::string_view text) {
  before_value();
  out_ << json_escape(text);
}

void JsonWriter::value(double number) {
  before_value();
  if (std::isfinite(number)) {
    out_ << format_double(number);
  } else {
    out_ << "null";
  }
}

void JsonWriter::value(std::int64_t number) {
  before_value();
  out_ << number;
}

void JsonWriter::value(std::uint64_t number) {
  before_value();
  out_ << number;
}

void JsonWriter::value(bool flag) {
  before_value();
  out_ << (flag ? "true" : "false");
}

void JsonWriter::null() {
  before_value();
  out_ << "null";
}

}  // namespace kvtier::sim
