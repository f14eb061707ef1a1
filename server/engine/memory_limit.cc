#include "engine/memory_limit.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace posenc::server {
namespace {

// A host with thousands of mounts has a mountinfo of a few hundred KiB.
constexpr int64_t kMaxProcFileBytes = int64_t{4} << 20;
constexpr int64_t kMaxLimitFileBytes = 4096;

// The file's bytes, or nullopt if it cannot be read or holds more than
// `cap` of them.
std::optional<std::string> ReadCapped(const std::string& path, int64_t cap) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text;
  char buf[4096];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > cap) return std::nullopt;
  }
  if (in.bad()) return std::nullopt;
  return text;
}

// mountinfo writes space, tab, newline and backslash in paths as \ooo.
std::string DecodeOctalEscapes(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const char a = s[i + 1], b = s[i + 2], c = s[i + 3];
      if (a >= '0' && a <= '3' && b >= '0' && b <= '7' && c >= '0' && c <= '7') {
        out.push_back(static_cast<char>((a - '0') * 64 + (b - '0') * 8 + (c - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

// An absolute path whose components are neither empty, "." nor "..", and
// which holds no NUL: nothing that could lead out of the directory it is
// put under.
bool IsCleanAbsolutePath(absl::string_view p) {
  if (p.empty() || p[0] != '/') return false;
  if (p == "/") return true;
  for (absl::string_view part : absl::StrSplit(p.substr(1), '/')) {
    if (part.empty() || part == "." || part == ".." || part.find('\0') != absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

// The machine's memory (CgroupFiles::physical_memory_bytes where a test
// sets it), or INT64_MAX where it cannot be read.
int64_t PhysicalMemoryBytes(const CgroupFiles& files) {
  if (files.physical_memory_bytes > 0) return files.physical_memory_bytes;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 && pages <= INT64_MAX / page ? int64_t{pages} * page : INT64_MAX;
}

// Whether `path` is `root` or lies under it (both clean absolute paths).
bool RootHolds(const std::string& root, const std::string& path) {
  if (root == "/" || path == root) return true;
  return path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
         path[root.size()] == '/';
}

bool ListHas(absl::string_view comma_list, absl::string_view item) {
  for (absl::string_view x : absl::StrSplit(comma_list, ',')) {
    if (x == item) return true;
  }
  return false;
}

}  // namespace

std::vector<CgroupMount> MemoryCgroupMounts(absl::string_view mountinfo) {
  std::vector<CgroupMount> mounts;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // ID PARENT MAJOR:MINOR ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    if (f.size() < 10) continue;
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash + 3 >= f.size()) continue;
    const absl::string_view fstype = f[dash + 1], super_options = f[dash + 3];
    const bool v1_memory = fstype == "cgroup" && ListHas(super_options, "memory");
    if (!v1_memory && fstype != "cgroup2") continue;
    CgroupMount mount{DecodeOctalEscapes(f[3]), DecodeOctalEscapes(f[4]), !v1_memory};
    if (!IsCleanAbsolutePath(mount.root) || !IsCleanAbsolutePath(mount.mount_point)) continue;
    mounts.push_back(std::move(mount));
  }
  return mounts;
}

std::optional<MemoryCgroup> FindMemoryCgroup(absl::string_view mountinfo,
                                             absl::string_view proc_cgroup) {
  const std::vector<CgroupMount> mounts = MemoryCgroupMounts(mountinfo);
  const bool v2 =
      std::none_of(mounts.begin(), mounts.end(), [](const CgroupMount& m) { return !m.v2; });
  std::optional<std::string> path = CgroupPathOf(proc_cgroup, v2);
  if (!path.has_value()) return std::nullopt;
  const CgroupMount* first = nullptr;
  const CgroupMount* holding = nullptr;
  for (const CgroupMount& m : mounts) {
    if (m.v2 != v2) continue;
    if (first == nullptr) first = &m;
    if (RootHolds(m.root, *path) && (holding == nullptr || m.root.size() > holding->root.size()))
      holding = &m;
  }
  if (first == nullptr) return std::nullopt;
  return MemoryCgroup{holding != nullptr ? *holding : *first, std::move(*path)};
}

std::optional<std::string> CgroupPathOf(absl::string_view proc_cgroup, bool v2) {
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n', absl::SkipEmpty())) {
    // HIERARCHY_ID:CONTROLLERS:PATH (the path may itself hold ':').
    const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const bool match = v2 ? (f[0] == "0" && f[1].empty()) : ListHas(f[1], "memory");
    if (!match) continue;
    if (!IsCleanAbsolutePath(f[2])) return std::nullopt;
    return std::string(f[2]);
  }
  return std::nullopt;
}

std::string RelativeToMount(const std::string& path, const std::string& root) {
  if (!RootHolds(root, path) || path == root) return "";
  return root == "/" ? path : path.substr(root.size());
}

std::optional<int64_t> ParseLimitBytes(absl::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.empty() || text.size() > 19) return std::nullopt;  // "max", or garbage
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(text, &bytes)) return std::nullopt;  // past 2^63 - 1
  return bytes;
}

std::optional<MemoryLimit> ReadCgroupMemoryLimit(const CgroupFiles& files) {
  const std::optional<std::string> mountinfo = ReadCapped(files.mountinfo, kMaxProcFileBytes);
  if (!mountinfo.has_value()) return std::nullopt;
  const std::optional<std::string> proc_cgroup = ReadCapped(files.cgroup, kMaxProcFileBytes);
  if (!proc_cgroup.has_value()) return std::nullopt;
  const std::optional<MemoryCgroup> cgroup = FindMemoryCgroup(*mountinfo, *proc_cgroup);
  if (!cgroup.has_value()) return std::nullopt;
  const CgroupMount* const mount = &cgroup->mount;
  const std::string* const path = &cgroup->path;

  const std::string base =
      files.mount_prefix + (mount->mount_point == "/" ? "" : mount->mount_point);
  const char* const name = mount->v2 ? "memory.max" : "memory.limit_in_bytes";
  const int64_t physical = PhysicalMemoryBytes(files);
  std::optional<MemoryLimit> least;
  // From the process's cgroup up to the mount point: a parent's limit binds
  // its children too (v1 with use_hierarchy, as every v1 host since 2019
  // has it; v2 always).
  for (std::string rel = RelativeToMount(*path, mount->root);;) {
    const std::string file = base + rel + "/" + name;
    if (const std::optional<std::string> text = ReadCapped(file, kMaxLimitFileBytes)) {
      if (const std::optional<int64_t> bytes = ParseLimitBytes(*text)) {
        if (*bytes < physical && (!least.has_value() || *bytes < least->bytes)) {
          least = MemoryLimit{*bytes, file};
        }
      }
    }
    if (rel.empty()) break;
    rel.resize(rel.rfind('/'));
  }
  return least;
}

std::optional<MemoryLimit> ReadMemoryLimit(const CgroupFiles& files) {
  if (std::optional<MemoryLimit> cgroup = ReadCgroupMemoryLimit(files)) return cgroup;
  const int64_t physical = PhysicalMemoryBytes(files);
  if (physical == INT64_MAX) return std::nullopt;
  return MemoryLimit{physical, "the machine's memory; no cgroup limit below it"};
}

namespace {
// Sizes are clamped to 0 first: InflightBytesUnder runs before Validate.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  a = std::max<int64_t>(a, 0);
  b = std::max<int64_t>(b, 0);
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}
}  // namespace

int64_t InflightBytesUnder(std::optional<int64_t> limit, int64_t message_limit, int64_t table_bytes,
                           int64_t unconstrained) {
  if (!limit.has_value()) return unconstrained;
  const int64_t two_messages = SaturatingAdd(message_limit, message_limit);
  const int64_t held = SaturatingAdd(SaturatingAdd(two_messages, table_bytes), kFixedOverheadBytes);
  const int64_t room = *limit > held ? *limit - held : 0;
  return std::max(two_messages, std::min(room, unconstrained));
}

int64_t PeakMemoryBytes(int64_t max_inflight_bytes, int64_t message_limit,
                        int64_t transport_memory_limit, int64_t table_bytes) {
  const int64_t held =
      std::max(SaturatingAdd(max_inflight_bytes, SaturatingAdd(message_limit, message_limit)),
               transport_memory_limit);
  return SaturatingAdd(SaturatingAdd(held, table_bytes), kFixedOverheadBytes);
}

}  // namespace posenc::server
