/* The contract between the fault-injection pass (pass/) and its run-time
 * library (runtime/rk_fi_rt.c): the fault types, the per-module descriptor
 * the pass emits, and the two entry points instrumented code calls.  Also
 * the annotation an application puts on code that must never get faults. */
#ifndef REKINDLE_FI_H
#define REKINDLE_FI_H

#include <stdint.h>

/* Put on a function the injector must leave alone (and everything inlined
 * from it):  RK_NO_FAULT static void keep_me(void) { ... } */
#define RK_NO_FAULT __attribute__((annotate("rekindle_no_fault")))

/* The seven fault types of PHOENIX's Table 6; the number is what the pass
 * stores in rk_fi_module.site_type, the name is what the sites list and the
 * "fired" line print. */
#define RK_FI_TYPES(X)                       \
	X(0, "comparison-inversion")         \
	X(1, "missing-assignment")           \
	X(2, "wrong-operand")                \
	X(3, "missing-if")                   \
	X(4, "uninitialized-variable")       \
	X(5, "wrong-result-stored")          \
	X(6, "missing-call")
#define RK_FI_NTYPES 7

/* Bumped whenever the layout below changes; __rk_fi_register refuses a
 * module built for another one. */
#define RK_FI_ABI 1

/* One per instrumented module (translation unit), emitted by the pass as
 * a writable global; the runtime links them into a list at startup. */
struct rk_fi_module {
	uint32_t abi;              /* RK_FI_ABI */
	uint32_t nsites;
	uint64_t hash;             /* stable module hash: site ids are hash:index */
	uint8_t *site_on;          /* [nsites]: nonzero sends a site to __rk_fi_hit */
	uint8_t *fn_on;            /* [functions]: nonzero runs the instrumented copy */
	const uint32_t *site_fn;   /* [nsites]: which fn_on byte opens a site */
	const uint8_t *site_type;  /* [nsites]: RK_FI_TYPES number */
	const char *source;        /* the module's source file name */
	uint64_t *counts;          /* runtime-owned: executions per site when tracing */
	struct rk_fi_module *next; /* runtime-owned */
};

void __rk_fi_register(struct rk_fi_module *m);
/* Called on an open site's slow path: counts it, returns nonzero when the
 * fault must act at this execution. */
int __rk_fi_hit(struct rk_fi_module *m, uint32_t site);

#endif
