; -rekindle-ev-no-alloc-gates (REKINDLE_EV_NO_ALLOC_GATES=1, a measurement
; switch): a checked allocation begins no transaction; it stays inside the
; running one with a note (a rollback frees the block), and the run-time
; learns its block (posix_memalign's through __rk_ev_fresh, with its size).
; A checked open stays a gate.  Without the switch, malloc is a gate.
; RUN: %opt -S -rekindle-ev-no-alloc-gates %s | %FileCheck %s
; RUN: %opt -S %s | %FileCheck %s --check-prefix=GATE

target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare ptr @malloc(i64)
declare i32 @posix_memalign(ptr, i64, i64)
declare i32 @open(ptr, i32, ...)

define ptr @alloc(i64 %n) {
  %p = call ptr @malloc(i64 %n)
  %null = icmp eq ptr %p, null
  br i1 %null, label %err, label %ok
ok:
  ret ptr %p
err:
  ret ptr null
}
; CHECK-LABEL: define ptr @alloc(
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: %p = call ptr @malloc(i64 %n)
; CHECK-NEXT: ptrtoint ptr %p to i64
; CHECK-NEXT: call void @__rk_ev_note(i32 {{[0-9]+}}, i64 %{{.*}}, i64 %n, i64 0)
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: ret ptr
; GATE-LABEL: define ptr @alloc(
; GATE: call ptr @malloc(
; GATE-NEXT: call i64 @__rk_ev_checkpoint(

define i32 @pool(ptr %out) {
  %e = call i32 @posix_memalign(ptr %out, i64 16, i64 4096)
  ret i32 %e
}
; CHECK-LABEL: define i32 @pool(
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: %e = call i32 @posix_memalign(ptr %out, i64 16, i64 4096)
; CHECK: call void @__rk_ev_note(
; CHECK: call void @__rk_ev_fresh(i32 {{[0-9]+}}, i64 %{{.*}}, i64 %{{.*}}, i64 16, i64 4096)
; CHECK: ret i32 %e

define i32 @opens(ptr %path) {
  %fd = call i32 (ptr, i32, ...) @open(ptr %path, i32 0)
  ret i32 %fd
}
; CHECK-LABEL: define i32 @opens(
; CHECK: call i64 @__rk_ev_checkpoint(

; Without the switch too: a posix_memalign whose failure only aborts is no
; gate (errorPathAborts); its note frees the block on a rollback, and the
; run-time learns the block with its size, so stores into it are fresh.
declare void @abort() noreturn
define ptr @pool_or_abort(ptr %out) {
  %e = call i32 @posix_memalign(ptr %out, i64 16, i64 2048)
  %bad = icmp ne i32 %e, 0
  br i1 %bad, label %die, label %ok
die:
  call void @abort()
  unreachable
ok:
  %p = load ptr, ptr %out
  ret ptr %p
}
; GATE-LABEL: define ptr @pool_or_abort(
; GATE-NOT: __rk_ev_checkpoint
; GATE: %e = call i32 @posix_memalign(ptr %out, i64 16, i64 2048)
; GATE: call void @__rk_ev_note(
; GATE: call void @__rk_ev_fresh(i32 {{[0-9]+}}, i64 %{{.*}}, i64 %{{.*}}, i64 16, i64 2048)
