; A store to a word that an earlier store of the same block checked, with
; no call between that may begin a transaction, needs no check of its own:
; the word is in the log already (or the window is closed).  The same
; pointer, or a field inside an 8-aligned word of the same base (nginx's
; bitfields).  A call in between, another word, or an unanchored base keeps
; the check.  -rekindle-ev-no-repeat-skip checks every store.
; RUN: %opt -S %s | %FileCheck %s
; RUN: %opt -S -rekindle-ev-no-repeat-skip %s | %FileCheck %s --check-prefix=NOREPEAT
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

declare void @other()

define void @same_ptr(ptr %p, i64 %a, i64 %b) {
  store i64 %a, ptr %p, align 8
  store i64 %b, ptr %p, align 8
  ret void
}
; CHECK-LABEL: define void @same_ptr(
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %a, ptr %p
; CHECK-NOT: __rk_ev_log_word
; CHECK: store i64 %b, ptr %p
; NOREPEAT-LABEL: define void @same_ptr(
; NOREPEAT: call preserve_mostcc void @__rk_ev_log_word_pm(
; NOREPEAT: call preserve_mostcc void @__rk_ev_log_word_pm(
; NOREPEAT: store i64 %b, ptr %p

define void @fields(ptr %p, i32 %a, i32 %b, i64 %c) {
  store i32 %a, ptr %p, align 8
  %f = getelementptr inbounds i8, ptr %p, i64 4
  store i32 %b, ptr %f, align 4
  %g = getelementptr inbounds i8, ptr %p, i64 8
  store i64 %c, ptr %g, align 8
  ret void
}
; CHECK-LABEL: define void @fields(
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i32 %a, ptr %p
; CHECK-NOT: __rk_ev_log_word
; CHECK: store i32 %b, ptr %f
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %c, ptr %g

define void @unanchored(ptr %p, i32 %a, i32 %b) {
  store i32 %a, ptr %p, align 4
  %f = getelementptr inbounds i8, ptr %p, i64 4
  store i32 %b, ptr %f, align 4
  ret void
}
; %p may be 4 mod 8: the second field can be the next word.
; CHECK-LABEL: define void @unanchored(
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i32 %a, ptr %p
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i32 %b, ptr %f

define void @call_between(ptr %p, i64 %a, i64 %b) {
  store i64 %a, ptr %p, align 8
  call void @other()
  store i64 %b, ptr %p, align 8
  ret void
}
; CHECK-LABEL: define void @call_between(
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %a, ptr %p
; CHECK: call void @other()
; CHECK: call preserve_mostcc void @__rk_ev_log_word_pm(
; CHECK: store i64 %b, ptr %p
