/* dlsym for AArch64, the same as dlsym_x86_64.S: return our hook for a hooked name, otherwise
 * *branch* to the real dlsym with the caller's x30 restored, so that it sees the caller's
 * return address: RTLD_NEXT lookups made by other libraries then resolve relative to them,
 * not to libhcs (a forwarding C call would break their interposition). */
	.text
	.globl dlsym
	.type dlsym, %function
	.p2align 2
dlsym:
	stp x29, x30, [sp, #-32]!
	mov x29, sp
	stp x0, x1, [sp, #16]
	mov x0, x1
	bl hcs_dlsym_hook_for
	mov x9, x0
	ldp x0, x1, [sp, #16]
	ldp x29, x30, [sp], #32
	cbz x9, 1f
	mov x0, x9
	ret
1:
	adrp x16, hcs_real_dlsym
	ldr x16, [x16, :lo12:hcs_real_dlsym]
	br x16
	.size dlsym, .-dlsym
	.section .note.GNU-stack, "", %progbits
