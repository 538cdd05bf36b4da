/* The exported symbols: each forwards to the internal hcs_* function of its vendor backend.
 * Only these and dlsym leave the library (the version script is generated from the same
 * rows); everything else is hidden. */
#include <string.h>

#include "exports.h"
#include "internal.h"

#define FORWARD(v, ret, name, params, args, ...)                                             \
	ret hcs_##name params;                                                               \
	HCS_API ret name params { return hcs_##name args; }
HCS_SYMBOLS(FORWARD)

#define ENTRY(v, ret, name, ...) {#name, (void *)name},
static const struct { const char *name; void *hook; } hooks[] = {HCS_SYMBOLS(ENTRY)};

/* Called by the dlsym trampoline: our hook for a hooked name, else NULL (forward). */
void *hcs_dlsym_hook_for(const char *symbol)
{
	if (!hcs_dlsym_ready() || !symbol || !hcs_cfg.enforcing || hcs_in_hook)
		return NULL;
	for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++)
		if (strcmp(hooks[i].name, symbol) == 0)
			return hooks[i].hook;
	return NULL;
}
