"""What every result JSON records about where it ran."""

import subprocess
from pathlib import Path

from growpage.provenance import cpu_kind, host_facts


def test_the_cpu_kind_is_the_widest_unit_the_flags_name():
    assert cpu_kind("processor : 0\nflags : fpu sse avx2 avx512f amx_tile amx_bf16\n") == "amx"
    assert cpu_kind("flags : fpu avx2 avx512f\n") == "avx512"
    assert cpu_kind("flags : fpu sse4_2 avx2\n") == "avx2"
    assert cpu_kind("flags : fpu avx2_like\n") == ""  # whole flags only
    assert cpu_kind("") == ""


def test_host_facts_name_this_checkout_and_this_cpu():
    facts = host_facts()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    assert facts["commit"] == head
    changed = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                             cwd=Path(__file__).parent).stdout.splitlines()
    assert facts["uncommitted_paths"] == len(changed)  # a run from a changed checkout says so
    assert facts["cpu"] == cpu_kind(Path("/proc/cpuinfo").read_text())
    assert facts["machine"] and facts["python"].count(".") == 2
