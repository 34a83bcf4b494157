; Calls that fill our memory through a pointer argument: where one is not a
; gate (its result unchecked, or a clock, which is never a gate), it runs
; inside the transaction, so the memory it fills is logged first.  The
; clocks' errors divert nothing (a program that checks clock_gettime carries
; on with the same code: lighttpd's log_clock_gettime), so even a checked
; clock is no gate and a crash after it rolls back to the gate before.
; RUN: %opt -S %s | %FileCheck %s
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare i32 @clock_gettime(i32, ptr)
declare i32 @gettimeofday(ptr, ptr)
declare i32 @fstat64(i32, ptr)
declare i32 @fstatat64(i32, ptr, ptr, i32)
declare i64 @read(i32, ptr, i64)

define i32 @checked_clock(ptr %ts) {
  %r = call i32 @clock_gettime(i32 0, ptr %ts)
  %bad = icmp ne i32 %r, 0
  %v = select i1 %bad, i32 -1, i32 0
  ret i32 %v
}
; CHECK-LABEL: define i32 @checked_clock(
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 0, i64 %{{.*}}, i64 0)
; CHECK-NEXT: %r = call i32 @clock_gettime(i32 0, ptr %ts)
; CHECK-NOT: __rk_ev_checkpoint
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: ret i32

define void @unchecked(ptr %tv, ptr %st, ptr %buf) {
  %a = call i32 @gettimeofday(ptr %tv, ptr null)
  %b = call i32 @fstat64(i32 3, ptr %st)
  %c = call i32 @fstatat64(i32 3, ptr %buf, ptr %st, i32 0)
  %d = call i64 @read(i32 3, ptr %buf, i64 100)
  ret void
}
; CHECK-LABEL: define void @unchecked(
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 %{{.*}}, i64 0, i64 0)
; CHECK-NEXT: %a = call i32 @gettimeofday(
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 3, i64 %{{.*}}, i64 0)
; CHECK-NEXT: %b = call i32 @fstat64(
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 3, i64 %{{.*}}, i64 %{{.*}})
; CHECK-NEXT: %c = call i32 @fstatat64(
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 3, i64 %{{.*}}, i64 100)
; CHECK-NEXT: %d = call i64 @read(
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: ret void

; A checked fstat stays a gate, and its call is not logged (it runs before
; the checkpoint).
define i32 @checked_fstat(ptr %st) {
  %r = call i32 @fstat64(i32 3, ptr %st)
  ret i32 %r
}
; CHECK-LABEL: define i32 @checked_fstat(
; CHECK-NOT: __rk_ev_log_call
; CHECK: %r = call i32 @fstat64(i32 3, ptr %st)
; CHECK-NEXT: %ev.ck = call i64 @__rk_ev_checkpoint(
