/* ev_checkpoint.S - __rk_ev_checkpoint(fn): the register half of a
 * transaction's checkpoint, called by every gate right after its library
 * call returned.  It saves what a function call must preserve (rbx, rbp,
 * r12-r15), the stack pointer as the caller sees it after the return, and
 * the return address, then tail-calls rk_ev_tx_begin, which returns 0.
 * A rollback (ev_fault.c) puts these back in the signal's context with rax
 * = 1: the gate sees its checkpoint return a second time and injects.  The
 * caller-saved registers are dead across a call, so nothing else matters. */
	.section rk_ev_text,"ax",@progbits
	.globl __rk_ev_checkpoint
	.type __rk_ev_checkpoint,@function
	.p2align 4
__rk_ev_checkpoint:
	.cfi_startproc
	movq rk_ev_regs@gottpoff(%rip), %rax
	movq %rbx, %fs:0(%rax)
	movq %rbp, %fs:8(%rax)
	movq %r12, %fs:16(%rax)
	movq %r13, %fs:24(%rax)
	movq %r14, %fs:32(%rax)
	movq %r15, %fs:40(%rax)
	leaq 8(%rsp), %rcx
	movq %rcx, %fs:48(%rax)
	movq (%rsp), %rcx
	movq %rcx, %fs:56(%rax)
	jmp rk_ev_tx_begin@PLT
	.cfi_endproc
	.size __rk_ev_checkpoint, .-__rk_ev_checkpoint
	.section .note.GNU-stack,"",@progbits
