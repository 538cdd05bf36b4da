/* The exported hook symbols (defined in exports.c from symbols.h), for code that must hand out
 * their addresses (dlsym, cuGetProcAddress). */
#ifndef HCS_EXPORTS_H
#define HCS_EXPORTS_H

#include "hcs_abi.h"
#include "symbols.h"

#define HCS_DECLARE_EXPORT(v, ret, name, params, ...) ret name params;
HCS_SYMBOLS(HCS_DECLARE_EXPORT)

#endif
