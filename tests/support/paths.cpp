#include "tests/support/paths.hpp"

namespace kvtier::test {

const char* source_dir() {
  return KVTIER_SOURCE_DIR;
}

const char* kvtier_binary() {
  return KVTIER_BINARY;
}

const char* spm_reference_binary() {
  return KVTIER_SPM_REFERENCE;
}

const char* mpiexec_binary() {
  return KVTIER_MPIEXEC;
}

}  // namespace kvtier::test
