#include <catch2/catch.hpp>

#include <array>
#include <memory>
#include <utility>

#include "sim/inline_callback.hpp"

using kvtier::sim::InlineCallback;

TEST_CASE("typical event lambdas are stored without a heap allocation", "[sim][callback]") {
  // An event typically captures its owner, a reference or two and a pair of ids.
  int counter = 0;
  auto small = [&counter, owner = &counter, id = 7u, generation = 3u] {
    counter += static_cast<int>(id + generation) + (owner != nullptr ? 1 : 0);
  };
  STATIC_REQUIRE(InlineCallback::stores_inline<decltype(small)>());
  InlineCallback callback(small);
  callback();
  CHECK(counter == 11);
  auto big = [payload = std::array<char, 64>{}] { (void)payload; };
  STATIC_REQUIRE_FALSE(InlineCallback::stores_inline<decltype(big)>());
}

TEST_CASE("an InlineCallback runs, moves and destroys what it holds", "[sim][callback]") {
  auto token = std::make_shared<int>(0);
  InlineCallback first([token] { ++*token; });
  CHECK(static_cast<bool>(first));
  first();
  CHECK(*token == 1);
  CHECK(token.use_count() == 2);
  InlineCallback second(std::move(first));
  CHECK_FALSE(static_cast<bool>(first));  // NOLINT(bugprone-use-after-move): moved-from is empty
  second();
  CHECK(*token == 2);
  second.reset();
  CHECK(token.use_count() == 1);
}

TEST_CASE("a large callable falls back to the heap and behaves the same", "[sim][callback]") {
  auto token = std::make_shared<int>(0);
  std::array<int, 32> payload{};
  payload[31] = 5;
  InlineCallback callback([token, payload] { *token += payload[31]; });
  InlineCallback moved;
  moved = std::move(callback);
  moved();
  CHECK(*token == 5);
  moved = InlineCallback([] {});
  CHECK(token.use_count() == 1);
}
