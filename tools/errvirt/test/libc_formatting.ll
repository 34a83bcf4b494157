; libc calls that servers make on their request paths and that the model
; must know: without a row, each is an unknown call (a run-time prefix
; check that finds no marker in libc and closes the window).  lighttpd's
; directory listings and Date headers call strftime, its error log
; strerror_r, and under _FILE_OFFSET_BITS=64 its fcntl is fcntl64.  The
; campaign's lighttpd fallbacks "closed by ev_unknown_call" were strftime
; and strerror_r (docs/errvirt.md, "The fault campaign").
; RUN: %opt -S %s | %FileCheck %s
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare i64 @strftime(ptr, i64, ptr, ptr)
declare ptr @strerror_r(i32, ptr, i64)
declare i32 @__xpg_strerror_r(i32, ptr, i64)
declare i32 @fcntl64(i32, i32, ...)

; strftime writes at most its size argument into its buffer: that range is
; logged before the call, and the call stays inside the transaction.
define i64 @format_time(ptr %buf, ptr %fmt, ptr %tm) {
  %n = call i64 @strftime(ptr %buf, i64 64, ptr %fmt, ptr %tm)
  ret i64 %n
}
; CHECK-LABEL: define i64 @format_time(
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: call void @__rk_ev_log_call(i32 [[STRFTIME:[0-9]+]], i64 %{{.*}}, i64 64, i64 %{{.*}})
; CHECK-NEXT: %n = call i64 @strftime(ptr %buf, i64 64, ptr %fmt, ptr %tm)
; CHECK-NOT: __rk_ev_unknown_call
; CHECK-NOT: __rk_ev_checkpoint
; CHECK: ret i64 %n

; strerror_r (both versions) writes into a1 up to a2 bytes.
define ptr @error_text(i32 %e, ptr %buf) {
  %s = call ptr @strerror_r(i32 %e, ptr %buf, i64 256)
  %r = call i32 @__xpg_strerror_r(i32 %e, ptr %buf, i64 256)
  ret ptr %s
}
; CHECK-LABEL: define ptr @error_text(
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 %{{.*}}, i64 %{{.*}}, i64 256)
; CHECK-NEXT: %s = call ptr @strerror_r(
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 %{{.*}}, i64 %{{.*}}, i64 256)
; CHECK-NEXT: %r = call i32 @__xpg_strerror_r(
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: ret ptr

; fcntl64 is fcntl: a checked one is a gate (no reversion needed), not an
; unknown call.
define i32 @nonblock(i32 %fd) {
  %r = call i32 (i32, i32, ...) @fcntl64(i32 %fd, i32 4, i32 2048)
  %bad = icmp slt i32 %r, 0
  %v = select i1 %bad, i32 -1, i32 0
  ret i32 %v
}
; CHECK-LABEL: define i32 @nonblock(
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: %r = call i32 (i32, i32, ...) @fcntl64(
; CHECK-NEXT: %ev.ck = call i64 @__rk_ev_checkpoint(
; CHECK: %r.ev = phi i32 [ %r, %{{.*}} ], [ -1, %{{.*}} ]

; lighttpd's timer reads the load average (logged: a1 doubles at a0), and its
; shutdown unloads modules (deferred to the commit, like close).
declare i32 @getloadavg(ptr, i32)
declare i32 @dlclose(ptr)
declare ptr @dlsym(ptr, ptr)

define ptr @timer_and_modules(ptr %la, ptr %lib, ptr %name) {
  %n = call i32 @getloadavg(ptr %la, i32 3)
  %f = call ptr @dlsym(ptr %lib, ptr %name)
  %r = call i32 @dlclose(ptr %lib)
  ret ptr %f
}
; CHECK-LABEL: define ptr @timer_and_modules(
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: call void @__rk_ev_log_call(i32 {{[0-9]+}}, i64 %{{.*}}, i64 3, i64 0)
; CHECK-NEXT: %n = call i32 @getloadavg(ptr %la, i32 3)
; CHECK-NEXT: %f = call ptr @dlsym(ptr %lib, ptr %name)
; CHECK-NEXT: %r = call i32 @__rk_ev_dlclose(ptr %lib)
; CHECK-NOT: __rk_ev_unknown_call
; CHECK: ret ptr %f
