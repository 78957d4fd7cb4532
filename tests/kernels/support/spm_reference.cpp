// Reference sentencepiece, run as its own process: Debian's libsentencepiece exports its own
// protobuf runtime, which cannot share a process with the system protobuf the tests link.
//   kvtier_spm_reference train CORPUS PREFIX VOCAB_SIZE MODEL_TYPE NORMALIZER
//   kvtier_spm_reference encode MODEL TEXTS   (TEXTS: records separated by NUL bytes)
// `encode` prints one line of space-separated ids per record.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 6 && args[0] == "train") {
    const std::string options =
        "--input=" + args[1] + " --model_prefix=" + args[2] + " --vocab_size=" + args[3] +
        " --model_type=" + args[4] + " --normalization_rule_name=" + args[5] +
        // Llama 2's settings: byte fallback, no whitespace clean-up, digits split.
        " --byte_fallback=true --remove_extra_whitespaces=false --split_digits=true"
        " --character_coverage=0.995 --num_threads=1 --minloglevel=2";
    const auto status = sentencepiece::SentencePieceTrainer::Train(options);
    if (!status.ok()) {
      std::cerr << status.ToString() << "\n";
      return 1;
    }
    return 0;
  }
  if (args.size() == 3 && args[0] == "encode") {
    sentencepiece::SentencePieceProcessor processor;
    const auto status = processor.Load(args[1]);
    if (!status.ok()) {
      std::cerr << status.ToString() << "\n";
      return 1;
    }
    std::ifstream in(args[2], std::ios::binary);
    for (std::string text; std::getline(in, text, '\0');) {
      std::vector<int> ids;
      if (!processor.Encode(text, &ids).ok()) {
        return 1;
      }
      for (std::size_t i = 0; i < ids.size(); ++i) {
        std::cout << (i == 0 ? "" : " ") << ids[i];
      }
      std::cout << "\n";
    }
    return 0;
  }
  std::cerr << "usage: kvtier_spm_reference train CORPUS PREFIX VOCAB TYPE NORMALIZER | "
               "encode MODEL TEXTS\n";
  return 2;
}
