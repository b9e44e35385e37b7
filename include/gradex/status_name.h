/* The name of each gradex status code, as plugins spell it in their messages ("gradex[NAME]: ...",
 * which the Python layer parses back into an exception class). Header-only so that the plugins
 * share one table without an ABI addition; tests/base/status_table_check.py checks it against
 * gradex.h. */
#ifndef GRADEX_STATUS_NAME_H_
#define GRADEX_STATUS_NAME_H_

#include "gradex/gradex.h"

static inline const char* gradex_status_name(gradex_status_t status) {
  switch (status) {
    case GRADEX_OK:
      return "OK";
    case GRADEX_ERR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case GRADEX_ERR_CONFIG:
      return "CONFIG";
    case GRADEX_ERR_TIMEOUT:
      return "TIMEOUT";
    case GRADEX_ERR_PEER:
      return "PEER";
    case GRADEX_ERR_CORRUPT:
      return "CORRUPT";
    case GRADEX_ERR_MISMATCH:
      return "MISMATCH";
    case GRADEX_ERR_TRANSPORT:
      return "TRANSPORT";
    case GRADEX_ERR_INTERNAL:
      return "INTERNAL";
    case GRADEX_ERR_STATE:
      return "STATE";
    case GRADEX_ERR_VERSION:
      return "VERSION";
    case GRADEX_ERR_ABORTED:
      return "ABORTED";
  }
  return "INTERNAL";
}

#endif /* GRADEX_STATUS_NAME_H_ */
