#pragma once
// Reading and writing the bench CSV: a header line of column names, then one line per row. Cells
// are numbers and hex digests, so there is no quoting; a baseline may be hand-edited, so reading
// tolerates CRLF line ends, blank lines and any column order.
#include <string>

#include "bench_rows.h"

namespace ds4::bench {

std::string format_csv(const CsvTable &t);
// Throws ds4::Error naming the file and line for a row whose cell count differs from the header.
CsvTable parse_csv(const std::string &text, const std::string &name);
CsvTable read_csv_file(const std::string &path);
void write_text_file(const std::string &path, const std::string &text);

}  // namespace ds4::bench
