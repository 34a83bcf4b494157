; Stores: a global's word goes through the inline once-per-transaction
; filter (slow path only on a miss); the frame's own allocas are never
; logged (the frame is copied whole at the checkpoint and at exits); memory
; a gate allocated is not logged until another call may begin a new
; transaction; wide or unaligned stores log their byte range.
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -S -rekindle-ev-no-stack-skip %s | %FileCheck %s --check-prefix=NOSTACK
; RUN: %opt -S -rekindle-ev-no-fresh-skip %s | %FileCheck %s --check-prefix=NOFRESH
; RUN: %opt -S -rekindle-ev-no-filter %s | %FileCheck %s --check-prefix=NOFILTER

target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

@g = global i64 0
@buf = global [4 x i64] zeroinitializer

declare ptr @malloc(i64)
declare void @other()

define void @global_store(i64 %v) {
  store i64 %v, ptr @g, align 8
  ret void
}
; CHECK-LABEL: define void @global_store(
; CHECK: %ev.w = and i64 ptrtoint (ptr @g to i64), -8
; CHECK: %ev.key = load i64, ptr
; CHECK: %ev.tag = or i64 %ev.w, %ev.key
; CHECK: %ev.seen = load i64, ptr %ev.slot
; CHECK: %ev.miss = icmp ne i64 %ev.seen, %ev.tag
; CHECK: %ev.open = icmp ne i64 %ev.key, 0
; CHECK: %ev.log = and i1 %ev.miss, %ev.open
; CHECK: br i1 %ev.log, label %{{.*}}, label %{{.*}}, !prof
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %v, ptr @g
; NOFILTER-LABEL: define void @global_store(
; NOFILTER-NOT: %ev.miss
; NOFILTER: call void @__rk_ev_log_word(
; NOFILTER-NEXT: store i64 %v, ptr @g

define i32 @local_store(i32 %v) {
  %a = alloca i32
  store i32 %v, ptr %a
  %r = load i32, ptr %a
  ret i32 %r
}
; CHECK-LABEL: define i32 @local_store(
; CHECK-NOT: __rk_ev_log
; CHECK: store i32 %v, ptr %a
; NOSTACK-LABEL: define i32 @local_store(
; NOSTACK: call preserve_mostcc void @__rk_ev_log_word_pm(
; NOSTACK: store i32 %v, ptr %a

define void @fresh(i64 %v) {
  %p = call ptr @malloc(i64 16)
  %null = icmp eq ptr %p, null
  br i1 %null, label %err, label %ok
ok:
  store i64 %v, ptr %p
  call void @other()
  %q = getelementptr i64, ptr %p, i64 1
  store i64 %v, ptr %q
  ret void
err:
  ret void
}
; The first store is to memory of the running transaction: not logged.
; After @other (which may pass a gate) the same memory is logged.
; CHECK-LABEL: define void @fresh(
; CHECK: ok:
; CHECK-NEXT: store i64 %v, ptr %p
; CHECK: call void @other()
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %v, ptr %q
; NOFRESH-LABEL: define void @fresh(
; NOFRESH: ok:
; NOFRESH-NEXT: ptrtoint ptr %p.ev to i64
; NOFRESH-NEXT: %ev.w = and i64

define void @wide(<4 x i64> %v, ptr %p) {
  store <4 x i64> %v, ptr @buf, align 32
  store i64 0, ptr %p, align 4
  ret void
}
; CHECK-LABEL: define void @wide(
; CHECK: call void @__rk_ev_log_range(ptr @buf, i64 32)
; CHECK: call void @__rk_ev_log_range(ptr %p, i64 8)

define void @hole(i64 %v, i64 %i) {
  %small = alloca i64
  %big = alloca [64 x i64]
  store i64 %v, ptr %small
  %e = getelementptr [64 x i64], ptr %big, i64 0, i64 %i
  store i64 %v, ptr %e
  ret void
}
; A 512-byte alloca is a hole in the frame copies: registered at entry,
; dropped at return, and its stores logged like any memory.
; CHECK-LABEL: define void @hole(
; CHECK: %big = alloca [64 x i64]
; CHECK-NEXT: call void @__rk_ev_hole_push(ptr %big, i64 512)
; CHECK-NEXT: store i64 %v, ptr %small
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %v, ptr %e
; CHECK: call void @__rk_ev_hole_pop(ptr %big)
; CHECK: call void @__rk_ev_frame_exit(
