#pragma once
// A minimal streaming JSON writer with deterministic output: no whitespace, doubles in their
// shortest round-trip form (common/text_output.hpp's format_double), non-finite doubles as null
// (JSON has no NaN or infinity), keys in the order they are written.

#include <cstdint>
#include <ostream>
#include <string_view>
#include <vector>

namespace kvtier::sim {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  void begin_object();
  void end_object();
  void begin_array();
  void end_array();
  // Inside an object: the next value's key.
  void key(std::string_view name);

  void value(std::string_view text);
  void value(const char* text) { value(std::string_view(text)); }
  void value(double number);
  void value(std::int64_t number);
  void value(std::uint64_t number);
  void value(int number) { value(static_cast<std::int64_t>(number)); }
  void value(bool flag);
  void null();

  // Shorthand for key(name) followed by value(v).
  template <class T>
  void field(std::string_view name, const T& v) {
    key(name);
    value(v);
  }

 private:
  // Writes the comma that separates this element from the previous one, if any.
  void before_value();

  std::ostream& out_;
  std::vector<bool> has_element_;  // one per open object or array
  bool after_key_ = false;
};

}  // namespace kvtier::sim
