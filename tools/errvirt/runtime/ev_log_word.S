/* ev_log_word.S - __rk_ev_log_word_pm(w): the inline filter's slow path as
 * the pass calls it, with LLVM's preserve_most convention: every general
 * register but r11 keeps its value across the call (the vector registers
 * are the caller's to save, as in the C convention).  The code at each
 * store site then needs no callee-saved register or spill for the values
 * live across the store; this trampoline saves the C convention's
 * caller-saved registers once, here, on the slow path only.  It passes its
 * own return address (the store site) for the window-closed events. */
	.section rk_ev_text,"ax",@progbits
	.globl __rk_ev_log_word_pm
	.type __rk_ev_log_word_pm,@function
	.p2align 4
__rk_ev_log_word_pm:
	.cfi_startproc
	pushq %rax
	.cfi_adjust_cfa_offset 8
	pushq %rcx
	.cfi_adjust_cfa_offset 8
	pushq %rdx
	.cfi_adjust_cfa_offset 8
	pushq %rsi
	.cfi_adjust_cfa_offset 8
	pushq %rdi
	.cfi_adjust_cfa_offset 8
	pushq %r8
	.cfi_adjust_cfa_offset 8
	pushq %r9
	.cfi_adjust_cfa_offset 8
	pushq %r10
	.cfi_adjust_cfa_offset 8
	/* 8 pushes and the return address: 16-byte aligned again after 8 more */
	subq $8, %rsp
	.cfi_adjust_cfa_offset 8
	movq 72(%rsp), %rsi
	call rk_ev_log_word_at@PLT
	addq $8, %rsp
	.cfi_adjust_cfa_offset -8
	popq %r10
	.cfi_adjust_cfa_offset -8
	popq %r9
	.cfi_adjust_cfa_offset -8
	popq %r8
	.cfi_adjust_cfa_offset -8
	popq %rdi
	.cfi_adjust_cfa_offset -8
	popq %rsi
	.cfi_adjust_cfa_offset -8
	popq %rdx
	.cfi_adjust_cfa_offset -8
	popq %rcx
	.cfi_adjust_cfa_offset -8
	popq %rax
	.cfi_adjust_cfa_offset -8
	ret
	.cfi_endproc
	.size __rk_ev_log_word_pm, .-__rk_ev_log_word_pm
	.section .note.GNU-stack,"",@progbits
