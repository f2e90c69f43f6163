"""The workspaces' seccomp filter: the number table against known numbers and the
kernel's header, and the BPF program, run by a small interpreter of classic BPF here,
against the policy stated directly (`syscall_filter.verdict`): every known number of
both architectures, and arbitrary numbers, arguments and architectures."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.isolate import syscall_filter as sf
from bashfleet.worker.engine.isolate import syscall_numbers

ALLOW = sf.SECCOMP_RET_ALLOW
EPERM = sf.errno_action(sf.EPERM)
EINVAL = sf.errno_action(sf.EINVAL)
ENOSYS = sf.errno_action(sf.ENOSYS)
ZERO = (0, 0, 0, 0, 0, 0)
HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def run(program: bytes, nr: int, arch: int, args: Sequence[int] = ZERO) -> int:
    """What the kernel's classic BPF machine returns for this seccomp_data (the subset
    of instructions the builder emits; any other is a failure)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    assert len(insns) <= 4096  # BPF_MAXINSNS
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == sf.BPF_LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == sf.BPF_RET_K:
            return int(k)
        elif code == sf.BPF_JA:
            pc += k
        else:
            taken = {sf.BPF_JEQ_K: acc == k, sf.BPF_JGE_K: acc >= k,
                     sf.BPF_JSET_K: bool(acc & k)}[code]
            pc += jt if taken else jf
        assert pc < len(insns), "jumped past the end"


PROGRAMS = {arch: sf.program(arch) for arch in sf.ARCHES}


@pytest.mark.parametrize(("arch", "name", "number"), [
    ("x86_64", "read", 0), ("x86_64", "add_key", 248), ("x86_64", "keyctl", 250),
    ("x86_64", "bpf", 321), ("x86_64", "userfaultfd", 323), ("x86_64", "io_uring_setup", 425),
    ("x86_64", "clone3", 435), ("x86_64", "personality", 135), ("x86_64", "socket", 41),
    ("x86_64", "listns", 470),
    ("aarch64", "read", 63), ("aarch64", "add_key", 217), ("aarch64", "keyctl", 219),
    ("aarch64", "bpf", 280), ("aarch64", "userfaultfd", 282), ("aarch64", "socket", 198),
    ("aarch64", "io_uring_setup", 425), ("aarch64", "newfstatat", 79), ("aarch64", "mmap", 222),
])
def test_the_table_has_known_numbers(arch: str, name: str, number: int) -> None:
    assert sf.ARCHES[arch][1][name] == number


def test_aarch64_has_no_legacy_calls() -> None:
    assert "open" not in syscall_numbers.AARCH64 and "fork" not in syscall_numbers.AARCH64


@pytest.mark.skipif(not HEADER.exists(), reason="the kernel headers (linux-libc-dev)")
def test_the_x86_64_table_is_the_headers() -> None:
    for line in HEADER.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("__NR_"):
            assert syscall_numbers.X86_64[parts[1][5:]] == int(parts[2]), line


@pytest.mark.parametrize(("arch", "name", "args", "expected"), [
    ("x86_64", "read", ZERO, ALLOW),
    ("x86_64", "execve", ZERO, ALLOW),
    ("x86_64", "clone3", ZERO, ALLOW),
    ("x86_64", "add_key", ZERO, EPERM),
    ("x86_64", "keyctl", ZERO, EPERM),
    ("x86_64", "request_key", ZERO, EPERM),
    ("x86_64", "io_uring_setup", ZERO, EPERM),
    ("x86_64", "io_uring_enter", ZERO, EPERM),
    ("x86_64", "userfaultfd", ZERO, EPERM),
    ("x86_64", "bpf", ZERO, EPERM),
    ("x86_64", "perf_event_open", ZERO, EPERM),
    ("x86_64", "kexec_load", ZERO, EPERM),
    ("x86_64", "init_module", ZERO, EPERM),
    ("x86_64", "open_by_handle_at", ZERO, EPERM),
    ("x86_64", "chroot", ZERO, ALLOW),
    ("x86_64", "personality", (0, 0, 0, 0, 0, 0), ALLOW),
    ("x86_64", "personality", (0xFFFFFFFF, 0, 0, 0, 0, 0), ALLOW),
    ("x86_64", "personality", (0x20008, 0, 0, 0, 0, 0), ALLOW),
    ("x86_64", "personality", (0x0040000, 0, 0, 0, 0, 0), EPERM),  # ADDR_NO_RANDOMIZE
    # High bits the kernel drops (an int argument) do not hide a persona.
    ("x86_64", "personality", ((1 << 32) | 0x0040000, 0, 0, 0, 0, 0), EPERM),
    ("x86_64", "socket", (2, 1, 0, 0, 0, 0), ALLOW),
    ("x86_64", "socket", (16, 3, 0, 0, 0, 0), ALLOW),
    ("x86_64", "socket", (16, 3, 9, 0, 0, 0), EINVAL),
    ("x86_64", "socket", ((7 << 32) | 16, 3, (1 << 40) | 9, 0, 0, 0), EINVAL),
    ("aarch64", "read", ZERO, ALLOW),
    ("aarch64", "add_key", ZERO, EPERM),
    ("aarch64", "bpf", ZERO, EPERM),
    ("aarch64", "socket", (16, 3, 9, 0, 0, 0), EINVAL),
])
def test_a_call_by_name(arch: str, name: str, args: tuple[int, ...], expected: int) -> None:
    token, numbers, _ = sf.ARCHES[arch]
    assert sf.verdict(arch, token, numbers[name], args) == expected
    assert run(PROGRAMS[arch], numbers[name], token, args) == expected


