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

TEST_CASE("Mooncake traces give each request its whole blocks' hash ids", "[workload]") {
  const auto requests = kvtier::serving::parse_mooncake_trace(
      R"({"timestamp": 0, "input_length": 1024, "output_length": 52, "hash_ids": [46, 47]}
{"timestamp": 10535, "input_length": 672, "output_length": 26, "hash_ids": [46, 47]}

{"timestamp": 27482, "input_length": 512, "output_length": 1, "hash_ids": [9]}
)",
      "t.jsonl", 0.5, 512);
  REQUIRE(requests.size() == 3);
  CHECK(requests[0].prompt_tokens == 1024);
  CHECK(requests[0].output_tokens == 52);
  CHECK(requests[0].segments == std::vector<std::uint64_t>{46, 47});
  CHECK(requests[0].shared_tokens == 1024);
  CHECK(requests[0].segment_tokens == 512);
  // 672 tokens: one whole block; the partial one's id may stand for other lengths too.
  CHECK(requests[1].segments == std::vector<std::uint64_t>{46});
  CHECK(requests[1].shared_tokens == 512);
  CHECK(*requests[1].arrival == kvtier::sim::Tick::ms(10535) / 2);
  CHECK(requests[2].file_line == 4);
  CHECK(requests[2].shared_tokens == 512);
}

TEST_CASE("malformed Mooncake traces name the file, line and field", "[workload]") {
  const auto fails = [](const std::string& text, const std::string& expected) {
    try {
      (void)kvtier::serving::parse_mooncake_trace(text, "t.jsonl", 1.0, 512);
      FAIL("expected a data error for " << text);
    } catch (const kvtier::DataError& error) {
      CHECK_THAT(error.what(), Catch::Contains(expected));
      CHECK_THAT(error.where(), Catch::StartsWith("t.jsonl"));
      CHECK(error.exit_code() == kvtier::ExitCode::kBadData);
    }
  };
  const std::string ok =
      R"({"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})";
  fails("{\"timestamp\": 0,\n", "expected a JSON object");
  fails("[1, 2]\n", "expected a JSON object");
  fails(R"({"timestamp": 0, "input_length": 600, "output_length": 2})", "no \"hash_ids\"");
  fails(R"({"timestamp": -1, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})",
        "timestamp -1 is not a non-negative number");
  fails(R"({"timestamp": 0, "input_length": 0, "output_length": 2, "hash_ids": []})",
        "input_length 0 is not an integer from 1");
  fails(R"({"timestamp": 0, "input_length": 600, "output_length": 2.5, "hash_ids": [1, 2]})",
        "output_length 2.5");
  fails(
      R"({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]})",
      "input_length 600 needs 2 hash_ids of 512 tokens (request_file.hash_block_tokens), found 1");
  fails(R"({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, -3]})",
        "hash id -3");
  fails(
      R"({"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 9223372036854775808]})",
      "to 2^63 - 1");
  fails(ok + "\n" +
            R"({"timestamp": 4, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]})",
        "timestamps must not decrease");
  fails("\n\n", "no requests");
  try {
    (void)kvtier::serving::parse_mooncake_trace(ok + "\n" + ok + "\nnot json\n", "t.jsonl", 1.0,
                                                512);
    FAIL("expected a data error");
  } catch (const kvtier::DataError& error) {
    CHECK(error.where() == "t.jsonl:3");
  }
}

TEST_CASE("a shared prefix goes before each generated prompt, drawn by popularity", "[workload]") {
  kvtier::config::WorkloadSpec spec;
  auto* loop = spec.mutable_closed_loop();
  loop->set_concurrency(1);
  loop->set_num_requests(4000);
  loop->mutable_prompt_tokens()->mutable_uniform()->set_min_tokens(10);
  loop->mutable_prompt_tokens()->mutable_uniform()->set_max_tokens(90);
  loop->mutable_output_tokens()->set_fixed_tokens(5);
  const kvtier::serving::Workload plain = kvtier::serving::make_workload(spec, 7);
  auto* prefix = spec.mutable_shared_prefix();
  prefix->set_tokens(300);
  prefix->set_groups(4);
  prefix->set_zipf_exponent(1.0);
  const kvtier::serving::Workload shared = kvtier::serving::make_workload(spec, 7);
  REQUIRE(shared.requests.size() == plain.requests.size());
  std::vector<int> counts(4, 0);
  for (std::size_t i = 0; i < shared.requests.size(); ++i) {
    const auto& request = shared.requests[i];
    // Its own prompt is drawn as without the prefix (a stream of its own draws the prefixes).
    CHECK(request.prompt_tokens == plain.requests[i].prompt_tokens + 300);
    CHECK(request.shared_tokens == 300);
    CHECK(request.segment_tokens == 300);
    REQUIRE(request.segments.size() == 1);
    REQUIRE(request.segments[0] < 4);
    ++counts[request.segments[0]];
  }
  // Zipf's law over 4: 1 : 1/2 : 1/3 : 1/4 of 25/12, i.e. 48%, 24%, 16%, 12%.
  CHECK(counts[0] / 4000.0 == Approx(0.48).margin(0.03));
  CHECK(counts[1] / 4000.0 == Approx(0.24).margin(0.03));
  CHECK(counts[3] / 4000.0 == Approx(0.12).margin(0.03));
  prefix->set_zipf_exponent(0.0);
  std::fill(counts.begin(), counts.end(), 0);
  for (const auto& request : kvtier::serving::make_workload(spec, 7).requests) {
    ++counts[request.segments[0]];
  }
  for (const int count : counts) {
    CHECK(count / 4000.0 == Approx(0.25).margin(0.03));
  }
  CHECK_THAT(shared.description, Catch::Contains("one of 4 shared 300-token prefixes"));
}
