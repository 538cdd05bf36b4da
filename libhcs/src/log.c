/* Logging for a library that lives inside someone else's process: a fixed buffer, one write,
 * a `libhcs:` prefix, and at most 20 lines per process so a hot loop cannot flood stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"

static int lines_left = 20;

void hcs_log(const char *format, ...)
{
	if (__atomic_sub_fetch(&lines_left, 1, __ATOMIC_RELAXED) < 0)
		return;
	char buffer[512] = "libhcs: ";
	va_list args;
	va_start(args, format);
	int length = vsnprintf(buffer + 8, sizeof(buffer) - 9, format, args);
	va_end(args);
	if (length < 0)
		return;
	size_t total = 8 + ((size_t)length < sizeof(buffer) - 9 ? (size_t)length : sizeof(buffer) - 10);
	buffer[total++] = '\n';
	ssize_t ignored = write(2, buffer, total);
	(void)ignored;
}
