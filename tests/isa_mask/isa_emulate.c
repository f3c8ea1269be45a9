/* isa_emulate: run a process, and every process it starts, on an emulated AVX2-only x86-64 CPU.
 *
 * The way of isa_mask.c for a machine without CPUID faulting: loaded with LD_PRELOAD, its
 * constructor looks at the CPU the process sees. Where that CPU has an instruction set the profile
 * forbids (AVX-512, VNNI, AVX512-BF16, AMX), the process is the program started natively: it
 * executes itself again under QEMU's user-mode emulator (qemu-x86_64 -cpu max; QEMU >= 7.2's TCG
 * implements AVX, AVX2, FMA and F16C but no AVX-512), with this library preloaded in the emulated
 * program only. There the constructor sees the emulated CPU and lets the program run. The
 * libraries (numpy, ONNX Runtime's MLAS, OpenVINO's oneDNN) then pick the kernels of an AVX2 CPU
 * and compute exactly what they compute on one, at emulated speed: timings mean nothing.
 *
 * qemu-x86_64 does not follow execve (the new program runs natively); LD_PRELOAD, kept in the
 * environment, makes every child do the same again, as with isa_mask.c. A static or setuid program
 * ignores LD_PRELOAD and runs natively. /proc/cpuinfo still shows the host's flags.
 *
 *   ISA_MASK=avx2             the only profile an emulator can give (avx512 needs CPUID faulting)
 *   ISA_MASK_QEMU=PATH        the emulator (qemu-x86_64)
 *   ISA_MASK_QEMU_CPU=MODEL   its CPU model (max)
 *   ISA_MASK_GUEST=PID        set for the emulated program: the process that is already emulated
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#define BIT(n) (1u << (n))

/* the instruction sets of the CPU this process sees that an AVX2-only CPU lacks, in words */
static void forbidden(char *out, size_t size)
{
    unsigned a, b, c, d;
    out[0] = 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    if (b & BIT(16))
        strncat(out, " avx512f", size - strlen(out) - 1);
    if (c & BIT(11))
        strncat(out, " avx512_vnni", size - strlen(out) - 1);
    if (d & (BIT(22) | BIT(24) | BIT(25)))
        strncat(out, " amx", size - strlen(out) - 1);
    __cpuid_count(7, 1, a, b, c, d);
    if (a & BIT(4))
        strncat(out, " avx_vnni", size - strlen(out) - 1);
    if (a & BIT(5))
        strncat(out, " avx512_bf16", size - strlen(out) - 1);
}

static int has_avx2_fma(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid(1, a, b, c, d);
    int fma = (c >> 12) & 1;
    __cpuid_count(7, 0, a, b, c, d);
    return fma && ((b >> 5) & 1);
}

static void fail(const char *fmt, const char *what)
{
    fprintf(stderr, "isa_mask: ");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    _exit(2);
}

__attribute__((constructor)) static void start(int argc, char **argv, char **envp)
{
    (void)envp;
    const char *name = getenv("ISA_MASK");
    if (!name || !*name)
        return;
    if (!strcmp(name, "avx512"))
        fail("ISA_MASK=%s cannot be emulated (QEMU's TCG has no AVX-512); it needs CPUID faulting",
             name);
    if (strcmp(name, "avx2"))
        fail("ISA_MASK=%s is not a profile (avx2, avx512)", name);

    char extra[128];
    forbidden(extra, sizeof extra);
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    const char *guest = getenv("ISA_MASK_GUEST");
    int emulated = guest && !strcmp(guest, pid);
    if (emulated) {
        if (*extra)
            fail("the emulated CPU still has%s (try another ISA_MASK_QEMU_CPU)", extra);
        if (!has_avx2_fma())
            fail("the emulated CPU has no AVX2 or FMA (%s needs QEMU >= 7.2)",
                 getenv("ISA_MASK_QEMU") ? getenv("ISA_MASK_QEMU") : "qemu-x86_64");
        return;
    }
    if (!*extra)
        return; /* an AVX2-only CPU already */

    const char *qemu = getenv("ISA_MASK_QEMU");
    const char *cpu = getenv("ISA_MASK_QEMU_CPU");
    const char *preload = getenv("LD_PRELOAD");
    if (!qemu || !*qemu)
        qemu = "qemu-x86_64";
    if (!cpu || !*cpu)
        cpu = "max";
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        fail("cannot read /proc/self/exe (%s)", strerror(errno));
    exe[n] = 0;

    /* qemu -cpu MODEL -0 ARGV0 -E LD_PRELOAD=... -E ISA_MASK_GUEST=PID EXE ARGV[1:] */
    char *set_preload = malloc(strlen(preload ? preload : "") + 16);
    char set_guest[64];
    sprintf(set_preload, "LD_PRELOAD=%s", preload ? preload : "");
    snprintf(set_guest, sizeof set_guest, "ISA_MASK_GUEST=%s", pid);
    char **args = calloc((size_t)argc + 12, sizeof *args);
    int k = 0;
    args[k++] = (char *)qemu;
    args[k++] = "-cpu";
    args[k++] = (char *)cpu;
    args[k++] = "-0";
    args[k++] = argc > 0 ? argv[0] : exe;
    args[k++] = "-E";
    args[k++] = set_preload;
    args[k++] = "-E";
    args[k++] = set_guest;
    args[k++] = exe;
    for (int i = 1; i < argc; i++)
        args[k++] = argv[i];
    args[k] = NULL;

    /* the emulator itself runs without this library: only the program it runs is masked */
    size_t count = 0;
    while (environ[count])
        count++;
    char **env = calloc(count + 1, sizeof *env);
    size_t m = 0;
    for (size_t i = 0; i < count; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11))
            env[m++] = environ[i];
    env[m] = NULL;
    execvpe(qemu, args, env);
    fail("cannot start the emulator: %s", strerror(errno));
}
