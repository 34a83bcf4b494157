; A stored value becomes 0 (1 where it is 0) when the site fires: integers,
; pointers (null or 1) and floating point.
; RUN: %opt -S %s | %FileCheck %s

define void @f(i64 %v, ptr %p, ptr %q, double %d, ptr %r) {
  store i64 %v, ptr %p
  store ptr %q, ptr %p
  store double %d, ptr %r
  ret void
}

; CHECK-LABEL: define internal void @f.rk_fi(
; CHECK: %[[Z:.*]] = icmp eq i64 %v, 0
; CHECK-NEXT: %[[W:.*]] = zext i1 %[[Z]] to i64
; CHECK-NEXT: %[[V:.*]] = select i1 %{{.*}}, i64 %[[W]], i64 %v
; CHECK: store i64 %[[V]], ptr %p
; CHECK: %[[PZ:.*]] = icmp eq ptr %q, null
; CHECK-NEXT: %[[PW:.*]] = select i1 %[[PZ]], ptr inttoptr (i64 1 to ptr), ptr null
; CHECK-NEXT: %[[PV:.*]] = select i1 %{{.*}}, ptr %[[PW]], ptr %q
; CHECK: store ptr %[[PV]], ptr %p
; CHECK: %[[DZ:.*]] = fcmp oeq double %d, 0.0
; CHECK-NEXT: %[[DW:.*]] = select i1 %[[DZ]], double 1.0{{.*}}, double 0.0
; CHECK-NEXT: %[[DV:.*]] = select i1 %{{.*}}, double %[[DW]], double %d
; CHECK: store double %[[DV]], ptr %r
