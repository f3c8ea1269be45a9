/* isa_mask: run a process as if its x86 CPU lacked some instruction sets.
 *
 * Loaded with LD_PRELOAD, it turns on the kernel's CPUID faulting (arch_prctl ARCH_SET_CPUID,
 * Linux >= 4.12 on CPUs whose /proc/cpuinfo lists cpuid_fault). Every CPUID the process runs then
 * traps; the handler runs the real CPUID and clears the feature bits of the chosen profile, so
 * every library that dispatches on CPUID (ONNX Runtime's MLAS, oneDNN in PyTorch, numpy, LLVM in
 * numba) picks the kernels it would pick on such a CPU, at native speed. The instructions stay
 * executable: only the libraries' choice changes, which is what decides their numbers.
 *
 *   ISA_MASK=avx2      no AVX-512, no VNNI (AVX-512 or AVX), no AMX: an AVX2 CPU such as AMD
 *                      EPYC Rome/Milan or Intel Haswell to Skylake client
 *   ISA_MASK=avx512    AVX-512 without VNNI or AMX: Intel Skylake-SP
 *
 * The kernel turns faulting off at execve; LD_PRELOAD in the environment turns it on again in
 * every child. Threads inherit it. Other SIGSEGVs go to whatever handler the program installed
 * (sigaction and signal are wrapped so that installing one keeps this handler in front).
 * /proc/cpuinfo still shows the real flags.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

enum { OFF, AVX2, AVX512 };
static int profile = OFF;
static struct sigaction program_segv; /* what the program asked for SIGSEGV */
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;

#define BIT(n) (1u << (n))

static void mask(unsigned leaf, unsigned sub, unsigned *a, unsigned *b, unsigned *c, unsigned *d)
{
    if (leaf == 7 && sub == 0) {
        *c &= ~BIT(11);                       /* avx512_vnni */
        *d &= ~(BIT(22) | BIT(24) | BIT(25)); /* amx_bf16, amx_tile, amx_int8 */
        if (profile == AVX2) {
            /* avx512 f, dq, ifma, pf, er, cd, bw, vl */
            *b &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
            /* avx512 vbmi, vbmi2, bitalg, vpopcntdq */
            *c &= ~(BIT(1) | BIT(6) | BIT(12) | BIT(14));
            /* avx512 4vnniw, 4fmaps, vp2intersect, fp16 */
            *d &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(23));
        }
    } else if (leaf == 7 && sub == 1) {
        *a &= ~(BIT(4) | BIT(5) | BIT(23));          /* avx_vnni, avx512_bf16, avx_ifma */
        *d &= ~(BIT(4) | BIT(5) | BIT(10) | BIT(19)); /* avx_vnni_int8, ne_convert, int16, avx10 */
    } else if (leaf == 0x24) {
        *a = *b = *c = *d = 0; /* AVX10 (its bit is cleared above) */
    }
}

static void on_segv(int sig, siginfo_t *info, void *context)
{
    ucontext_t *uc = context;
    greg_t *r = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    if (info->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) { /* a trapped CPUID */
        int saved = errno;
        unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX], a, b, c, d;
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
        __cpuid_count(leaf, sub, a, b, c, d);
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
        mask(leaf, sub, &a, &b, &c, &d);
        r[REG_RAX] = a;
        r[REG_RBX] = b;
        r[REG_RCX] = c;
        r[REG_RDX] = d;
        r[REG_RIP] += 2;
        errno = saved;
        return;
    }
    /* not ours: the program's handler, or the default action on the instruction's return */
    if (program_segv.sa_flags & SA_SIGINFO) {
        program_segv.sa_sigaction(sig, info, context);
    } else if (program_segv.sa_handler != SIG_DFL && program_segv.sa_handler != SIG_IGN) {
        program_segv.sa_handler(sig);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction(SIGSEGV, &dfl, NULL);
    }
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (!real_sigaction)
        real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (profile == OFF || sig != SIGSEGV)
        return real_sigaction(sig, act, old);
    if (old)
        *old = program_segv;
    if (act)
        program_segv = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler)
{
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

__attribute__((constructor)) static void start(void)
{
    const char *name = getenv("ISA_MASK");
    real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (!name || !*name)
        return;
    if (!strcmp(name, "avx2"))
        profile = AVX2;
    else if (!strcmp(name, "avx512"))
        profile = AVX512;
    else {
        fprintf(stderr, "isa_mask: ISA_MASK=%s is not a profile (avx2, avx512)\n", name);
        _exit(2);
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_segv;
    act.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&act.sa_mask);
    real_sigaction(SIGSEGV, &act, &program_segv);
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        fprintf(stderr, "isa_mask: this kernel or CPU cannot trap CPUID (%s)\n", strerror(errno));
        _exit(2);
    }
}
