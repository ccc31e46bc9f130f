#include "csv_file.h"

#include <fmt/format.h>

#include <cstdio>
#include <sstream>

#include "common/error.h"
#include "input_files.h"

namespace ds4::bench {

namespace {

std::vector<std::string> split_cells(const std::string &line) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream in(line);
    while (std::getline(in, cell, ',')) {
        const size_t a = cell.find_first_not_of(" \t"), b = cell.find_last_not_of(" \t");
        cells.push_back(a == std::string::npos ? "" : cell.substr(a, b - a + 1));
    }
    if (!line.empty() && line.back() == ',') cells.push_back("");
    return cells;
}

}  // namespace

std::string format_csv(const CsvTable &t) {
    std::string out;
    for (size_t i = 0; i < t.header.size(); ++i) out += (i ? "," : "") + t.header[i];
    out += "\n";
    for (const auto &row : t.rows) {
        for (size_t i = 0; i < t.header.size(); ++i) {
            const auto it = row.find(t.header[i]);
            out += (i ? "," : "") + (it == row.end() ? std::string() : it->second);
        }
        out += "\n";
    }
    return out;
}

CsvTable parse_csv(const std::string &text, const std::string &name) {
    CsvTable t;
    std::istringstream in(text);
    std::string line;
    for (int lineno = 1; std::getline(in, line); ++lineno) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        auto cells = split_cells(line);
        if (t.header.empty()) {
            t.header = std::move(cells);
            continue;
        }
        if (cells.size() != t.header.size())
            throw Error(fmt::format("{}:{}: {} cells, the header has {}", name, lineno,
                                    cells.size(), t.header.size()));
        CsvRecord rec;
        for (size_t i = 0; i < cells.size(); ++i) rec[t.header[i]] = cells[i];
        t.rows.push_back(std::move(rec));
    }
    if (t.header.empty()) throw Error(fmt::format("{}: empty CSV", name));
    return t;
}

CsvTable read_csv_file(const std::string &path) {
    return parse_csv(tools::read_input_file(path, "CSV file"), path);
}

void write_text_file(const std::string &path, const std::string &text) {
    std::FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw Error(fmt::format("cannot write {}", path));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw Error(fmt::format("write to {} failed", path));
}

}  // namespace ds4::bench
