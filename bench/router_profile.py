#!/usr/bin/env python3
"""Where the router's time goes, from `perf script` of a `perf record -g`
(bench/router.sh, PROFILE=1): reads the samples on stdin and sorts each one
by what it was doing.

The kernel's half of a stack is always complete, so a sample in the kernel
is put under its system call (the __x64_sys_* / __do_sys_* frame), a page
fault, or an interrupt; a sample in user space under its shared object and
symbol (user stacks from frame pointers are often cut short in -O3 code, so
callers are not used). The system calls are then grouped into activities.
Prints percentages of all the router's samples.
"""
import collections
import re
import sys

SYS = re.compile(r"^(?:__x64_sys_|__do_sys_|__se_sys_|__ia32_sys_|ksys_)(\w+)")
FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.+?)\s+\((.*)\)\s*$")

GROUPS = [
    ("thread start/exit (a thread per connection: clone3, stack madvise/munmap/mmap)",
     {"clone3", "clone", "madvise", "munmap", "mmap", "mprotect", "exit", "set_robust_list",
      "rseq", "rt_sigprocmask", "sched_getaffinity"}),
    ("socket read/write", {"read", "write", "recvfrom", "sendto", "recvmsg", "sendmsg", "writev",
                           "readv"}),
    ("connection open/close (socket, connect, accept, close, shutdown)",
     {"socket", "connect", "accept", "accept4", "close", "shutdown", "setsockopt",
      "getsockopt"}),
    ("fcntl (SQLite's file locks, socket flags)", {"fcntl"}),
    ("poll/wait", {"poll", "ppoll", "epoll_wait", "select", "pselect6", "nanosleep",
                   "clock_nanosleep"}),
    ("locks (futex)", {"futex"}),
    ("ledger files (pwrite, pread, fsync, fdatasync, lseek)",
     {"pwrite64", "pread64", "fsync", "fdatasync", "lseek", "openat", "fstat", "newfstatat",
      "unlink", "ftruncate"}),
]


def libc_call(sym):
    """The system call a libc wrapper symbol makes, or None."""
    base = re.sub(r"^(?:__)?(?:GI_)?(?:__)?(?:libc_)?", "", sym.split("+0x")[0].split("@")[0])
    base = re.sub(r"_nocancel.*$", "", base)
    base = re.sub(r"64$", "", base)
    alias = {"pthread_create": "clone3", "start_thread": "clone3", "pwrite": "pwrite64",
             "pread": "pread64", "send": "sendto", "recv": "recvfrom", "lll_lock_wait": "futex",
             "lll_lock_wait_private": "futex"}
    base = alias.get(base, base)
    return base if any(base in names for _, names in GROUPS) else None


def classify(stack):
    """stack: [(sym, dso)] leaf first -> (kind, name)"""
    sched = False
    user = None
    for sym, dso in stack:
        if dso != "[kernel.kallsyms]":
            user = (sym, dso)
            break
        m = SYS.match(sym)
        if m:
            return "syscall", m.group(1)
        if sym.startswith(("asm_exc_page_fault", "exc_page_fault")):
            return "kernel", "page fault"
        if sym.startswith(("asm_sysvec_", "asm_common_interrupt", "irq_exit", "__irq_exit",
                           "handle_softirqs", "__do_softirq")):
            return "kernel", "interrupt/softirq"
        if sym.startswith(("ret_from_fork", "schedule_tail")):
            return "syscall", "clone3"  # a new thread's first steps
        if sym.startswith(("__schedule", "schedule+")):
            sched = True
    if sched:
        return "kernel", "scheduling (context switches)"
    if user and user[1].rsplit("/", 1)[-1].startswith("libc"):
        # a libc system call wrapper: samples at the syscall instruction
        # (entry and return, also in the kernel's entry code) belong to it
        call = libc_call(user[0])
        if call:
            return "wrapper", call
    leaf_sym, leaf_dso = stack[0] if stack else ("?", "?")
    if leaf_dso == "[kernel.kallsyms]":
        return "kernel", "kernel, other (%s)" % leaf_sym.split("+")[0]
    dso = leaf_dso.rsplit("/", 1)[-1]
    return "user", "%s %s" % (dso, leaf_sym.split("+0x")[0])


def main():
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    samples, stack = [], None
    for line in sys.stdin:
        if not line.strip():
            if stack is not None:
                samples.append(stack)
            stack = None
            continue
        if not line.startswith((" ", "\t")):
            if stack is not None:
                samples.append(stack)
            stack = []
            continue
        m = FRAME.match(line)
        if m and stack is not None:
            stack.append((m.group(1), m.group(2)))
    if stack is not None:
        samples.append(stack)
    n = len(samples)
    if not n:
        print("no samples")
        return
    by = collections.Counter()
    user_dso = collections.Counter()
    for s in samples:
        kind, name = classify(s)
        by[(kind, name)] += 1
        if kind == "user":
            user_dso[name.split(" ", 1)[0]] += 1
    groups = collections.Counter()
    for (kind, name), k in by.items():
        g = "other"
        if kind in ("syscall", "wrapper"):
            g = "other system calls"
            for title, names in GROUPS:
                if name in names:
                    g = title
                    break
        elif kind == "kernel":
            g = "kernel: " + (name if not name.startswith("kernel, other") else "other")
        else:
            g = "user space (%s)" % ("libc" if name.startswith("libc") else
                                     "SQLite ledger" if "sqlite" in name else
                                     "jansson" if "jansson" in name else
                                     "spillway" if name.startswith("spillway") else "other")
        groups[g] += k
    print("%d samples of the router; by activity:" % n)
    for g, k in groups.most_common():
        print("  %5.1f%%  %s" % (100.0 * k / n, g))
    print("system calls (kernel time under each, plus its libc wrapper's samples):")
    sc = collections.Counter()
    for (kind, name), k in by.items():
        if kind in ("syscall", "wrapper"):
            sc[name] += k
    sc = list(sc.items())
    for name, k in sorted(sc, key=lambda x: -x[1])[:top]:
        print("  %5.1f%%  %s" % (100.0 * k / n, name))
    print("user space, by shared object: " + ", ".join(
        "%s %.1f%%" % (d, 100.0 * k / n) for d, k in user_dso.most_common(6)))
    us = [(name, k) for (kind, name), k in by.items() if kind == "user"]
    print("user space, top symbols:")
    for name, k in sorted(us, key=lambda x: -x[1])[:top]:
        print("  %5.1f%%  %s" % (100.0 * k / n, name))


if __name__ == "__main__":
    main()
