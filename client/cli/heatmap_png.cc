#include "heatmap_png.h"

#include <png.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace posenc::cli {
namespace {

// libpng reports errors by longjmp; the message is kept here so the Status
// can carry it (libpng's default handler would print it to stderr instead).
struct PngError {
  char message[256] = "";
  bool io = false;  // the file refused bytes (as opposed to libpng itself)
};

void OnPngError(png_structp png, png_const_charp message) {
  auto* e = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(e->message, sizeof e->message, "%s", message);
  png_longjmp(png, 1);
}

void OnPngWarning(png_structp, png_const_charp) {}

// Our own write callback: libpng's says only "Write Error", and a full disk
// or a broken pipe should be named as such.
void WriteToFile(png_structp png, png_bytep data, size_t size) {
  FILE* f = static_cast<FILE*>(png_get_io_ptr(png));
  if (std::fwrite(data, 1, size, f) != size) {
    static_cast<PngError*>(png_get_error_ptr(png))->io = true;
    png_error(png, std::strerror(errno));
  }
}

void FlushFile(png_structp png) {
  if (std::fflush(static_cast<FILE*>(png_get_io_ptr(png))) != 0) {
    static_cast<PngError*>(png_get_error_ptr(png))->io = true;
    png_error(png, std::strerror(errno));
  }
}

// Encodes into an open file; everything touched after setjmp is either
// plain data or owned by the caller, as longjmp requires.
absl::Status Encode(FILE* f, const Canvas& canvas) {
  PngError error;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, &error, OnPngError, OnPngWarning);
  if (png == nullptr) return absl::ResourceExhaustedError("libpng: cannot allocate a writer");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    if (error.io) return absl::UnavailableError(error.message);
    return absl::InternalError(absl::StrCat("libpng: ", error.message));
  }
  png_set_write_fn(png, f, WriteToFile, FlushFile);
  png_set_IHDR(png, info, canvas.width(), canvas.height(), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < canvas.height(); ++y) png_write_row(png, canvas.row(y));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return absl::OkStatus();
}

}  // namespace

absl::Status WritePng(const std::string& path, const Canvas& canvas) {
  if (path.empty()) return absl::InvalidArgumentError("PNG path is empty");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    const int e = errno;
    const std::string why = absl::StrCat("cannot write PNG '", path, "': ", std::strerror(e));
    if (e == EACCES || e == EPERM || e == EROFS) return absl::PermissionDeniedError(why);
    if (e == ENOENT || e == ENOTDIR) return absl::NotFoundError(why);
    return absl::UnavailableError(why);
  }
  absl::Status s = Encode(f, canvas);
  // A full disk shows up only when the buffered bytes are flushed.
  int write_errno = 0;
  if (std::fflush(f) != 0 || std::ferror(f)) write_errno = errno;
  if (std::fclose(f) != 0 && write_errno == 0) write_errno = errno;
  if (s.ok() && write_errno != 0) s = absl::UnavailableError(std::strerror(write_errno));
  if (!s.ok()) {
    // Only a file of ours: the path may name a device (/dev/full) or a pipe.
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) std::remove(path.c_str());
    return absl::Status(s.code(), absl::StrCat("cannot write PNG '", path, "': ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace posenc::cli
