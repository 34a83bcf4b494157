; The copy of @f xors the comparison with the site's fire bit: an inverted
; predicate (sgt -> sle) exactly when the site fires.
; RUN: %opt -S %s | %FileCheck %s

define i32 @f(i32 %x) {
  %c = icmp sgt i32 %x, 10
  %r = zext i1 %c to i32
  ret i32 %r
}

; The original keeps its body behind the function gate.
; CHECK-LABEL: define i32 @f(i32 %x)
; CHECK: %[[ON:.*]] = load i8, ptr @__rk_fi_fn_on
; CHECK: br i1 %{{.*}}, label %rk_fi_armed, label %rk_fi_body
; CHECK: rk_fi_armed:
; CHECK-NEXT: %[[R:.*]] = tail call i32 @f.rk_fi(i32 %x)
; CHECK-NEXT: ret i32 %[[R]]
; CHECK: rk_fi_body:
; CHECK-NEXT: %c = icmp sgt i32 %x, 10
; CHECK-NEXT: %r = zext i1 %c to i32

; CHECK-LABEL: define internal i32 @f.rk_fi(i32 %x)
; CHECK: load i8, ptr @__rk_fi_site_on
; CHECK: call i32 @__rk_fi_hit(ptr @__rk_fi_module, i32 0)
; CHECK: %[[FIRE:.*]] = phi i1 [ false, %{{.*}} ], [ %{{.*}}, %{{.*}} ]
; CHECK-NEXT: %c = icmp sgt i32 %x, 10
; CHECK-NEXT: %[[INV:.*]] = xor i1 %c, %[[FIRE]]
; CHECK-NEXT: %r = zext i1 %[[INV]] to i32
