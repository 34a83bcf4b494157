; An allocating gate tells the run-time its block on the normal path only
; (__rk_ev_fresh, with the call's result and first three arguments): the
; run-time then skips logging stores into it until the next gate
; (ev_fresh.c).  posix_memalign reports its block through its out-pointer,
; which the pass's own analysis cannot follow.  Not on the injected path
; (compensation has freed the block), and not for gates that allocate
; nothing.  -rekindle-ev-no-fresh-skip leaves it out.
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -S -rekindle-ev-no-fresh-skip %s | %FileCheck %s --check-prefix=NOFRESH
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare i32 @posix_memalign(ptr, i64, i64)
declare ptr @malloc(i64)
declare i64 @read(i32, ptr, i64)

define ptr @pool(ptr %out) {
  %e = call i32 @posix_memalign(ptr %out, i64 16, i64 4096)
  %bad = icmp ne i32 %e, 0
  br i1 %bad, label %fail, label %ok
ok:
  %p = load ptr, ptr %out
  ret ptr %p
fail:
  ret ptr null
}
; CHECK-LABEL: define ptr @pool(
; CHECK: %e = call i32 @posix_memalign(ptr %out, i64 16, i64 4096)
; CHECK-NEXT: %ev.ck = call i64 @__rk_ev_checkpoint(i32 [[PM:[0-9]+]])
; CHECK: %ev.inject = icmp ne i64 %ev.ck, 0
; CHECK-NEXT: br i1 %ev.inject, label %[[INJ:[0-9]+]], label %[[NORM:[0-9]+]], !prof
; CHECK: [[INJ]]:
; CHECK-NEXT: call void @__rk_ev_compensate(i32 [[PM]],
; CHECK-NOT: __rk_ev_fresh
; CHECK: [[NORM]]:
; CHECK-NEXT: call void @__rk_ev_fresh(i32 [[PM]], i64 %{{.*}}, i64 %{{.*}}, i64 16, i64 4096)
; CHECK: %e.ev = phi i32 [ %e, %[[NORM]] ], [ 12, %[[INJ]] ]
; NOFRESH-LABEL: define ptr @pool(
; NOFRESH-NOT: __rk_ev_fresh
; NOFRESH: ret ptr

define ptr @block(i64 %n) {
  %p = call ptr @malloc(i64 %n)
  ret ptr %p
}
; CHECK-LABEL: define ptr @block(
; CHECK: call void @__rk_ev_fresh(i32 {{[0-9]+}}, i64 %{{.*}}, i64 %n, i64 0, i64 0)
; CHECK: %p.ev = phi ptr

define i64 @no_block(i32 %fd, ptr %b) {
  %n = call i64 @read(i32 %fd, ptr %b, i64 8)
  ret i64 %n
}
; CHECK-LABEL: define i64 @no_block(
; CHECK: __rk_ev_checkpoint
; CHECK-NOT: __rk_ev_fresh
; CHECK: ret i64
