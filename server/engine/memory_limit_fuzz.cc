// Any bytes as /proc/self/mountinfo, /proc/self/cgroup (either hierarchy)
// and a limit file, through memory_limit.h's parsers (FindMemoryCgroup
// takes the bytes up to the first NUL as mountinfo, the rest as the cgroup
// file). A finding is a crash,
// a sanitizer report, or a result that breaks what the header promises:
// mounts and cgroup paths absolute with no "." or ".." component (so that
// no path is followed out of the mount), a path relative to a mount a
// suffix of the path, a limit that is a number of bytes the text spells.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/memory_limit.h"

namespace {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "memory_limit_fuzz: %s\n", what);
  std::abort();
}

bool Clean(const std::string& p) {
  return !p.empty() && p[0] == '/' && p.find("/../") == std::string::npos &&
         p.find("/./") == std::string::npos && p.find("//") == std::string::npos &&
         (p.size() < 3 || p.compare(p.size() - 3, 3, "/..") != 0) &&
         (p.size() < 2 || p.compare(p.size() - 2, 2, "/.") != 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace posenc::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const CgroupMount& m : MemoryCgroupMounts(text)) {
    Check(Clean(m.root) && Clean(m.mount_point), "mount");
  }
  // Up to the first NUL: mountinfo; after it: /proc/self/cgroup.
  const size_t nul = text.find('\0');
  const std::string mountinfo = text.substr(0, nul);
  const std::string proc_cgroup = nul == std::string::npos ? text : text.substr(nul + 1);
  if (const std::optional<MemoryCgroup> c = FindMemoryCgroup(mountinfo, proc_cgroup)) {
    Check(Clean(c->path) && Clean(c->mount.root) && Clean(c->mount.mount_point), "cgroup");
    const std::string rel = RelativeToMount(c->path, c->mount.root);
    Check(rel.empty() || (rel[0] == '/' && c->path.size() >= rel.size() &&
                          c->path.compare(c->path.size() - rel.size(), rel.size(), rel) == 0),
          "relative path");
  }
  for (bool v2 : {false, true}) {
    const std::optional<std::string> path = CgroupPathOf(text, v2);
    if (path.has_value()) Check(Clean(*path), "cgroup path");
  }
  if (const std::optional<int64_t> bytes = ParseLimitBytes(text)) {
    std::string digits = text;
    if (!digits.empty() && digits.back() == '\n') digits.pop_back();
    Check(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
          "a limit from text that is not a decimal number");
    const size_t first = digits.find_first_not_of('0');
    Check(std::to_string(*bytes) == (first == std::string::npos ? "0" : digits.substr(first)),
          "a limit other than the number the text spells");
  }
  return 0;
}
