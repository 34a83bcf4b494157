/* Prints the allocator's size classes as the runtime computes them at start
 * (alloc.c, rk_class_size[]) and its layout hash (rk_layout_hash(), stored in
 * every arena header), one "NAME VALUE" line each.  Unlike probe.c it needs
 * the runtime's code: supervisor/tests/layout.rs compiles it together with
 * runtime/src/*.c, then checks that `rekindle inspect` (inspect.rs) computes
 * the same table and the same hash. */
#include "rk_internal.h"

#include <stdio.h>

int main(void)
{
	for (unsigned c = 0; c < RK_NCLASSES; c++)
		printf("CLASS_SIZE_%u %u\n", c, rk_class_size[c]);
	printf("LAYOUT_HASH %llu\n", (unsigned long long)rk_layout_hash());
	return 0;
}
