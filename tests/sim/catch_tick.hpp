#pragma once
// Lets Catch print sim::Tick values in failed assertions ("1500000 ps" instead of "{?}").

#include <catch2/catch.hpp>

#include <string>

#include "sim/tick.hpp"

namespace Catch {
template <>
struct StringMaker<kvtier::sim::Tick> {
  static std::string convert(kvtier::sim::Tick tick) {
    return std::to_string(tick.picoseconds()) + " ps";
  }
};
}  // namespace Catch
