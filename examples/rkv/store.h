/* store.h - where the keyspace's memory comes from.
 *
 * The Rekindle build (default) allocates every keyspace object in the arena
 * "keyspace" and wraps every change of it in an unsafe region; a fault
 * inside one makes the restart cold, because the table may be half-changed.
 * The baseline build (-DRKV_PLAIN_MALLOC) uses malloc and no regions, to
 * measure what Rekindle itself costs.  These macros and rekindle_glue.c are
 * the only places that know the difference. */
#ifndef RKV_STORE_H
#define RKV_STORE_H

#ifdef RKV_PLAIN_MALLOC
#include <malloc.h>
#include <stdlib.h>
#define store_alloc(n) malloc(n)
#define store_free(p) free(p)
#define store_usable(p) malloc_usable_size(p)
#define UNSAFE_BEGIN() ((void)0)
#define UNSAFE_END() ((void)0)
#else
#include "rekindle.h"
extern rk_arena *rkv_arena;
#define store_alloc(n) rk_alloc(rkv_arena, (n))
#define store_free(p) rk_free(rkv_arena, (p))
#define store_usable(p) rk_usable_size(rkv_arena, (p))
#define UNSAFE_BEGIN() rk_unsafe_begin(rkv_arena)
#define UNSAFE_END() rk_unsafe_end(rkv_arena)
#endif

#endif /* RKV_STORE_H */