@pytest.mark.parametrize(("arch", "nr", "audit_arch", "expected"), [
    ("x86_64", 0x40000000 | 39, sf.AUDIT_ARCH_X86_64, EPERM),  # x32's getpid
    ("x86_64", 20, 0x40000003, EPERM),  # i386 (int 0x80): its numbers mean other calls
    ("x86_64", 471, sf.AUDIT_ARCH_X86_64, ENOSYS),  # newer than the table: the fallback
    ("x86_64", 999, sf.AUDIT_ARCH_X86_64, ENOSYS),
    ("x86_64", -1, sf.AUDIT_ARCH_X86_64, EPERM),  # as unsigned, it has the x32 bit
    ("aarch64", -1, sf.AUDIT_ARCH_AARCH64, ENOSYS),
    ("x86_64", 335, sf.AUDIT_ARCH_X86_64, EPERM),  # a hole in the table: not allowed
    ("aarch64", 20, sf.AUDIT_ARCH_X86_64, EPERM),
    ("aarch64", 0x40000000 | 63, sf.AUDIT_ARCH_AARCH64, ENOSYS),
])
def test_numbers_outside_the_table(arch: str, nr: int, audit_arch: int, expected: int) -> None:
    assert sf.verdict(arch, audit_arch, nr, ZERO) == expected
    assert run(PROGRAMS[arch], nr, audit_arch, ZERO) == expected


@pytest.mark.parametrize("arch", list(sf.ARCHES))
def test_the_program_agrees_with_the_policy_on_every_number(arch: str) -> None:
    token, numbers, _ = sf.ARCHES[arch]
    for nr in range(max(numbers.values()) + 3):
        for args in (ZERO, (16, 3, 9, 0, 0, 0), (8, 0, 0, 0, 0, 0)):
            assert run(PROGRAMS[arch], nr, token, args) == sf.verdict(arch, token, nr, args), nr


U64 = st.integers(min_value=0, max_value=2**64 - 1)


@settings(max_examples=400, deadline=None)
@given(arch=st.sampled_from(list(sf.ARCHES)),
       nr=st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 480)),
       audit_arch=st.sampled_from([sf.AUDIT_ARCH_X86_64, sf.AUDIT_ARCH_AARCH64, 0x40000003]),
       args=st.tuples(U64, U64, U64, U64, U64, U64))
def test_the_program_agrees_with_the_policy(arch: str, nr: int, audit_arch: int,
                                            args: tuple[int, ...]) -> None:
    expected = sf.verdict(arch, audit_arch, nr, args)
    assert run(PROGRAMS[arch], nr, audit_arch, args) == expected
    # Nothing is ever killed: every refusal is an errno.
    assert expected == ALLOW or expected & 0xFFFF0000 == sf.SECCOMP_RET_ERRNO


def test_modes() -> None:
    assert sf.for_mode("unconfined", "x86_64") is None
    assert sf.for_mode("default", "x86_64") == PROGRAMS["x86_64"]
    assert sf.for_mode("default", "riscv64") is None
    with pytest.raises(ValueError, match="unknown seccomp mode"):
        sf.for_mode("loose", "x86_64")


def test_it_is_at_least_as_tight_as_the_profile() -> None:
    """What containers-common's profile refuses (explicitly, or by capability) is never
    in the allowlist."""
    refused = {"add_key", "keyctl", "request_key", "bpf", "perf_event_open", "userfaultfd",
               "kexec_load", "kexec_file_load", "init_module", "finit_module",
               "delete_module", "acct", "swapon", "swapoff", "settimeofday",
               "clock_settime", "open_by_handle_at", "io_uring_setup", "io_uring_enter",
               "io_uring_register", "quotactl", "sethostname", "setdomainname", "kcmp",
               "process_madvise", "iopl", "ioperm", "vhangup", "lookup_dcookie",
               "vmsplice", "move_pages", "migrate_pages", "uselib"}
    assert not refused & sf.ALLOWED


def test_a_search_too_long_for_short_jumps_jumps_far() -> None:
    # 400 alternating ranges: a lower half past 255 instructions, which only a long
    # jump (`ja`) gets over; the search still finds every number's action.
    actions = [ALLOW, EPERM]
    ranges = [(number * 2, actions[number % 2]) for number in range(400)]
    tree = sf._tree(ranges)
    codes = {struct.unpack_from("=H", tree, at)[0] for at in range(0, len(tree), 8)}
    assert sf.BPF_JA in codes and len(tree) // 8 > sf.MAX_CONDITIONAL_JUMP
    program = sf._insn(sf.BPF_LD_W_ABS, sf.NR_AT) + tree  # the number in A, as `program`
    for nr in range(0, 802):
        assert run(program, nr, 0) == actions[min(nr // 2, 399) % 2], nr


def test_the_programs_take_no_long_jump_they_do_not_need() -> None:
    # Shorter than one short jump's reach: every comparison jumps over its lower half
    # itself (fewer instructions for the kernel to compile at each call's start).
    for program in PROGRAMS.values():
        codes = [struct.unpack_from("=H", program, at)[0] for at in range(0, len(program), 8)]
        assert sf.BPF_JA not in codes
        assert len(codes) <= sf.MAX_CONDITIONAL_JUMP
