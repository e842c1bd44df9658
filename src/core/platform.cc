// The parts of the platform layer (include/zerorun/platform.h) that are the same on every platform.
#include "zerorun/platform.h"

namespace zerorun::platform {

const char* file_kind_name(FileKind k) {
  switch (k) {
    case FileKind::Missing:
      return "missing";
    case FileKind::Regular:
      return "a regular file";
    case FileKind::Directory:
      return "a directory";
    case FileKind::Fifo:
      return "a FIFO (named pipe)";
    case FileKind::CharDevice:
      return "a character device";
    case FileKind::BlockDevice:
      return "a block device";
    case FileKind::Socket:
      return "a socket";
    case FileKind::Other:
      break;
  }
  return "not a file";
}

}  // namespace zerorun::platform
