/* Set-up, once: the configuration (from the constructor, or the first hook if another
 * library's constructor calls a hook before ours ran), the real dlsym, and fork handling.
 * The "done" flag is pthread_once's own, set before any work that could re-enter a hook. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

__thread int hcs_in_hook __attribute__((tls_model("initial-exec")));
void *(*hcs_real_dlsym)(void *, const char *);
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* Locks are taken in one order before fork and released in the reverse order after it. */
static void fork_prepare(void)
{
	hcs_accounting_fork(HCS_FORK_PREPARE);
	hcs_track_fork(HCS_FORK_PREPARE);
	hcs_limiter_fork(HCS_FORK_PREPARE);
	hcs_graph_fork(HCS_FORK_PREPARE);
}

static void fork_parent(void)
{
	hcs_graph_fork(HCS_FORK_PARENT);
	hcs_limiter_fork(HCS_FORK_PARENT);
	hcs_track_fork(HCS_FORK_PARENT);
	hcs_accounting_fork(HCS_FORK_PARENT);
}

static void fork_child(void)
{
	hcs_graph_fork(HCS_FORK_CHILD);
	hcs_limiter_fork(HCS_FORK_CHILD);
	hcs_track_fork(HCS_FORK_CHILD);
	hcs_accounting_fork(HCS_FORK_CHILD);
}

static bool initialised;
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;

/* The first glibc version of each architecture, which older glibcs' dlsym carries. */
#if defined(__x86_64__)
#define HCS_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define HCS_GLIBC_BASE "GLIBC_2.17"
#else
#error "libhcs is built for x86-64 and AArch64 only (the dlsym trampoline is per architecture)"
#endif

static void resolve_dlsym(void)
{
	/* glibc 2.34 moved dlsym into libc with a new version; older ones (the glibc 2.28 of
	 * openEuler 20.03 and Kylin V10 on Kunpeng servers, say) have only the base one. */
	hcs_real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!hcs_real_dlsym)
		hcs_real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym",
									 HCS_GLIBC_BASE);
}

static void initialise(void)
{
	hcs_in_hook++;
	pthread_once(&dlsym_once, resolve_dlsym);
	hcs_config_load();
	pthread_atfork(fork_prepare, fork_parent, fork_child);
	hcs_in_hook--;
	__atomic_store_n(&initialised, true, __ATOMIC_RELEASE);
}

/* For the dlsym trampoline, which runs even during other libraries' start-up (sanitizers
 * resolve their interceptors through dlsym before anything else is ready): it may only make
 * sure the real dlsym is known, and tells whether set-up is complete. */
bool hcs_dlsym_ready(void)
{
	pthread_once(&dlsym_once, resolve_dlsym);
	return __atomic_load_n(&initialised, __ATOMIC_ACQUIRE);
}

void hcs_init(void)
{
	pthread_once(&init_once, initialise);
}

__attribute__((constructor)) static void hcs_constructor(void)
{
	hcs_init();
}

/* The vendor's own function, never ours: look it up in the vendor library itself. The library
 * is opened only when the application already uses that vendor's API (we are in its hook),
 * so a process that never touches a GPU never loads a driver because of us. */
void *hcs_real(const char *const *libraries, const char *symbol)
{
	hcs_init();
	if (!hcs_real_dlsym)
		return NULL;
	for (const char *const *name = libraries; *name; name++) {
		void *handle = dlopen(*name, RTLD_LAZY | RTLD_NOLOAD);
		if (!handle)
			handle = dlopen(*name, RTLD_LAZY);
		if (!handle)
			continue;
		void *function = hcs_real_dlsym(handle, symbol);
		if (function)
			return function;
	}
	return NULL;
}
