; A binary operator gets a twin with one operand set to 0 or 1, chosen so
; the result changes; a select picks the twin when the site fires.  A
; divisor is never replaced (a zero divisor is undefined behaviour).
; RUN: %opt -S %s | %FileCheck %s

define i32 @f(i32 %a, i32 %b) {
  %s = add nsw i32 %a, %b
  %q = udiv i32 %s, %b
  %m = mul i32 %q, 0
  ret i32 %m
}

; CHECK-LABEL: define internal i32 @f.rk_fi(
; CHECK: %s = add nsw i32 %a, %b
; CHECK-NEXT: %[[W:.*]] = add i32 %a, 1
; CHECK-NEXT: %[[S:.*]] = select i1 %{{.*}}, i32 %[[W]], i32 %s
; CHECK: %q = udiv i32 %[[S]], %b
; CHECK-NEXT: %[[WQ:.*]] = udiv i32 0, %b
; CHECK-NEXT: %[[Q:.*]] = select i1 %{{.*}}, i32 %[[WQ]], i32 %q
; CHECK: %m = mul i32 %[[Q]], 0
; CHECK-NEXT: %[[WM:.*]] = mul i32 %[[Q]], 1
