// Results in files: one JSON object per run (every field, windows
// included) and one CSV row per run for spreadsheets and
// scripts/loadtest-report.py.
#ifndef POSENC_LOADGEN_REPORT_H_
#define POSENC_LOADGEN_REPORT_H_

#include <string>

#include "runner.h"

namespace posenc::loadgen {

std::string ToJson(const RunResult& r);

// The header row and a run's row, each ending in a newline.
std::string CsvHeader();
std::string ToCsv(const RunResult& r);

// "RESOURCE_EXHAUSTED=12 UNAVAILABLE=3" (empty when none).
std::string ErrorCounts(const RunResult& r);

}  // namespace posenc::loadgen

#endif  // POSENC_LOADGEN_REPORT_H_
