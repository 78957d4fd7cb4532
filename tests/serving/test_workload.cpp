#include <catch2/catch.hpp>

#include "common/errors.hpp"
#include "configs/schema/workload.pb.h"
#include "serving/workload.hpp"

using kvtier::config::TokenCount;

TEST_CASE("token counts follow their distribution and stay in bounds", "[workload]") {
  kvtier::sim::RandomStream random(42);
  TokenCount uniform;
  uniform.mutable_uniform()->set_min_tokens(10);
  uniform.mutable_uniform()->set_max_tokens(20);
  TokenCount lognormal;
  auto* spec = lognormal.mutable_lognormal();
  spec->set_median_tokens(100);
  spec->set_sigma(1.0);
  spec->set_min_tokens(5);
  spec->set_max_tokens(2000);
  std::vector<std::uint64_t> draws;
  for (int i = 0; i < 4001; ++i) {
    const auto u = kvtier::serving::sample_tokens(uniform, random);
    CHECK((u >= 10 && u <= 20));
    draws.push_back(kvtier::serving::sample_tokens(lognormal, random));
  }
  std::sort(draws.begin(), draws.end());
  CHECK(draws.front() >= 5);
  CHECK(draws.back() <= 2000);
  CHECK(static_cast<double>(draws[2000]) == Approx(100).epsilon(0.1));  // the median
}

TEST_CASE("request files are read in both formats", "[workload]") {
  const auto azure = kvtier::serving::parse_request_file(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.6805900,374,44\n"
      "2023-11-16 18:15:50.9951690,396,109\n",
      "azure.csv", kvtier::config::AZURE_CSV, 1.0);
  REQUIRE(azure.size() == 2);
  CHECK(azure[0].prompt_tokens == 374);
  CHECK(*azure[0].arrival == kvtier::sim::Tick::zero());
  CHECK(kvtier::sim::to_seconds(*azure[1].arrival) == Approx(4.314579));
  const auto ours = kvtier::serving::parse_request_file(
      "arrival_s,prompt_tokens,output_tokens\n0,10,5\n# comment\n2.5,20,6\n", "ours.csv",
      kvtier::config::KVTIER_CSV, 0.5);
  REQUIRE(ours.size() == 2);
  CHECK(*ours[1].arrival == kvtier::sim::Tick::ms(1250));
}

TEST_CASE("malformed request files name the file and line", "[workload]") {
  const auto fails = [](const std::string& text, const std::string& expected) {
    try {
      (void)kvtier::serving::parse_request_file(text, "r.csv", kvtier::config::KVTIER_CSV, 1.0);
      FAIL("expected a data error for " << text);
    } catch (const kvtier::DataError& error) {
      CHECK_THAT(error.what(), Catch::Contains(expected));
      CHECK_THAT(error.where(), Catch::StartsWith("r.csv"));
      CHECK(error.exit_code() == kvtier::ExitCode::kBadData);
    }
  };
  fails("time,a,b\n1,2,3\n", "expected the header");
  fails("arrival_s,prompt_tokens,output_tokens\n1,2\n", "expected 3 comma-separated fields");
  fails("arrival_s,prompt_tokens,output_tokens\nsoon,2,3\n", "is not a non-negative number");
  fails("arrival_s,prompt_tokens,output_tokens\n1,0,3\n", "prompt token count");
  fails("arrival_s,prompt_tokens,output_tokens\n2,5,3\n1,5,3\n", "must not decrease");
  fails("arrival_s,prompt_tokens,output_tokens\n", "no requests");
  fails("arrival_s,prompt_tokens,output_tokens\n1e300,2,3\n", "beyond the simulator's 106 days");
  try {
    (void)kvtier::serving::parse_request_file("arrival_s,prompt_tokens,output_tokens\n1,2,x\n",
                                              "r.csv", kvtier::config::KVTIER_CSV, 1.0);
  } catch (const kvtier::DataError& error) {
    CHECK(error.where() == "r.csv:2");
  }
}
