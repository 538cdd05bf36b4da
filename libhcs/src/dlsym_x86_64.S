/* dlsym: return our hook for a hooked name, otherwise *jump* to the real dlsym so that it
 * sees the caller's return address: RTLD_NEXT lookups made by other libraries then resolve
 * relative to them, not to libhcs (a forwarding C call would break their interposition). */
	.text
	.globl dlsym
	.type dlsym, @function
dlsym:
	push %rdi
	push %rsi
	sub $8, %rsp
	mov %rsi, %rdi
	call hcs_dlsym_hook_for
	add $8, %rsp
	pop %rsi
	pop %rdi
	test %rax, %rax
	jnz 1f
	jmp *hcs_real_dlsym(%rip)
1:
	ret
	.size dlsym, .-dlsym
	.section .note.GNU-stack, "", @progbits
