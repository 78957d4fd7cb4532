// results.h5: the result table as one HDF5 dataset per column, through the traces module's
// checked C-API helpers (traces/impl/h5.hpp), so every failure is one line naming the file.

#include <hdf5.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <system_error>

#include "common/errors.hpp"
#include "common/temporary_file.hpp"
#include "serving/demand_memo.hpp"
#include "sweep/sweep.hpp"
#include "traces/impl/h5.hpp"

namespace kvtier::sweep {
namespace {

namespace h5 = traces::h5;
using h5::Blame;
using h5::Handle;

Handle utf8_string_type(const std::string& where_text) {
  const char* what = "cannot make a string type";
  Handle type = h5::checked(H5Tcopy(H5T_C_S1), H5Tclose, Blame::kOutput, what, where_text);
  h5::check(H5Tset_size(type.get(), H5T_VARIABLE), Blame::kOutput, what, where_text);
  h5::check(H5Tset_cset(type.get(), H5T_CSET_UTF8), Blame::kOutput, what, where_text);
  return type;
}

// Contiguous (the table is small) and without timestamps, so equal tables give equal bytes.
Handle dataset_properties(const std::string& where_text) {
  const char* what = "cannot set dataset creation properties";
  Handle properties =
      h5::checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, Blame::kOutput, what, where_text);
  h5::check(H5Pset_obj_track_times(properties.get(), 0), Blame::kOutput, what, where_text);
  return properties;
}

void write_column(hid_t file, const std::string& column, hid_t file_type, hid_t memory_type,
                  std::size_t rows, const void* data, const std::string& name) {
  const std::string where_text = h5::where(name, "/" + column);
  const hsize_t dims[1] = {static_cast<hsize_t>(rows)};
  const Handle space = h5::checked(H5Screate_simple(1, dims, nullptr), H5Sclose, Blame::kOutput,
                                   "cannot create a dataspace", where_text);
  const Handle properties = dataset_properties(where_text);
  const Handle dataset = h5::checked(H5Dcreate2(file, column.c_str(), file_type, space.get(),
                                                H5P_DEFAULT, properties.get(), H5P_DEFAULT),
                                     H5Dclose, Blame::kOutput, "cannot create dataset", where_text);
  if (rows > 0) {
    h5::check(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
              Blame::kOutput, "cannot write dataset", where_text);
  }
}

void write_string_column(hid_t file, const std::string& column,
                         const std::vector<std::string>& values, const std::string& name) {
  const Handle type = utf8_string_type(h5::where(name, "/" + column));
  std::vector<const char*> pointers;
  pointers.reserve(values.size());
  for (const std::string& value : values) {
    pointers.push_back(value.c_str());
  }
  write_column(file, column, type.get(), type.get(), values.size(), pointers.data(), name);
}

// The column order, which HDF5's alphabetical listing loses, as an array of strings.
void write_columns_attribute(hid_t object, const std::vector<std::string>& columns,
                             const std::string& where_text) {
  const char* what = "cannot write the columns attribute";
  const Handle type = utf8_string_type(where_text);
  const hsize_t dims[1] = {static_cast<hsize_t>(columns.size())};
  const Handle space =
      h5::checked(H5Screate_simple(1, dims, nullptr), H5Sclose, Blame::kOutput, what, where_text);
  const Handle attribute =
      h5::checked(H5Acreate2(object, "columns", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                  H5Aclose, Blame::kOutput, what, where_text);
  std::vector<const char*> pointers;
  pointers.reserve(columns.size());
  for (const std::string& column : columns) {
    pointers.push_back(column.c_str());
  }
  h5::check(H5Awrite(attribute.get(), type.get(), pointers.data()), Blame::kOutput, what,
            where_text);
}

// Metric values by column, NaN where a row lacks the metric.
std::vector<std::vector<double>> metric_matrix(const ResultTable& table) {
  std::map<std::string, std::size_t, std::less<>> index;
  for (std::size_t c = 0; c < table.metric_columns.size(); ++c) {
    index.emplace(table.metric_columns[c], c);
  }
  std::vector<std::vector<double>> values(
      table.metric_columns.size(),
      std::vector<double>(table.rows.size(), std::numeric_limits<double>::quiet_NaN()));
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    for (const auto& [name, text] : table.rows[r].metrics) {
      const auto found = index.find(name);
      if (found != index.end()) {
        (void)std::from_chars(text.data(), text.data() + text.size(), values[found->second][r]);
      }
    }
  }
  return values;
}

void write_table(hid_t file, const ResultTable& table, const std::string& name) {
  const std::string root_where = name + ", root attributes";
  {
    const Handle root = h5::checked(H5Oopen(file, "/", H5P_DEFAULT), H5Oclose, Blame::kOutput,
                                    "cannot open the root group", name);
    h5::write_string_attribute(root.get(), "schema", kSchema, root_where);
    h5::write_string_attribute(root.get(), "name", table.name, root_where);
    h5::write_string_attribute(root.get(), "kvtier_version", table.kvtier_version, root_where);
    h5::write_string_attribute(root.get(), "spec_hash", table.spec_hash, root_where);
    write_columns_attribute(root.get(), table.columns(), root_where);
  }
  const std::size_t rows = table.rows.size();
  std::vector<std::uint64_t> points;
  points.reserve(rows);
  for (const Row& row : table.rows) {
    points.push_back(row.point);
  }
  write_column(file, "point", H5T_STD_U64LE, H5T_NATIVE_UINT64, rows, points.data(), name);
  std::vector<std::string> text(rows);
  for (std::size_t a = 0; a < table.axis_columns.size(); ++a) {
    for (std::size_t r = 0; r < rows; ++r) {
      text[r] = a < table.rows[r].axis_values.size() ? table.rows[r].axis_values[a] : "";
    }
    write_string_column(file, table.axis_columns[a], text, name);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    text[r] = table.rows[r].policy;
  }
  write_string_column(file, "policy", text, name);
  for (std::size_t r = 0; r < rows; ++r) {
    text[r] = table.rows[r].error;
  }
  write_string_column(file, "error", text, name);
  const std::vector<std::vector<double>> values = metric_matrix(table);
  for (std::size_t c = 0; c < table.metric_columns.size(); ++c) {
    write_column(file, table.metric_columns[c], H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, rows,
                 values[c].data(), name);
  }
}

}  // namespace

void write_results_h5(const std::filesystem::path& path, const ResultTable& table) {
  // HDF5 (Debian's serial build) is not thread-safe; sweeps replay traces on other threads.
  const std::lock_guard lock(serving::hdf5_mutex());
  h5::silence_library_errors();
  const std::string name = path.string();
  std::error_code ignored;
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), ignored);
  }
  TemporaryFile temporary(path);
  {
    const char* what = "cannot create the results file";
    Handle file = h5::create_file(temporary.path().string(), what, name);
    write_table(file.get(), table, name);
    if (!file.reset()) {
      h5::raise(Blame::kOutput, "cannot close the results file (disk full?)", name);
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary.path(), temporary.target(), error);
  if (error) {
    h5::raise(Blame::kOutput, "cannot move the results file into place: " + error.message(), name);
  }
  temporary.release();
}

}  // namespace kvtier::sweep
