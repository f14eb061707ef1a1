#include "load_range.h"

#include <cmath>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace posenc::loadgen {
namespace {

absl::Status Bad(absl::string_view flag, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " must be start:end:step, start:end:xFACTOR, start:end, a value or a comma list (", why,
      "); got '", absl::CHexEscape(text), "'"));
}

// One value of the range: a load point (integers: callers).
absl::StatusOr<double> Point(absl::string_view flag, absl::string_view whole,
                             absl::string_view part, bool integers) {
  double v;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &v) || !std::isfinite(v)) {
    return Bad(flag, whole, absl::StrCat("'", absl::CHexEscape(part), "' is not a number"));
  }
  if (integers && (v < 1 || v != std::floor(v) || v > kMaxCallers)) {
    return Bad(flag, whole, absl::StrCat("callers are whole numbers in [1, ", kMaxCallers, "]"));
  }
  if (!integers && !(v > 0 && v <= 1e9)) return Bad(flag, whole, "rates are in (0, 1e9] per s");
  return v;
}

}  // namespace

absl::StatusOr<std::vector<double>> ExpandLoadRange(absl::string_view flag, absl::string_view text,
                                                    bool integers) {
  std::vector<double> points;
  if (absl::StrContains(text, ',')) {
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      absl::StatusOr<double> v = Point(flag, text, part, integers);
      if (!v.ok()) return v.status();
      points.push_back(*v);
    }
  } else {
    const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
    if (parts.size() > 3) return Bad(flag, text, "at most three fields");
    absl::StatusOr<double> start = Point(flag, text, parts[0], integers);
    if (!start.ok()) return start.status();
    double end = *start;
    if (parts.size() >= 2) {
      absl::StatusOr<double> e = Point(flag, text, parts[1], integers);
      if (!e.ok()) return e.status();
      end = *e;
    }
    if (end < *start) return Bad(flag, text, "end is below start");
    bool geometric = false;
    double step = 1;
    if (parts.size() == 3) {
      absl::string_view s = absl::StripAsciiWhitespace(parts[2]);
      geometric = absl::ConsumePrefix(&s, "x") || absl::ConsumePrefix(&s, "X");
      if (!absl::SimpleAtod(s, &step) || !std::isfinite(step)) {
        return Bad(flag, text, "the step is not a number");
      }
      if (geometric && !(step > 1)) return Bad(flag, text, "a factor must be > 1");
      if (!geometric && !(step > 0)) return Bad(flag, text, "a step must be > 0");
      if (integers && !geometric && step != std::floor(step)) {
        return Bad(flag, text, "a step of callers is a whole number");
      }
    }
    // Counted, not accumulated, so that 0.1 steps do not drift past the end.
    for (int i = 0;; ++i) {
      if (i > 100 * kMaxLoadPoints) return Bad(flag, text, "the step is too small");
      double v = geometric ? *start * std::pow(step, i) : *start + step * i;
      if (integers) v = std::round(v);
      if (v > end * (1 + 1e-12)) break;
      if (!points.empty() && v <= points.back()) continue;  // x1.1 of 1 rounds to 1
      if (static_cast<int>(points.size()) == kMaxLoadPoints) {
        return Bad(flag, text, absl::StrCat("more than ", kMaxLoadPoints, " points"));
      }
      points.push_back(v);
    }
  }
  if (points.size() > static_cast<size_t>(kMaxLoadPoints)) {
    return Bad(flag, text, absl::StrCat("more than ", kMaxLoadPoints, " points"));
  }
  return points;
}

}  // namespace posenc::loadgen
